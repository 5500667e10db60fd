"""The numbers of `tiermesh bench --scenario overload`, from request records: per priority (and
per API key, with its share of the offered rate) the share answered and stepped down, quality
against the same requests answered unloaded and TTFT; the time to a refusal; step-downs by tier;
and the team's targets, met or not.

Pure arithmetic over RequestRecords (loadgen.py) with the workload's scorer; nothing of gRPC,
processes or the mesh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.bench.loadgen import RequestRecord
from services.bench.metrics import latency, percentile
from services.workload import WorkloadItem, score

PRIORITY_NAMES = ("interactive", "batch", "critical")
REFUSED = "RESOURCE_EXHAUSTED"

# the goal overload is measured against
TARGET_INTERACTIVE_ANSWERED = 0.99  # share of interactive chats answered...
TARGET_QUALITY_VS_UNLOADED = 0.9  # ...with quality at least this much of unloaded
TARGET_CRITICAL_TTFT_P99_X = 2.0  # critical TTFT p99 at most this many times unloaded
TARGET_REFUSAL_P99_MS = 50.0  # a refusal comes back within this
TARGET_SLOWER_KEY_ANSWERED = 0.99  # the key sending the least, beside a faster one: answered


def ms_percentiles(seconds: Iterable[float | None]) -> dict[str, float | None]:
    """p50 and p99 in milliseconds of the values present (None when there are none)."""
    present = [s * 1000 for s in seconds if s is not None]
    p50, p99 = percentile(present, 0.50), percentile(present, 0.99)
    return {
        "p50": None if p50 is None else round(p50, 2),
        "p99": None if p99 is None else round(p99, 2),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def step_downs(records: Iterable[RequestRecord]) -> dict[str, int]:
    """How many chats overload moved, as {"large->medium": n, ...}: from the route decision's
    stepped_from to the tier it routed to instead."""
    moves = Counter(
        f"{r.stepped_from}->{r.routed_tier}" for r in records if r.stepped_from and r.routed_tier
    )
    return dict(sorted(moves.items()))


def refusal_seconds(records: Iterable[RequestRecord]) -> list[float]:
    """Seconds from sending to RESOURCE_EXHAUSTED, per refused chat."""
    return [
        r.finished_at_s - r.sent_at_s
        for r in records
        if r.status == REFUSED and r.finished_at_s is not None
    ]


def quality_vs_unloaded(
    loaded: Sequence[RequestRecord],
    unloaded: Mapping[int, RequestRecord],
    items: Mapping[str, WorkloadItem],
) -> tuple[float | None, int]:
    """The scorer's accuracy of the loaded answers over the accuracy of the same requests
    (same index of the same sequence) answered unloaded, over the loaded chats answered whose
    request was answered unloaded too; and how many those are. None when unloaded got none
    right (or none match)."""
    matched = [r for r in loaded if r.ok and r.index in unloaded and unloaded[r.index].ok]
    loaded_right = sum(score(items[r.item_id], r.text) for r in matched)
    unloaded_right = sum(score(items[r.item_id], unloaded[r.index].text) for r in matched)
    if not unloaded_right:
        return None, len(matched)
    return round(loaded_right / unloaded_right, 4), len(matched)


def router_ttft_seconds(records: Iterable[RequestRecord]) -> list[float | None]:
    """Each answered chat's time to first token as the router measured it (Final's timings:
    from the router receiving the chat to its first delta), in seconds; what the client adds
    on top is its own and the network's."""
    return [r.server_timings["ttft_ms"] / 1000 for r in records if "ttft_ms" in r.server_timings]


def chats_summary(
    records: Sequence[RequestRecord],
    unloaded: Mapping[int, RequestRecord],
    items: Mapping[str, WorkloadItem],
) -> dict[str, Any]:
    """One group's numbers (a priority's chats, or a key's): sent, answered and stepped-down
    shares (of sent), quality against unloaded and TTFT of the answered, refusals by reason."""
    answered = [r for r in records if r.ok]
    quality, matched = quality_vs_unloaded(records, unloaded, items)
    refused = Counter(r.error_reason or "-" for r in records if r.status == REFUSED)
    return {
        "sent": len(records),
        "answered_share": _share(len(answered), len(records)),
        "stepped_down_share": _share(sum(1 for r in records if r.stepped_from), len(records)),
        "quality_vs_unloaded": quality,
        "quality_matched": matched,
        "ttft_ms": ms_percentiles(r.ttft_s for r in answered),
        "router_ttft_ms": ms_percentiles(router_ttft_seconds(answered)),
        "refused": dict(sorted(refused.items())),
        "errors": dict(sorted(Counter(r.status for r in records if not r.ok).items())),
    }


def overload_summary(
    records: Sequence[RequestRecord],
    unloaded: Sequence[RequestRecord],
    items: Mapping[str, WorkloadItem],
    key_rates: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Per priority, refusal times, step-downs and the unloaded pass's own numbers; with
    `key_rates` (each API key's share of the offered rate, by name) per_key_share, else None."""
    by_index = {r.index: r for r in unloaded}
    per_priority = {
        p: chats_summary([r for r in records if r.priority == p], by_index, items)
        for p in PRIORITY_NAMES
    }
    per_key = None
    if key_rates:
        per_key = {
            key: {
                "rate_share": round(rate, 4),
                **chats_summary([r for r in records if r.api_key == key], by_index, items),
            }
            for key, rate in key_rates.items()
        }
    answered = [r for r in unloaded if r.ok]
    return {
        **per_priority,
        "refusal_ms": ms_percentiles(refusal_seconds(records)),
        "refusals": len(refusal_seconds(records)),
        "step_downs": step_downs(records),
        "unloaded": {
            "sent": len(unloaded),
            "answered": len(answered),
            "ttft_ms": latency(unloaded)["ttft_ms"],
            "router_ttft_ms": ms_percentiles(router_ttft_seconds(answered)),
        },
        "per_key_share": per_key,
    }


def slower_key(per_key: Mapping[str, Any] | None) -> str | None:
    """The key with the least share of the offered rate, when the keys' shares differ (None
    with no keys, one key, or equal shares)."""
    if not per_key or len({row["rate_share"] for row in per_key.values()}) < 2:
        return None
    return min(per_key, key=lambda key: per_key[key]["rate_share"])


def targets(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The goal's targets from an overload_summary: each {value, target, met} (met None when
    the run measured nothing to judge it by)."""
    interactive, critical = summary["interactive"], summary["critical"]
    unloaded_p99 = summary["unloaded"]["ttft_ms"]["p99"]
    critical_p99 = critical["ttft_ms"]["p99"]
    critical_x = round(critical_p99 / unloaded_p99, 3) if critical_p99 and unloaded_p99 else None
    refusal_p99 = summary["refusal_ms"]["p99"]
    per_key = summary.get("per_key_share")
    slower = slower_key(per_key)
    slower_share = per_key[slower]["answered_share"] if per_key and slower else None

    def judged(value: float | None, target: float, at_least: bool) -> dict[str, Any]:
        met = None if value is None else (value >= target if at_least else value <= target)
        return {"value": value, "target": target, "met": met}

    return {
        "interactive_answered_share": judged(
            interactive["answered_share"], TARGET_INTERACTIVE_ANSWERED, True
        ),
        "interactive_quality_vs_unloaded": judged(
            interactive["quality_vs_unloaded"], TARGET_QUALITY_VS_UNLOADED, True
        ),
        "critical_ttft_p99_x_unloaded": judged(critical_x, TARGET_CRITICAL_TTFT_P99_X, False),
        # no refusal at all meets it
        "refusal_p99_ms": judged(refusal_p99 or 0.0, TARGET_REFUSAL_P99_MS, False),
        # fairness: measured only with keys at different rates
        "slower_key_answered_share": judged(slower_share, TARGET_SLOWER_KEY_ANSWERED, True),
    }


def table_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """Rows of the table, one per priority and then one per API key (with its share of the
    offered rate): chats, sent, answered, stepped down, quality vs unloaded, TTFT p50 / p99 ms."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    groups = [(p, report[p]) for p in PRIORITY_NAMES]
    per_key = report.get("per_key_share") or {}
    groups += [(f"{k} ({row['rate_share']:.1%} of rate)", row) for k, row in per_key.items()]
    rows = []
    for name, row in groups:
        rows.append(
            [
                name,
                str(row["sent"]),
                pct(row["answered_share"]),
                pct(row["stepped_down_share"]),
                f"{num(row['quality_vs_unloaded'], '.3f')} (n={row['quality_matched']})",
                f"{num(row['ttft_ms']['p50'], '.0f')} / {num(row['ttft_ms']['p99'], '.0f')}",
            ]
        )
    return rows
