"""The one percentile rule of the project: nearest rank, over plain numbers.

Used by the tiers' recent-TTFT window, the benchmarks and the measurement scripts, so a p99 means
the same everywhere. Pure Python; knows nothing of what the numbers measure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank q-quantile (q in [0, 1]) of values; None when there are none.

    The value at rank ceil(q * n) (at least 1) of the n values in ascending order: always one
    of the values, never an interpolation. q = 0 gives the smallest, q = 1 the largest.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: must be in [0, 1], got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]
