"""The gateway's HTTP surface with plain httpx and a raw socket: SSE framing, health, metrics, the
chat page, the revisions header, error bodies, the body size limit, and a client that leaves
(streamed or not) cancelling the router's work."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.common.tiers import TIER_NAMES
from services.gateway.chat_endpoint import MAX_BODY_BYTES
from tests.integration.gateway_mesh import GatewayMesh, module_gateway

MESSAGES = [{"role": "user", "content": "What is your return policy?"}]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[GatewayMesh]:
    yield from module_gateway(tmp_path_factory.mktemp("tiny-model-large"), tiny_model_dir)


def sse_events(response: httpx.Response) -> list[str]:
    """The data of each event; every event is exactly one `data: ` line and a blank line."""
    body = response.read().decode()
    assert body.endswith("\n\n")
    events = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        assert "\n" not in block
        events.append(block.removeprefix("data: "))
    return events


def test_sse_framing(gateway: GatewayMesh) -> None:
    body = {"model": "tiermesh-routed", "messages": MESSAGES, "stream": True, "max_tokens": 10}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all("tiermesh" not in c for c in chunks)


def _http_chunks(gateway: GatewayMesh, body: dict[str, object]) -> list[bytes]:
    """The chunks of a chunked HTTP/1.1 response as they were framed on the wire."""
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    received = b""
    with socket.create_connection((host, int(port)), timeout=30) as client:
        client.sendall(head + data)
        while part := client.recv(65536):
            received += part
    headers, rest = received.split(b"\r\n\r\n", 1)
    assert b"transfer-encoding: chunked" in headers.lower()
    chunks = []
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return chunks
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


def test_a_streamed_answer_is_written_in_few_pieces(gateway: GatewayMesh) -> None:
    body = {"model": "tiermesh-small", "messages": MESSAGES, "stream": True, "max_tokens": 10}
    chunks = _http_chunks(gateway, body)
    events = [[e for e in c.decode().split("\n\n") if e] for c in chunks]
    assert len(chunks) >= 2
    first, *middle, last = events
    # the role chunk goes out with the first content, not on its own
    assert [json.loads(e.removeprefix("data: "))["choices"][0]["delta"] for e in first] == [
        {"role": "assistant", "content": ""},
        {"content": json.loads(first[1].removeprefix("data: "))["choices"][0]["delta"]["content"]},
    ]
    assert all(len(piece) == 1 for piece in middle)  # one write per content delta
    # the finish chunk and [DONE] are one write (with the body's end)
    assert last[-1] == "data: [DONE]"
    finish = json.loads(last[-2].removeprefix("data: "))["choices"][0]
    assert (finish["finish_reason"], finish["delta"]) == ("length", {})


def test_revisions_header_opts_in(gateway: GatewayMesh) -> None:
    body = {"model": "tiermesh-progressive", "messages": MESSAGES, "stream": True}
    body["max_tokens"] = 8
    headers = {"X-Tiermesh-Revisions": "1"}
    url = f"{gateway.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers) as response:
        chunks = [json.loads(e) for e in sse_events(response)[:-1]]
    infos = [c["tiermesh"] for c in chunks if "tiermesh" in c]
    assert {i["revision"] for i in infos} == {0, 1}
    assert infos[-1]["final"] is True


def test_error_body_is_openai_shaped(gateway: GatewayMesh) -> None:
    body = {"model": "tiermesh-small", "messages": MESSAGES, "max_tokens": 0, "stream": True}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "max_tokens"
    not_json = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{oops")
    assert not_json.status_code == 400
    assert "JSON" in not_json.json()["error"]["message"]
    wrong_method = httpx.get(f"{gateway.url}/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert "POST" in wrong_method.json()["error"]["message"]
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("POST", "/v1/messages/count_tokens", 404, "not_found"),  # what Anthropic clients call
        ("GET", "/v1/embeddings", 404, "not_found"),
        ("POST", "/v1/models", 405, "method_not_allowed"),
    ],
)
def test_other_routes_answer_in_openai_shape(
    gateway: GatewayMesh, method: str, path: str, status: int, code: str
) -> None:
    response = httpx.request(method, f"{gateway.url}{path}", json={"model": "tiermesh-small"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["type"]) == (code, "invalid_request_error")
    assert path in error["message"]
    if status == 404:  # names what is served
        assert "POST /v1/chat/completions" in error["message"]
    else:
        assert response.headers["allow"] == "GET"


def test_health_metrics_and_page(gateway: GatewayMesh) -> None:
    health = httpx.get(f"{gateway.url}/health")
    assert health.status_code == 200
    assert health.json()["router_status"] == "SERVING"
    assert health.json()["status"] == "ok"
    assert health.json()["tiers"] == dict.fromkeys(TIER_NAMES, "SERVING")
    body = {"model": "tiermesh-small", "messages": MESSAGES, "max_tokens": 4}
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=body).status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'tiermesh_gateway_requests_total{model="tiermesh-small"' in metrics.text
    page = httpx.get(f"{gateway.url}/")
    assert page.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing external


@pytest.mark.parametrize("choices", [1, 2])
def test_client_leaving_cancels_the_router_call(gateway: GatewayMesh, choices: int) -> None:
    before = {tier: gateway.wait_idle(tier).completed for tier in ("small", "large")}
    body = {
        "model": "tiermesh-progressive",
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 400,
        "tiermesh": {"revisions": True},
        "n": choices,
    }
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # the first draft text: leave
    for tier in ("small", "large"):
        status = gateway.wait_idle(tier)
        assert status.running == 0
        assert status.completed == before[tier], f"{tier} finished instead of being cancelled"


def test_client_leaving_a_non_streamed_answer_cancels_it(gateway: GatewayMesh) -> None:
    before = gateway.wait_idle("large").completed
    body = json.dumps(
        {"model": "tiermesh-large", "messages": MESSAGES, "max_tokens": 400, "seed": 1}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port))) as client:
        client.sendall(head + body)
        deadline = time.monotonic() + 10
        while gateway.tier_status("large").running == 0:  # the answer is being generated
            assert time.monotonic() < deadline, "the large tier never started the answer"
            time.sleep(0.01)
    status = gateway.wait_idle("large")  # the client left with no byte of the answer read
    assert status.completed == before, "large finished the answer instead of being cancelled"


def test_a_body_over_the_limit_is_413(gateway: GatewayMesh) -> None:
    content = "x" * (MAX_BODY_BYTES + 1)
    body = {"model": "tiermesh-small", "messages": [{"role": "user", "content": content}]}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert gateway.tier_status("small").running == 0
