"""Echo tiers for a local mesh (`tiermesh run --engine echo`, `tiermesh bench sweep`): each
tier's own config with `engine = "echo"` (no model), the echo timing asked for, and limits wide
enough to load the router with a thousand streams, written to a file its process is started with.

Knows tier config files and the tier command line; nothing of what the echo engine does.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from services.common.config import TierConfig
from services.common.config_loading import load_config, read_toml


@dataclass(frozen=True)
class EchoSettings:
    """How every echo tier of the mesh answers."""

    ttft_ms: float = 10.0  # time to the first token
    tokens_per_s: float = 100.0  # per stream after the first token; 0 = as fast as it goes
    max_running: int = 2048  # streams at once per tier process
    max_queued: int = 512  # waiting beyond those; past it RESOURCE_EXHAUSTED


def write_echo_config(tier_config: Path, out_dir: Path, settings: EchoSettings) -> Path:
    """`tier_config` turned into an echo tier's config in out_dir/<tier>-echo.toml; raises
    ConfigError if the result is not a valid tier config."""
    data = read_toml(tier_config)
    data.update(
        engine="echo",
        model_path="echo",  # the echo engine loads no model
        max_running=settings.max_running,
        max_queued=settings.max_queued,
        echo_ttft_ms=float(settings.ttft_ms),
        echo_tokens_per_s=float(settings.tokens_per_s),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{data.get('name', tier_config.parent.name)}-echo.toml"
    lines = ["# written by the tiermesh launcher: an echo tier (no model)"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in data.items()]
    path.write_text("\n".join(lines) + "\n")
    load_config(TierConfig, path)  # fails here, naming the field, rather than in the child
    return path


def echo_tier_command(
    tier: str, tier_config: Path, out_dir: Path, settings: EchoSettings
) -> list[str]:
    """The command line of one echo tier process (port flags are added by the caller)."""
    path = write_echo_config(tier_config, out_dir, settings)
    return [sys.executable, "-m", f"services.tier_{tier}", "--config", str(path)]
