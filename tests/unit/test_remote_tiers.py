"""`tiermesh run --engine TIER=openai --model TIER=URL[,URL]`: the options parsed
(services/launcher/run_options.py) and the plan (remote_tiers.py, local_mesh.py): one tier
process per URL, each started with a written config of `engine = "openai"` and its server,
all given to the router as the tier's replicas. Nothing is started."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.common.config import TierConfig
from services.common.config_loading import load_config
from services.common.errors import ConfigError
from services.launcher.echo_tiers import EchoSettings
from services.launcher.local_mesh import plan_children, tier_config_path
from services.launcher.run_options import (
    engine_option,
    model_overrides,
    remote_models,
    tier_engines,
)

A, B = "http://10.0.0.5:8000/v1", "https://vllm.internal/v1"


def test_engine_values() -> None:
    assert [engine_option(v) for v in ("model", "echo", "large=openai")] == [
        "model",
        "echo",
        "large=openai",
    ]
    for bad in ("vllm", "large=sglang", "huge=openai", "openai"):
        with pytest.raises(argparse.ArgumentTypeError):
            engine_option(bad)
    assert tier_engines([]) == ("model", set())
    assert tier_engines(["echo", "small=openai", "large=openai"]) == ("echo", {"small", "large"})
    with pytest.raises(SystemExit):
        tier_engines(["echo", "model"])


def test_urls_are_remote_models_and_folders_stay_models() -> None:
    values = [f"large={A},{B}", "small=models/mine", f"medium={A}"]
    assert remote_models(values, {"large"}) == {"large": (A, B), "medium": (A,)}
    assert model_overrides(values, remote=True) == {"small": Path("models/mine")}
    with pytest.raises(SystemExit, match="only tiermesh run"):
        model_overrides(values)  # a command that starts no remote tier refuses a URL
    with pytest.raises(SystemExit, match="needs --model small=http"):
        remote_models(values, {"small"})
    with pytest.raises(SystemExit, match="every server"):
        remote_models([f"large={A},models/x"], set())


def test_one_tier_process_per_url_each_with_its_server(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    children = plan_children(9000, {}, None, logs, echo=EchoSettings(), remotes={"large": (A, B)})
    names = [child.name for child in children]
    assert names[:4] == ["small", "medium", "large", "large-2"] and names[-1] == "router"
    first, second = children[2], children[3]
    configs = [Path(c.command[c.command.index("--config") + 1]) for c in (first, second)]
    assert [p.name for p in configs] == ["large-openai.toml", "large-2-openai.toml"]
    loaded = [load_config(TierConfig, path) for path in configs]
    assert [(c.engine, c.remote_url, c.name) for c in loaded] == [
        ("openai", A, "large"),
        ("openai", B, "large"),
    ]
    assert loaded[0].max_running == load_config(TierConfig, tier_config_path("large")).max_running
    assert "small-echo.toml" in " ".join(children[0].command)  # the others stay echo tiers
    assert f"large={first.address},{second.address}" in children[-1].command
    assert second.command[second.command.index("--metrics-port") + 1] == "0"


def test_replicas_of_a_remote_tier_come_from_its_urls(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one process per URL"):
        plan_children(
            9000, {}, None, tmp_path, echo=EchoSettings(), replicas={"large": 2},
            remotes={"large": (A,)},
        )  # fmt: skip
