"""`python -m services.security.health_probe --port P [--service NAME]`: exits 0 when the gRPC
server on localhost:P answers health SERVING, 1 otherwise, over the TLS of TIERMESH_TLS_* (this
pod's own certificate, which every secure service's health check accepts) or plaintext when
those are unset. The exec probe of the secure Kubernetes manifests: kubelet's native gRPC probe
cannot speak TLS. Knows nothing of the service it probes.
"""

from __future__ import annotations

import argparse
import sys

from services.common.errors import ConfigError
from services.common.serving import SERVING, health_status
from services.security.settings import ServiceSecurity


def probe(port: int, service: str = "", timeout_s: float = 3.0) -> tuple[bool, str]:
    """(serving, what was seen) for the server on localhost:`port`."""
    credentials = ServiceSecurity.from_env().channel_credentials()
    seen = health_status(f"localhost:{port}", credentials, timeout_s, service)
    return seen == SERVING, seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.security.health_probe")
    parser.add_argument("--port", type=int, required=True, help="the service's gRPC port")
    parser.add_argument("--service", default="", help="the health service name ('' = server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait")
    args = parser.parse_args(argv)
    try:
        serving, seen = probe(args.port, args.service, args.timeout)
    except ConfigError as e:
        print(f"health probe: {e}", file=sys.stderr)
        return 2
    print(f"localhost:{args.port}: {seen}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
