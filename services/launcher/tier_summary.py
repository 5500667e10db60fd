"""What `tiermesh run`'s start table shows of one tier, from its TierStatus: the model, its
memory (weights + KV pool) and its cold start, phase by phase.

Formatting only: it asks no tier itself and knows nothing of how the tier loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tiermesh.v1 import tier_pb2

COLUMNS = ("model", "MiB: weights+KV", "to SERVING")
UNKNOWN = ("?", "?", "?")


def tier_cells(status: tier_pb2.TierStatus | None) -> tuple[str, str, str]:
    """The model, memory and cold-start cells of one tier's row (its phases go under the
    table: `startup_line`); "?" for a tier that did not answer."""
    if status is None:
        return UNKNOWN
    mib = 1024 * 1024
    weights, pool = status.weights_bytes / mib, status.kv_pool_bytes / mib
    return (
        f"{status.params / 1e6:.1f}M params",
        f"{weights:.1f} + {pool:.1f}",
        f"{status.startup_s:.1f} s" if status.startup_s else "-",
    )


def startup_line(name: str, status: tier_pb2.TierStatus | None) -> str | None:
    """ "small 14.2 s: imports 9.1, weights 0.9 (lazy), kv_pool 0.3, warm_up 1.9"; None when
    unknown."""
    if status is None or not status.startup_s:
        return None
    return f"{name} {startup_cell(status)}"


def startup_cell(status: tier_pb2.TierStatus) -> str:
    """ "14.2 s: imports 9.1, weights 0.9 (lazy), kv_pool 0.3, warm_up 1.9"; "-" when unknown."""
    if not status.startup_s:
        return "-"
    parts = []
    for phase in status.startup_phases:
        part = f"{phase.name} {phase.seconds:.1f}"
        if phase.name == "weights" and status.weights_loading:
            part += f" ({status.weights_loading})"
        parts.append(part)
    return f"{status.startup_s:.1f} s: {', '.join(parts)}" if parts else f"{status.startup_s:.1f} s"
