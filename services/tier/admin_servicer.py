"""TierAdminService over gRPC (hot swap of the tier's model) and who may call what on a tier.

Relays model_swap.EngineSwitch's swap records as protobuf and its refusals as gRPC statuses;
knows nothing of how a model is loaded or switched.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.errors import TiermeshError
from services.common.status_details import abort_error, abort_with_details
from services.security.api_key_auth import ApiKeyAuth
from services.security.api_keys import KeyRing
from services.security.settings import ServiceSecurity
from services.security.tls import AllowedCallers
from services.tier.model_swap import EngineSwitch, SwapRecord

TIER_SERVICE = tier_pb2.DESCRIPTOR.services_by_name["TierService"].full_name
ADMIN_SERVICE = tier_pb2.DESCRIPTOR.services_by_name["TierAdminService"].full_name

log = logging.getLogger(__name__)


def swap_to_proto(record: SwapRecord) -> tier_pb2.ModelSwap:
    """The record as its message: SwapRecord's fields are ModelSwap's, name for name."""
    return tier_pb2.ModelSwap(**dataclasses.asdict(record))


class TierAdminServicer(tier_pb2_grpc.TierAdminServiceServicer):
    def __init__(self, engines: EngineSwitch) -> None:
        self._engines = engines

    async def SwapModel(
        self, request: tier_pb2.SwapModelRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tier_pb2.SwapModelResponse]:
        try:
            swap = self._engines.begin_swap(request.model_path, request.drain_timeout_s)
            async for record in swap:
                yield tier_pb2.SwapModelResponse(swap=swap_to_proto(record))
        except TiermeshError as e:
            await abort_error(context, e)
        except Exception as e:  # never UNKNOWN: say what failed
            log.exception("tier swap to %s failed", request.model_path)
            message = f"swap to {request.model_path} failed ({type(e).__name__}: {e})"
            await abort_with_details(context, grpc.StatusCode.INTERNAL, message, reason="INTERNAL")


def tier_interceptors(security: ServiceSecurity) -> list[Any]:
    """Who may call what on a tier. With allowed callers (the router's certificate), only they
    may call TierService and reflection; the admin service too, unless a key file is set, when
    it takes keys instead (an operator's CLI holds a key, not the router's certificate). With a
    key file, the admin service needs a key with the `admin` scope, and so does TierService when
    no allowed callers guard it (the router sends no key: a tier behind it is guarded by
    certificates)."""
    admin, tier = f"/{ADMIN_SERVICE}/", f"/{TIER_SERVICE}/"
    chain: list[Any] = []
    if security.allowed_callers:
        open_to_keys = (admin,) if security.keys_file is not None else ()
        chain.append(AllowedCallers(security.allowed_callers, open_to_keys))
    if security.keys_file is not None:
        open_to_certificates = (tier,) if security.allowed_callers else ()
        chain.append(ApiKeyAuth(KeyRing(security.keys_file), {}, open_to_certificates))
    return chain
