"""`bench engine --engine`'s decisions as tables: which engines, the seeded bursts, greedy
agreement with `generate`, the target ratios, a level's row from timed bursts, process trees."""

from __future__ import annotations

from typing import Any

import pytest

from services.bench.engine_bursts import Burst, StreamTiming, descendants, level_from_bursts
from services.bench.engine_plan import (
    answer_ids,
    engine_ratios,
    parse_engines,
    plan_levels,
    streams_matching,
)


@pytest.mark.parametrize(
    ("value", "engines"),
    [
        ("torch,vllm", ["torch", "vllm"]),
        ("vllm,torch", ["torch", "vllm"]),  # always in the same order
        ("vllm-server, vllm-tier,vllm-server", ["vllm-tier", "vllm-server"]),
        ("torch", ["torch"]),
    ],
)
def test_engines_are_parsed_in_one_order(value: str, engines: list[str]) -> None:
    assert parse_engines(value) == engines


@pytest.mark.parametrize(("value", "named"), [("torch,sglang", "sglang"), ("", "''"), (",", "','")])
def test_an_unknown_engine_is_named(value: str, named: str) -> None:
    with pytest.raises(ValueError, match=f"unknown engine {named}"):
        parse_engines(value)


def test_every_burst_gets_prompts_no_other_burst_had() -> None:
    prompts = [f"p{i}" for i in range(100)] + ["p0", "p1"]  # duplicates count once
    plans = plan_levels(prompts, [1, 4, 16], rounds=3, seed=0)
    assert [p.concurrency for p in plans] == [1, 4, 16]
    assert [[len(b) for b in p.bursts] for p in plans] == [[1] * 4, [4] * 4, [16] * 4]
    drawn = [x for p in plans for b in p.bursts for x in b]
    assert len(drawn) == len(set(drawn)) == 84
    assert plans[1].checked == plans[1].bursts[1]  # the first timed burst is checked


def test_the_plan_depends_on_the_seed_alone() -> None:
    prompts = [f"p{i}" for i in range(50)]
    assert plan_levels(prompts, [2, 8], 2, seed=3) == plan_levels(prompts, [2, 8], 2, seed=3)
    assert plan_levels(prompts, [2, 8], 2, seed=3) != plan_levels(prompts, [2, 8], 2, seed=4)


def test_prompts_repeat_only_when_all_were_used() -> None:
    plans = plan_levels(["a", "b", "c"], [2], rounds=1, seed=0)
    first, second = plans[0].bursts
    assert sorted(first + second[:1]) == ["a", "b", "c"]
    assert second[1] == first[0]


def test_a_plan_survives_json() -> None:
    plan = plan_levels(["a", "b", "c"], [2], rounds=1, seed=0)[0]
    assert type(plan).from_json(plan.to_json()) == plan


EOS = frozenset({2})


@pytest.mark.parametrize(
    ("ids", "answer"),
    [
        ([5, 6, 2], [5, 6]),  # the id it stopped at is dropped
        ([5, 6], [5, 6]),  # one that returns no stop id
        ([5, 2, 7], [5]),
        ([2], []),
    ],
)
def test_the_answer_ends_before_end_of_sequence(ids: list[int], answer: list[int]) -> None:
    assert answer_ids(ids, EOS) == answer


@pytest.mark.parametrize(
    ("outputs", "reference", "matching"),
    [
        ([[1, 2], [3, 4, 2]], [[1, 2], [3, 4]], 2),  # with or without the stop id
        ([[1, 5], [3, 4]], [[1, 6], [3, 4]], 1),  # a stream that parted
        ([[3, 4], [1, 2]], [[1, 2], [3, 4]], 0),  # same answers, other prompts
    ],
)
def test_streams_match_generate_for_their_own_prompt(
    outputs: list[list[int]], reference: list[list[int]], matching: int
) -> None:
    assert streams_matching(outputs, reference, EOS) == matching


def _row(engine: str, level: int, tokens_per_s: float, ttft_p99: float) -> dict[str, Any]:
    return {
        "engine": engine,
        "concurrency": level,
        "tokens_per_s": tokens_per_s,
        "ttft_ms_p99": ttft_p99,
    }


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            [_row("torch", 1, 90, 20), _row("vllm", 1, 60, 40)],
            {"torch_vs_vllm_tokens_per_s_at_1": 1.5, "torch_vs_vllm_ttft_p99_at_1": 0.5},
        ),
        (
            [_row("vllm-tier", 16, 380, 500), _row("vllm-server", 16, 400, 450)],
            {"tier_vs_vllm_server_tokens_per_s_at_16": 0.95},
        ),
        ([_row("torch", 1, 90, 20), _row("hf_generate", 1, 45, 30)], {}),  # no vllm row
        ([_row("torch", 1, 90, 20), _row("vllm", 16, 60, 40)], {}),  # other levels
        ([_row("torch", 1, 90, 20), _row("vllm", 1, 0, 0)], {}),  # nothing to divide by
    ],
)
def test_ratios_need_both_rows_at_a_level(
    rows: list[dict[str, Any]], expected: dict[str, float]
) -> None:
    assert engine_ratios(rows, [1, 16]) == expected


def test_a_level_row_covers_every_timed_stream() -> None:
    bursts = [
        Burst([StreamTiming([1, 2, 3], 0.1, 0.3), StreamTiming([4], 0.2, 0.2)], 0.5),
        Burst([StreamTiming([5, 6, 7, 8, 9], 0.05, 0.45), StreamTiming([], 0.0, 0.0)], 0.5),
    ]
    row = level_from_bursts("vllm", 2, bursts)
    assert (row.engine, row.concurrency, row.tokens, row.seconds) == ("vllm", 2, 9, 1.0)
    assert row.tokens_per_s == 9.0
    assert row.tpot_ms == pytest.approx(100.0)  # (0.2 s / 2 + 0.4 s / 4) / 2, in ms
    assert row.ttft_ms_p99 == pytest.approx(200.0)


@pytest.mark.parametrize(
    ("parents", "root", "tree"),
    [
        ({10: 1, 11: 10, 12: 11, 13: 1}, 10, {10, 11, 12}),
        ({10: 1, 11: 1}, 10, {10}),
        ({10: 1, 11: 10, 12: 10, 13: 12}, 10, {10, 11, 12, 13}),
    ],
)
def test_a_process_tree_is_the_root_and_everything_below(
    parents: dict[int, int], root: int, tree: set[int]
) -> None:
    assert descendants(parents, root) == tree
