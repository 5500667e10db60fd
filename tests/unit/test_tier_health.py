"""Health-aware routing decisions without processes: passive ejection (outlier.py), the
fallback choice over loads and down reasons (fallback.py), and the choice of a tier's replica
(tier_health.py) over reports the test sets."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tiermesh.v1 import router_pb2

from services.common.config import RouterConfig
from services.router.chat_events import TierCallEnded
from services.router.fallback import (
    TiersLoading,
    choose_with_fallback,
    fallback_chain,
    fallback_order,
)
from services.router.outlier import OutlierDetector
from services.router.policy import InterimHeuristicPolicy, TierLoad
from services.router.servicer import RouterServicer
from services.router.tier_health import TierHealth
from tests.fakes.fake_tier_channels import FakeTierChannels

IDLE = TierLoad(True, 0, 0, 4, 16, 1.0, 2.0)
CONFIG = RouterConfig()


def detector() -> OutlierDetector:
    return OutlierDetector(failures=3, base_s=1.0, max_s=3.0, probe_timeout_s=10.0)


def test_consecutive_failures_eject_with_doubling_capped_backoff_and_one_probe() -> None:
    outliers = detector()
    for _ in range(2):
        outliers.ended("small", "UNAVAILABLE", 0.0)
    assert outliers.blocked("small", 0.0) is None  # two failures: not yet
    outliers.ended("small", "UNAVAILABLE", 0.0)
    assert "ejected after 3 failed calls" in (outliers.blocked("small", 0.5) or "")
    assert outliers.blocked("small", 1.0) is None  # time is up: one probe may go
    outliers.starting("small", 1.0)
    assert "probe call still running" in (outliers.blocked("small", 1.1) or "")
    outliers.ended("small", "UNAVAILABLE", 1.1)  # the probe failed: ejected for 2 s
    assert outliers.blocked("small", 3.0) is not None and outliers.blocked("small", 3.1) is None
    outliers.starting("small", 3.1)
    outliers.ended("small", "UNAVAILABLE", 3.2)  # 4 s would be next, the cap says 3 s
    assert outliers.blocked("small", 6.1) is not None and outliers.blocked("small", 6.2) is None
    outliers.starting("small", 6.2)
    outliers.ended("small", "OK", 6.3)  # the probe succeeded: restored, backoff reset
    assert outliers.blocked("small", 6.3) is None
    for _ in range(3):
        outliers.ended("small", "UNAVAILABLE", 7.0)
    assert outliers.blocked("small", 7.9) is not None and outliers.blocked("small", 8.0) is None


def test_only_tier_failures_count_and_a_success_resets_the_count() -> None:
    outliers = detector()
    for code in ("UNAVAILABLE", "UNAVAILABLE", "OK", "UNAVAILABLE", "CANCELLED", "UNAVAILABLE"):
        outliers.ended("small", code, 0.0)
    for code in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"):
        outliers.ended("small", code, 0.0)
    assert outliers.blocked("small", 0.0) is None


def test_a_probe_whose_call_never_reports_is_freed_after_its_timeout() -> None:
    outliers = detector()
    for _ in range(3):
        outliers.ended("small", "INTERNAL", 0.0)
    outliers.starting("small", 1.0)
    assert outliers.blocked("small", 10.9) is not None and outliers.blocked("small", 11.0) is None


def test_fallback_chain_follows_the_configured_order_once() -> None:
    assert fallback_chain("small", CONFIG) == ("medium", "large")
    assert fallback_chain("large", CONFIG) == ("medium",)


def test_unknown_load_is_never_room_and_the_reason_names_the_fallback() -> None:
    loads = {"small": None, "medium": IDLE, "large": IDLE}
    tier, note, then = choose_with_fallback("small", loads, CONFIG)
    assert (tier, then) == ("medium", ("large",))
    assert note == "; small load unknown → fallback medium"


def test_a_down_tier_is_skipped_and_put_last_among_the_fallbacks() -> None:
    loads = {"small": IDLE, "medium": IDLE, "large": IDLE}

    def down(tier: str) -> str | None:
        return "medium health NOT_SERVING" if tier == "medium" else None

    assert choose_with_fallback("small", loads, CONFIG, down) == ("small", "", ("large", "medium"))
    tier, note, then = choose_with_fallback("medium", loads, CONFIG, down)
    assert (tier, then) == ("large", ("medium",))
    assert note == "; medium health NOT_SERVING → fallback large"


def test_with_no_tier_available_the_chosen_one_is_tried_and_the_note_says_so() -> None:
    loads = dict.fromkeys(("small", "medium", "large"))
    tier, note, then = choose_with_fallback("small", loads, CONFIG)
    assert (tier, then) == ("small", ("medium", "large"))
    assert note.endswith("no tier available, trying small")


def test_with_no_tier_available_but_one_loading_the_caller_may_wait() -> None:
    loads = dict.fromkeys(("small", "medium", "large"))
    with pytest.raises(TiersLoading, match="no tier able to take it yet"):
        choose_with_fallback("small", loads, CONFIG, loading=lambda tier: tier == "large")
    # none loading: tried all the same
    tier, note, _ = choose_with_fallback("small", loads, CONFIG, loading=lambda tier: False)
    assert tier == "small" and note.endswith("no tier available, trying small")


def test_a_failed_call_moves_along_its_own_tiers_chain_whichever_tier_could_take_it() -> None:
    # small's load unknown (its first report late) and medium's fallback is small: a call pinned
    # to small that fails goes on to medium, small's own fallback, not along medium's chain
    config = RouterConfig(fallback={"small": "medium", "medium": "small", "large": "medium"})
    loads = {"small": None, "medium": IDLE, "large": IDLE}
    assert fallback_order("small", loads, config) == ("medium",)
    servicer = RouterServicer(config, FakeTierChannels({}), InterimHeuristicPolicy(), loads)
    pinned = router_pb2.ChatRequest(prompt="hi", mode=router_pb2.MODE_PINNED, tier="small")
    plan = servicer.plan(pinned)
    assert (plan.tiers, plan.fallbacks) == (("small",), ("medium",))
    # with the default order, medium down: large, the able one, comes first
    loads = {"small": IDLE, "medium": replace(IDLE, serving=False), "large": IDLE}
    servicer = RouterServicer(CONFIG, FakeTierChannels({}), InterimHeuristicPolicy(), loads)
    assert servicer.plan(pinned).fallbacks == ("large", "medium")
    # a refinement on large whose load is unknown moves on along large's chain, never to large
    servicer = RouterServicer(CONFIG, FakeTierChannels({}), InterimHeuristicPolicy(), loads)
    loads.update(medium=IDLE, large=None)
    progressive = router_pb2.ChatRequest(
        prompt="hi", mode=router_pb2.MODE_PROGRESSIVE, progressive_gate="always"
    )
    assert servicer.plan(progressive).tiers == ("small", "large")
    assert servicer.plan(progressive).fallbacks == ("medium",)


class Reports:
    """Replica reports set by the test: loads and down reasons by address."""

    def __init__(self) -> None:
        self.loads: dict[str, TierLoad] = {}
        self.downs: dict[str, str] = {}
        self.refusals: list[str] = []

    def endpoint_down(self, endpoint: str) -> str | None:
        return self.downs.get(endpoint)

    def endpoint_load(self, endpoint: str) -> TierLoad | None:
        return None if endpoint in self.downs else self.loads.get(endpoint)

    def note_refusal(self, endpoint: str, batch_only: bool = False) -> None:
        self.refusals.append(f"{endpoint} (batch)" if batch_only else endpoint)

    def endpoint_loading(self, endpoint: str) -> bool:
        return False

    async def changed(self, timeout_s: float) -> None:
        pass


def busy(running: int) -> TierLoad:
    return TierLoad(True, running, 0, 4, 16, 1.0, 2.0)


def test_pick_prefers_able_and_least_loaded_replicas_in_turn() -> None:
    reports = Reports()
    replicas = {"small": ("a", "b", "c")}
    health = TierHealth(replicas, reports, detector(), clock=lambda: 0.0)
    reports.loads = {"a": busy(3), "b": busy(1), "c": busy(1)}
    picked = {health.pick("small", ("a", "b", "c")) for _ in range(4)}
    assert picked == {"b", "c"}  # the least loaded two, in turn
    reports.downs = {"b": "health NOT_SERVING"}
    assert health.pick("small", ("a", "b")) == "a"  # loaded but able beats down
    assert health.down("small") is None
    reports.downs = {"a": "silent for 1200 ms", "b": "health NOT_SERVING", "c": "not serving"}
    assert health.down("small") == (
        "small has no replica able to serve (a: silent for 1200 ms; b: health NOT_SERVING; "
        "c: not serving)"
    )


def test_a_single_replica_tier_is_down_with_its_reason() -> None:
    reports = Reports()
    health = TierHealth({"small": ("127.0.0.1:1",)}, reports, detector(), clock=lambda: 0.0)
    reports.downs = {"127.0.0.1:1": "load stream broken (UNAVAILABLE)"}
    assert health.down("small") == "small load stream broken (UNAVAILABLE)"


def test_failed_calls_eject_the_replica_they_went_to() -> None:
    health = TierHealth({"small": ("a", "b")}, Reports(), detector(), clock=lambda: 0.0)
    for _ in range(3):
        health.observe(TierCallEnded("small", "r/small/1", "UNAVAILABLE", endpoint="a"))
    assert "ejected" in (health.endpoint_down("a") or "")
    assert health.endpoint_down("b") is None and health.down("small") is None
    assert health.pick("small", ("a", "b")) == "b"


def test_room_means_a_replica_not_tried_would_start_a_call_at_once() -> None:
    reports = Reports()
    health = TierHealth({"small": ("a", "b")}, reports, detector(), clock=lambda: 0.0)
    assert not health.has_room("small", ())  # unknown load is no room
    reports.loads = {"a": busy(4), "b": TierLoad(True, 3, 1, 4, 16, 1.0, 2.0)}
    assert not health.has_room("small", ())  # a full, b has a slot but someone waits for it
    reports.loads["b"] = busy(3)
    assert health.has_room("small", ()) and not health.has_room("small", ("b",))
    reports.downs = {"b": "health NOT_SERVING"}
    assert not health.has_room("small", ())
    assert not health.has_room("medium", ())  # not configured


def test_a_refusal_for_overload_is_told_to_the_replica_s_reports_and_ejects_nothing() -> None:
    reports = Reports()
    health = TierHealth({"small": ("a", "b")}, reports, detector(), clock=lambda: 0.0)
    for _ in range(3):
        health.observe(TierCallEnded("small", "r/small/1", "RESOURCE_EXHAUSTED", endpoint="a"))
    health.observe(TierCallEnded("small", "r/small/2", "UNAVAILABLE", endpoint="b"))
    refused_batch = TierCallEnded(
        "small", "r/small/3", "RESOURCE_EXHAUSTED", endpoint="b", priority="batch"
    )
    health.observe(refused_batch)  # the tier's queue takes the others first: batch alone
    assert reports.refusals == ["a", "a", "a", "b (batch)"]
    assert health.endpoint_down("a") is None


def test_a_replica_that_refused_since_its_last_report_has_no_room() -> None:
    reports = Reports()
    health = TierHealth({"small": ("a",)}, reports, detector(), clock=lambda: 0.0)
    reports.loads = {"a": busy(1)}
    assert health.has_room("small", ())
    reports.loads = {"a": replace(busy(1), refusing=True)}  # refused a call at this report
    assert not health.has_room("small", ())


@pytest.mark.parametrize(
    ("load", "down", "queueing"),
    [
        (TierLoad(True, 4, 2, 4, 16, 1.0, 2.0), None, True),  # requests wait: ours may be one
        (TierLoad(True, 4, 0, 4, 16, 1.0, 2.0), None, False),  # full, nobody waits: silent
        (TierLoad(True, 1, 0, 4, 16, 1.0, 2.0), None, False),
        (TierLoad(False, 0, 2, 4, 16, 1.0, 2.0), None, False),  # not serving
        (TierLoad(True, 4, 2, 4, 16, 1.0, 2.0), "silent for 2100 ms", False),  # hung: no reports
        (None, None, False),  # never reported
    ],
)
def test_a_silent_call_may_be_queued_only_where_a_live_replica_reports_a_queue(
    load: TierLoad | None, down: str | None, queueing: bool
) -> None:
    reports = Reports()
    if load is not None:
        reports.loads["a"] = load
    if down is not None:
        reports.downs["a"] = down
    health = TierHealth({"small": ("a",)}, reports, detector(), clock=lambda: 0.0)
    assert health.queueing("a") is queueing
