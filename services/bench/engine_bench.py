"""`tiermesh bench engine`: the torch engine's continuous batching against sequential Hugging
Face `generate` (and transformers' own continuous batching when it runs), side by side in one
run at several concurrency levels, on one model, in this process.

Reports tokens/s, TTFT p50/p99 and time per output token per level, the engine's TTFT p99 at
each level over its first level's (batch 1 when the levels start at 1), and the batch-1 decode
rate against the memory-bandwidth bound. A folder written by `tiermesh models import` runs in
the dtype it was imported in (as a tier serves it), any other in float32, unless a dtype is
given. Knows torch and the engine; nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch

from services.bench.engine_bursts import LevelResult
from services.bench.engine_bursts import level_result as _level
from services.common.config import TierConfig
from services.tier.engine import GenerationRequest
from services.tier.linear_kernels import LINEAR_LAYOUT_ENV
from services.tier.model_loading import LoadedModel, imported_dtype, load_causal_lm
from services.tier.tokenizer_loading import encode_prompt, render_prompt
from services.tier.torch_engine import TorchEngine

T = TypeVar("T")

DEFAULT_PROMPTS = [
    "What is your return policy?",
    "How much does the blue kettle cost?",
    "Do you ship to Canada?",
    "How much are 3 mugs?",
    "Can I change my delivery address?",
    "What payment methods do you accept?",
]


def prompt_ids(loaded: LoadedModel, n: int, prompts: list[str]) -> list[list[int]]:
    texts = [prompts[i % len(prompts)] for i in range(n)]
    return [
        encode_prompt(loaded.tokenizer, render_prompt(loaded.tokenizer, [("user", t)]))
        for t in texts
    ]


async def run_ours(
    model: Path,
    concurrency: int,
    max_tokens: int,
    prompts: list[str],
    dtype: str = "float32",
    rounds: int = 3,
) -> LevelResult:
    """`concurrency` requests at once, `rounds` times after one untimed warm-up burst (so the
    first timed request meets no first-call costs of its shapes); TTFT and TPOT over every timed
    request, tokens/s over the timed rounds' time."""
    config = TierConfig(
        name="large",
        model_path=model,
        dtype=dtype,
        max_running=concurrency,
        max_queued=0,
        max_tokens=max_tokens,
        torch_threads=torch.get_num_threads(),
    )
    engine = TorchEngine(config)
    await engine.start()

    async def burst(round_: int) -> tuple[list[tuple[int, float, float]], float, list[list[int]]]:
        requests = [
            GenerationRequest(
                request_id=f"b{round_}-{i}", messages=(("user", p),), max_tokens=max_tokens
            )
            for i, p in enumerate(prompts[i % len(prompts)] for i in range(concurrency))
        ]
        outputs: list[list[int]] = []
        start = time.perf_counter()

        async def one(request: GenerationRequest) -> tuple[int, float, float]:
            first = last = 0.0
            tokens: list[int] = []
            async for chunk in engine.generate(request):
                now = time.perf_counter() - start
                if not tokens:
                    first = now
                last = now
                tokens.extend(chunk.token_ids)
            outputs.append(tokens)
            return len(tokens), first, last

        results = await asyncio.gather(*(one(r) for r in requests))
        return results, time.perf_counter() - start, outputs

    try:
        await burst(0)  # warm-up, not timed
        timed = [await burst(r + 1) for r in range(rounds)]
    finally:
        await engine.shutdown()
    results = [r for round_results, _, _ in timed for r in round_results]
    tokens = sum(r[0] for r in results)
    seconds = sum(s for _, s, _ in timed)
    tpots = [(r[2] - r[1]) / (r[0] - 1) * 1000 for r in results if r[0] > 1]
    level = _level("tiermesh", concurrency, tokens, seconds, [r[1] * 1000 for r in results], tpots)
    level.outputs = sorted(timed[0][2])
    level.linear_layout = engine.linear_layout
    return level


class _FirstTokenTimer:
    """A transformers streamer that notes when the first generated token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None
        self.last = 0.0

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()
        self.last = time.perf_counter()

    def end(self) -> None:
        self.last = time.perf_counter()


def run_generate(
    loaded: LoadedModel,
    concurrency: int,
    max_tokens: int,
    prompts: list[str],
    keep_order: bool = False,
) -> LevelResult:
    """All requests arrive at once; HF generate serves them one after another (greedy). The
    outputs are sorted, or in the requests' order with `keep_order`."""
    ids = prompt_ids(loaded, concurrency, prompts)
    start = time.perf_counter()
    firsts, tpots, tokens, outputs = [], [], 0, []
    with torch.inference_mode():
        for prompt in ids:
            timer = _FirstTokenTimer()
            out = loaded.model.generate(
                torch.tensor([prompt], device=loaded.device),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=loaded.device),
                max_new_tokens=max_tokens,
                do_sample=False,
                streamer=timer,
                pad_token_id=next(iter(loaded.eos_token_ids), 0),
            )
            n = out.shape[1] - len(prompt)
            generated = out[0, len(prompt) :].tolist()
            eos = loaded.eos_token_ids
            outputs.append(
                generated[: next((i + 1 for i, t in enumerate(generated) if t in eos), n)]
            )
            tokens += n
            first = timer.first or timer.last
            firsts.append((first - start) * 1000)
            if n > 1:
                tpots.append((timer.last - first) / (n - 1) * 1000)
    level = _level("hf_generate", concurrency, tokens, time.perf_counter() - start, firsts, tpots)
    level.outputs = outputs if keep_order else sorted(outputs)
    return level


def run_transformers_batching(
    loaded: LoadedModel, concurrency: int, max_tokens: int, prompts: list[str]
) -> LevelResult | str:
    """transformers' generate_batch (continuous batching); returns why if it cannot run.

    It returns whole results, so TTFT is not observable: reported as the total time."""
    from transformers import GenerationConfig

    ids = prompt_ids(loaded, concurrency, prompts)
    try:
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=next(iter(loaded.eos_token_ids), None),
            pad_token_id=0,
        )
        start = time.perf_counter()
        outputs = loaded.model.generate_batch(
            inputs=ids, generation_config=config, progress_bar=False
        )
        seconds = time.perf_counter() - start
    except Exception as e:  # report, do not fail the benchmark
        return f"{type(e).__name__}: {e}"[:200]
    tokens = sum(len(o.generated_tokens) for o in outputs.values())
    level = _level("hf_generate_batch", concurrency, tokens, seconds, [seconds * 1000], [])
    level.outputs = sorted(list(o.generated_tokens) for o in outputs.values())
    return level


def _row(result: LevelResult, reference: LevelResult | None) -> dict[str, Any]:
    """A report row; `matches_generate` says whether its greedy outputs equal HF generate's."""
    row = asdict(result)
    outputs = row.pop("outputs")
    row.pop("linear_layout")  # one per report, not per row
    row["matches_generate"] = reference is not None and outputs == reference.outputs
    return row


def memory_bandwidth_gbs(megabytes: int = 256) -> float:
    """Measured copy bandwidth (bytes read + written per second), best of 5."""
    source = torch.ones(megabytes * 1024 * 1024 // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best / 1e9


def bandwidth_bound(loaded: LoadedModel, batch1: LevelResult | None) -> dict[str, float]:
    """The batch-1 rates against the memory-bandwidth bound: `batch1_tokens_per_s` over the
    whole request (prefill included), `batch1_decode_tokens_per_s` over its decode steps alone
    (first token to last, one token a step); 0 without a batch-1 level."""
    bandwidth = memory_bandwidth_gbs()
    bound = bandwidth * 1e9 / loaded.weights_bytes
    whole = batch1.tokens_per_s if batch1 else 0.0
    decode = 1000 / batch1.tpot_ms if batch1 and batch1.tpot_ms > 0 else 0.0
    return {
        "copy_bandwidth_gb_s": round(bandwidth, 2),
        "weights_bytes": loaded.weights_bytes,
        "bound_tokens_per_s": round(bound, 1),
        "batch1_tokens_per_s": round(whole, 1),
        # three significant digits: a tiny model's share of its bound is a small number
        "fraction_of_bound": float(f"{whole / bound:.3g}"),
        "batch1_decode_tokens_per_s": round(decode, 1),
        "decode_fraction_of_bound": float(f"{decode / bound:.3g}"),
    }


def in_own_thread(function: Callable[..., T], *args: Any) -> T:
    """Runs `function` on a thread that ends with it. Each thread issuing torch ops gets its
    own OpenMP team; a team left alive on another thread would slow the engine under test."""
    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(function, *args).result()


@contextmanager
def _same_layout(rows: list[LevelResult]) -> Iterator[None]:
    """Every level after the first runs the linear layout the first one measured (each level
    starts its own engine, which would time the layouts again and could pick the other)."""
    first = next((r.linear_layout for r in rows if r.linear_layout), None)
    if first is None or LINEAR_LAYOUT_ENV in os.environ:
        yield
        return
    os.environ[LINEAR_LAYOUT_ENV] = first.layout
    try:
        yield
    finally:
        del os.environ[LINEAR_LAYOUT_ENV]


def report_head(
    model: Path,
    params: int,
    dtype: str,
    max_tokens: int,
    layout: str,
    rounds: int,
    levels: list[int],
) -> dict[str, Any]:
    """The fields every `bench engine` report opens with: what was measured, and how."""
    return {
        "model": str(model),
        "params": params,
        "dtype": dtype,
        "max_tokens": max_tokens,
        "torch_threads": torch.get_num_threads(),
        "linear_layout": layout,
        "rounds": rounds,
        "levels": levels,
    }


def run_engine_bench(
    model: Path,
    levels: list[int],
    max_tokens: int,
    prompts: list[str] | None = None,
    with_transformers_batching: bool = True,
    progress: Any = None,
    dtype: str | None = None,
    rounds: int = 3,
) -> dict[str, Any]:
    """`dtype` None: the folder's import dtype, else float32. Our engine runs each level
    `rounds` times after a warm-up burst; sequential generate runs it once."""
    prompts = prompts or DEFAULT_PROMPTS
    dtype = dtype or imported_dtype(model) or "float32"
    loaded = in_own_thread(load_causal_lm, model, "cpu", dtype)
    rows: list[LevelResult] = []
    skipped: dict[str, str] = {}
    for level in levels:
        if progress:
            progress(f"{level} streams: tiermesh engine")
        with _same_layout(rows):
            rows.append(asyncio.run(run_ours(model, level, max_tokens, prompts, dtype, rounds)))
        if progress:
            progress(f"{level} streams: sequential generate")
        rows.append(in_own_thread(run_generate, loaded, level, max_tokens, prompts))
        if with_transformers_batching and "hf_generate_batch" not in skipped:
            if progress:
                progress(f"{level} streams: transformers generate_batch")
            result = in_own_thread(run_transformers_batching, loaded, level, max_tokens, prompts)
            if isinstance(result, str):
                skipped["hf_generate_batch"] = result
            else:
                rows.append(result)
    by = {(r.engine, r.concurrency): r for r in rows}
    ours1 = by.get(("tiermesh", levels[0]))
    layout = ours1.linear_layout.label if ours1 and ours1.linear_layout else ""
    report: dict[str, Any] = {
        **report_head(model, loaded.params, dtype, max_tokens, layout, rounds, levels),
        "rows": [_row(r, by.get(("hf_generate", r.concurrency))) for r in rows],
        "skipped": skipped,
        "bandwidth": in_own_thread(
            bandwidth_bound, loaded, ours1 if ours1 and ours1.concurrency == 1 else None
        ),
    }
    for level in levels:
        ours, base = by.get(("tiermesh", level)), by.get(("hf_generate", level))
        if ours and base:
            report[f"ratio_vs_generate_at_{level}"] = round(
                ours.tokens_per_s / base.tokens_per_s, 3
            )
        if ours and ours1 and ours1.ttft_ms_p99 > 0:  # TTFT p99 over the first level's
            report[f"ttft_p99_ratio_at_{level}"] = round(ours.ttft_ms_p99 / ours1.ttft_ms_p99, 3)
    return report
