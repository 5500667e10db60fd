"""The command-line values a local mesh is planned from, parsed once for every command that
starts one (`tiermesh run`, `tiermesh chaos`): `--model TIER=PATH` (or `TIER=URL[,URL]`, a
remote OpenAI-compatible server), `--engine`, `--replicas TIER=N,...` and the tiers' CPU
priority.

Knows tier names and the option syntax; nothing of processes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from services.common.tiers import TIER_NAMES

MAX_REPLICAS = 8
# Tier processes run at a lower CPU priority than the router, gateway and control plane: on a
# machine they share, a tier's decode loop would otherwise delay the router's routing decisions,
# refusals and failovers, which take little CPU but are on every request's path. The tiers
# still get every CPU cycle nothing else wants.
TIER_NICE = 10


def nice_level(value: str) -> int:
    """`--tier-nice N`: a whole number of nice levels from 0 to 19 (argparse `type`)."""
    if not value.isdigit() or int(value) > 19:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 19, got {value!r}")
    return int(value)


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
EVERY_TIER = ("model", "echo")  # --engine values for every tier (model: each its configured)


def is_remote(model: str) -> bool:
    """Whether a --model value names a remote server rather than a folder."""
    return model.startswith(("http://", "https://"))


def engine_option(value: str) -> str:
    """`--engine model|echo|TIER=openai` (argparse `type`)."""
    tier, sep, engine = value.partition("=")
    if value in EVERY_TIER or (sep and tier in TIER_NAMES and engine == REMOTE_ENGINE):
        return value
    raise argparse.ArgumentTypeError(
        f"expected {' or '.join(EVERY_TIER)} (every tier), or TIER={REMOTE_ENGINE} with TIER "
        f"in {', '.join(TIER_NAMES)}, got {value!r}"
    )


def tier_engines(values: list[str]) -> tuple[str, set[str]]:
    """`--engine` values (each checked by engine_option) as the engine of every tier ("model"
    unless "echo" is given) and the tiers given `TIER=openai`."""
    every = "echo" if "echo" in values else "model"
    if "model" in values and every == "echo":
        raise SystemExit("tiermesh: --engine model and --engine echo exclude each other")
    return every, {value.partition("=")[0] for value in values if "=" in value}


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
