"""Where a running `tiermesh run` mesh listens, as a file in its run directory (`mesh.json`):
written once every service serves, removed when the launcher stops. `tiermesh top` reads it to
find the tiers behind a router that was started with other ports than the configs' (the router
has no RPC that lists its tiers).

Knows file paths and the launcher's service names; nothing of gRPC.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from services.common.tiers import TIER_NAMES
from services.launcher.json_file import write_json

FILE_NAME = "mesh.json"


@dataclass(frozen=True)
class RunAddresses:
    """The router's address, the gateway's (None without one) and each tier's replicas."""

    router: str
    gateway: str | None
    tiers: dict[str, list[str]]

    def replicas(self) -> list[tuple[str, str]]:
        """(tier, address) of every replica, in tier order."""
        return [(tier, address) for tier, addresses in self.tiers.items() for address in addresses]


def tier_of(service: str) -> str | None:
    """The tier a launcher child serves (`small`, or `small-2` for a second replica), else None."""
    if service in TIER_NAMES:
        return service
    tier, _, replica = service.rpartition("-")
    return tier if tier in TIER_NAMES and replica.isdigit() else None


def run_addresses(services: Iterable[tuple[str, str]]) -> RunAddresses:
    """The addresses of a mesh from its (service name, address) pairs."""
    router, gateway = "", None
    tiers: dict[str, list[str]] = {}
    for name, address in services:
        if (tier := tier_of(name)) is not None:
            tiers.setdefault(tier, []).append(address)
        elif name == "router":
            router = address
        elif name == "gateway":
            gateway = address
    return RunAddresses(router, gateway, {t: tiers[t] for t in TIER_NAMES if t in tiers})


def write_run_addresses(run_dir: Path, addresses: RunAddresses) -> Path:
    """Writes run_dir/mesh.json (atomically); returns its path."""
    path = run_dir / FILE_NAME
    write_json(
        path, {"router": addresses.router, "gateway": addresses.gateway, "tiers": addresses.tiers}
    )
    return path


def remove_run_addresses(run_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (run_dir / FILE_NAME).unlink()


def read_run_addresses(run_dir: Path) -> RunAddresses | None:
    """The addresses in run_dir/mesh.json; None when there is no such file or it is not one
    that write_run_addresses wrote."""
    try:
        body = json.loads((run_dir / FILE_NAME).read_text())
        tiers = {
            str(tier): [str(a) for a in addresses] for tier, addresses in body["tiers"].items()
        }
        gateway = body.get("gateway")
        return RunAddresses(str(body["router"]), None if gateway is None else str(gateway), tiers)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
