"""Security of the mesh: a development CA and SPIFFE-identified certificates (certs.py), gRPC
TLS and mTLS credentials that reload rotated files (tls.py), and API keys stored hashed with
scopes and per-key rate limits (api_keys.py). Knows nothing of routing or engines."""
