"""`tiermesh run` and `tiermesh chat`: the whole mesh on this machine, and one chat through it
(with no PROMPT, a conversation: interactive_chat.py)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tiermesh.client.requests import MODES

from services.cli.client_flags import add_client_security_flags
from services.common import env
from services.common.config import GATES, POLICIES
from services.common.cpu_priority import nice_level
from services.common.parent_watch import stop_with_parent
from services.common.tiers import TIER_NAMES
from services.common.validation import MAX_TOP_LOGPROBS
from services.launcher.run_options import (
    TIER_NICE,
    add_connection_limit_flags,
    connection_limit_flags,
    engine_option,
    model_overrides,
    remote_models,
    replica_counts,
    tier_engines,
    vllm_tiers,
)

DEMO_PROMPT = "What is your return policy?"


def cmd_run(args: argparse.Namespace) -> int:
    from services.launcher.echo_tiers import EchoSettings
    from services.launcher.local_mesh import run_mesh

    stop_with_parent()  # started by a harness: stop (and stop the mesh) when it dies
    echo = None
    every_tier, remote_tiers = tier_engines(args.engine)
    if every_tier == "echo":
        echo = EchoSettings(ttft_ms=args.echo_ttft_ms, tokens_per_s=args.echo_tokens_per_s)

    return run_mesh(
        base_port=args.base_port,
        models=model_overrides(args.model, remote=True),
        device=args.device,
        demo_prompt=None if args.no_demo else args.demo_prompt,
        mesh=args.mesh,
        secure=args.secure,
        http_port=args.http_port,
        replicas=replica_counts(args.replicas) if args.replicas else None,
        echo=echo,
        tier_nice=args.tier_nice,
        cors_origins=tuple(args.cors_origin),
        remotes=remote_models(args.model, remote_tiers),
        limits=connection_limit_flags(args),
        vllm=vllm_tiers(args.engine),
        router_args=_router_args(args),
    )


def _router_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The router's command-line overrides `tiermesh run` was given."""
    flags = (("--policy", args.policy), ("--progressive-gate", args.progressive_gate))
    return tuple(arg for flag, value in flags if value for arg in (flag, value))


def cmd_chat(args: argparse.Namespace) -> int:
    from tiermesh.client import RouterClient, tls_credentials

    from services.cli.interactive_chat import run_conversation
    from services.common.telemetry import setup_telemetry
    from services.terminal.chat_view import print_json_events, show_live

    if args.mode == "pinned" and not args.tier:
        print("tiermesh chat: --mode pinned needs --tier small|medium|large", file=sys.stderr)
        return 2
    started = time.perf_counter()
    options = {
        "mode": args.mode,
        "tier": args.tier or "",
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stop": tuple(args.stop),
        "top_logprobs": args.top_logprobs,
        "priority": args.priority,
        "progressive_gate": args.progressive_gate or "",
        "timeout": args.timeout,
    }
    telemetry = setup_telemetry("tiermesh-cli")
    try:
        credentials = None
        if args.ca:
            credentials = tls_credentials(args.ca, args.cert, args.key)
        elif args.cert or args.key:
            print("tiermesh chat: --cert and --key need --ca", file=sys.stderr)
            return 2
        with RouterClient(args.router, credentials=credentials, api_key=args.api_key) as client:
            if args.prompt is None:
                return run_conversation(client, options, json_lines=args.json)
            events = client.chat_stream(args.prompt, **options)
            if args.json:
                return print_json_events(events, started)
            return show_live(events)
    finally:
        telemetry.shutdown()


def register_run(commands: Any) -> None:
    run = commands.add_parser("run", help="start the tiers and the router on this machine")
    run.add_argument("--no-demo", action="store_true", help="skip the demo chat after start-up")
    run.add_argument("--demo-prompt", default=DEMO_PROMPT, help="prompt of the demo chat")
    run.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="TIER=PATH|URL",
        help="override a tier's model folder; or http(s)://HOST:PORT/v1 (several: comma "
        "separated, one tier process each): a remote OpenAI-compatible server",
    )
    run.add_argument("--device", help="device for every tier (cpu, cuda, cuda:N)")
    run.add_argument(
        "--policy", choices=POLICIES, help="the router's routing policy (default: its config's)"
    )
    run.add_argument(
        "--progressive-gate",
        choices=GATES,
        help="the router's progressive gate (default: its config's, escalate): always refines "
        "every draft; escalate sends an answer on to a larger tier only when it is unsure",
    )
    run.add_argument(
        "--base-port",
        type=int,
        help="router on BASE, tiers on BASE+10..12 (default: router 50051, tiers 50061-50063)",
    )
    run.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (https://app.example, or *) the gateway serves cross-origin; "
        "repeat for more (default: same origin only)",
    )
    run.add_argument(
        "--http-port",
        type=int,
        help="HTTP gateway (OpenAI API, chat page) port; default 8080, or BASE+40 with --base-port",
    )
    run.add_argument(
        "--mesh",
        action="store_true",
        help="also start the xDS control plane; the router reaches tiers via xds:///tier-NAME",
    )
    run.add_argument(
        "--secure",
        action="store_true",
        help="TLS everywhere, mTLS router -> tiers, API keys at the router (certs in "
        "<run dir>/certs, keys in <run dir>/keys.json)",
    )
    run.add_argument(
        "--replicas",
        metavar="TIER=N[,TIER=N]",
        help="run N processes of a tier (e.g. small=2); the router balances over them by load",
    )
    run.add_argument(
        "--engine",
        action="append",
        type=engine_option,
        default=[],
        metavar="model|echo|TIER=openai",
        help="echo: tiers with no model that stream a deterministic answer at a set TTFT and "
        "token rate (load tests of the mesh); model: each tier's configured engine (default); "
        "TIER=openai: that tier is the remote server its --model TIER=URL names",
    )
    run.add_argument("--echo-ttft-ms", type=float, default=10.0, help="echo tiers' TTFT")
    run.add_argument(
        "--echo-tokens-per-s", type=float, default=100.0, help="echo tiers' tokens/s per stream"
    )
    run.add_argument(
        "--tier-nice",
        type=nice_level,
        default=TIER_NICE,
        metavar="N",
        help=f"run the tiers N nice levels below the router and gateway (default {TIER_NICE}; "
        "0: the same priority), so decode loops never delay routing on a shared machine",
    )
    add_connection_limit_flags(run)
    run.set_defaults(func=cmd_run)


def register_chat(commands: Any) -> None:
    chat = commands.add_parser("chat", help="one chat through the router, or a conversation")
    chat.add_argument(
        "prompt",
        nargs="?",
        help="the user's message; without it, a conversation: one question per line (from the "
        "terminal or stdin), /help for its commands",
    )
    chat.add_argument("--mode", choices=tuple(MODES), default="routed")
    chat.add_argument("--tier", choices=TIER_NAMES, help="the tier for --mode pinned")
    chat.add_argument("--json", action="store_true", help="one JSON object per event per line")
    chat.add_argument("--router", default=env.router_address(), help="router address")
    chat.add_argument("--max-tokens", type=int, help="most tokens per revision")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    chat.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="a stop sequence: the answer ends just before it (repeat for up to 4)",
    )
    chat.add_argument(
        "--top-logprobs",
        type=_top_logprobs,
        metavar="K",
        help="each token's log-probability and the K (0-20) likeliest at its step, on the "
        "--json delta lines (token_logprobs)",
    )
    chat.add_argument(
        "--priority",
        choices=("interactive", "batch", "critical"),
        default="interactive",
        help="who goes first under overload: interactive steps down to a smaller tier, batch "
        "keeps its tier or is refused first, critical keeps its tier",
    )
    chat.add_argument(
        "--progressive-gate",
        choices=GATES,
        help="--mode progressive: always (every draft refined), race, cascade or escalate "
        "(default: the router's, escalate)",
    )
    chat.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    add_client_security_flags(chat, "the router")
    chat.set_defaults(func=cmd_chat)


def _top_logprobs(value: str) -> int:
    try:
        k = int(value)
    except ValueError:
        k = -1
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    return k
