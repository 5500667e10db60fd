"""OpenAI-style errors: the JSON body `{"error": {message, type, param, code}}`, its HTTP status,
and the mapping from the router's gRPC status codes to HTTP.

Knows nothing of how a chat is run: only status names, messages and the error shape.
"""

from __future__ import annotations

import re
from typing import Any

# gRPC status name -> HTTP status (what a stock OpenAI client expects for each failure)
HTTP_STATUS: dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "OUT_OF_RANGE": 400,
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
# HTTP status -> OpenAI error type
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
# the router names the bad field first ("max_tokens: must be in [1, 200], got 0")
_FIELD = re.compile(r"^([a-z_]+(?:\.[a-z_]+)*): ")
# the router's field names that differ from the OpenAI request's
PARAMS = {
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.stop": "stop",
    "prompt": "messages",
}


def openai_param(field: str) -> str:
    """The OpenAI request field for a router field name (`sampling.stop[1]` -> `stop`)."""
    return PARAMS.get(field) or PARAMS.get(re.sub(r"\[\d+\]$", "", field)) or field


class GatewayError(Exception):
    """A request that fails with an HTTP status and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "server_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(self.retry_after_s)}

    @classmethod
    def from_status(cls, code: str, message: str, retry_after_s: int | None = None) -> GatewayError:
        """The error for a gRPC status (by name) the router answered with."""
        status = HTTP_STATUS.get(code, 500)
        match = _FIELD.match(message)
        param = openai_param(match.group(1)) if match and status == 400 else None
        return cls(
            status,
            message or code,
            param=param,
            code=code.lower(),
            retry_after_s=retry_after_s if status == 429 else None,
        )


def bad_request(param: str, message: str, code: str = "invalid_value") -> GatewayError:
    """400 for a request field, the message naming it."""
    return GatewayError(400, f"{param}: {message}", param=param, code=code)
