"""A remote tier's config (services/common/config.py TierConfig, engine "openai") and what its
engine checks before it reaches the server (services/tier/remote_server.py): one http(s) URL,
the API key's variable by name and set, the CA file there. Nothing is connected to."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.common.errors import ConfigError
from services.tier.factory import create_engine
from services.tier.openai_engine import OpenAiEngine
from services.tier.remote_server import RemoteServer

URL = "http://127.0.0.1:8000/v1"


def _config(**options: object) -> TierConfig:
    return build_config(
        TierConfig, {"name": "large", "model_path": "unused", "engine": "openai", **options}
    )


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({}, "remote_url"),
        ({"remote_url": "10.0.0.5:8000/v1"}, "remote_url"),
        ({"remote_url": "ftp://host/v1"}, "remote_url"),
        ({"remote_url": f"{URL},{URL}"}, "remote_url"),  # replicas: one process per URL
        ({"remote_url": "http://host:99999/v1"}, "remote_url"),
        ({"remote_url": URL, "remote_api_key_env": "NOT A NAME"}, "remote_api_key_env"),
    ],
)
def test_a_bad_remote_setting_is_named(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        _config(**options)


def test_the_factory_builds_the_remote_engine() -> None:
    config = _config(remote_url="https://vllm.internal/v1", remote_model="qwen")
    engine = create_engine(config)
    assert isinstance(engine, OpenAiEngine) and engine.name == "openai"
    assert engine.load().model == "qwen" and not engine.load().serving


async def test_the_api_key_and_ca_file_are_checked_before_connecting(tmp_path: Path) -> None:
    keyed = _config(remote_url=URL, remote_api_key_env="VLLM_KEY")
    with pytest.raises(ConfigError, match=r"remote_api_key_env: .*VLLM_KEY.* is not set"):
        RemoteServer.open(keyed, {})
    server = RemoteServer.open(keyed, {"VLLM_KEY": "secret"})
    assert (server.api, server.root) == (URL, "http://127.0.0.1:8000")
    await server.close()
    with pytest.raises(ConfigError, match="remote_ca_file: no file at"):
        RemoteServer.open(_config(remote_url=URL, remote_ca_file=str(tmp_path / "no.pem")), {})
