"""The drift evaluation (services/routing/drift.py): the seeded stream's mixes, the replay's
feedback, the report's shape, and the adaptive policy following a change of traffic."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest

from services.router.adaptive_policy import AdaptivePolicy
from services.router.complexity_model import ComplexityModel
from services.router.policy import Loads, RouteChoice, RoutingInput
from services.routing.drift import (
    AFTER_MIX,
    drift_eval,
    drift_policies,
    drift_stream,
    group_counts,
    group_key,
    replay,
)
from services.routing.outcomes import Outcome, TierOutcome, load_outcomes
from services.routing.predictor_training import train_model
from tests.unit.test_routing_offline import COSTS, synthetic


@pytest.mark.parametrize(
    ("mix", "total", "counts"),
    [
        ({"a": 0.8, "b": 0.1, "c": 0.1}, 10, {"a": 8, "b": 1, "c": 1}),
        ({"a": 0.5, "b": 0.5}, 3, {"a": 2, "b": 1}),  # a tie goes to the mix's first group
        ({"a": 1, "b": 1, "c": 1}, 100, {"a": 34, "b": 33, "c": 33}),  # shares are weights
        ({"a": 0.3, "b": 0.0}, 7, {"a": 7, "b": 0}),
        ({"a": 0.25, "b": 0.75}, 0, {"a": 0, "b": 0}),
    ],
)
def test_group_counts_keep_the_mix_and_the_total(
    mix: dict[str, float], total: int, counts: dict[str, int]
) -> None:
    assert group_counts(mix, total) == counts


@pytest.mark.parametrize("mix", [{}, {"a": 0.0}, {"a": 1.0, "b": -0.5}])
def test_a_mix_with_no_weight_or_a_negative_share_is_refused(mix: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="mix"):
        group_counts(mix, 10)


def outcome(n: int, request_class: str, phrasing: str, small_answers: bool) -> Outcome:
    tiers = {t: TierOutcome(t != "small" or small_answers, 10, 0.9) for t in COSTS}
    return Outcome(f"{request_class}-{n}", request_class, f"q {n}", tiers, phrasing)


POOL = [outcome(n, "simple", "seen", True) for n in range(30)]
POOL += [outcome(n, "medium", "unseen", False) for n in range(10)]
POOL += [outcome(n, "complex", "seen", False) for n in range(5)]


@pytest.mark.parametrize(
    ("before_mix", "after_mix", "before", "after"),
    [
        ({"simple/seen": 0.8, "complex/seen": 0.2}, {"medium/unseen": 1.0}, 50, 20),
        ({"simple/seen": 0.9, "medium/unseen": 0.1}, AFTER_MIX, 100, 100),
        ({"complex/seen": 1.0}, {"simple/seen": 0.5, "complex/seen": 0.5}, 0, 10),
    ],
)
def test_the_stream_has_each_segments_mix_and_its_seed_repeats_it(
    before_mix: dict[str, float], after_mix: dict[str, float], before: int, after: int
) -> None:
    stream = drift_stream(POOL, before_mix, after_mix, before, after, seed=3)
    assert stream.change_at == before and len(stream.requests) == before + after
    for part, mix in ((stream.before, before_mix), (stream.after, after_mix)):
        drawn = Counter(group_key(o) for o in part)
        assert drawn == Counter({g: c for g, c in group_counts(mix, len(part)).items() if c})
    assert drift_stream(POOL, before_mix, after_mix, before, after, seed=3) == stream
    other = drift_stream(POOL, before_mix, after_mix, before, after, seed=4)
    assert other.requests != stream.requests or len(set(POOL)) == 1


def test_a_mix_naming_a_group_the_split_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="no 'complex/unseen' requests"):
        drift_stream(POOL, {"simple/seen": 1.0}, {"complex/unseen": 1.0}, 5, 5)


@dataclass
class RecordingPolicy:
    """A fake policy: routes by the prompt's position in `tiers`, records what it learns."""

    tiers: list[str]
    name: str = "recording"
    lessons: list[tuple[str, float]] = field(default_factory=list)

    def route(self, request: RoutingInput, loads: Loads) -> RouteChoice:
        assert loads == {}  # the replay assumes idle tiers
        return RouteChoice(self.tiers[len(self.lessons)], 0.0, self.name, "fake")

    def learn(self, choice: RouteChoice, tier: str, quality: float) -> None:
        assert tier == choice.tier
        self.lessons.append((tier, quality))


def test_replay_teaches_each_chosen_tiers_measured_correctness_in_order() -> None:
    requests = [POOL[0], POOL[30], POOL[30], POOL[40]]  # simple, medium, medium, complex
    tiers = ["small", "small", "medium", "small"]
    policy = RecordingPolicy(tiers)
    assert replay(policy, requests) == tiers
    assert policy.lessons == [("small", 1.0), ("small", 0.0), ("medium", 1.0), ("small", 0.0)]


@pytest.fixture(scope="module")
def model() -> ComplexityModel:
    return train_model(synthetic("train", 600))


def test_the_report_scores_every_policy_after_the_change_against_hindsight(model) -> None:
    outcomes = synthetic("dev", 240)
    before_mix, after_mix = {"simple/seen": 1.0}, {"complex/seen": 1.0}
    report = drift_eval(outcomes, model, COSTS, 0.3, 1, before_mix, after_mix, 300, 200)["drift"]
    assert (report["change_at"], report["requests"]) == (300, 500)
    assert (report["before_mix"], report["after_mix"]) == (before_mix, after_mix)
    names = [row["name"] for row in report["policies"]]
    assert names == list(drift_policies(model, COSTS, 0.3, {"small_below": 0, "medium_below": 0}))
    best = report["best_static_after"]
    for row in [*report["policies"], {"name": "best", "after": best}]:
        after = row["after"]
        for name in ("accuracy", "cost", "reward", "misroute_rate", "reward_vs_best_static"):
            low, high = after[f"{name}_ci95"]
            assert low <= after[name] <= high, (row["name"], name)
        assert after["reward_vs_best_static"] == pytest.approx(
            after["reward"] - best["reward"], abs=2e-4
        )
    assert best["reward_vs_best_static"] == 0.0
    # the static thresholds are points of the same sweep: none beats the hindsight one
    static = {row["name"]: row["after"] for row in report["policies"]}
    for name in ("threshold", "cost_target", "static_tuned_before"):
        assert static[name]["reward"] <= best["reward"] + 1e-9
    windows = report["policies"][0]["reward_windows"]
    assert len(windows) == 500 // report["window"]
    # every complex order after the change needs large: the hindsight threshold sends them there
    assert best["accuracy"] == 1.0 and best["share"]["large"] == 1.0


def test_forgetting_follows_a_tier_that_stops_answering(model: ComplexityModel) -> None:
    # the same simple requests; after the change the small tier gets none of them right (a
    # broken model): with its old rewards fading the policy stops sending them there sooner
    simple = [o for o in synthetic("dev", 240) if o.request_class == "simple"]
    broken = [
        Outcome(
            o.id, "simple", o.prompt, {**o.tiers, "small": TierOutcome(False, 10, 0.9)}, "broken"
        )
        for o in simple
    ]
    stream = drift_stream(simple + broken, {"simple/seen": 1}, {"simple/broken": 1}, 3000, 600, 2)
    sent_small = {}
    for forgetting in (1.0, AdaptivePolicy(model, COSTS)._forgetting):
        choices = replay(AdaptivePolicy(model, COSTS, forgetting=forgetting), stream.requests)
        sent_small[forgetting] = choices[stream.change_at :].count("small")
    remembers, forgets = sent_small.values()
    assert forgets < 0.7 * remembers, sent_small


def test_forgetting_keeps_exploration_alive(model: ComplexityModel) -> None:
    """An arm left untried regains its uncertainty; without forgetting it keeps what it had."""
    prompt = synthetic("dev", 30)[0].prompt
    bonus = {}
    for forgetting in (1.0, 0.99):
        policy = AdaptivePolicy(model, COSTS, forgetting=forgetting)
        choice = policy.route(RoutingInput((("user", prompt),), 64), {})
        for _ in range(50):
            policy.learn(choice, "large", 1.0)
        tried = policy.estimates(np.array(choice.context))["large"][1]
        for _ in range(500):
            policy.learn(choice, "small", 1.0)
        bonus[forgetting] = (tried, policy.estimates(np.array(choice.context))["large"][1])
    assert bonus[1.0][1] == pytest.approx(bonus[1.0][0])
    assert bonus[0.99][1] > 3 * bonus[0.99][0]


def test_on_the_measured_split_the_adaptive_policy_recovers_and_cost_target_falls_behind() -> None:
    # the figures docs/routing.md shows (seed 0): within a point of the hindsight threshold
    outcomes = load_outcomes("test")
    model = ComplexityModel.load()
    makers = drift_policies(model, COSTS, 0.3, {"small_below": 0.0, "medium_below": 0.0})
    chosen = {name: makers[name] for name in ("cost_target", "adaptive")}
    report = drift_eval(outcomes, model, COSTS, seed=0, policies=chosen)["drift"]
    after = {row["name"]: row["after"] for row in report["policies"]}
    assert after["adaptive"]["reward_vs_best_static"] >= -0.01
    assert after["cost_target"]["reward_vs_best_static_ci95"][1] < 0
