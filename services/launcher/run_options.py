"""The command-line values a local mesh is planned from, parsed once for every command that
starts one (`tiermesh run`, `tiermesh chaos`): `--model TIER=PATH`, `--replicas TIER=N,...`
and the tiers' CPU priority.

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


def model_overrides(values: list[str]) -> dict[str, Path]:
    """`["small=PATH", ...]` as {tier: folder}; exits with a message on a bad value."""
    models = {}
    for value in values:
        tier, _, path = value.partition("=")
        if tier not in TIER_NAMES or not path:
            raise SystemExit(f"tiermesh: --model expects TIER=PATH with TIER in {TIER_NAMES}")
        models[tier] = Path(path)
    return models


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
