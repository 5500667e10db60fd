"""Trains the router's complexity predictor on measured outcomes and tunes the cost_target
thresholds on dev: the least-cost thresholds that keep a quality target.

Model: multinomial logistic regression (scikit-learn) over the router's own hashed features
(complexity_model.features), predicting the cheapest correct tier; requests no tier answers
are labelled large. The weights are exported into the numpy artifact the router loads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix

from services.common.extras import require_extra
from services.router.complexity_model import CLASSES, DIMENSIONS, ComplexityModel, features
from services.routing.outcomes import Outcome
from services.routing.simulation import evaluate_choices


def design_matrix(prompts: Sequence[str]) -> csr_matrix:
    rows, cols, values = [], [], []
    for row, prompt in enumerate(prompts):
        for col, value in features(prompt).items():
            rows.append(row)
            cols.append(col)
            values.append(value)
    return csr_matrix((values, (rows, cols)), shape=(len(prompts), DIMENSIONS))


def target(outcome: Outcome) -> int:
    label = outcome.label
    return CLASSES.index(label) if label in CLASSES else CLASSES.index("large")


def train_model(train: Sequence[Outcome], regularisation: float = 4.0) -> ComplexityModel:
    require_extra("sklearn", "training the complexity predictor")
    from sklearn.linear_model import LogisticRegression

    x = design_matrix([o.prompt for o in train])
    y = np.array([target(o) for o in train])
    classifier = LogisticRegression(C=regularisation, max_iter=2000)
    classifier.fit(x, y)
    weights = np.zeros((len(CLASSES), DIMENSIONS))
    bias = np.zeros(len(CLASSES))
    for row, label in enumerate(classifier.classes_):  # classes absent from train stay at 0
        weights[label] = classifier.coef_[row] if len(classifier.classes_) > 2 else 0.0
        bias[label] = classifier.intercept_[row] if len(classifier.classes_) > 2 else 0.0
    return ComplexityModel(weights, bias)


@dataclass(frozen=True)
class Tuning:
    small_below: float
    medium_below: float
    accuracy: float
    cost: float
    large_accuracy: float
    large_cost: float


def tune_thresholds(
    model: ComplexityModel,
    dev: Sequence[Outcome],
    costs: dict[str, float],
    quality_target: float = 0.99,
    step: float = 0.025,
) -> Tuning:
    """The least-cost (small_below, medium_below) on dev whose accuracy is at least
    quality_target x always-large's."""
    scores = np.array([model.score(o.prompt) for o in dev])
    large = evaluate_choices(dev, ["large"] * len(dev), costs)
    grid = np.round(np.arange(0.0, 1.0 + step, step), 4)
    best: Tuning | None = None
    for small_below in grid:
        for medium_below in grid[grid >= small_below]:
            choices = np.where(
                scores < small_below, "small", np.where(scores < medium_below, "medium", "large")
            )
            result = evaluate_choices(dev, list(choices), costs)
            if result.accuracy < quality_target * large.accuracy:
                continue
            if best is None or result.cost < best.cost:
                best = Tuning(
                    float(small_below),
                    float(medium_below),
                    result.accuracy,
                    result.cost,
                    large.accuracy,
                    large.cost,
                )
    if best is None:  # unreachable target: route everything large
        best = Tuning(0.0, 0.0, large.accuracy, large.cost, large.accuracy, large.cost)
    return best


def latency_us(model: ComplexityModel, prompts: Sequence[str]) -> tuple[float, float]:
    """p50 and p99 of one score() call, in microseconds."""
    samples = []
    for prompt in prompts:
        start = time.perf_counter()
        model.score(prompt)
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def label_accuracy(model: ComplexityModel, outcomes: Sequence[Outcome]) -> float:
    hits = sum(int(np.argmax(model.probabilities(o.prompt))) == target(o) for o in outcomes)
    return hits / max(1, len(outcomes))
