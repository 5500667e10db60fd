"""Chooses and builds a tier's engine from its config; engines are imported lazily."""

from __future__ import annotations

import os

from services.common.config import TierConfig
from services.common.errors import ConfigError
from services.tier.engine import Engine


def create_engine(config: TierConfig) -> Engine:
    """The engine named by config.engine. Raises ConfigError if it cannot be used here."""
    if config.engine == "torch":
        from services.tier.torch_engine import TorchEngine

        return TorchEngine(config)
    if config.engine == "tensorrt_llm":
        from services.tier.tensorrt_llm_engine import TensorRtLlmEngine

        return TensorRtLlmEngine(config)
    if config.engine == "echo":
        from services.tier.echo_engine import EchoEngine

        return EchoEngine(config)
    if config.engine == "openai":
        from services.tier.openai_engine import OpenAiEngine

        return OpenAiEngine(config, os.environ)  # it reads the variable the config names
    if config.engine == "vllm":
        from services.tier.vllm_engine import VllmEngine

        return VllmEngine(config)
    raise ConfigError(f"engine: {config.engine!r} is not available in this build")
