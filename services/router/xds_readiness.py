"""Whether the router has its xDS resources: in mesh mode (tiers reached through `xds:///`
targets) the router reports NOT_SERVING until grpcio's xDS client holds a listener, routes,
clusters and endpoints for every tier target, then SERVING, so that a router started while the
control plane is down is not sent chats it can only fail.

grpcio does not expose its xDS client's state, so each target is probed with a gRPC health
check through its own channel: an answer, or a failure that comes from a backend (a tier that is
down), shows the resources are there; a failure naming an xDS resource or the xDS channel (the
control plane unreachable, a resource missing) shows they are not. Once a target has its
resources it keeps them (grpcio keeps serving its cached config when the control plane goes
away). Knows gRPC only.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)
XDS_SCHEME = "xds:"
PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 1.0
# grpcio's wording when its xDS client lacks a resource or cannot reach the control plane
_NO_RESOURCES = re.compile(r"\b(LDS|RDS|CDS|EDS) resource\b|xDS channel for server|does not exist")


def is_xds_target(target: str) -> bool:
    return target.startswith(XDS_SCHEME)


def lacks_resources(error: grpc.aio.AioRpcError) -> bool:
    """True when a call failed because the xDS client has no config for its target."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and bool(
        _NO_RESOURCES.search(error.details() or "")
    )


class XdsReadiness:
    """Probes every `xds:///` channel until each has its resources. `missing` says which have
    not, and why (the xDS client's own error)."""

    def __init__(
        self,
        channels: Mapping[str, grpc.aio.Channel],
        interval_s: float = PROBE_INTERVAL_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._channels = {t: c for t, c in channels.items() if is_xds_target(t)}
        self._interval_s = interval_s
        self._probe_timeout_s = probe_timeout_s
        self.missing: dict[str, str] = dict.fromkeys(self._channels, "not probed yet")

    @property
    def needed(self) -> bool:
        return bool(self._channels)

    @property
    def ready(self) -> bool:
        return not self.missing

    async def _probe(self, target: str) -> str | None:
        """None when `target` has its resources, else why not."""
        stub = health_pb2_grpc.HealthStub(self._channels[target])
        try:
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=self._probe_timeout_s)
        except grpc.aio.AioRpcError as e:
            if lacks_resources(e):
                return f"no xDS resources for {target}: {e.details()}"
        return None

    async def wait(self) -> None:
        """Returns once every target has had its resources; logs what is missing meanwhile."""
        reported = ""
        while self.missing:
            for target in list(self.missing):
                why = await self._probe(target)
                if why is None:
                    del self.missing[target]
                    log.info("xDS resources for %s received", target)
                else:
                    self.missing[target] = why
            summary = "; ".join(self.missing.values())
            if summary and summary != reported:
                log.warning("router NOT_SERVING until it has its xDS resources: %s", summary)
                reported = summary
            if self.missing:
                await asyncio.sleep(self._interval_s)

    async def serve_when_ready(self, set_serving: Callable[[bool], Awaitable[None]]) -> None:
        await self.wait()
        log.info("xDS resources for every tier: router SERVING")
        await set_serving(True)
