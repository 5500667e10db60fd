"""What `tiermesh bench engine --engine ...` runs and how it compares: the engines it knows, the
seeded requests every engine gets (the same prompts, in the same bursts), whether an engine's
greedy token ids equal `generate`'s, and the ratios the report carries.

Pure functions over plain values: no torch, no processes, no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# torch: tiermesh's engine; vllm: tiermesh's vllm engine (vLLM's AsyncLLM) in-process, each in a
# child process of its own; vllm-tier: a tier on vLLM over gRPC; vllm-server: vLLM's own OpenAI
# server over HTTP (the last two compare a tier with the server it stands in for)
ENGINES = ("torch", "vllm", "vllm-tier", "vllm-server")
VLLM_ENGINES = frozenset({"vllm", "vllm-tier", "vllm-server"})


def parse_engines(value: str) -> list[str]:
    """`torch,vllm` as ["torch", "vllm"], in ENGINES' order, each once; raises ValueError naming
    an unknown one."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown or not names:
        raise ValueError(
            f"unknown engine {', '.join(unknown) or repr(value)}: expected a comma-separated "
            f"list of {', '.join(ENGINES)}"
        )
    return [e for e in ENGINES if e in names]


@dataclass(frozen=True)
class LevelPlan:
    """One concurrency level: its bursts of prompts (the first is the untimed warm-up) and the
    burst whose greedy outputs are checked against `generate` (the first timed one)."""

    concurrency: int
    bursts: list[list[str]]

    @property
    def checked(self) -> list[str]:
        return self.bursts[1]

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "bursts": self.bursts}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LevelPlan:
        return cls(int(data["concurrency"]), [list(b) for b in data["bursts"]])


def plan_levels(
    prompts: Sequence[str], levels: Sequence[int], rounds: int, seed: int
) -> list[LevelPlan]:
    """Each level gets 1 + `rounds` bursts of `concurrency` prompts, drawn in a seeded order from
    the distinct `prompts`, none used twice while any is left (so an engine's prefix cache gains
    only what prompts share, such as the chat template's system turn); then they repeat."""
    distinct = list(dict.fromkeys(prompts))
    if not distinct:
        raise ValueError("no prompts to plan with")
    random.Random(seed).shuffle(distinct)
    drawn = 0

    def take(n: int) -> list[str]:
        nonlocal drawn
        out = [distinct[(drawn + i) % len(distinct)] for i in range(n)]
        drawn += n
        return out

    return [LevelPlan(c, [take(c) for _ in range(1 + rounds)]) for c in levels]


def answer_ids(ids: Sequence[int], eos: Iterable[int]) -> list[int]:
    """The ids up to the first end-of-sequence id, without it (engines differ in whether they
    return the id they stopped at)."""
    stops = frozenset(eos)
    out: list[int] = []
    for token in ids:
        if token in stops:
            break
        out.append(token)
    return out


def streams_matching(
    outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]], eos: Iterable[int]
) -> int:
    """How many streams' greedy ids equal the reference's for the same prompt (same order)."""
    stops = frozenset(eos)
    return sum(
        answer_ids(out, stops) == answer_ids(ref, stops)
        for out, ref in zip(outputs, reference, strict=True)
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def engine_ratios(rows: Sequence[Mapping[str, Any]], levels: Sequence[int]) -> dict[str, float]:
    """Ratios per level, where both rows ran: torch over vllm in tokens/s and in TTFT p99 (the
    targets: >= 1 and <= 1), and a tier on vLLM over vLLM's own server in tokens/s."""
    by = {(r["engine"], r["concurrency"]): r for r in rows}
    pairs = {
        "torch_vs_vllm_tokens_per_s": ("torch", "vllm", "tokens_per_s"),
        "torch_vs_vllm_ttft_p99": ("torch", "vllm", "ttft_ms_p99"),
        "tier_vs_vllm_server_tokens_per_s": ("vllm-tier", "vllm-server", "tokens_per_s"),
    }
    out: dict[str, float] = {}
    for level in levels:
        for name, (a, b, field) in pairs.items():
            ra, rb = by.get((a, level)), by.get((b, level))
            value = _ratio(ra[field], rb[field]) if ra and rb else None
            if value is not None:
                out[f"{name}_at_{level}"] = value
    return out
