"""`tiermesh bench --configs`: the named configurations, hybrid under a chosen routing policy and
progressive under a chosen gate."""

from __future__ import annotations

import argparse

import pytest

from services.bench.hybrid_cli import configuration_names, plain_configuration_names
from services.bench.loadgen import CONFIGURATIONS, configuration
from services.common.config import GATES, POLICIES


def test_named_configurations_keep_the_routers_policy() -> None:
    for name, config in CONFIGURATIONS.items():
        assert configuration(name) is config and config.policy == ""


@pytest.mark.parametrize("policy", POLICIES)
def test_hybrid_with_a_policy_is_routed_under_that_policy(policy: str) -> None:
    config = configuration(f"hybrid:{policy}")
    assert (config.name, config.mode, config.tier, config.policy) == (
        f"hybrid:{policy}",
        "routed",
        "",
        policy,
    )
    assert config.options() == {"mode": "routed", "tier": "", "progressive_gate": ""}


@pytest.mark.parametrize("gate", GATES)
def test_progressive_with_a_gate_asks_each_chat_for_that_gate(gate: str) -> None:
    config = configuration(f"progressive:{gate}")
    assert (config.name, config.mode, config.policy) == (f"progressive:{gate}", "progressive", "")
    assert config.options() == {"mode": "progressive", "tier": "", "progressive_gate": gate}


@pytest.mark.parametrize(
    "name", ["hybrid:", "hybrid:nope", "single:keyword", "fast", "progressive:", "progressive:x"]
)
def test_unknown_configurations_are_refused_with_what_is_accepted(name: str) -> None:
    with pytest.raises(ValueError, match="hybrid:<policy> with a policy from") as error:
        configuration(name)
    assert repr(name) in str(error.value)
    with pytest.raises(argparse.ArgumentTypeError):
        configuration_names(f"single,{name}")


def test_a_sweep_takes_only_the_named_configurations() -> None:
    assert plain_configuration_names("single,hybrid") == ["single", "hybrid"]
    assert configuration_names("single,hybrid:threshold") == ["single", "hybrid:threshold"]
    with pytest.raises(argparse.ArgumentTypeError, match="compare policies"):
        plain_configuration_names("single,hybrid:threshold")
