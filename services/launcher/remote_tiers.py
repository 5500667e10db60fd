"""Remote tiers for a local mesh (`tiermesh run --model TIER=http://HOST:PORT/v1[,URL...]`):
each URL gets one tier process, running the tier's own config with `engine = "openai"` and that
server as its `remote_url`, written to a file the process is started with. The router balances
over a tier's processes as over any tier's replicas.

Knows tier config files and the tier command line; nothing of what the openai engine does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from services.common.config import TierConfig
from services.common.config_loading import load_config, read_toml


def write_remote_config(tier_config: Path, out_dir: Path, url: str, replica: int) -> Path:
    """`tier_config` turned into the config of the tier's process for the server at `url`
    (its `replica`-th, from 1), in out_dir/<tier>[-N]-openai.toml; keeps the tier's limits and
    any remote_* settings of its config. Raises ConfigError if the result is not valid."""
    data = read_toml(tier_config)
    data.update(engine="openai", remote_url=url)
    if "remote_ca_file" in data:  # relative to the tier's config file, not to the written one
        data["remote_ca_file"] = str(tier_config.parent / data["remote_ca_file"])
    name = str(data.get("name", tier_config.parent.name))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name if replica == 1 else f'{name}-{replica}'}-openai.toml"
    lines = [f"# written by the tiermesh launcher: tier {name} served by {url}"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in data.items()]
    path.write_text("\n".join(lines) + "\n")
    load_config(TierConfig, path)  # fails here, naming the field, rather than in the child
    return path


def remote_tier_commands(
    tier: str, tier_config: Path, out_dir: Path, urls: tuple[str, ...]
) -> list[list[str]]:
    """The command lines of a remote tier's processes, one per URL in order (port flags are
    added by the caller)."""
    return [
        [
            sys.executable,
            "-m",
            f"services.tier_{tier}",
            "--config",
            str(write_remote_config(tier_config, out_dir, url, replica)),
        ]
        for replica, url in enumerate(urls, start=1)
    ]
