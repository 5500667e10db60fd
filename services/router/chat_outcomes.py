"""The gRPC side of how a chat's tier calls turn out: a tier's failure read off its gRPC error
(TierError, what the session core decides with), and the failure relayed to the client when no
answer is left (UpstreamFailed, with the tier's own status code and google.rpc details).

Knows gRPC's error type; the decisions about failures live in session_core.py.
"""

from __future__ import annotations

import grpc
from tiermesh.client.status_details import parse_status_details

from services.router.session_calls import TierError


def tier_error(error: grpc.aio.AioRpcError) -> TierError:
    """A tier call's gRPC failure as plain data."""
    code = error.code().name
    trailing = error.trailing_metadata() or ()
    status_details = tuple(
        (key, value) for key, value in trailing if key == "grpc-status-details-bin"
    )
    parsed = parse_status_details(trailing) if status_details else None
    reason, metadata = (parsed.reason, parsed.metadata) if parsed is not None else ("", {})
    return TierError(code, error.details() or "", status_details, reason, metadata)


class UpstreamFailed(Exception):
    """A tier failed and no other answer is left; relayed to the client with the tier's code."""

    def __init__(self, tier: str, error: TierError) -> None:
        super().__init__(f"tier {tier}: {error.details}")
        self.code: grpc.StatusCode = grpc.StatusCode[error.code]
        self.details = f"tier {tier}: {error.details}"
        # the tier's google.rpc details (its RetryInfo, BadRequest, ...), relayed as they are
        self.trailing_metadata = error.status_details
