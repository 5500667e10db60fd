"""The command-line values a local mesh is planned from, parsed once for every command that
starts one (`tiermesh run`, `tiermesh chaos`): `--model TIER=PATH` (or `TIER=URL[,URL]`, a
remote OpenAI-compatible server), `--engine`, `--replicas TIER=N,...`, the tiers' CPU
priority and the services' connection limits (`--http-max-connections`, `--grpc-...`).

Knows tier names and the option syntax; nothing of processes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from services.common.tiers import TIER_NAMES

MAX_REPLICAS = 8
# Tier processes run at a lower CPU priority than the router, gateway and control plane: on a
# machine they share, a tier's decode loop would otherwise delay the router's routing decisions,
# refusals and failovers, which take little CPU but are on every request's path. The tiers
# still get every CPU cycle nothing else wants.
TIER_NICE = 10


def model_overrides(values: list[str], remote: bool = False) -> dict[str, Path]:
    """`["small=PATH", ...]` as {tier: folder}; exits with a message on a bad value. With
    `remote`, `TIER=URL` values are left out (remote_models reads them), else refused."""
    models = {}
    for value in values:
        tier, _, path = value.partition("=")
        if tier not in TIER_NAMES or not path:
            raise SystemExit(f"tiermesh: --model expects TIER=PATH with TIER in {TIER_NAMES}")
        if is_remote(path):
            if not remote:
                raise SystemExit(f"tiermesh: --model {value}: only tiermesh run serves a URL")
            continue
        models[tier] = Path(path)
    return models


REMOTE_ENGINE = "openai"  # the engine of a tier served by a remote OpenAI-compatible server
VLLM_ENGINE = "vllm"  # the engine of a tier served by vLLM in its own process
EVERY_TIER = ("model", "echo")  # --engine values for every tier (model: each its configured)


def is_remote(model: str) -> bool:
    """Whether a --model value names a remote server rather than a folder."""
    return model.startswith(("http://", "https://"))


def engine_option(value: str) -> str:
    """`--engine model|echo|TIER=openai|TIER=vllm` (argparse `type`)."""
    tier, sep, engine = value.partition("=")
    if value in EVERY_TIER or (
        sep and tier in TIER_NAMES and engine in (REMOTE_ENGINE, VLLM_ENGINE)
    ):
        return value
    raise argparse.ArgumentTypeError(
        f"expected {' or '.join(EVERY_TIER)} (every tier), or TIER={REMOTE_ENGINE} or "
        f"TIER={VLLM_ENGINE} with TIER in {', '.join(TIER_NAMES)}, got {value!r}"
    )


def tier_engines(values: list[str]) -> tuple[str, set[str]]:
    """`--engine` values (each checked by engine_option) as the engine of every tier ("model"
    unless "echo" is given) and the tiers given `TIER=openai`."""
    every = "echo" if "echo" in values else "model"
    if "model" in values and every == "echo":
        raise SystemExit("tiermesh: --engine model and --engine echo exclude each other")
    remote = {v.partition("=")[0] for v in values if v.partition("=")[2] == REMOTE_ENGINE}
    return every, remote


def vllm_tiers(values: list[str]) -> frozenset[str]:
    """The tiers given `--engine TIER=vllm` (each checked by engine_option)."""
    return frozenset(v.partition("=")[0] for v in values if v.partition("=")[2] == VLLM_ENGINE)


def remote_models(values: list[str], remote_tiers: set[str]) -> dict[str, tuple[str, ...]]:
    """The `--model TIER=URL[,URL...]` values as {tier: its servers' URLs} (one tier process
    each: the tier's replicas). A tier given `--engine TIER=openai` needs a URL; exits with a
    message otherwise."""
    remotes: dict[str, tuple[str, ...]] = {}
    for value in values:
        tier, _, models = value.partition("=")
        if tier in TIER_NAMES and is_remote(models):
            urls = tuple(url.strip() for url in models.split(","))
            if not all(is_remote(url) for url in urls):
                raise SystemExit(f"tiermesh: --model {value}: every server is http(s)://...")
            remotes[tier] = urls
    if missing := sorted(remote_tiers - set(remotes)):
        tier = missing[0]
        raise SystemExit(
            f"tiermesh: --engine {tier}={REMOTE_ENGINE} needs --model {tier}=http://HOST:PORT/v1"
        )
    return remotes


def replica_counts(value: str) -> dict[str, int]:
    """`small=2,large=2` as {tier: processes}; exits with a message on a bad value."""
    counts = {}
    for part in value.split(","):
        tier, _, count = part.strip().partition("=")
        if tier not in TIER_NAMES or not count.isdigit() or not 1 <= int(count) <= MAX_REPLICAS:
            expected = f"TIER=N[,TIER=N] with N in [1, {MAX_REPLICAS}]"
            raise SystemExit(f"tiermesh: --replicas expects {expected}, got {part!r}")
        counts[tier] = int(count)
    return counts


def positive_int(value: str) -> int:
    """A whole number >= 1 (argparse `type`)."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return int(value)


def positive_seconds(value: str) -> float:
    """A number of seconds > 0 (argparse `type`)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value!r}")
    return seconds


@dataclass(frozen=True)
class ConnectionLimitFlags:
    """The connection limits asked for on the command line (None: the service's default): the
    gateway's go on its command line, every gRPC server's (router, tiers, control plane) in its
    environment as TIERMESH_GRPC_* (services.common.grpc_service.ServerLimits)."""

    http_max_connections: int | None = None
    http_max_connections_per_client: int | None = None
    http_header_timeout_s: float | None = None
    grpc_max_connections: int | None = None
    grpc_handshake_timeout_s: float | None = None

    def gateway_args(self) -> list[str]:
        flags = (
            ("--max-connections", self.http_max_connections),
            ("--max-connections-per-client", self.http_max_connections_per_client),
            ("--header-timeout-s", self.http_header_timeout_s),
        )
        return [arg for flag, value in flags if value is not None for arg in (flag, str(value))]

    def environment(self) -> dict[str, str]:
        variables = (
            ("TIERMESH_GRPC_MAX_CONNECTIONS", self.grpc_max_connections),
            ("TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S", self.grpc_handshake_timeout_s),
        )
        return {name: str(value) for name, value in variables if value is not None}


def add_connection_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The connection-limit flags of `tiermesh run` and `tiermesh chaos`."""
    parser.add_argument(
        "--http-max-connections",
        type=positive_int,
        metavar="N",
        help="the HTTP gateway's open connections cap (default 4096, kept under its open "
        "files limit); past it a new connection is refused",
    )
    parser.add_argument(
        "--http-max-connections-per-client",
        type=positive_int,
        metavar="N",
        help="the HTTP gateway's open connections cap per client address (default 512)",
    )
    parser.add_argument(
        "--http-header-timeout",
        type=positive_seconds,
        metavar="S",
        help="seconds a request's headers may take to arrive at the gateway (default 10)",
    )
    parser.add_argument(
        "--grpc-max-connections",
        type=positive_int,
        metavar="N",
        help="every gRPC server's open connections cap (router, tiers, control plane; "
        "default 4096, kept under its open files limit)",
    )
    parser.add_argument(
        "--grpc-handshake-timeout",
        type=positive_seconds,
        metavar="S",
        help="seconds a gRPC client has from connecting to its HTTP/2 SETTINGS (default 5)",
    )


def connection_limit_flags(args: argparse.Namespace) -> ConnectionLimitFlags:
    return ConnectionLimitFlags(
        http_max_connections=args.http_max_connections,
        http_max_connections_per_client=args.http_max_connections_per_client,
        http_header_timeout_s=args.http_header_timeout,
        grpc_max_connections=args.grpc_max_connections,
        grpc_handshake_timeout_s=args.grpc_handshake_timeout,
    )
