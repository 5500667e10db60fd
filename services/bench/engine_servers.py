"""The children `tiermesh bench engine --engine ...` measures: an engine worker (torch or vllm, in
services.bench.engine_worker), a tier on vLLM over gRPC, and vLLM's own OpenAI server over HTTP
(`python -m vllm.entrypoints.openai.api_server`), each started, driven with the plan's bursts and
stopped in turn, with the resident memory of its process tree after each level.

Both servers get the same engine settings (services.bench.engine_worker.engine_config): room for
the largest level, the dtype, eager mode, the context, vLLM's KV-cache size and threads, prefix
caching on (both defaults). The tier gets each prompt as a chat and renders it itself; the OpenAI
server gets the token ids that rendering gives (`/v1/completions`), so both prefill the same ids.
Knows processes, the tier's gRPC contract and OpenAI's SSE chunks; no decisions.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import grpc
import httpx
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.bench.engine_bursts import Burst, Stream, level_from_bursts, timed_burst, tree_memory
from services.bench.engine_plan import LevelPlan
from services.bench.engine_worker import engine_config
from services.bench.sse_client import SsePool
from services.common.child_process import REPO_ROOT, Child, spawn, stop_process
from services.common.parent_watch import child_environment
from services.common.ports import free_port
from services.common.serving import NotServingError, wait_serving_async
from services.tier.vllm_args import engine_environment

Progress = Callable[[str], None]
LOAD_TIMEOUT_S = 600.0  # a vLLM process loads in ~30-70 s on 2 cores
SERVED_NAME = "bench"


class ChildFailed(RuntimeError):
    """A measured child did not start or did not finish; the message ends with its log."""


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def run_worker(
    python: Path, job: dict[str, Any], work: Path, progress: Progress
) -> dict[str, Any]:
    """An engine worker under `python`: its `result` object; its progress lines go to
    `progress`, its other output to work/<engine>.log."""
    name = job["engine"]
    job_file = work / f"{name}-job.json"
    job_file.write_text(json.dumps(job))
    log = work / f"{name}.log"
    with log.open("wb") as err:
        process = await asyncio.create_subprocess_exec(
            str(python),
            "-m",
            "services.bench.engine_worker",
            str(job_file),
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=REPO_ROOT,
            env=child_environment(os.environ),
        )
    result: dict[str, Any] | None = None
    assert process.stdout is not None
    try:
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            kind, _, rest = line.partition(" ")
            if kind == "progress":
                progress(rest)
            elif kind == "result":
                result = json.loads(rest)
        code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if code != 0 or result is None:
        raise ChildFailed(f"{name} worker exited with {code}; {log}:\n{_tail(log)}")
    return result


def _row(name: str, plan: LevelPlan, bursts: list[Burst], pid: int) -> dict[str, Any]:
    row = asdict(level_from_bursts(name, plan.concurrency, bursts[1:]))
    row.pop("linear_layout")
    row["outputs"] = [t.tokens for t in bursts[1].streams]
    memory = tree_memory(pid)
    row["rss_mb"] = round(memory["rss"] / 2**20, 1)
    row["rss_peak_mb"] = round(memory["hwm"] / 2**20, 1)
    return row


async def _drive(
    name: str,
    plans: Sequence[LevelPlan],
    stream: Callable[[str, str], Stream],
    pid: int,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Every level's bursts through `stream(request id, prompt)`: one row per level."""
    rows = []
    for plan in plans:
        progress(f"{name}: {plan.concurrency} streams")
        bursts = []
        for index, prompts in enumerate(plan.bursts):
            streams = [
                stream(f"{name}-{plan.concurrency}-{index}-{i}", p) for i, p in enumerate(prompts)
            ]
            bursts.append(await timed_burst(streams))
        rows.append(_row(name, plan, bursts, pid))
    return rows


def _write_toml(path: Path, values: dict[str, Any]) -> Path:
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()))
    return path


async def run_vllm_tier(
    python: Path, job: dict[str, Any], plans: Sequence[LevelPlan], work: Path, progress: Progress
) -> dict[str, Any]:
    """A tier on vLLM (services.tier.vllm_server) with the job's engine settings, each request
    a gRPC Generate of one user message (the tier's default chunking)."""
    config = engine_config({**job, "engine": "vllm"})
    port = free_port()
    values = {k: v for k, v in asdict(replace(config, port=port)).items() if _plain(v)}
    values["model_path"] = str(config.model_path)
    path = _write_toml(work / "vllm-tier.toml", values)
    command = [str(python), "-m", "services.tier.vllm_server", "--config", str(path)]
    child = Child("vllm-tier", f"127.0.0.1:{port}", command, work / "vllm-tier.log")
    progress(f"vllm-tier: loading {config.model_path}")
    started = time.perf_counter()
    child.start()
    try:
        try:
            await wait_serving_async(child.address, LOAD_TIMEOUT_S, exited=child.exited)
        except NotServingError as e:
            raise ChildFailed(f"vllm-tier: {e}\n{_tail(child.log_path)}") from None
        load_s = time.perf_counter() - started
        progress(f"vllm-tier: loaded in {load_s:.1f} s")
        async with grpc.aio.insecure_channel(child.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)

            def stream(request_id: str, prompt: str) -> Stream:
                async def chunks() -> AsyncIterator[list[int]]:
                    request = tier_pb2.GenerateRequest(
                        request_id=request_id,
                        messages=[common_pb2.ChatMessage(role="user", content=prompt)],
                        max_tokens=int(job["max_tokens"]),
                    )
                    async for chunk in stub.Generate(request):
                        yield list(chunk.token_ids)

                return chunks

            assert child.process is not None
            rows = await _drive("vllm-tier", plans, stream, child.process.pid, progress)
    finally:
        child.stop()
    return {"engine": "vllm-tier", "load_s": round(load_s, 2), "levels": rows}


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


async def _wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ChildFailed(f"exited with {process.returncode} before serving")
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise ChildFailed(f"not serving after {timeout_s:.0f} s")


def vllm_server_command(python: Path, job: dict[str, Any], port: int) -> list[str]:
    """vLLM's OpenAI server on the job's model with the tier's engine settings."""
    config = engine_config({**job, "engine": "vllm"})
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", str(config.model_path), "--served-model-name", SERVED_NAME]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", config.dtype]
    command += ["--max-num-seqs", str(config.max_running)]
    command += ["--max-model-len", str(config.max_model_len), "--disable-uvicorn-access-log"]
    if config.device == "cpu":
        command.append("--enforce-eager")
    return command


async def run_vllm_server(
    python: Path,
    job: dict[str, Any],
    plans: Sequence[LevelPlan],
    prompt_ids: Callable[[str], list[int]],
    eos: Sequence[int],
    work: Path,
    progress: Progress,
) -> dict[str, Any]:
    """vLLM's OpenAI server; each request a streamed `/v1/completions` of the prompt's token ids
    (greedy, the tier's end-of-sequence ids, `return_token_ids`, and each token's log-probability,
    `logprobs: 0`: what a tier asks vLLM for, its chunks carrying every token's)."""
    config = engine_config({**job, "engine": "vllm"})
    port = free_port()
    env = {**os.environ, **engine_environment(config, os.environ)}
    log = work / "vllm-server.log"
    progress(f"vllm-server: loading {config.model_path}")
    started = time.perf_counter()
    process = spawn(vllm_server_command(python, job, port), log, env=env)
    base = f"http://127.0.0.1:{port}"
    pool = SsePool(f"{base}/v1")
    try:
        try:
            await _wait_http(f"{base}/health", process, LOAD_TIMEOUT_S)
        except ChildFailed as e:
            raise ChildFailed(f"vllm-server: {e}\n{_tail(log)}") from None
        load_s = time.perf_counter() - started
        progress(f"vllm-server: loaded in {load_s:.1f} s")

        def stream(request_id: str, prompt: str) -> Stream:
            body = {
                "model": SERVED_NAME,
                "prompt": prompt_ids(prompt),
                "max_tokens": int(job["max_tokens"]),
                "temperature": 0.0,
                "stream": True,
                "return_token_ids": True,
                "logprobs": 0,
                "stop_token_ids": list(eos),
            }

            async def chunks() -> AsyncIterator[list[int]]:
                async for data in pool.post_events("/completions", body):
                    if data == "[DONE]":
                        break
                    choices = json.loads(data).get("choices") or [{}]
                    yield list(choices[0].get("token_ids") or [])

            return chunks

        rows = await _drive("vllm-server", plans, stream, process.pid, progress)
    finally:
        pool.close()
        stop_process(process)
    return {"engine": "vllm-server", "load_s": round(load_s, 2), "levels": rows}
