"""Builds the routing policy a router config names, with the artifacts it needs."""

from __future__ import annotations

from pathlib import Path

from services.common.config import RouterConfig
from services.common.errors import ConfigError
from services.router.adaptive_policy import AdaptivePolicy
from services.router.complexity_model import DEFAULT_ARTIFACT, ComplexityModel
from services.router.policy import InterimHeuristicPolicy, RoutingPolicy
from services.router.static_policies import CostTargetPolicy, KeywordPolicy, ThresholdPolicy


def load_complexity_model(path: Path) -> ComplexityModel:
    path = path if str(path) not in ("", ".") else DEFAULT_ARTIFACT
    if not path.is_file():
        raise ConfigError(
            f"complexity_model: {path} not found (train it with `tiermesh route train`)"
        )
    return ComplexityModel.load(path)


def create_policy(config: RouterConfig) -> RoutingPolicy:
    name = config.policy
    if name == "interim_heuristic":
        return InterimHeuristicPolicy()
    if name == "keyword":
        return KeywordPolicy()
    model = load_complexity_model(config.complexity_model)
    if name == "threshold":
        return ThresholdPolicy(
            model,
            large_queue_limit=config.large_queue_limit,
            fallback_min_success=config.queue_fallback_min_success,
        )
    if name == "cost_target":
        return CostTargetPolicy(
            model,
            large_queue_limit=config.large_queue_limit,
            fallback_min_success=config.queue_fallback_min_success,
        )
    if name == "adaptive":
        return AdaptivePolicy(
            model,
            config.tier_costs,
            cost_weight=config.adaptive_cost_weight,
            exploration=config.adaptive_exploration,
        )
    raise ConfigError(f"policy: unknown routing policy {name!r}")
