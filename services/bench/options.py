"""Argument types shared by the `tiermesh bench` command modules (services.bench.cli and
services.bench.hybrid_cli), kept here so that neither has to import the other."""

from __future__ import annotations

import argparse


def concurrency_levels(value: str) -> list[int]:
    """`1,4,16,64` as [1, 4, 16, 64]; every level at least 1."""
    try:
        levels = [int(v) for v in value.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers like 1,4,16,64, got {value!r}"
        ) from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be >= 1")
    return levels
