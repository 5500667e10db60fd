"""The project's one percentile rule (nearest rank), including empty and one-element inputs."""

from __future__ import annotations

import math
import random

import pytest

from services.bench import metrics
from services.common.percentiles import percentile


def test_no_values_have_no_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile([], 0.99) is None


@pytest.mark.parametrize("q", [0.0, 0.01, 0.5, 0.99, 1.0])
def test_one_value_is_every_percentile(q: float) -> None:
    assert percentile([7.5], q) == 7.5


def test_nearest_rank_on_one_to_a_hundred() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # unsorted on purpose
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0  # rank 99 of 100, not the maximum
    assert percentile(values, 1.0) == 100.0


def test_small_inputs_take_the_value_at_the_rank_rounded_up() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0  # rank 2: never an interpolation
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.99) == 4.0
    assert percentile([10.0, 20.0], 0.51) == 20.0


def test_matches_the_nearest_rank_definition_on_random_inputs() -> None:
    rng = random.Random(0)
    for _ in range(200):
        values = [rng.uniform(0, 100) for _ in range(rng.randint(1, 300))]
        q = rng.random()
        ordered = sorted(values)
        assert percentile(values, q) == ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_accepts_any_iterable_and_leaves_the_input_alone() -> None:
    values = [5.0, 1.0, 3.0]
    assert percentile(iter(values), 0.5) == 3.0
    assert values == [5.0, 1.0, 3.0]


@pytest.mark.parametrize("q", [-0.1, 1.01, 99.0])
def test_quantile_outside_zero_to_one_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="q: must be in"):
        percentile([1.0], q)


def test_the_benchmark_uses_the_same_function() -> None:
    assert metrics.percentile is percentile
