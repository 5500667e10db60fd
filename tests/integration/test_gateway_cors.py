"""Cross-origin access to a real gateway (real mesh, torch tiers) over plain HTTP: with an origin
configured, a preflight from it is answered with the methods and headers a chat client sends,
and the streamed answer carries Access-Control-Allow-Origin; another origin, or a gateway with
no origins configured, gets no CORS grant. The browser's side is in
tests/e2e/test_gateway_browser.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.common.config import GatewayConfig
from services.common.config_loading import build_config
from services.common.errors import ConfigError
from tests.integration.gateway_mesh import GatewayMesh

ROOT = Path(__file__).resolve().parents[2]
APP = "http://app.example:3000"
BODY = {
    "model": "tiermesh-small",
    "messages": [{"role": "user", "content": "What is your return policy?"}],
    "stream": True,
    "max_tokens": 8,
}


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: Path) -> Iterator[GatewayMesh]:
    mesh = GatewayMesh.start(tiny_model_dir, tiers=("small", "large"))
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def cors_url(gateway: GatewayMesh) -> str:
    return gateway.extra_gateway(cors_origins=(APP,))


def preflight(url: str, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        # as OpenAI's JavaScript SDK sends them: its x-stainless-* headers besides the key
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
    }
    return httpx.options(f"{url}/v1/chat/completions", headers=headers, timeout=10)


def test_a_preflight_from_a_configured_origin_is_granted(cors_url: str) -> None:
    answer = preflight(cors_url, APP)
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == APP
    assert "POST" in answer.headers["access-control-allow-methods"]
    allowed = answer.headers["access-control-allow-headers"].lower()
    assert {"authorization", "content-type", "x-stainless-os"} <= {
        h.strip() for h in allowed.split(",")
    }
    assert answer.headers["access-control-max-age"] == "600"


def test_the_streamed_answer_carries_the_grant(cors_url: str) -> None:
    headers = {"Origin": APP, "Authorization": "Bearer x"}
    with httpx.stream(
        "POST", f"{cors_url}/v1/chat/completions", json=BODY, headers=headers, timeout=30
    ) as response:
        body = response.read().decode()
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == APP
    assert "retry-after" in response.headers["access-control-expose-headers"].lower()
    assert body.rstrip().endswith("data: [DONE]")


def test_another_origin_gets_no_grant(cors_url: str) -> None:
    answer = preflight(cors_url, "http://evil.example")
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers
    plain = httpx.get(f"{cors_url}/v1/models", headers={"Origin": "http://evil.example"})
    assert plain.status_code == 200  # served, but the browser will not hand it to the page
    assert "access-control-allow-origin" not in plain.headers


def test_without_origins_there_is_no_cors_at_all(gateway: GatewayMesh) -> None:
    answer = preflight(gateway.url, APP)
    assert answer.status_code == 405  # no preflight handling: POST is the route's only method
    assert "access-control-allow-origin" not in answer.headers
    plain = httpx.get(f"{gateway.url}/v1/models", headers={"Origin": APP})
    assert "access-control-allow-origin" not in plain.headers


@pytest.mark.parametrize(
    "origin",
    [
        "app.example",
        "https://app.example/path",
        "ftp://x",
        "",
        "https://App.Example",  # browsers send lower case, and origins are compared exactly
        "https://app.example:99999",
        "https://user@app.example",
    ],
)
def test_a_malformed_origin_is_a_config_error(origin: str) -> None:
    with pytest.raises(ConfigError, match=r"cors_origins\[0\]"):
        build_config(GatewayConfig, {"cors_origins": [origin]})


def test_origins_as_browsers_send_them_are_accepted() -> None:
    origins = ["*", "https://app.example", "http://127.0.0.1:3000", "http://[::1]:8000"]
    assert build_config(GatewayConfig, {"cors_origins": origins}).cors_origins == tuple(origins)


def test_the_gateway_command_refuses_a_malformed_origin() -> None:
    command = [sys.executable, "-m", "services.gateway", "--port", "0", "--cors-origin", "app"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "cors_origins[0]: must be http(s)://host[:port]" in done.stderr
