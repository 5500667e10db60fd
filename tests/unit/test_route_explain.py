"""`tiermesh route explain` (services/routing/explain.py): the explanation's fields per policy,
its tier equal to the policy's own decision, the predictor's view consistent with the predictor,
and the command line's JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from services.common.config import RouterConfig
from services.common.config_loading import load_config
from services.router.complexity_model import ComplexityModel, gram_index
from services.router.policy import RoutingInput
from services.router.policy_factory import create_policy
from services.routing.cli import ROUTER_CONFIG
from services.routing.explain import LOADS_ASSUMED, explain, predictor_view

PROMPTS = (
    "What is your return policy?",
    "What would six white belts cost me?",
    "Please price an order of 2 navy bottles, 4 pink spoons and 3 green bowls. "
    "I have coupon SAVE10. How much will I pay in total?",
)


@pytest.mark.parametrize(
    ("policy", "thresholds", "predictor"),
    [
        ("cost_target", True, True),
        ("threshold", True, True),
        ("adaptive", False, True),
        ("interim_heuristic", True, False),
        ("keyword", False, False),
    ],
)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_explanation_is_the_policys_decision(
    policy: str, thresholds: bool, predictor: bool, prompt: str
) -> None:
    config = load_config(RouterConfig, ROUTER_CONFIG, policy=policy)
    routing = create_policy(config)
    decided = routing.route(RoutingInput((("user", prompt),), 200), {})
    explained = explain(create_policy(config), prompt, top=4)
    assert (explained.policy, explained.tier, explained.reason) == (
        policy,
        decided.tier,
        decided.reason,
    )
    assert explained.complexity == pytest.approx(decided.complexity, abs=1e-4)
    assert (explained.thresholds is not None) == thresholds
    assert (explained.predictor is not None) == predictor
    assert explained.loads == LOADS_ASSUMED
    if explained.predictor is not None:
        assert explained.predictor.score == pytest.approx(decided.complexity, abs=1e-4)
        assert len(explained.predictor.features) == min(4, explained.predictor.feature_count)
    fields = set(explained.to_json())
    assert {"prompt", "policy", "tier", "complexity", "reason", "thresholds"} <= fields
    assert {"predictor", "loads", "large_queue_limit"} <= fields


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_predictor_view_agrees_with_the_predictor(prompt: str) -> None:
    model = ComplexityModel.load()
    view = predictor_view(model, prompt, top=100)
    assert view.score == pytest.approx(model.score(prompt), abs=1e-4)
    assert list(view.probabilities.values()) == pytest.approx(
        list(model.probabilities(prompt)), abs=1e-4
    )
    assert len(view.features) == view.feature_count  # every feature when top is large enough
    effects = [abs(row.effect) for row in view.features]
    assert effects == sorted(effects, reverse=True)
    for row in view.features:
        assert all(gram_index(gram) == row.index for gram in row.grams)
        assert list(row.weights.values()) == pytest.approx(
            list(model.weights[:, row.index]), abs=1e-4
        )
    # the values are the predictor's own L2-normalised feature vector
    assert np.linalg.norm([row.value for row in view.features]) == pytest.approx(1.0, abs=1e-3)


def test_route_explain_prints_one_json_object() -> None:
    prompt = PROMPTS[1]
    command = [sys.executable, "-m", "services.cli", "route", "explain", prompt, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    explained = json.loads(done.stdout)
    config = load_config(RouterConfig, ROUTER_CONFIG)
    decided = create_policy(config).route(RoutingInput((("user", prompt),), 200), {})
    assert explained["policy"] == config.policy
    assert explained["tier"] == decided.tier and explained["reason"] == decided.reason
    assert explained["predictor"]["features"][0]["grams"]
    other = subprocess.run(
        [*command, "--policy", "nope"], capture_output=True, text=True, timeout=60, check=False
    )
    assert other.returncode == 2 and "policy" in other.stdout + other.stderr


@pytest.mark.parametrize(
    ("prompt", "gate", "tiers", "reason"),
    [
        (PROMPTS[0], "escalate", ("small", "medium", "large"), "escalate: small first"),
        (PROMPTS[2], "escalate", ("medium", "large"), "escalate: medium first"),
        (PROMPTS[0], "always", ("small", "large"), "draft from small, refined by large"),
    ],
)
def test_the_progressive_plan_is_the_routers(
    prompt: str, gate: str, tiers: tuple[str], reason: str
) -> None:
    config = load_config(RouterConfig, ROUTER_CONFIG, progressive_gate=gate)
    explained = explain(create_policy(config), prompt, config=config)
    assert explained.progressive is not None
    assert (explained.progressive.gate, explained.progressive.tiers) == (gate, tiers)
    assert explained.progressive.reason.startswith(reason)
