"""Offline routing: misroute accounting, predictor training on real workload prompts, threshold
tuning, and the adaptive policy learning from feedback. Correctness here is synthetic (by
request class), so the tests pin the mechanics, not the built-in models' quality."""

from __future__ import annotations

import pytest

from services.router.adaptive_policy import AdaptivePolicy
from services.router.complexity_model import ComplexityModel
from services.router.policy import RoutingInput
from services.routing.outcomes import Outcome, TierOutcome
from services.routing.predictor_training import (
    label_accuracy,
    latency_us,
    train_model,
    tune_thresholds,
)
from services.routing.route_eval import by_phrasing, learning_curve, mean_reward, route_eval
from services.routing.simulation import evaluate_choices, misrouted, oracle_choice
from services.workload import load_split

COSTS = {"small": 0.05, "medium": 0.25, "large": 1.0}
# Which tiers answer each class correctly (the shape of gap the built-in family aims for).
CORRECT = {
    "simple": {"small": True, "medium": True, "large": True},
    "medium": {"small": False, "medium": True, "large": True},
    "complex": {"small": False, "medium": False, "large": True},
}


def synthetic(split: str, n: int) -> list[Outcome]:
    items = load_split(split)
    by_class: dict[str, list] = {"simple": [], "medium": [], "complex": []}
    for item in items:
        by_class[item.request_class].append(item)
    chosen = [i for c in by_class.values() for i in c[: n // 3]]
    return [
        Outcome(
            i.id,
            i.request_class,
            i.prompt,
            {t: TierOutcome(ok, 10, 0.9) for t, ok in CORRECT[i.request_class].items()},
        )
        for i in chosen
    ]


@pytest.fixture(scope="module")
def trained() -> tuple[ComplexityModel, list[Outcome], list[Outcome]]:
    train, dev = synthetic("train", 600), synthetic("dev", 240)
    return train_model(train), train, dev


def test_misroutes_count_both_directions() -> None:
    outcome = Outcome(
        "x", "medium", "p", {t: TierOutcome(ok, 5, 1.0) for t, ok in CORRECT["medium"].items()}
    )
    assert outcome.label == "medium" and oracle_choice(outcome) == "medium"
    assert misrouted(outcome, "small")  # failed while medium would have succeeded
    assert misrouted(outcome, "large")  # costlier than needed
    assert not misrouted(outcome, "medium")
    result = evaluate_choices([outcome, outcome], ["medium", "large"], COSTS)
    assert result.accuracy == 1.0 and result.misroute_rate == 0.5
    assert result.cost == pytest.approx((0.25 * 5 + 1.0 * 5) / 2)


def test_predictor_learns_labels(trained) -> None:
    model, _, dev = trained
    assert label_accuracy(model, dev) >= 0.9
    p50, p99 = latency_us(model, [o.prompt for o in dev])  # timed in `route train`, not here
    assert 0 < p50 <= p99
    simple = next(o for o in dev if o.request_class == "simple")
    complex_ = next(o for o in dev if o.request_class == "complex")
    assert model.score(simple.prompt) < 0.3 < 0.7 <= model.score(complex_.prompt)


def test_tuned_thresholds_meet_the_quality_target_at_lower_cost(trained) -> None:
    model, _, dev = trained
    tuning = tune_thresholds(model, dev, COSTS, quality_target=0.97)
    assert tuning.accuracy >= 0.97 * tuning.large_accuracy
    assert tuning.cost < 0.6 * tuning.large_cost
    assert 0.0 <= tuning.small_below <= tuning.medium_below <= 1.0


def test_adaptive_learns_from_feedback(trained) -> None:
    model, train, dev = trained
    cold = AdaptivePolicy(model, COSTS)
    _, curve = learning_curve(model, train, dev, COSTS, 0.3, steps=1500, every=500, seed=1)
    large = evaluate_choices(dev, ["large"] * len(dev), COSTS)
    assert curve[0]["feedback"] == 0 and curve[-1]["feedback"] == 1500
    assert curve[-1]["reward"] > mean_reward(large, COSTS, 0.3)
    assert curve[-1]["reward"] > curve[0]["reward"]
    choice = cold.route(RoutingInput((("user", dev[0].prompt),), 64), {})
    assert choice.policy == "adaptive" and "LinUCB after 0 rewards" in choice.reason


@pytest.mark.parametrize("seed", range(8))
def test_adaptive_finds_the_cheapest_right_tier_whatever_the_feedback_order(trained, seed) -> None:
    # with too small an exploration bonus, an arm that lost its first tries on hard requests was
    # never tried on easy ones again, and some orders ended routing everything to large
    model, train, dev = trained
    _, curve = learning_curve(
        model, train + dev, dev, COSTS, 0.3, steps=1000, every=1000, seed=seed
    )
    oracle = evaluate_choices(dev, [oracle_choice(o) for o in dev], COSTS)
    assert curve[-1]["reward"] == pytest.approx(mean_reward(oracle, COSTS, 0.3), abs=0.01)


def test_route_eval_report_contract(trained) -> None:
    model, train, dev = trained
    report = route_eval(dev, train, model, COSTS, feedback_steps=500)
    names = [row["name"] for row in report["policies"]]
    assert names == ["keyword", "interim_heuristic", "threshold", "cost_target", "adaptive"]
    assert set(report["references"]) == {"always_small", "always_large", "random", "oracle"}
    for row in [*report["policies"], *report["references"].values()]:
        assert {"name", "accuracy", "cost", "misroute_rate", "share"} <= set(row)
        assert sum(row["share"].values()) == pytest.approx(1.0, abs=1e-3)
    oracle = report["references"]["oracle"]
    assert oracle["accuracy"] == 1.0 and oracle["misroute_rate"] == 0.0
    assert report["bootstrap"] == {"resamples": 1000, "confidence": 0.95, "seed": 0}
    for row in [*report["policies"], *report["references"].values()]:
        for field in ("accuracy", "cost", "quality_vs_large", "cost_vs_large", "misroute_rate"):
            low, high = row[f"{field}_ci95"]
            assert low <= row[field] <= high, (row["name"], field)
        assert row["misroute_too_small"] + row["misroute_too_big"] == pytest.approx(
            row["misroute_rate"], abs=2e-4
        )
        for groups in (row["by_phrasing"], row["by_class"]):
            assert all("misroute_rate_ci95" in figures for figures in groups.values())
        assert set(row["by_class"]) == {o.request_class for o in dev}
    # without a tuning split the deployable static threshold is the hindsight one
    assert report["static_threshold_tuned_on_dev"] == report["best_static_threshold"]
    tuned = route_eval(dev, train, model, COSTS, feedback_steps=0, tuning=train)
    assert (
        tuned["static_threshold_tuned_on_dev"]["reward"] <= tuned["best_static_threshold"]["reward"]
    )


def test_route_eval_reports_seen_and_unseen_phrasings_apart() -> None:
    items = load_split("dev", phrasing=None)
    unseen = [i for i in items if i.phrasing == "unseen"][:20]
    chosen = [i for i in items if i.phrasing == "seen"][:40] + unseen
    outcomes = [
        Outcome(
            i.id,
            i.request_class,
            i.prompt,
            {t: TierOutcome(t == "large" or i.phrasing == "seen", 10, 0.9) for t in COSTS},
            i.phrasing,
        )
        for i in chosen
    ]
    assert Outcome.from_json(outcomes[-1].to_json()) == outcomes[-1]
    older = {k: v for k, v in outcomes[0].to_json().items() if k != "phrasing"}
    assert Outcome.from_json(older).phrasing == "seen"  # rows written before phrasings existed
    parts = by_phrasing(outcomes, ["small"] * len(outcomes), COSTS)
    assert parts["seen"] == {"requests": 40, "accuracy": 1.0, "cost": 0.5}
    assert parts["unseen"]["requests"] == 20 and parts["unseen"]["accuracy"] == 0.0
    assert set(by_phrasing(outcomes[:40], ["large"] * 40, COSTS)) == {"seen"}
