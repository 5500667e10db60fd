"""Config loading: typed fields, errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import RouterConfig, TierConfig
from services.common.config_loading import build_config, load_config
from services.common.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tier", ["small", "medium", "large"])
def test_shipped_tier_configs_load(tier: str) -> None:
    config = load_config(TierConfig, ROOT / "services" / f"tier_{tier}" / "config.toml")
    assert config.name == tier
    assert config.model_path == ROOT / "services" / f"tier_{tier}" / "model"


@pytest.mark.parametrize(
    ("max_running", "reserve", "critical", "running"),
    [(16, 0.0, 0, 16), (16, 0.25, 4, 20), (16, 0.1, 1, 17), (9, 0.1, 0, 9), (16, 1.0, 16, 32)],
)
def test_critical_slots_are_beyond_max_running(
    max_running: int, reserve: float, critical: int, running: int
) -> None:
    fields = {"name": "small", "model_path": "m", "max_running": max_running}
    config = build_config(TierConfig, {**fields, "critical_reserve": reserve})
    assert (config.critical_slots, config.running_slots) == (critical, running)


def test_shipped_router_config_loads() -> None:
    config = load_config(RouterConfig, ROOT / "services" / "router" / "config.toml")
    assert set(config.tiers) == {"small", "medium", "large"}
    assert (config.draft_tier, config.refine_tier) == ("small", "large")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "huge", "model_path": "m"}, "name"),
        ({"name": "small", "model_path": "m", "max_running": 0}, "max_running"),
        ({"name": "small", "model_path": "m", "max_wait_s": 0}, "max_wait_s"),
        ({"name": "small", "model_path": "m", "port": "80"}, "port"),
        ({"name": "small", "model_path": "m", "engine": "onnx"}, "engine"),
        ({"name": "small", "model_path": "m", "tokens_per_chunk": 100}, "tokens_per_chunk"),
        ({"name": "small", "model_path": "m", "colour": "red"}, "colour"),
        ({"name": "small", "model_path": "m", "critical_reserve": 1.5}, "critical_reserve"),
        ({"name": "small", "model_path": "m", "critical_reserve": -0.1}, "critical_reserve"),
    ],
)
def test_bad_tier_config_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(TierConfig, data)
    assert str(caught.value).startswith(f"{field}:")


def test_router_config_rejects_unconfigured_refine_tier() -> None:
    with pytest.raises(ConfigError, match="refine_tier"):
        build_config(RouterConfig, {"tiers": {"small": "a:1"}})


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tier.toml"
    path.write_text('name = "small"\nmodel_path = "m"\nmax_queued = -1\n')
    with pytest.raises(ConfigError) as caught:
        load_config(TierConfig, path)
    assert str(caught.value) == f"{path}: max_queued: must be >= 0"
    with pytest.raises(ConfigError, match="not found"):
        load_config(TierConfig, tmp_path / "missing.toml")
