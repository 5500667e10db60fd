"""The `tiermesh` command: run the mesh, chat with it, and manage the built-in models.

tiermesh run [--mesh]             start tiers + router (+ xDS control plane), show an answer, serve
tiermesh chat [--json] [PROMPT]   one chat through the router (no PROMPT: a conversation)
tiermesh models train|eval        the built-in model family (see services/training)
tiermesh mesh serve|status|...    the xDS control plane and what points at it (see mesh/)
tiermesh chaos [--faults ...]     seeded load + scheduled faults; lost tokens counted
tiermesh top [--once --json]      every tier replica's load, live
tiermesh tier swap TIER DIR       hot swap of a tier's model (in-flight streams finish on the old)

Every sub-command is listed in COMMANDS below: a module that fails to import fails the command
line loudly instead of making its commands vanish.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from mesh import cli as mesh_cli
from services.bench import cli as bench_cli
from services.chaos import cli as chaos_cli
from services.cli import tier_command, top_command, trace_view
from services.cli.chat_command import register_chat, register_run
from services.common.extras import MissingExtra
from services.routing import cli as routing_cli
from services.security import cli as security_cli
from services.training import cli as training_cli

# Each adds its sub-commands to the parser; order is the order of `tiermesh --help`.
COMMANDS: tuple[Callable[[Any], None], ...] = (
    register_run,
    register_chat,
    trace_view.register,
    top_command.register,
    tier_command.register,
    training_cli.register,
    bench_cli.register,
    chaos_cli.register,
    routing_cli.register,
    mesh_cli.register,
    security_cli.register,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiermesh", description="Hybrid and progressive LLM inference over a gRPC mesh."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except MissingExtra as e:
        print(f"tiermesh {args.command}: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
