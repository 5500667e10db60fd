"""Whether a local mesh's children serve: each child's own health check (gRPC health, or HTTP
for the gateway), waiting for a whole mesh to come up with the front doors (router, gateway)
reported last, and a tier's GetStatus for the start report.

Knows gRPC health and the children's addresses; nothing of how they are planned or started.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import grpc
from rich.console import Console

from services.common.child_process import Child
from services.common.serving import is_serving, open_channel

if TYPE_CHECKING:
    from tiermesh.v1 import tier_pb2

READY_TIMEOUT_S = 300.0
FRONT_DOORS = frozenset({"router", "gateway"})  # what clients call: ready once the rest is


def wait_healthy(
    children: list[Child], console: Console, credentials: grpc.ChannelCredentials | None = None
) -> bool:
    """Polls each child's gRPC health until SERVING; False if one exits or time runs out.
    The front doors (router, gateway) are reported serving only once every other child is: a
    chat sent when the router's ✓ shows finds its tiers loaded. `credentials` make the health
    calls mTLS (a `--secure` run)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = {child.name: child for child in children}
    with console.status("starting tiers and router…") as status:
        while pending:
            behind = any(name not in FRONT_DOORS for name in pending)
            for name, child in list(pending.items()):
                code = child.exited()
                if code is not None:
                    console.print(f"[red]{name} exited with code {code}[/red]; log tail:")
                    console.print(child.log_tail(), markup=False)
                    return False
                if name in FRONT_DOORS and behind:
                    continue
                if is_healthy(child, credentials):
                    del pending[name]
                    console.print(f"[green]✓[/green] {name} serving on {child.address}")
            status.update(f"waiting for {', '.join(pending)}…")
            if time.monotonic() > deadline:
                console.print(f"[red]not healthy after {READY_TIMEOUT_S:.0f} s:[/red] {pending}")
                return False
            time.sleep(0.2)
    return True


def is_healthy(child: Child, credentials: grpc.ChannelCredentials | None = None) -> bool:
    """The child's own health check: HTTP for the gateway, gRPC health for the rest."""
    if child.health_url:
        return is_http_healthy(child.health_url)
    return is_serving(child.address, credentials)


def is_http_healthy(url: str) -> bool:
    """True when GET `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=0.5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def tier_status(
    address: str, credentials: grpc.ChannelCredentials | None = None
) -> tier_pb2.TierStatus | None:
    """The tier's GetStatus (model, memory, cold start), or None if it does not answer."""
    from tiermesh.v1 import tier_pb2, tier_pb2_grpc

    try:
        with open_channel(address, credentials) as channel:
            status: tier_pb2.TierStatus = tier_pb2_grpc.TierServiceStub(channel).GetStatus(
                tier_pb2.GetStatusRequest(), timeout=2
            )
    except grpc.RpcError:
        return None
    return status
