"""`tiermesh bench engine --engine torch,vllm[,vllm-tier,vllm-server]`: engines side by side in
one run, on one model, under the same seeded requests.

Sequential Hugging Face `generate` runs first in this process, on every level's checked burst:
its rows are the baseline and its greedy ids the reference. Then each engine runs in a child
process of its own, one after the other (so none competes with another for the CPUs): torch and
vllm through the tier's engine interface (services.bench.engine_worker, vllm under the
interpreter of `.venv-vllm`), vllm-tier as a tier process over gRPC and vllm-server as vLLM's own
OpenAI server over HTTP (services.bench.engine_servers). The report has the default report's
fields, with per row the resident memory of the process serving it and how many streams' greedy
ids equal `generate`'s, and the ratios of services.bench.engine_plan.engine_ratios.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from services.bench.engine_bench import bandwidth_bound, in_own_thread, report_head, run_generate
from services.bench.engine_bursts import LevelResult
from services.bench.engine_plan import (
    VLLM_ENGINES,
    LevelPlan,
    engine_ratios,
    plan_levels,
    streams_matching,
)
from services.bench.engine_servers import run_vllm_server, run_vllm_tier, run_worker
from services.tier.model_loading import LoadedModel, imported_dtype, load_causal_lm
from services.tier.tokenizer_loading import encode_prompt, render_prompt
from services.workload import load_split

Progress = Callable[[str], None]
MAX_PROMPT_TOKENS = 256  # the workload's prompts are under 64 tokens with the chat template
MAX_MODEL_LEN = 2048


def _quiet(text: str) -> None:
    pass


def _reference(
    loaded: LoadedModel, plans: list[LevelPlan], max_tokens: int, progress: Progress
) -> dict[int, LevelResult]:
    # one short untimed answer first: the first call pays for pages and kernels it alone meets
    in_own_thread(run_generate, loaded, 1, 2, plans[0].checked[:1])
    out = {}
    for plan in plans:
        progress(f"{plan.concurrency} streams: sequential generate")
        out[plan.concurrency] = in_own_thread(
            run_generate, loaded, plan.concurrency, max_tokens, plan.checked, True
        )
    return out


def _engine_rows(
    result: dict[str, Any], reference: dict[int, LevelResult], eos: frozenset[int]
) -> list[dict[str, Any]]:
    rows = []
    for level in result["levels"]:
        row = dict(level)
        outputs = row.pop("outputs")
        expected = reference[row["concurrency"]].outputs or []
        matching = streams_matching(outputs, expected, eos)
        row["matches_generate"] = matching == len(expected)
        row["streams_matching_generate"] = matching
        row["load_s"] = result["load_s"]
        rows.append(row)
    return rows


def _generate_row(level: LevelResult) -> dict[str, Any]:
    row = asdict(level)
    row.pop("outputs")
    row.pop("linear_layout")
    row.update(matches_generate=True, streams_matching_generate=level.concurrency)
    row.update(rss_mb=None, rss_peak_mb=None, load_s=None)  # in the bench's own process
    return row


def run_engines_bench(
    model: Path,
    engines: list[str],
    levels: list[int],
    max_tokens: int,
    vllm_python: Path,
    rounds: int = 3,
    seed: int = 0,
    dtype: str | None = None,
    kv_cache_gib: float = 1.0,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Runs `engines` at each level; the report. Raises ChildFailed when a child fails."""
    model = model.resolve()
    dtype = dtype or imported_dtype(model) or "float32"
    prompts = [item.prompt for item in load_split("test")]
    plans = plan_levels(prompts, levels, rounds, seed)
    threads = torch.get_num_threads()
    progress(f"loading {model} for sequential generate")
    loaded = in_own_thread(load_causal_lm, model, "cpu", dtype)
    reference = _reference(loaded, plans, max_tokens, progress)
    eos = frozenset(loaded.eos_token_ids)
    job: dict[str, Any] = {
        "model": str(model),
        "dtype": dtype,
        "max_running": max(levels),
        "max_tokens": max_tokens,
        "max_prompt_tokens": MAX_PROMPT_TOKENS,
        "max_model_len": MAX_MODEL_LEN,
        "threads": threads,
        "kv_cache_gib": kv_cache_gib,
        "levels": [p.to_json() for p in plans],
    }

    def ids(prompt: str) -> list[int]:
        return encode_prompt(loaded.tokenizer, render_prompt(loaded.tokenizer, [("user", prompt)]))

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tiermesh-bench-engine-") as folder:
        work = Path(folder)
        for engine in engines:
            python = vllm_python if engine in VLLM_ENGINES else Path(sys.executable)
            if engine in ("torch", "vllm"):
                run = run_worker(python, {**job, "engine": engine}, work, progress)
            elif engine == "vllm-tier":
                run = run_vllm_tier(python, job, plans, work, progress)
            else:
                run = run_vllm_server(python, job, plans, ids, sorted(eos), work, progress)
            results[engine] = asyncio.run(run)
    rows: list[dict[str, Any]] = []
    for level in levels:
        for engine in engines:
            rows += [
                r
                for r in _engine_rows(results[engine], reference, eos)
                if r["concurrency"] == level
            ]
        rows.append(_generate_row(reference[level]))
    return _report(model, loaded, dtype, max_tokens, rounds, levels, rows, results) | {
        "engines": engines,
        "seed": seed,
        "prompts": "the workload's test split, distinct prompts in a seeded order",
        "max_running": max(levels),
        "kv_cache_gib": kv_cache_gib,
        "vllm_python": str(vllm_python) if VLLM_ENGINES & set(engines) else "",
        **engine_ratios(rows, levels),
    }


def _report(
    model: Path,
    loaded: LoadedModel,
    dtype: str,
    max_tokens: int,
    rounds: int,
    levels: list[int],
    rows: list[dict[str, Any]],
    results: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The default report's fields, for the torch rows (empty where torch did not run)."""
    by = {(r["engine"], r["concurrency"]): r for r in rows}
    torch1 = by.get(("torch", levels[0]))
    batch1 = None
    if torch1 is not None and torch1["concurrency"] == 1:
        batch1 = LevelResult(
            **{k: torch1[k] for k in LevelResult.__dataclass_fields__ if k in torch1}
        )
    layout = results.get("torch", {}).get("linear_layout", "")
    report: dict[str, Any] = {
        **report_head(model, loaded.params, dtype, max_tokens, layout, rounds, levels),
        "rows": rows,
        "skipped": {},
        "bandwidth": in_own_thread(bandwidth_bound, loaded, batch1),
    }
    for level in levels:
        ours, base = by.get(("torch", level)), by.get(("hf_generate", level))
        if ours and base:
            report[f"ratio_vs_generate_at_{level}"] = round(
                ours["tokens_per_s"] / base["tokens_per_s"], 3
            )
        if ours and torch1 and torch1["ttft_ms_p99"] > 0:
            report[f"ttft_p99_ratio_at_{level}"] = round(
                ours["ttft_ms_p99"] / torch1["ttft_ms_p99"], 3
            )
    return report
