"""The client's one exception: a chat or feedback call that ended with a gRPC error status."""

from __future__ import annotations

import grpc


class ChatError(Exception):
    """The call ended with a gRPC error status; `code` is its name, e.g. "UNAVAILABLE", and
    `message` the router's explanation (e.g. "max_tokens: must be in [1, 200], got 0")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> ChatError:
        code = error.code()
        return cls(code.name if code else "UNKNOWN", error.details() or "")
