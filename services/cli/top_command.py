"""`tiermesh top`: every tier replica's load, live (rich, once a second) or as one JSON snapshot.

Asks each tier's GetStatus. The router has no status RPC that lists its tiers, so the tiers are,
in order: those named with `--tier [NAME=]ADDR` (repeated); those of the router's config file
when `--router-config` is given; those of the mesh `tiermesh run` is running from this run
directory (its mesh.json, when `--router` is not given or names that mesh's router); else those
of the router's default config file. The router itself is asked only for its health.
What the view looks like is services/terminal/top_view.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tiermesh.client import tls_credentials
from tiermesh.client.router_client import API_KEY_ENV
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.cli.client_flags import add_client_security_flags
from services.common import env
from services.common.config import RouterConfig
from services.common.config_loading import load_config
from services.common.errors import TiermeshError
from services.common.serving import open_channel
from services.common.tiers import TIER_NAMES
from services.launcher.run_addresses import read_run_addresses
from services.terminal.top_view import Snapshot, print_json_snapshot, show_top

ROUTER_CONFIG = Path(__file__).resolve().parents[1] / "router" / "config.toml"
STATUS_TIMEOUT_S = 2.0


class TopTargets:
    """The replicas to ask, and how to reach them (TLS, API key)."""

    def __init__(
        self,
        replicas: list[tuple[str, str]],
        router: str | None,
        credentials: grpc.ChannelCredentials | None,
        api_key: str | None,
    ) -> None:
        self.replicas = replicas
        self.router = router
        self._credentials = credentials
        self._metadata = [("authorization", f"Bearer {api_key}")] if api_key else []

    def _channel(self, address: str) -> grpc.Channel:
        return open_channel(address, self._credentials)

    def snapshot(self) -> Snapshot:
        """One reading of every replica (and the router's health), as the README's JSON shape."""
        router = None
        if self.router is not None:
            router = {"address": self.router, "serving": self._router_serving(self.router)}
        rows = [self._tier_row(tier, address) for tier, address in self.replicas]
        return {"t": round(time.time(), 3), "router": router, "tiers": rows}

    def _router_serving(self, address: str) -> bool | None:
        try:
            with self._channel(address) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(),
                    timeout=STATUS_TIMEOUT_S,
                    metadata=self._metadata,
                )
        except grpc.RpcError:
            return None
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def _tier_row(self, tier: str, address: str) -> dict[str, Any]:
        try:
            with self._channel(address) as channel:
                status = tier_pb2_grpc.TierServiceStub(channel).GetStatus(
                    tier_pb2.GetStatusRequest(), timeout=STATUS_TIMEOUT_S, metadata=self._metadata
                )
        except grpc.RpcError as e:
            return {"tier": tier, "address": address, "error": f"{e.code().name}: {e.details()}"}
        return status_row(tier, address, status)


def status_row(tier: str, address: str, status: tier_pb2.TierStatus) -> dict[str, Any]:
    """One replica's row of the snapshot, from its TierStatus."""
    return {
        "tier": status.tier or tier,
        "address": address,
        "error": None,
        "model": status.model_id,
        "engine": status.engine,
        "serving": status.serving,
        "queued": status.queued,
        "max_queued": status.max_queued,
        "running": status.running,
        "max_running": status.max_running,
        "kv_pool_used_tokens": status.kv_pool_used_tokens,
        "kv_pool_capacity_tokens": status.kv_pool_capacity_tokens,
        "kv_pool_use_share": round(status.recent_kv_pool_use_share, 4),
        "decode_busy_share": round(status.decode_busy_share, 4),
        "tokens_per_s": round(status.recent_tokens_per_s, 2),
        "ttft_ms_p50": round(status.recent_ttft_ms_p50, 2),
        "ttft_ms_p99": round(status.recent_ttft_ms_p99, 2),
        "completed": status.completed,
        "rejected": status.rejected,
        "startup_s": round(status.startup_s, 3),
        "startup_phases": {p.name: round(p.seconds, 3) for p in status.startup_phases},
        "weights_loading": status.weights_loading,
        "last_swap": _last_swap(status),
        "engine_running": status.engine_running,
        "engine_waiting": status.engine_waiting,
        "prefix_cache_hit_rate": round(status.prefix_cache_hit_rate, 4),
        "queued_batch": status.queued_batch,
        "paused": status.paused,
    }


def _last_swap(status: tier_pb2.TierStatus) -> dict[str, Any] | None:
    """The replica's last hot swap (`tiermesh tier swap`), None when it never swapped."""
    if not status.HasField("last_swap"):
        return None
    swap = status.last_swap
    return {
        "phase": swap.phase,
        "old_model_id": swap.old_model_id,
        "new_model_id": swap.new_model_id,
        "load_s": round(swap.load_s, 3),
        "switch_s": round(swap.switch_s, 6),
        "started_unix_s": round(swap.started_unix_s, 3),
        "error": swap.error or None,
    }


def parse_tier_flag(value: str) -> tuple[str, str]:
    """`NAME=ADDR` or a bare `ADDR` (its tier then comes from its status)."""
    name, sep, address = value.partition("=")
    if not sep:
        return "?", value
    if name not in TIER_NAMES:
        raise argparse.ArgumentTypeError(f"--tier {value}: {name!r} is not one of {TIER_NAMES}")
    return name, address


def router_replicas(config_path: Path) -> list[tuple[str, str]]:
    """Every tier replica the router's config names (comma-separated replicas split)."""
    config = load_config(RouterConfig, config_path)
    return [
        (tier, address.strip())
        for tier, target in config.tiers.items()
        for address in target.split(",")
    ]


def run_top(args: argparse.Namespace) -> int:
    if (args.cert or args.key) and not args.ca:
        print("tiermesh top: --cert and --key need --ca", file=sys.stderr)
        return 2
    credentials = tls_credentials(args.ca, args.cert, args.key) if args.ca else None
    replicas: list[tuple[str, str]] = list(args.tier or [])
    run = None
    if not replicas and args.router_config is None:
        run = read_run_addresses(Path(env.run_dir()))
        if run is not None and args.router not in (None, run.router):
            run = None  # another router than the one `tiermesh run` started here
    router = args.router or (run.router if run is not None else env.router_address())
    if not replicas and run is not None:
        replicas = run.replicas()
    elif not replicas:
        try:
            replicas = router_replicas(args.router_config or ROUTER_CONFIG)
        except (TiermeshError, OSError) as e:
            print(f"tiermesh top: {e}", file=sys.stderr)
            return 2
    if any(address.startswith("xds:") for _, address in replicas):
        print(
            "tiermesh top: an xds:/// tier target has no address to ask: pass --tier",
            file=sys.stderr,
        )
        return 2
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    targets = TopTargets(replicas, router, credentials, api_key)
    if args.once:
        snapshot = targets.snapshot()
        if args.json:
            print_json_snapshot(snapshot)
        else:
            from rich.console import Console

            from services.terminal.top_view import snapshot_table

            Console().print(snapshot_table(snapshot))
        return 0
    show_top(targets.snapshot, args.interval)
    return 0


def register(commands: Any) -> None:
    top = commands.add_parser(
        "top", help="every tier replica's load, live", description=__doc__.split("\n\n")[0]
    )
    top.add_argument(
        "--router",
        help="router address (its health is shown); default: the one `tiermesh run` started "
        "from this run directory, else $TIERMESH_ROUTER or 127.0.0.1:50051",
    )
    top.add_argument(
        "--router-config",
        type=Path,
        help="the router's config file: the tiers to show when no --tier is given (default: "
        "those of the mesh `tiermesh run` started here, else services/router/config.toml)",
    )
    top.add_argument(
        "--tier",
        action="append",
        type=parse_tier_flag,
        metavar="[NAME=]ADDR",
        help="a tier replica to show (repeat); replaces the router config's tiers",
    )
    top.add_argument("--once", action="store_true", help="one snapshot, then exit")
    top.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    add_client_security_flags(top, "the router and the tiers")
    top.set_defaults(func=run_top)
