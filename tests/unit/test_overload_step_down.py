"""Overload step-down (services/router/overload.py) as a table of scenarios: which tier a routed
chat goes to when the one its policy chose cannot start it in time, by priority (a critical chat
keeps a tier that serves); plain loads, no servers."""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import ANY

import pytest
from tiermesh.client.requests import PRIORITIES as PRIORITY_VALUES
from tiermesh.v1 import router_pb2

from services.common.config import RouterConfig
from services.router.chat_planning import check_chat_request, plan_chat
from services.router.drain_rate import DrainRate
from services.router.fair_share import FairShare
from services.router.fallback import TiersFull
from services.router.overload import (
    Keep,
    OverFairShare,
    Step,
    inflight_limit,
    priority_allowed,
    step_for_load,
)
from services.router.policy import LoadsSeenBy, RouteChoice, TierLoad

CONFIG = RouterConfig()
SHED = replace(CONFIG, overload="shed")
IDLE = TierLoad(True, 0, 0, 4, 8, 10.0, 20.0)
FULL = TierLoad(True, 4, 8, 4, 8, 900.0, 1500.0, expected_wait_ms=2500.0, max_wait_ms=5000.0)
SLOW = TierLoad(True, 4, 3, 4, 8, 900.0, 1500.0, expected_wait_ms=2500.0, max_wait_ms=5000.0)
REFUSING = replace(IDLE, running=4, refusing=True)
LOADS = {
    "large full": {"small": IDLE, "medium": IDLE, "large": FULL},
    "large and medium full": {"small": IDLE, "medium": FULL, "large": FULL},
    "large slow": {"small": IDLE, "medium": IDLE, "large": SLOW},
    "large slow, batch queued": {
        "small": IDLE,
        "medium": IDLE,
        "large": replace(SLOW, queued_batch=3),
    },
    "small full": {"small": FULL, "medium": IDLE, "large": IDLE},
    "small refusing": {"small": REFUSING, "medium": IDLE, "large": IDLE},
    "all full": {"small": FULL, "medium": FULL, "large": FULL},
    "all slow": {"small": SLOW, "medium": SLOW, "large": SLOW},
    "large idle": {"small": IDLE, "medium": IDLE, "large": IDLE},
    "medium unknown": {"small": IDLE, "medium": None, "large": FULL},
}
LARGE_FULL = "large full (4 running, 8 queued)"
LARGE_SLOW = "large expected wait 2500 ms over the chat's 1000 ms budget"

SCENARIOS = [
    # (name, config, chosen, loads, down, priority, budget_ms, expected)
    ("idle: stays", CONFIG, "large", "large idle", (), "interactive", 1000, None),
    (
        "full: steps down one",
        CONFIG,
        "large",
        "large full",
        (),
        "interactive",
        1000,
        Step("medium", "large", f"stepped down from large: {LARGE_FULL}"),
    ),
    (
        "two full: steps down two",
        CONFIG,
        "large",
        "large and medium full",
        (),
        "interactive",
        1000,
        Step("small", "large", f"stepped down from large: {LARGE_FULL}"),
    ),
    (
        "slow past the budget: steps down",
        CONFIG,
        "large",
        "large slow",
        (),
        "interactive",
        1000,
        Step("medium", "large", f"stepped down from large: {LARGE_SLOW}"),
    ),
    ("slow within the budget: stays", CONFIG, "large", "large slow", (), "interactive", 5000, None),
    (
        "smallest full: steps up",
        CONFIG,
        "small",
        "small full",
        (),
        "interactive",
        1000,
        Step("medium", "small", "stepped up from small: small full (4 running, 8 queued)"),
    ),
    (
        "refusing: steps up",
        CONFIG,
        "small",
        "small refusing",
        (),
        "interactive",
        1000,
        Step(
            "medium", "small", "stepped up from small: small refused a call at 4 running, 0 queued"
        ),
    ),
    (
        "a step skips a tier of unknown load",
        CONFIG,
        "large",
        "medium unknown",
        (),
        "interactive",
        1000,
        Step("small", "large", f"stepped down from large: {LARGE_FULL}"),
    ),
    (
        "a step skips a tier that is down",
        CONFIG,
        "large",
        "large full",
        ("medium",),
        "interactive",
        1000,
        Step("small", "large", f"stepped down from large: {LARGE_FULL}"),
    ),
    (
        "every tier full: stays (the fallback chain refuses)",
        CONFIG,
        "large",
        "all full",
        (),
        "interactive",
        1000,
        None,
    ),
    (
        "chosen tier down: the fallback chain decides",
        CONFIG,
        "large",
        "large idle",
        ("large",),
        "interactive",
        1000,
        None,
    ),
    ("critical keeps its tier", CONFIG, "large", "large full", (), "critical", 1000, Keep("large")),
    (
        "critical keeps a full tier",
        CONFIG,
        "large",
        "all full",
        (),
        "critical",
        1000,
        Keep("large"),
    ),
    (
        "critical keeps its tier, shed too",
        SHED,
        "large",
        "large full",
        (),
        "critical",
        1000,
        Keep("large"),
    ),
    (
        "critical keeps an idle tier",
        CONFIG,
        "large",
        "large idle",
        (),
        "critical",
        None,
        Keep("large"),
    ),
    (
        "critical, tier down: the fallback chain decides",
        CONFIG,
        "large",
        "large idle",
        ("large",),
        "critical",
        1000,
        None,
    ),
    (
        "batch keeps a slow tier where only batch waits (queued)",
        CONFIG,
        "large",
        "large slow, batch queued",
        (),
        "batch",
        None,
        None,
    ),
    ("shed: no step", SHED, "large", "large full", (), "interactive", 1000, None),
]


@pytest.mark.parametrize(
    ("config", "chosen", "loads", "down", "priority", "budget_ms", "expected"),
    [scenario[1:] for scenario in SCENARIOS],
    ids=[scenario[0] for scenario in SCENARIOS],
)
def test_step_for_load(
    config: RouterConfig,
    chosen: str,
    loads: str,
    down: tuple[str, ...],
    priority: str,
    budget_ms: float | None,
    expected: Step | Keep | None,
) -> None:
    def is_down(tier: str) -> str | None:
        return f"{tier} health NOT_SERVING" if tier in down else None

    assert step_for_load(chosen, LOADS[loads], config, is_down, priority, budget_ms) == expected


# large's queue is full of batch chats: an interactive one waits behind none of them (the tier's
# expected wait, an interactive request's, is one hand-over) and takes one's place
FULL_OF_BATCH = replace(FULL, queued_batch=8, expected_wait_ms=150.0)
# large refused a batch call since its report, at 4 running and 2 batch queued
REFUSED_BATCH = replace(SLOW, queued=2, queued_batch=2, expected_wait_ms=150.0, refusing_batch=True)


@pytest.mark.parametrize(
    ("large", "priority", "outcome"),
    [
        (FULL_OF_BATCH, "interactive", "stays"),
        (FULL_OF_BATCH, "critical", "keeps"),
        (FULL_OF_BATCH, "batch", "refused"),
        (REFUSED_BATCH, "interactive", "stays"),
        (REFUSED_BATCH, "batch", "refused"),
        (FULL, "interactive", "steps down"),  # a queue full of interactive chats is full
        (replace(FULL, queued_batch=2), "interactive", "steps down"),  # 6 of them: still late
    ],
)
def test_batch_chats_queued_or_refused_count_only_for_batch(
    large: TierLoad, priority: str, outcome: str
) -> None:
    loads = LoadsSeenBy({"small": IDLE, "medium": IDLE, "large": large}, priority)
    try:
        step = step_for_load("large", loads, CONFIG, lambda t: None, priority, 1000)
    except TiersFull as e:
        assert outcome == "refused", e
        return
    expected = {
        "stays": None,
        "keeps": Keep("large"),
        "steps down": Step("medium", "large", ANY),
    }[outcome]
    assert step == expected


def test_a_load_seen_by_each_priority() -> None:
    assert FULL_OF_BATCH.seen_by("interactive") == replace(FULL_OF_BATCH, queued=0, queued_batch=0)
    assert FULL_OF_BATCH.seen_by("batch") is FULL_OF_BATCH
    assert REFUSED_BATCH.seen_by("batch").queue_full
    assert not REFUSED_BATCH.seen_by("interactive").queue_full
    assert FULL.seen_by("interactive") is FULL  # nothing batch: as reported


def test_a_batch_chat_whose_tier_is_full_is_refused_at_once() -> None:
    full = {"large": replace(FULL, queued_batch=8)}
    with pytest.raises(TiersFull, match=r"batch chat refused: large full") as refused:
        step_for_load("large", full, CONFIG, lambda t: None, "batch", None)
    assert refused.value.retry_after_s == pytest.approx(2.5)  # the tier's expected wait


def test_a_batch_chat_is_refused_at_once_where_people_wait() -> None:
    """The tier would not queue it behind them (queue_order.may_queue): no call is made."""
    why = r"batch chat refused: large has 3 interactive or critical requests waiting \(4 running\)"
    with pytest.raises(TiersFull, match=why):
        step_for_load("large", LOADS["large slow"], CONFIG, lambda t: None, "batch", None)
    only_batch = {"large": replace(SLOW, queued_batch=3)}  # it waits in its turn behind them
    assert step_for_load("large", only_batch, CONFIG, lambda t: None, "batch", None) is None


@pytest.mark.parametrize(
    ("priority", "ceiling", "allowed"),
    [
        ("critical", None, True),
        ("critical", "interactive", False),
        ("interactive", "interactive", True),
        ("batch", "interactive", True),
        ("interactive", "batch", False),
        ("batch", "batch", True),
    ],
)
def test_a_keys_priority_ceiling(priority: str, ceiling: str | None, allowed: bool) -> None:
    assert priority_allowed(priority, ceiling) is allowed


def test_a_refusal_at_capacity_retries_when_the_next_chat_should_finish() -> None:
    now = [0.0]
    drain = DrainRate(lambda: now[0])
    assert drain.retry_after_s() == 0.5  # nothing measured yet
    for gap in (0.2, 0.2, 0.2):
        now[0] += gap
        drain.finished()
    assert drain.retry_after_s() == pytest.approx(0.2)  # chats finish every 0.2 s
    now[0] += 1.2  # one slow gap moves the average a fifth of the way
    drain.finished()
    assert drain.retry_after_s() == pytest.approx(0.2 + 0.2 * 1.0)
    now[0] += 100.0
    drain.finished()
    assert drain.retry_after_s() == 5.0  # never past the bound


def shares(*inflight: tuple[str, int, float]) -> FairShare:
    fair = FairShare()
    for key, count, weight in inflight:
        for _ in range(count):
            fair.start(key, "interactive", weight)
    return fair


@pytest.mark.parametrize(
    ("inflight", "key", "weight", "over"),
    [
        ((), "a", 1.0, False),  # nobody else: its whole part
        ((("a", 9, 1.0),), "a", 1.0, False),  # alone, however many
        # part 5.5 of 11, allowance 5.5 + 2 x 1.66 + 1 = 9.8
        ((("a", 9, 1.0), ("b", 1, 1.0)), "a", 1.0, True),  # 10 of 11: past it
        ((("a", 8, 1.0), ("b", 2, 1.0)), "a", 1.0, False),  # 9 of 11: within it
        ((("a", 9, 1.0), ("b", 1, 1.0)), "b", 1.0, False),  # 2 of 11: under its part
        ((("a", 5, 1.0), ("b", 5, 1.0)), "a", 1.0, False),  # 6 of 11: chance, not unfairness
        ((("a", 16, 1.0), ("b", 16, 1.0)), "a", 1.0, False),  # equal keys at load: never over
        ((("a", 22, 1.0), ("b", 10, 1.0)), "a", 1.0, False),  # 23 of 33: 16.5 + 5.7 + 1 = 23.2
        ((("a", 23, 1.0), ("b", 10, 1.0)), "a", 1.0, True),  # 24 of 34: past 17 + 5.8 + 1
        ((("a", 45, 1.0), ("b", 5, 1.0)), "a", 1.0, True),  # a key at 10x the other's rate
        ((("a", 5, 3.0), ("b", 2, 1.0)), "a", 3.0, False),  # weight 3: 6 of 8 within 6
        ((("a", 40, 3.0), ("b", 1, 1.0)), "a", 3.0, True),  # weight 3: 41 of 42 past 31.5 + 5.6 + 1
        ((("a", 30, 3.0), ("b", 10, 1.0)), "b", 1.0, False),  # weight 1 of 4: 11 of 41 within 10.25
    ],
)
def test_a_keys_fair_share(
    inflight: tuple[tuple[str, int, float], ...], key: str, weight: float, over: bool
) -> None:
    fair = shares(*inflight)
    assert fair.over_share(key, "interactive", weight) is over
    assert not fair.over_share(key, "batch", weight)  # another priority is shared apart


def test_a_fair_share_forgets_chats_that_ended() -> None:
    fair = shares(("a", 9, 1.0), ("b", 1, 1.0))
    for _ in range(9):
        fair.end("a", "interactive")
    assert fair.inflight("a", "interactive") == 0
    assert not fair.over_share("a", "interactive")  # b's 1 and a's 1: 1 of 2 within 1


def test_a_chat_over_its_keys_share_under_load_is_refused_not_stepped_down() -> None:
    loads = LOADS["large full"]
    with pytest.raises(OverFairShare, match="over this API key's fair share under load") as no:
        step_for_load("large", loads, CONFIG, lambda t: None, "interactive", 1000, True)
    assert no.value.reason == "FAIR_SHARE" and no.value.status == "RESOURCE_EXHAUSTED"
    # no load, no pressure: served where it was sent, share or not
    idle = LOADS["large idle"]
    assert step_for_load("large", idle, CONFIG, lambda t: None, "interactive", 1000, True) is None


@pytest.mark.parametrize(
    ("priority", "max_inflight", "limit"),
    [
        ("critical", 256, 256),  # the whole router
        ("interactive", 256, 231),  # all but the critical reserve (10%)
        ("batch", 256, 128),  # half
        ("critical", 1, 1),
        ("interactive", 1, 1),  # a tiny router still takes one chat of each
        ("batch", 1, 1),
        ("interactive", 10, 9),
        ("batch", 3, 1),
    ],
)
def test_the_router_limit_leaves_room_for_higher_priorities(
    priority: str, max_inflight: int, limit: int
) -> None:
    assert inflight_limit(priority, max_inflight) == limit


def _routed(priority: str, chosen: str, loads: str) -> tuple[str, ...]:
    config = replace(CONFIG, tiers={t: "x:1" for t in ("small", "medium", "large")})
    request = router_pb2.ChatRequest(prompt="Hi", priority=PRIORITY_VALUES[priority])
    chat = check_chat_request(request, config)
    choice = RouteChoice(chosen, 0.9, "threshold", "why")
    return plan_chat(chat, config, LOADS[loads], lambda t: None, choice).tiers


@pytest.mark.parametrize(
    ("priority", "loads", "tiers"),
    [
        ("critical", "all full", ("large",)),  # kept: large's queue takes it first
        ("critical", "large full", ("large",)),
        ("interactive", "large full", ("medium",)),  # stepped down
    ],
)
def test_a_critical_chat_goes_to_its_tier_even_when_it_reads_full(
    priority: str, loads: str, tiers: tuple[str, ...]
) -> None:
    assert _routed(priority, "large", loads) == tiers


def test_with_every_tier_full_an_interactive_chat_is_refused_at_the_router() -> None:
    with pytest.raises(TiersFull):
        _routed("interactive", "large", "all full")


@pytest.mark.parametrize(
    ("limit", "max_tokens", "loads", "priority", "tier", "expected"),
    [
        (64, None, "large full", "interactive", "medium", 64),  # stepped down: lowered
        (64, None, "all slow", "interactive", "large", 64),  # no tier in time, queued: lowered
        (64, None, "large idle", "interactive", "large", 200),  # no load: the router's default
        (64, 150, "large full", "interactive", "medium", 150),  # set by the request: kept
        (64, None, "large full", "critical", "large", 200),  # critical keeps its answer
        (0, None, "large full", "interactive", "medium", 200),  # off
        (250, None, "large full", "interactive", "medium", 200),  # never raised
    ],
)
def test_max_tokens_lowered_under_load_where_the_request_leaves_them_to_the_router(
    limit: int, max_tokens: int | None, loads: str, priority: str, tier: str, expected: int
) -> None:
    config = replace(
        CONFIG,
        tiers={t: "x:1" for t in ("small", "medium", "large")},
        default_max_tokens=200,
        max_tokens=256,
        overload_max_tokens=limit,
    )
    request = router_pb2.ChatRequest(prompt="Hi", priority=PRIORITY_VALUES[priority])
    if max_tokens is not None:
        request.max_tokens = max_tokens
    chat = check_chat_request(request, config)
    choice = RouteChoice("large", 0.9, "threshold", "why")
    plan = plan_chat(chat, config, LOADS[loads], lambda t: None, choice)
    assert plan.tiers == (tier,)
    assert plan.generate.max_tokens == expected
    assert plan.generate.fit_max_tokens_to_context == (max_tokens is None)
    lowered = f"max_tokens lowered to {expected} under load"
    assert (lowered in plan.decision.reason) == (expected < (max_tokens or 200))
    assert (lowered in plan.note) == (expected < (max_tokens or 200))
