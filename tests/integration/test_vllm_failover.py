"""Failover on vLLM: two vLLM replicas of the large tier (real tier processes on SmolLM2-135M,
CPU) behind a real router; one is SIGKILLed mid-answer, and the answer goes on in the same
revision on the other, which prefills the tokens already sent: with greedy decoding it is the
unbroken answer, token by token. The killed tier's vLLM engine core stops with it.

Two vLLM processes take about three minutes here on a 2-core machine, so the test runs only when
asked:

    TIERMESH_VLLM_FAILOVER=1 .venv/bin/python -m pytest tests/integration/test_vllm_failover.py
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, DeltaEvent, Event, FinalEvent, RevisionStartEvent
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.child_process import Child
from services.common.ports import free_port
from tests.integration.processes import spawn, wait_serving, write_toml
from tests.integration.vllm_env import smollm2, vllm_python

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.environ.get("TIERMESH_VLLM_FAILOVER") != "1",
        reason="two vLLM processes (minutes on 2 cores): set TIERMESH_VLLM_FAILOVER=1",
    ),
]

PROMPT = "Write a long story about a dragon who learns to cook."
MAX_TOKENS = 64
LOAD_S = 600.0
ORPHAN_GUARD_S = 60.0  # a bound on waiting for the killed tier's engine core to stop
ROUTER = {
    "draft_tier": "large",
    "refine_tier": "large",
    "max_tokens": 256,
    "load_watch_interval_ms": 100,
    "load_stale_ms": 5000,  # generous: two vLLM engines share this machine's two cores
    "stall_timeout_ms": 10000,
    "tier_call_timeout_s": 120.0,
}


def vllm_replica(work: Path, name: str, python: Path, model: Path) -> Child:
    port = free_port()
    config = {
        "name": "large",
        "engine": "vllm",
        "model_path": str(model),
        "dtype": "bfloat16",
        "port": port,
        "metrics_port": 0,
        "max_running": 2,
        "max_queued": 2,
        "max_tokens": 256,
        "max_model_len": 2048,
        "torch_threads": 1,  # two engines, two cores
        "cpu_kvcache_space_gib": 1,
    }
    path = write_toml(work / f"{name}.toml", config, {})
    command = [str(python), "-m", "services.tier.vllm_server", "--config", str(path)]
    child = Child(name, f"127.0.0.1:{port}", command, work / f"{name}.log")
    child.start()
    return child


async def answering(replicas: dict[str, Child]) -> Child:
    """The replica running a request now."""
    for child in replicas.values():
        async with grpc.aio.insecure_channel(child.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            status = await stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=5)
        if status.running:
            return child
    raise AssertionError(f"none of {list(replicas)} is running a request")


def descendants(pid: int) -> set[int]:
    """The processes under `pid` now (Linux: each one's parent from /proc/PID/stat)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # it ended while we looked
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    todo = [pid]
    while todo:
        pid = todo.pop()
        children = {child for child, parent in parents.items() if parent == pid}
        found |= children
        todo += children
    return found


def running_of(pids: set[int]) -> set[int]:
    """Those of `pids` still running (an exited one not yet reaped is a zombie: not running)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


async def test_a_vllm_replica_killed_mid_answer_is_continued_by_the_other(
    tmp_path: Path,
) -> None:
    python, model = vllm_python(), smollm2()
    replicas = {name: vllm_replica(tmp_path, name, python, model) for name in ("a", "b")}
    router: Child | None = None
    engine_core: set[int] = set()  # the killed tier's vLLM processes
    try:
        await asyncio.gather(*(wait_serving(child, LOAD_S) for child in replicas.values()))
        port = free_port()
        targets = ",".join(child.address for child in replicas.values())
        config = write_toml(
            tmp_path / "router.toml",
            {"port": port, "metrics_port": 0, "policy": "interim_heuristic", **ROUTER},
            {"tiers": {"large": targets}},
        )
        address = f"127.0.0.1:{port}"
        router = spawn("router", "services.router", ["--config", str(config)], address, tmp_path)
        await wait_serving(router)
        async with AsyncRouterClient(address) as client:
            reference = await client.chat(
                PROMPT, mode="pinned", tier="large", max_tokens=MAX_TOKENS, timeout=120
            )
            events: list[Event] = []
            killed: Child | None = None
            async for event in client.chat_stream(
                PROMPT, mode="pinned", tier="large", max_tokens=MAX_TOKENS, timeout=120
            ):
                events.append(event)
                if isinstance(event, DeltaEvent) and killed is None:
                    killed = await answering(replicas)
                    assert killed.process is not None
                    engine_core = descendants(killed.process.pid)
                    killed.signal(signal.SIGKILL)
        deadline = asyncio.get_running_loop().time() + ORPHAN_GUARD_S
        while running_of(engine_core):  # told by Linux that the tier died, they stop
            assert asyncio.get_running_loop().time() < deadline, "vLLM outlived its tier"
            await asyncio.sleep(0.2)
    finally:
        for child in (*replicas.values(), *([router] if router else [])):
            child.stop()
        for pid in running_of(engine_core):  # after a failure above: leave nothing behind
            os.kill(pid, signal.SIGKILL)
    starts = [e for e in events if isinstance(e, RevisionStartEvent)]
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.tier == "large", kinds(events)
    assert [(s.revision, s.tier) for s in starts] == [(0, "large")]
    answer = [e for e in events if isinstance(e, DeltaEvent)]
    assert "".join(e.text for e in answer) == final.text == reference.text
    tokens = [t for e in answer for t in e.token_ids]
    reference_deltas = [e for e in reference.events if isinstance(e, DeltaEvent)]
    assert tokens == [t for e in reference_deltas for t in e.token_ids]
    assert len(tokens) == MAX_TOKENS  # the kill came before the end: the rest was continued
    assert "another large replica continued revision 0" in final.reason, final.reason
    assert engine_core  # there was an engine core to stop (and it stopped, above)
