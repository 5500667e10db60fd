"""vLLM tiers for a local mesh (`tiermesh run --engine TIER=vllm --model TIER=DIR`): the tier's
own config with `engine = "vllm"`, written to a file, and a command that starts it with the
interpreter of the environment holding vLLM (`make setup-vllm`) through the spawn-safe entry.

Knows tier config files and the tier command line; nothing of what the vllm engine does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from services.common.config import TierConfig
from services.common.config_loading import load_config, read_toml
from services.common.errors import ConfigError

CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding services/ and .venv-vllm
VLLM_VENV = ".venv-vllm"  # where `make setup-vllm` installs vLLM, in the checkout
PYTHON_ENV = "TIERMESH_VLLM_PYTHON"  # the interpreter, when the config names none


def vllm_python(config: TierConfig, environ: Mapping[str, str], checkout: Path) -> Path:
    """The interpreter a vLLM tier runs under: the config's vllm_python, else
    $TIERMESH_VLLM_PYTHON, else .venv-vllm/bin/python in the checkout."""
    named = config.vllm_python or environ.get(PYTHON_ENV, "")
    return Path(named) if named else checkout / VLLM_VENV / "bin" / "python"


def require_python(python: Path) -> Path:
    """The interpreter, if it is there; else a ConfigError naming `make setup-vllm`."""
    if not python.is_file():
        raise ConfigError(
            f'engine "vllm": no Python with vLLM at {python}; run `make setup-vllm` (or set '
            f"vllm_python in the tier's config, or ${PYTHON_ENV})"
        )
    return python


def write_vllm_config(tier_config: Path, out_dir: Path, model: Path) -> Path:
    """`tier_config` turned into the config of the tier's process on vLLM, serving `model`,
    in out_dir/<tier>-vllm.toml; keeps the tier's limits and any vLLM settings of its config.
    Raises ConfigError if the result is not valid."""
    data = read_toml(tier_config)
    data.update(engine="vllm", model_path=str(model.resolve()))
    name = str(data.get("name", tier_config.parent.name))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-vllm.toml"
    lines = [f"# written by the tiermesh launcher: tier {name} on vLLM"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in data.items()]
    path.write_text("\n".join(lines) + "\n")
    load_config(TierConfig, path)  # fails here, naming the field, rather than in the child
    return path


def vllm_tier_command(tier_config: Path, out_dir: Path, model: Path) -> list[str]:
    """The command line of a vLLM tier's process (port flags are added by the caller). Raises
    ConfigError naming `make setup-vllm` when the interpreter with vLLM is missing."""
    path = write_vllm_config(tier_config, out_dir, model)
    python = require_python(vllm_python(load_config(TierConfig, path), os.environ, CHECKOUT))
    command = [str(python), "-m", "services.tier.vllm_server", "--config", str(path)]
    return [*command, "--model", str(model)]
