"""Cold start: a real tier process started with lazy (memory-mapped) and with eager weight
loading gives the same greedy output, and reports its start-up breakdown in GetStatus."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.child_process import Child
from services.common.ports import free_port
from tests.integration.processes import spawn, wait_serving, write_toml

pytestmark = pytest.mark.timeout(600)  # two tier processes on a busy 2-core machine


def start_tier_process(model: Path, work_dir: Path, loading: str) -> Child:
    port = free_port()
    config = {
        "name": "small",
        "model_path": str(model),
        "port": port,
        "metrics_port": 0,
        "max_running": 2,
        "weights_loading": loading,
    }
    path = write_toml(work_dir / f"tier-{loading}.toml", config, {})
    return spawn(
        f"tier-{loading}",
        "services.tier_small",
        ["--config", str(path)],
        f"127.0.0.1:{port}",
        work_dir,
    )


async def greedy_and_status(address: str) -> tuple[list[int], tier_pb2.TierStatus]:
    request = tier_pb2.GenerateRequest(
        request_id="cold-start",
        prompt="What is your return policy?",
        max_tokens=16,
        sampling=common_pb2.SamplingParams(temperature=0),
    )
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        tokens = [t async for chunk in stub.Generate(request) for t in chunk.token_ids]
        status = await stub.GetStatus(tier_pb2.GetStatusRequest())
    return tokens, status


async def test_lazy_and_eager_loading_answer_alike_and_report_start_up(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    services = {
        loading: start_tier_process(tiny_model_dir, tmp_path, loading)
        for loading in ("lazy", "eager")
    }
    try:
        results = {}
        for loading, service in services.items():
            await wait_serving(service)
            results[loading] = await greedy_and_status(service.address)
    finally:
        for service in services.values():
            service.stop()
    assert results["lazy"][0] == results["eager"][0]
    assert len(results["lazy"][0]) > 0
    for loading, (_, status) in results.items():
        phases = {phase.name: phase.seconds for phase in status.startup_phases}
        expected = ["imports", "model_code", "weights", "weight_layout", "kv_pool", "warm_up"]
        expected.append("heap_freeze")
        assert list(phases) == expected, phases
        assert all(seconds >= 0 for seconds in phases.values())
        assert status.startup_s >= sum(phases.values()) - 0.05, (status.startup_s, phases)
        assert status.weights_loading == loading
        assert "SERVING after" in services[loading].log_path.read_text()
