"""The OpenAI-compatible HTTP/SSE front door and chat page; speaks gRPC to the router."""
