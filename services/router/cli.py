"""The `tiermesh` command: run the mesh, chat with it, and manage the built-in models.

tiermesh run [--mesh]             start tiers + router (+ xDS control plane), show an answer, serve
tiermesh chat [--json] PROMPT     one chat through the router
tiermesh models train|eval        the built-in model family (see services/training)
tiermesh mesh serve|status|...    the xDS control plane and what points at it (see mesh/)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path

from services.common import env
from services.common.tiers import TIER_NAMES

DEMO_PROMPT = "What is your return policy?"
# Modules that add their own subcommands through `register(subparsers)`.
COMMAND_MODULES = tuple(
    name
    for name in (
        "services.router.trace_view",
        "services.training.cli",
        "services.bench.cli",
        "services.routing.cli",
        "mesh.cli",
    )
    if importlib.util.find_spec(name.rsplit(".", 1)[0]) is not None
    and importlib.util.find_spec(name) is not None
)


def _model_overrides(values: list[str]) -> dict[str, Path]:
    models = {}
    for value in values:
        tier, _, path = value.partition("=")
        if tier not in TIER_NAMES or not path:
            raise SystemExit(f"tiermesh: --model expects TIER=PATH with TIER in {TIER_NAMES}")
        models[tier] = Path(path)
    return models


def cmd_run(args: argparse.Namespace) -> int:
    from services.router.launcher import run_mesh

    return run_mesh(
        base_port=args.base_port,
        models=_model_overrides(args.model),
        device=args.device,
        demo_prompt=None if args.no_demo else args.demo_prompt,
        mesh=args.mesh,
    )


def cmd_chat(args: argparse.Namespace) -> int:
    from services.common.telemetry import setup_telemetry
    from services.router.chat_view import print_json_events, show_live
    from services.router.sdk import RouterClient

    if args.mode == "pinned" and not args.tier:
        print("tiermesh chat: --mode pinned needs --tier small|medium|large", file=sys.stderr)
        return 2
    started = time.perf_counter()
    options = {
        "mode": args.mode,
        "tier": args.tier or "",
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "timeout": args.timeout,
    }
    telemetry = setup_telemetry("tiermesh-cli")
    try:
        with RouterClient(args.router) as client:
            events = client.chat_stream(args.prompt, **options)
            if args.json:
                return print_json_events(events, started)
            return show_live(events)
    finally:
        telemetry.shutdown()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiermesh", description="Hybrid and progressive LLM inference over a gRPC mesh."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="start the tiers and the router on this machine")
    run.add_argument("--no-demo", action="store_true", help="skip the demo chat after start-up")
    run.add_argument("--demo-prompt", default=DEMO_PROMPT, help="prompt of the demo chat")
    run.add_argument(
        "--model", action="append", default=[], metavar="TIER=PATH", help="override a model"
    )
    run.add_argument("--device", help="device for every tier (cpu, cuda, cuda:N)")
    run.add_argument(
        "--base-port",
        type=int,
        help="router on BASE, tiers on BASE+10..12 (default: router 50051, tiers 50061-50063)",
    )
    run.add_argument(
        "--mesh",
        action="store_true",
        help="also start the xDS control plane; the router reaches tiers via xds:///tier-NAME",
    )
    run.set_defaults(func=cmd_run)

    chat = commands.add_parser("chat", help="one chat through the router")
    chat.add_argument("prompt", help="the user's message")
    chat.add_argument("--mode", choices=("routed", "progressive", "pinned"), default="routed")
    chat.add_argument("--tier", choices=TIER_NAMES, help="the tier for --mode pinned")
    chat.add_argument("--json", action="store_true", help="one JSON object per event per line")
    chat.add_argument("--router", default=env.router_address(), help="router address")
    chat.add_argument("--max-tokens", type=int, help="most tokens per revision")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    chat.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    chat.set_defaults(func=cmd_chat)

    for module in COMMAND_MODULES:
        importlib.import_module(module).register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
