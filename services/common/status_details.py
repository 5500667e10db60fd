"""Rich gRPC error statuses: the google.rpc details a client can act on, attached to an abort.

- RESOURCE_EXHAUSTED carries RetryInfo (how long to wait before retrying);
- INVALID_ARGUMENT carries BadRequest with the field that was wrong;
- every error carries ErrorInfo with a stable, machine-readable `reason` (e.g.
  "ROUTER_AT_CAPACITY", "RATE_LIMITED") in the domain "tiermesh".

They travel in the standard `grpc-status-details-bin` trailer (what grpcio-status writes), so
clients in every language read them with their usual helpers. Knows nothing of our services.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common.errors import InvalidArgument, Overloaded, TiermeshError

DOMAIN = "tiermesh"


def rich_status(
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str = "",
    retry_after_s: float | None = None,
    field: str | None = None,
    metadata: dict[str, str] | None = None,
) -> grpc.Status:
    """A grpc.Status whose trailer holds the google.rpc.Status with these details."""
    details: list[Any] = []
    if reason:
        details.append(
            error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata or {})
        )
    if retry_after_s is not None:
        seconds = max(0.0, retry_after_s)
        whole = math.floor(seconds)
        delay = duration_pb2.Duration(seconds=whole, nanos=int((seconds - whole) * 1e9))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    if field is not None:
        violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=message)
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    packed = []
    for detail in details:
        item = any_pb2.Any()
        item.Pack(detail)
        packed.append(item)
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=packed)
    return rpc_status.to_status(status)


async def abort_with_details(
    context: Any, code: grpc.StatusCode, message: str, **details: Any
) -> None:
    """Aborts the call (grpc.aio) with `message` and the details `rich_status` builds."""
    await context.abort_with_status(rich_status(code, message, **details))


# How long a client refused for overload should wait before retrying, when nothing better is
# known: about one short answer's time on a busy tier.
OVERLOAD_RETRY_S = 0.5
_REASONS = {
    "INVALID_ARGUMENT": "INVALID_REQUEST",
    "RESOURCE_EXHAUSTED": "OVERLOADED",
    "UNAVAILABLE": "UNAVAILABLE",
    "UNAUTHENTICATED": "API_KEY_INVALID",
    "PERMISSION_DENIED": "PERMISSION_DENIED",
}


def error_details(error: TiermeshError) -> dict[str, Any]:
    """The details for one of our errors: the field an InvalidArgument names (its message reads
    "field: what was wrong"), a retry delay for overload, a stable reason for all."""
    reason = getattr(error, "reason", "") or _REASONS.get(error.status, error.status)
    details: dict[str, Any] = {"reason": reason}
    if isinstance(error, InvalidArgument):
        field, sep, _ = str(error).partition(": ")
        if sep and " " not in field:
            details["field"] = field
    if isinstance(error, Overloaded):
        details["retry_after_s"] = getattr(error, "retry_after_s", OVERLOAD_RETRY_S)
    if metadata := getattr(error, "metadata", None):
        details["metadata"] = dict(metadata)
    return details


async def abort_error(context: Any, error: TiermeshError) -> None:
    """Aborts the call with `error`'s status, message and details."""
    code = grpc.StatusCode[error.status]
    await abort_with_details(context, code, str(error), **error_details(error))
