"""`tiermesh chaos`'s report: one JSON object (a contract: fields are only ever added) and its
tables. The object's core is

    {"faults": [{"kind", "target", "at_s", "recovered_ms", ...}],
     "requests": {"sent", "completed", "failed": {status: n}},
     "tokens": {"lost", "duplicated", ...}, "availability", "step_downs": {"large->medium": n},
     "memory": {service: rss_peak_bytes}}

`requests` and `availability` count the scenario's own load; an overload burst's extra
requests are counted in its fault's entry. Knows the run's records; nothing of how they were made.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from services.bench.loadgen import RequestRecord
from services.chaos.checks import TokenAccount
from services.chaos.injector import FaultRecord
from services.chaos.loop_lag import LoopLag
from services.chaos.memory import MemoryWatch
from services.chaos.recording import StreamTrace
from services.common.percentiles import percentile

OK = "OK"


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _trace_of(record: RequestRecord, traces: Mapping[str, StreamTrace]) -> StreamTrace | None:
    """What the request streamed, by the request id the load generator gave it."""
    return traces.get(f"bench-chaos-{record.index}")


def _routed_around(
    records: Sequence[RequestRecord], traces: Mapping[str, StreamTrace], fault: FaultRecord
) -> dict[str, Any]:
    """How long after the fault chats were still sent to what it hit: the latest send time,
    between the fault and its recovery, of a chat whose Final.reason names a failed call to it
    (`routed_around_ms`, 0 when none was), and how many such chats there were."""
    if not fault.reason_markers:
        return {}
    hit = []
    example = ""
    for record in records:
        trace = _trace_of(record, traces)
        if trace is None or trace.final is None:
            continue
        if not fault.at_s <= record.sent_at_s <= fault.window_end_s():  # later: a later fault's
            continue
        if any(marker in trace.final.reason for marker in fault.reason_markers):
            hit.append(record.sent_at_s - fault.at_s)
            if record.sent_at_s - fault.at_s >= max(hit):
                example = trace.final.reason[:300]
    return {
        "routed_around_ms": round(max(hit, default=0.0) * 1000, 1),
        "sent_to_it_after": len(hit),
        "sent_to_it_last_reason": example,  # the Final.reason of the latest of them
    }


def _during(records: Sequence[RequestRecord], fault: FaultRecord) -> dict[str, Any]:
    """The scenario's requests in flight at some point of the fault's window, by outcome."""
    start, end = fault.at_s, fault.window_end_s()
    overlapping = [
        r
        for r in records
        if r.sent_at_s <= end and (r.finished_at_s is None or r.finished_at_s >= start)
    ]
    failed = Counter(r.status for r in overlapping if r.status != OK)
    return {"in_flight_during": len(overlapping), "failed_during": dict(failed)}


def build_report(
    run: dict[str, Any],
    records: Sequence[RequestRecord],
    faults: Sequence[FaultRecord],
    account: TokenAccount,
    traces: Mapping[str, StreamTrace],
    memory: MemoryWatch,
    lag: LoopLag | None = None,
) -> dict[str, Any]:
    """`lag`: the chaos client's own event-loop lag, reported over each fault's window and the
    whole run (`client_loop_lag_ms`): the part of a latency measured there that is the client's."""
    lag = lag or LoopLag()
    completed = sum(1 for r in records if r.status == OK)
    failed = Counter(r.status for r in records if r.status != OK)
    ttfts = [r.ttft_s * 1000 for r in records if r.status == OK and r.ttft_s is not None]
    failovers = [f for trace in traces.values() for f in trace.failovers()]
    gaps = [f.gap_s * 1000 for f in failovers]
    told = [f.told_s * 1000 for f in failovers if f.told_s is not None]
    broken = [f.broken_tokens for f in failovers]
    per_token = [f.gap_s * 1000 / f.broken_tokens for f in failovers if f.broken_tokens]
    continued = [gap * 1000 for trace in traces.values() for gap in trace.continuation_gaps_s()]
    every_gap = gaps + continued
    return {
        "faults": [
            {
                "kind": f.kind,
                "target": f.target,
                "at_s": f.at_s,
                "recovered_ms": f.recovered_ms,
                **_during(records, f),
                **_routed_around(records, traces, f),
                **f.detail,
                "client_loop_lag_ms": lag.summary_ms(f.at_s, f.window_end_s()),
            }
            for f in faults
        ],
        "requests": {
            "sent": len(records),
            "completed": completed,
            "failed": dict(failed),
            "ttft_ms_p50": _ms(percentile(ttfts, 0.50)),  # the load's own, faults included
            "ttft_ms_p99": _ms(percentile(ttfts, 0.99)),
        },
        # chats overload moved off the tier their policy chose (RouteDecision.stepped_from), by
        # "from->to": served by a smaller (or larger) tier rather than refused
        "step_downs": dict(
            sorted(Counter(t.step_down for t in traces.values() if t.step_down).items())
        ),
        "failure_examples": _failure_examples(records),
        "failure_paths": _failure_paths(records, traces),
        "tokens": account.to_json(),
        "availability": round(completed / len(records), 5) if records else None,
        "memory": dict(memory.peak),
        "memory_detail": {
            name: {"first": memory.first.get(name), "last": memory.last.get(name), "peak": peak}
            for name, peak in memory.peak.items()
        },
        "failover": {
            "count": len(gaps),
            "gap_ms_p50": _ms(percentile(gaps, 0.50)),
            "gap_ms_p99": _ms(percentile(gaps, 0.99)),
            "gap_ms_max": _ms(max(gaps, default=None)),
            "told_ms_p50": _ms(percentile(told, 0.50)),  # the part until RevisionEnd(error)
            "told_ms_p99": _ms(percentile(told, 0.99)),
            # tokens the broken revision had streamed: the replacing one starts over and
            # streams them again before its first delta; and the gap per such token
            "broken_tokens_p50": percentile(broken, 0.50),
            "broken_tokens_p99": percentile(broken, 0.99),
            "gap_ms_per_broken_token_p50": _ms(percentile(per_token, 0.50)),
            # breaks continued in the same revision by another replica (no new revision): the
            # longest pause between that revision's deltas, one per break
            "continued_count": len(continued),
            "continued_gap_ms_p50": _ms(percentile(continued, 0.50)),
            "continued_gap_ms_p99": _ms(percentile(continued, 0.99)),
            "continued_gap_ms_max": _ms(max(continued, default=None)),
            "slowest_continued": slowest_continued(records, traces),
            # both kinds together: every break an answer went on from
            "all_gap_ms_p50": _ms(percentile(every_gap, 0.50)),
            "all_gap_ms_p99": _ms(percentile(every_gap, 0.99)),
        },
        "client_loop_lag_ms": lag.summary_ms(),
        "run": run,
    }


def _failure_examples(records: Sequence[RequestRecord]) -> dict[str, str]:
    """The first error message seen per failed status."""
    examples: dict[str, str] = {}
    for record in records:
        if record.status != OK:
            examples.setdefault(record.status, record.error[:300])
    return examples


FAILURE_PATHS = 12  # the most frequent paths reported


def failure_path(record: RequestRecord, trace: StreamTrace | None) -> str:
    """How a failed chat went, as the client saw it: each revision's tier, whether it streamed
    tokens (`>0` or `0`) and `!` when it broke, then the status and the tier the error names,
    e.g. `small >0! > medium 0! | UNAVAILABLE tier medium`. No counts, so paths group."""
    revisions = [trace.revisions[n] for n in sorted(trace.revisions)] if trace else []
    steps = [
        f"{r.tier or '?'} {'>0' if r.token_ids else '0'}{'!' if r.finish_reason == 'error' else ''}"
        for r in revisions
    ]
    named = re.match(r"(tier \S+?):", record.error)
    where = f" {named.group(1)}" if named else ""
    return f"{' > '.join(steps) or 'no revision'} | {record.status}{where}"


SLOWEST_SHOWN = 5


def slowest_continued(
    records: Sequence[RequestRecord], traces: Mapping[str, StreamTrace]
) -> list[dict[str, Any]]:
    """The breaks continued in the same revision with the longest gaps, longest first: when the
    chat was sent (seconds into the run, to set beside the faults' `at_s`), the gap and the
    chat's Final.reason (what broke and where it went on)."""
    found = []
    for record in records:
        trace = _trace_of(record, traces)
        if trace is None or trace.final is None:
            continue
        for gap in trace.continuation_gaps_s():
            found.append((gap, record.sent_at_s, trace.final.reason))
    found.sort(key=lambda item: item[0], reverse=True)
    return [
        {"sent_at_s": round(sent_at, 3), "gap_ms": _ms(gap * 1000), "reason": reason[:400]}
        for gap, sent_at, reason in found[:SLOWEST_SHOWN]
    ]


def _failure_paths(
    records: Sequence[RequestRecord], traces: Mapping[str, StreamTrace]
) -> dict[str, int]:
    """The most frequent failure paths (failure_path) and how many chats took each."""
    paths = Counter(
        failure_path(record, _trace_of(record, traces)) for record in records if record.status != OK
    )
    return dict(paths.most_common(FAILURE_PATHS))


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _slow_connections_detail(fault: Mapping[str, Any]) -> str:
    attack, fds, probes = fault["attack"], fault["descriptors"], fault["probes"]
    kept, fresh = probes["kept"], probes["fresh"]
    return (
        f"{attack['asked']} {attack['kind']} connections ({attack['opened']} opened): "
        f"{attack['refused_fast']} refused within 1 s, {attack['closed_by_server']} closed by "
        f"it in all; its descriptors {fds['before']} -> peak {fds['peak']} -> {fds['after']} "
        f"(limit {fds['soft_limit']}); probes over a kept connection: {kept['answered']} of "
        f"{kept['sent']} answered, first token p99 {kept['ttft_ms_p99']} ms "
        f"({kept.get('ttft_p99_vs_unloaded')}x unloaded); over new connections: "
        f"{fresh['answered']} of {fresh['sent']}; 'Too many open files' in its log: "
        f"{fault['descriptor_exhaustion_in_log']}"
    )


def _fault_detail(fault: Mapping[str, Any]) -> str:
    if "attack" in fault:
        return _slow_connections_detail(fault)
    if "requests" in fault and isinstance(fault["requests"], dict) and "sent" in fault["requests"]:
        statuses = ", ".join(f"{k} {v}" for k, v in fault["requests"]["statuses"].items())
        return f"burst: {statuses}; refusals p99 {fault.get('refusal_ms_p99')} ms"
    if "requests" in fault:
        return "; ".join(f"{k}: {v}" for k, v in fault["requests"].items())
    if "streams" in fault:
        return f"{fault['streams']} streams never read"
    if "processes" in fault:
        mid = " mid-stream" if fault.get("streaming") else ""
        around = fault.get("routed_around_ms")
        after = "" if around is None else f"; new chats sent to it for {around:.0f} ms"
        restart = fault.get("restarted_ms")
        back = "" if restart is None else f"; restarted after {restart:.0f} ms"
        return f"{', '.join(fault['processes'])}{mid}{after}{back}"
    return ""


def print_report(report: Mapping[str, Any], console: Console) -> None:
    """The faults table, the requests and tokens summary, and the memory table."""
    faults = Table(title="faults")
    for column in ("kind", "target", "at s", "recovered ms", "in flight", "failed", "detail"):
        faults.add_column(column)
    for fault in report["faults"]:
        failed = ", ".join(f"{k} {v}" for k, v in fault["failed_during"].items()) or "0"
        recovered = fault["recovered_ms"]
        faults.add_row(
            fault["kind"],
            fault["target"],
            f"{fault['at_s']:.1f}",
            "not recovered" if recovered is None else f"{recovered:.0f}",
            str(fault["in_flight_during"]),
            failed,
            _fault_detail(fault),
        )
    console.print(faults)
    requests, tokens, failover = report["requests"], report["tokens"], report["failover"]
    failed = ", ".join(f"{k} {v}" for k, v in requests["failed"].items()) or "none"
    console.print(
        f"requests: sent {requests['sent']}, completed {requests['completed']}, failed {failed}; "
        f"availability {report['availability']}; first token p50 {requests['ttft_ms_p50']} ms, "
        f"p99 {requests['ttft_ms_p99']} ms"
    )
    steps = ", ".join(f"{k} {v}" for k, v in report.get("step_downs", {}).items()) or "none"
    console.print(f"step-downs (overload moved a chat to another tier): {steps}")
    console.print(
        f"tokens: lost {tokens['lost']}, duplicated {tokens['duplicated']} over "
        f"{tokens['checked_requests']} greedy answers compared with an unfaulted reference "
        f"({tokens['unchecked_requests']} unchecked); final text != its deltas: "
        f"{tokens['text_mismatches']}"
    )
    console.print(
        f"failover: {failover['count']} broken revisions continued; gap from the last token "
        f"before to the first after: p50 {failover['gap_ms_p50']} ms, p99 "
        f"{failover['gap_ms_p99']} ms (of which until the broken revision's end: p50 "
        f"{failover['told_ms_p50']} ms, p99 {failover['told_ms_p99']} ms)"
    )
    console.print(
        f"continued in the same revision: {failover['continued_count']} breaks; longest pause "
        f"p50 {failover['continued_gap_ms_p50']} ms, p99 {failover['continued_gap_ms_p99']} ms; "
        f"every break: p99 {failover['all_gap_ms_p99']} ms"
    )
    lag = report["client_loop_lag_ms"]
    console.print(
        f"this client's own event-loop lag (in every latency above): p50 {lag['p50']} ms, "
        f"p99 {lag['p99']} ms, max {lag['max']} ms"
    )
    memory = Table(title="memory (RSS MiB)")
    for column in ("service", "first", "last", "peak"):
        memory.add_column(column)
    for name, row in report["memory_detail"].items():
        memory.add_row(name, _mib(row["first"]), _mib(row["last"]), _mib(row["peak"]))
    console.print(memory)
