"""`tiermesh tier swap TIER DIR`: hot swap of a tier's model (TierAdminService.SwapModel).

The tier loads the model folder DIR beside the model it serves, then switches; streams in flight
finish on the old model. The replicas are `--address`, or every replica the router's config file
names for TIER (as `tiermesh top` finds them), swapped one after another, stopping at the first
failure. Prints each phase as it comes, or with `--json` one object at the end (its shape is in
the README, "Model lifecycle"). Knows the admin RPC and its records; not how a tier swaps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
from tiermesh.client import tls_credentials
from tiermesh.client.router_client import API_KEY_ENV
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.cli.client_flags import add_client_security_flags
from services.cli.top_command import ROUTER_CONFIG, router_replicas
from services.common.errors import TiermeshError
from services.common.serving import open_channel
from services.common.tiers import TIER_NAMES

RECORD_FIELDS = (
    "phase",
    "old_model_id",
    "new_model_id",
    "model_path",
    "load_s",
    "switch_s",
    "drain_s",
    "streams_on_old",
    "streams_cut",
    "freed_bytes",
    "error",
)


def swap_row(address: str, swap: tier_pb2.ModelSwap | None, error: str = "") -> dict[str, Any]:
    """One replica's entry of the JSON object: the swap's last record, or the error."""
    row: dict[str, Any] = {"address": address}
    for name in RECORD_FIELDS:
        value = getattr(swap, name) if swap is not None else None
        row[name] = round(value, 6) if isinstance(value, float) else value
    row["error"] = error or row["error"] or None
    return row


def _say(swap: tier_pb2.ModelSwap, tier: str, address: str) -> None:
    if swap.phase == "loading":
        print(
            f"tier {tier} at {address}: loading {swap.model_path} beside {swap.old_model_id}",
            flush=True,
        )
    elif swap.phase == "switched":
        print(
            f"  loaded in {swap.load_s:.2f} s; switched in {swap.switch_s * 1000:.3f} ms: new "
            f"requests go to {swap.new_model_id}, {swap.streams_on_old} stream(s) finish on "
            f"{swap.old_model_id}",
            flush=True,
        )
    elif swap.phase == "done":
        print(
            f"  done {swap.drain_s:.2f} s after the switch: {swap.old_model_id} stopped, "
            f"{swap.freed_bytes / 1e6:.1f} MB freed, {swap.streams_cut} stream(s) cut",
            flush=True,
        )


def swap_replica(
    tier: str,
    address: str,
    model_path: str,
    credentials: grpc.ChannelCredentials | None,
    api_key: str | None,
    timeout_s: float,
    quiet: bool,
    drain_timeout_s: float = 0.0,
) -> dict[str, Any]:
    """Swaps one replica's model; its row, with "error" set when the swap failed."""
    metadata = [("authorization", f"Bearer {api_key}")] if api_key else None
    last: tier_pb2.ModelSwap | None = None
    with open_channel(address, credentials) as channel:
        stub = tier_pb2_grpc.TierAdminServiceStub(channel)
        request = tier_pb2.SwapModelRequest(model_path=model_path, drain_timeout_s=drain_timeout_s)
        try:
            for response in stub.SwapModel(request, timeout=timeout_s, metadata=metadata):
                last = response.swap
                if not quiet:
                    _say(last, tier, address)
        except grpc.RpcError as e:
            return swap_row(address, last, f"{e.code().name}: {e.details()}")
    return swap_row(address, last)


def _replicas(args: argparse.Namespace) -> list[str]:
    if args.address:
        return [args.address]
    replicas = [a for t, a in router_replicas(args.router_config) if t == args.tier]
    if not replicas:
        raise TiermeshError(f"{args.router_config} names no replica of tier {args.tier}")
    if any(address.startswith("xds:") for address in replicas):
        raise TiermeshError("an xds:/// tier target has no address to call: pass --address")
    return replicas


def run_swap(args: argparse.Namespace) -> int:
    if (args.cert or args.key) and not args.ca:
        print("tiermesh tier swap: --cert and --key need --ca", file=sys.stderr)
        return 2
    try:
        replicas = _replicas(args)
    except (TiermeshError, OSError) as e:
        print(f"tiermesh tier swap: {e}", file=sys.stderr)
        return 2
    credentials = tls_credentials(args.ca, args.cert, args.key) if args.ca else None
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    # the tier reads the path: a relative one is taken from here, where it was typed
    model_path = os.path.abspath(os.path.expanduser(args.model_dir))
    rows = []
    for address in replicas:
        row = swap_replica(
            args.tier,
            address,
            model_path,
            credentials,
            api_key,
            args.timeout,
            args.json,
            args.drain_timeout,
        )
        rows.append(row)
        if row["error"]:
            if not args.json:
                print(f"tiermesh tier swap: {address}: {row['error']}", file=sys.stderr)
            break
    ok = len(rows) == len(replicas) and not any(row["error"] for row in rows)
    if args.json:
        report = {"tier": args.tier, "model_path": model_path, "ok": ok, "replicas": rows}
        print(json.dumps(report, indent=2))
        if not ok:
            print(f"tiermesh tier swap: {rows[-1]['error']}", file=sys.stderr)
    return 0 if ok else 1


def register(commands: Any) -> None:
    tier = commands.add_parser("tier", help="operate one tier: hot swap of its model")
    actions = tier.add_subparsers(dest="tier_command", required=True, metavar="ACTION")
    swap = actions.add_parser(
        "swap",
        help="load a model folder beside the tier's model, then switch to it",
        description=__doc__.split("\n\n")[0],
    )
    swap.add_argument("tier", choices=TIER_NAMES, metavar="TIER", help=", ".join(TIER_NAMES))
    swap.add_argument(
        "model_dir",
        metavar="DIR",
        help="the new model's folder, as the tier's machine sees it (relative: from here)",
    )
    swap.add_argument("--address", help="the tier replica to swap (default: every replica of TIER)")
    swap.add_argument(
        "--router-config",
        type=Path,
        default=ROUTER_CONFIG,
        help="the router's config file: where TIER's replicas are when no --address is given",
    )
    swap.add_argument(
        "--drain-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds the old model's streams may take to finish (default: the tier's "
        "drain_grace_s); those still running then end UNAVAILABLE",
    )
    swap.add_argument("--json", action="store_true", help="one JSON object at the end")
    swap.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one replica's swap may take"
    )
    add_client_security_flags(swap, "the tier (an API key with the admin scope)")
    swap.set_defaults(func=run_swap)
