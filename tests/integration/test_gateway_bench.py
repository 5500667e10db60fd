"""`tiermesh bench --target openai` pieces against a real gateway and router: the open-loop run
reports TTFT, ITL, TPOT and E2E per model, the overhead comparison reads both sides (and a bare
relay's, run in its own process, which relays the same answer), and its lean SSE client keeps
one connection alive and reports HTTP statuses."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.bench.openai_target import gateway_overhead, run_openai
from services.bench.relay_floor import relay_floor
from services.bench.scenarios import build_scenario
from services.bench.sse_client import HttpStatusError, SseConnection
from tests.integration.gateway_mesh import GatewayMesh, module_gateway

MESSAGES = [{"role": "user", "content": "What is your return policy?"}]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[GatewayMesh]:
    yield from module_gateway(tmp_path_factory.mktemp("tiny-model-large"), tiny_model_dir)


def test_open_loop_against_the_gateway(gateway: GatewayMesh) -> None:
    scenario = build_scenario("long-tail", rate_rps=4.0, duration_s=3.0, warmup_s=0.5, seed=3)
    models = ["tiermesh-small", "tiermesh-progressive"]
    report = asyncio.run(run_openai(f"{gateway.url}/v1", models, scenario, 16, 30.0, 16))
    assert report["target"] == "openai" and list(report["models"]) == models
    for numbers in report["models"].values():
        assert numbers["requests"]["completed"] >= 1
        assert numbers["requests"]["errors"] == {}
        for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(numbers[metric]) == {"p50", "p90", "p99"}
        assert numbers["ttft_ms"]["p50"] <= numbers["e2e_ms"]["p99"]
        assert numbers["output_tokens_per_s"] > 0


def test_overhead_compares_gateway_and_router(gateway: GatewayMesh) -> None:
    assert gateway.mesh is not None
    overhead = asyncio.run(
        gateway_overhead(
            f"{gateway.url}/v1", gateway.mesh.address, "tiermesh-small", 8, 30.0, 1.5, 0, (1, 2)
        )
    )
    assert [level["streams"] for level in overhead["levels"]] == [1, 2]
    for level in overhead["levels"]:
        assert level["grpc"]["requests"]["completed"] >= 1
        assert level["gateway"]["requests"]["completed"] >= 1
        assert level["tokens_per_s_ratio"] is not None
        assert level["ttft_added_ms"]["p50"] is not None
    assert overhead["http_client"].startswith("lean")


async def _streamed_text(url: str, model: str) -> str:
    connection = SseConnection(url)
    body = {"model": model, "messages": MESSAGES, "stream": True, "max_tokens": 12}
    chunks = [json.loads(d) async for d in connection.post_events("/chat/completions", body)
              if d != "[DONE]"]  # fmt: skip
    connection.close()
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


def test_the_relay_floor_relays_the_same_answer_and_is_timed_beside_the_gateway(
    gateway: GatewayMesh,
) -> None:
    assert gateway.mesh is not None
    with relay_floor(gateway.mesh.address) as floor_url:
        relayed = asyncio.run(_streamed_text(floor_url, "tiermesh-small"))
        overhead = asyncio.run(
            gateway_overhead(
                f"{gateway.url}/v1", gateway.mesh.address, "tiermesh-small", 8, 30.0, 1.0, 0,
                (1,), floor_url=floor_url,
            )
        )  # fmt: skip
    assert relayed and relayed == asyncio.run(_streamed_text(f"{gateway.url}/v1", "tiermesh-small"))
    level = overhead["levels"][0]
    floor = level["relay_floor"]
    assert floor["requests"]["completed"] >= 1 and floor["requests"]["errors"] == {}
    assert floor["output_tokens_per_s"] > 0  # its usage chunk counted the tokens
    for key in ("floor_ttft_added_ms", "gateway_over_floor_ms"):
        assert level[key]["p50"] is not None
    expected = round(level["gateway"]["ttft_ms"]["p50"] - floor["ttft_ms"]["p50"], 2)
    assert level["gateway_over_floor_ms"]["p50"] == pytest.approx(expected, abs=0.011)


def test_lean_sse_client_reuses_its_connection_and_reports_statuses(gateway: GatewayMesh) -> None:
    async def run() -> tuple[list[list[str]], set[object], int]:
        connection = SseConnection(f"{gateway.url}/v1")
        answers, sockets = [], set()
        for _ in range(3):
            body = {"model": "tiermesh-small", "messages": MESSAGES, "stream": True}
            body["max_tokens"] = 4
            answers.append(
                [data async for data in connection.post_events("/chat/completions", body)]
            )
            assert connection._writer is not None
            sockets.add(connection._writer.get_extra_info("sockname"))
        with pytest.raises(HttpStatusError) as refused:
            bad = {"model": "tiermesh-small", "messages": MESSAGES, "max_tokens": 0}
            async for _ in connection.post_events("/chat/completions", bad):
                pass
        assert b"max_tokens" in refused.value.body
        connection.close()
        return answers, sockets, refused.value.status

    answers, sockets, status = asyncio.run(run())
    for events in answers:
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len(sockets) == 1  # one keep-alive connection served the three answers
    assert status == 400


def test_relay_floor_without_a_router_is_refused_before_any_load() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "--target", "openai"]
        + ["--url", "http://127.0.0.1:9/v1", "--model", "tiermesh-small", "--relay-floor"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "--relay-floor needs --router" in run.stdout + run.stderr
