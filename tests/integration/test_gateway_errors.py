"""gRPC failures of a real router seen through the gateway: RESOURCE_EXHAUSTED as 429 with
Retry-After, DEADLINE_EXCEEDED as 504, an unreachable router as 503; and the trace context and
authorization the gateway forwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from opentelemetry.trace import format_trace_id

from services.common.ports import free_port
from services.gateway.router_chat import call_metadata, start_span
from tests.integration.gateway_mesh import GatewayMesh

MESSAGES = [{"role": "user", "content": "What is your return policy?"}]
LONG = {"max_tokens": 400}


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: Path) -> Iterator[GatewayMesh]:
    mesh = GatewayMesh.start(
        tiny_model_dir,
        tiers=("small", "large"),
        tier_options=LONG,
        router_options={**LONG, "max_inflight": 1},
    )
    yield mesh
    mesh.stop()


def test_router_at_capacity_is_429_with_retry_after(gateway: GatewayMesh) -> None:
    body = {"model": "tiermesh-small", "messages": MESSAGES, "stream": True, "max_tokens": 400}
    url = f"{gateway.url}/v1/chat/completions"
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    with httpx.stream("POST", url, json=body) as held:
        assert held.status_code == 200  # the one chat the router admits, still streaming
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="tiermesh-small", messages=MESSAGES)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "1"
    assert "capacity" in caught.value.body["message"]
    assert caught.value.body["code"] == "resource_exhausted"


@pytest.mark.parametrize("stream", [False, True])
def test_one_refused_choice_fails_the_request_and_cancels_the_other(
    gateway: GatewayMesh, stream: bool
) -> None:
    before = gateway.wait_idle("small").completed
    body = {
        "model": "tiermesh-small",
        "messages": MESSAGES,
        "max_tokens": 400,
        "n": 2,
        "stream": stream,
    }
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30)
    # the router admits one chat at a time: one choice starts, the other is refused
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "resource_exhausted"
    status = gateway.wait_idle("small")
    assert status.running == 0
    assert status.completed == before, "the admitted choice ran on after the request failed"


def test_deadline_exceeded_is_504(gateway: GatewayMesh) -> None:
    assert gateway.mesh is not None
    url = gateway.extra_gateway(timeout_s=0.02)
    body = {"model": "tiermesh-small", "messages": MESSAGES, "max_tokens": 400}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    gateway.wait_idle("small")


def test_unreachable_router_is_503(gateway: GatewayMesh) -> None:
    closed = f"127.0.0.1:{free_port()}"  # nothing listens there
    url = gateway.extra_gateway(closed, timeout_s=5.0)
    body = {"model": "tiermesh-routed", "messages": MESSAGES, "stream": True}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_error"
    health = httpx.get(f"{url}/health", timeout=30)
    assert health.status_code == 503
    assert health.json()["router_status"] == "UNREACHABLE"


def test_trace_context_and_authorization_go_to_the_router() -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0aa9aa"
    headers = {
        "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
        "authorization": "Bearer k-123",
    }
    _span, context = start_span(headers, "tiermesh-small", "")
    metadata = dict(call_metadata(headers, context))
    assert metadata["authorization"] == "Bearer k-123"
    version, sent_trace_id, _parent, _flags = metadata["traceparent"].split("-")
    assert (version, sent_trace_id) == ("00", format_trace_id(int(trace_id, 16)))


def test_failure_after_the_stream_started_is_an_error_event(tiny_model_dir: Path) -> None:
    mesh = GatewayMesh.start(
        tiny_model_dir, tiers=("small", "large"), tier_options=LONG, router_options=LONG
    )
    try:
        assert mesh.mesh is not None
        small = mesh.mesh.tiers["small"]
        body = {"model": "tiermesh-small", "messages": MESSAGES, "stream": True, "max_tokens": 400}
        lines = []
        url = f"{mesh.url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=30) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                if len(lines) == 1:
                    mesh.run(small.stop(0))  # the tier goes away mid-answer
    finally:
        mesh.stop()
    events = [line.removeprefix("data: ") for line in lines if line]
    assert events[-1] != "[DONE]"
    error = json.loads(events[-1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] in ("unavailable", "cancelled", "internal", "unknown")
