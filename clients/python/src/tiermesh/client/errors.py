"""The client's one exception: a chat or feedback call that ended with a gRPC error status."""

from __future__ import annotations

import grpc
from tiermesh.client.status_details import StatusDetails, parse_status_details


class ChatError(Exception):
    """The call ended with a gRPC error status; `code` is its name, e.g. "UNAVAILABLE", and
    `message` the router's explanation (e.g. "max_tokens: must be in [1, 200], got 0").

    `details` holds what the server added in google.rpc details: `retry_after_s` (RetryInfo,
    on RESOURCE_EXHAUSTED: wait that long before retrying), `reason` (ErrorInfo, a stable
    machine-readable cause) and `field_violations` (BadRequest, on INVALID_ARGUMENT)."""

    def __init__(self, code: str, message: str, details: StatusDetails | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details or StatusDetails()

    @property
    def retry_after_s(self) -> float | None:
        return self.details.retry_after_s

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> ChatError:
        code = error.code()
        try:
            trailers = error.trailing_metadata()
        except Exception:  # some RpcErrors (e.g. a failed channel) carry none
            trailers = None
        details = parse_status_details(trailers)
        return cls(code.name if code else "UNKNOWN", error.details() or "", details)
