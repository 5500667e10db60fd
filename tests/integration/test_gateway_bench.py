"""`tiermesh bench --target openai` pieces against a real gateway and router: the open-loop run
reports TTFT, ITL, TPOT and E2E per model, and the overhead comparison reads both sides."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.bench.openai_target import gateway_overhead, run_openai
from services.bench.scenarios import build_scenario
from tests.integration.gateway_mesh import GatewayMesh, module_gateway


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
