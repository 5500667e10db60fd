"""`python -m services.bench.engine_worker JOB.json`: one tier engine (torch, or vllm from the
interpreter of `.venv-vllm`) in a process of its own, driven through the tier's engine interface
(`generate` -> chunks) with the bursts of `bench engine --engine`'s plan, level after level.

Prints `progress <text>` lines while it runs and one `result <json>` line at the end: per level
the row, the checked burst's token ids (in request order) and the resident memory of this process
with its children (vLLM's engine core is one). Spawn-safe (vLLM spawns its engine core, which
imports this module again): nothing runs on import. Knows the engine interface; nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from services.bench.engine_bursts import Burst, Stream, level_from_bursts, timed_burst, tree_memory
from services.bench.engine_plan import LevelPlan
from services.common.config import TierConfig
from services.common.parent_watch import stop_with_parent
from services.tier.engine import Engine, GenerationRequest
from services.tier.factory import create_engine


def engine_config(job: dict[str, Any]) -> TierConfig:
    """The tier config every engine of the bench is built from: room for the largest level at
    once (no queue), the job's dtype, threads and vLLM KV-cache size; the rest a tier's defaults
    (the torch engine's compute threads `compute_nice` below its event loop unless the job says
    otherwise: at 64 streams on 2 cores, the same priority cut its tokens/s 5x)."""
    config = TierConfig(
        name="large",
        model_path=Path(job["model"]),
        engine=job["engine"],
        dtype=job["dtype"],
        max_running=int(job["max_running"]),
        max_queued=0,
        max_tokens=int(job["max_tokens"]),
        max_prompt_tokens=int(job["max_prompt_tokens"]),
        torch_threads=int(job["threads"]),
        max_model_len=int(job["max_model_len"]),
        cpu_kvcache_space_gib=float(job["kv_cache_gib"]),
    )
    if "compute_nice" in job:
        return replace(config, compute_nice=int(job["compute_nice"]))
    return config


def _progress(text: str) -> None:
    print(f"progress {text}", flush=True)


def _stream(engine: Engine, request: GenerationRequest) -> Stream:
    async def chunks() -> AsyncIterator[list[int]]:
        async for chunk in engine.generate(request):
            yield list(chunk.token_ids)

    return chunks


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Starts the engine, runs every level's bursts, stops it; the `result` object."""
    name = job["engine"]
    started = time.perf_counter()
    _progress(f"{name}: loading {job['model']}")
    engine = create_engine(engine_config(job))
    await engine.start()
    load_s = time.perf_counter() - started
    _progress(f"{name}: loaded in {load_s:.1f} s")
    levels = []
    try:
        for plan in (LevelPlan.from_json(p) for p in job["levels"]):
            _progress(f"{name}: {plan.concurrency} streams")
            bursts: list[Burst] = []
            for index, prompts in enumerate(plan.bursts):
                requests = [
                    GenerationRequest(
                        request_id=f"{name}-{plan.concurrency}-{index}-{i}",
                        messages=(("user", prompt),),
                        max_tokens=int(job["max_tokens"]),
                    )
                    for i, prompt in enumerate(prompts)
                ]
                bursts.append(await timed_burst([_stream(engine, r) for r in requests]))
            row = asdict(level_from_bursts(name, plan.concurrency, bursts[1:]))
            row.pop("linear_layout")
            row["outputs"] = [t.tokens for t in bursts[1].streams]
            memory = tree_memory(os.getpid())
            row["rss_mb"] = round(memory["rss"] / 2**20, 1)
            row["rss_peak_mb"] = round(memory["hwm"] / 2**20, 1)
            levels.append(row)
    finally:
        await engine.shutdown()
    layout = getattr(engine, "linear_layout", None)
    return {
        "engine": name,
        "load_s": round(load_s, 2),
        "linear_layout": layout.label if layout is not None else "",
        "levels": levels,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m services.bench.engine_worker JOB.json", file=sys.stderr)
        return 2
    stop_with_parent()
    job = json.loads(Path(argv[0]).read_text())
    result = asyncio.run(run_job(job))
    print(f"result {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
