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
