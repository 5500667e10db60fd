"""Checks the torch engine on a CUDA GPU against the CPU: the same greedy answers (alone, batched,
continued), decode throughput and first-token latency at 1, 16 and 64 streams, and one tier
served over gRPC on the GPU. Prints PASS/FAIL per check and writes a JSON summary.

    python scripts/cuda_check.py --out DIR [--device cuda] [--levels 1,16,64]

With `--device cpu` every step runs on the CPU against itself (a dry run of the script). Needs
torch and transformers; the gRPC step needs grpcio and the generated stubs (`make protos`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "clients" / "python" / "src"))

from services.common.config import TierConfig  # noqa: E402
from services.tier.engine import GenerationRequest  # noqa: E402
from services.tier.torch_engine import TorchEngine  # noqa: E402

PROMPTS = [
    "What is your return policy?",
    "How much does the blue kettle cost?",
    "Please price an order of 2 navy bottles and 3 green bowls with coupon SAVE10.",
    "Do you ship to Canada?",
    "Hi there",
    "Can I change the address of order 1234 after it shipped?",
]
TIERS = ("small", "medium", "large")
RESULTS: dict[str, Any] = {}


def log(line: str) -> None:
    print(line, flush=True)


def config(tier: str, model: Path, device: str, dtype: str = "float32", **more: Any) -> TierConfig:
    options: dict[str, Any] = {
        "name": tier,
        "model_path": model,
        "device": device,
        "dtype": dtype,
        "max_running": 64,
        "max_queued": 256,
        "max_tokens": 128,
        "torch_threads": 4,
        "compute_nice": 0,
    }
    return TierConfig(**(options | more))


async def answer(engine: TorchEngine, rid: str, prompt: str, tokens: int, **more: Any) -> list[int]:
    request = GenerationRequest(rid, tokens, messages=(("user", prompt),), **more)
    return [t async for chunk in engine.generate(request) for t in chunk.token_ids]


async def answers(cfg: TierConfig, tokens: int = 32) -> dict[str, Any]:
    """Greedy token ids per prompt: alone (one at a time) and batched (all at once), and a
    continuation of the first answer from its 8th token."""
    engine = TorchEngine(cfg)
    await engine.start()
    try:
        alone = [await answer(engine, f"a{i}", p, tokens) for i, p in enumerate(PROMPTS)]
        batched = await asyncio.gather(
            *(answer(engine, f"b{i}", p, tokens) for i, p in enumerate(PROMPTS))
        )
        head = tuple(alone[0][:8])
        rest = await answer(engine, "c0", PROMPTS[0], tokens, continue_ids=head)
        return {"alone": alone, "batched": list(batched), "continued": list(head) + rest}
    finally:
        await engine.shutdown()


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(name: str, expected: list[list[int]], got: list[list[int]]) -> bool:
    diffs = [first_difference(e, g) for e, g in zip(expected, got, strict=True)]
    bad = [(i, d) for i, d in enumerate(diffs) if d is not None]
    RESULTS.setdefault("compare", {})[name] = {"prompts": len(diffs), "differ_at": bad}
    log(
        f"{'PASS' if not bad else 'FAIL'} {name}: {len(diffs) - len(bad)}/{len(diffs)} equal"
        + (f"; (prompt, first differing token) {bad}" if bad else "")
    )
    return not bad


async def timed_stream(
    engine: TorchEngine, rid: str, prompt: str, tokens: int, ttfts: list[float]
) -> int:
    """One stream of `tokens` tokens; its first-token time (ms) goes to `ttfts`."""
    start = time.perf_counter()
    request = GenerationRequest(rid, tokens, messages=(("user", prompt),))
    count = 0
    async for chunk in engine.generate(request):
        if count == 0 and chunk.token_ids:
            ttfts.append((time.perf_counter() - start) * 1000)
        count += len(chunk.token_ids)
    return count


async def throughput(
    cfg: TierConfig, levels: list[int], tokens: int = 64, cudnn_attention: bool | None = None
) -> list[dict[str, Any]]:
    """Per level: N concurrent streams of `tokens` tokens, three rounds after a warm-up.
    `cudnn_attention`: turn torch's cuDNN attention backend on or off after the engine loaded,
    to compare the two in one run."""
    engine = TorchEngine(cfg)
    await engine.start()
    if cudnn_attention is not None:
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    rows = []
    try:
        await asyncio.gather(*(answer(engine, f"w{i}", PROMPTS[i % 6], 8) for i in range(8)))
        for level in levels:
            ttfts: list[float] = []
            rates: list[float] = []
            for r in range(3):
                start = time.perf_counter()
                counts = await asyncio.gather(
                    *(
                        timed_stream(engine, f"t{level}-{r}-{i}", PROMPTS[i % 6], tokens, ttfts)
                        for i in range(level)
                    )
                )
                rates.append(sum(counts) / (time.perf_counter() - start))
            ttfts.sort()
            row = {
                "concurrency": level,
                "tokens_per_s": round(statistics.median(rates), 1),
                "ttft_ms_p50": round(ttfts[len(ttfts) // 2], 2),
                "ttft_ms_p99": round(ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))], 2),
            }
            rows.append(row)
            log(f"     {cfg.name} {cfg.device} {cfg.dtype} {level:>3} streams: {row}")
    finally:
        await engine.shutdown()
    return rows


def smollm2_shape(folder: Path, tokenizer_dir: Path) -> Path:
    """A randomly initialised Llama of SmolLM2-135M's shape (no download) with the built-in
    tokenizer (a smaller vocabulary than SmolLM2's 49,152)."""
    from tests.tiny_llama import build_tiny_llama

    return build_tiny_llama(
        folder,
        tokenizer_dir,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        initializer_range=0.02,
    )


async def profile(cfg: TierConfig, level: int, out: Path, tokens: int = 32) -> None:
    """One round of `level` streams under torch.profiler: where a decode step's time goes (the
    top operators by device time and by host time, and the device's busy share of the wall)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    engine = TorchEngine(cfg)
    await engine.start()
    try:
        ttfts: list[float] = []
        await asyncio.gather(*(answer(engine, f"w{i}", PROMPTS[i % 6], 8) for i in range(level)))
        activities = [ProfilerActivity.CPU]
        if cfg.device.startswith("cuda"):
            activities.append(ProfilerActivity.CUDA)
        try:  # the decode loop runs in its own thread
            every_thread = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        except TypeError:
            every_thread = None
        with torch_profile(activities=activities, experimental_config=every_thread) as prof:
            start = time.perf_counter()
            await asyncio.gather(
                *(
                    timed_stream(engine, f"p{i}", PROMPTS[i % 6], tokens, ttfts)
                    for i in range(level)
                )
            )
            wall = time.perf_counter() - start
        events = prof.key_averages()
        device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
        RESULTS.setdefault("profile", {})[f"{cfg.dtype}_{level}"] = {
            "wall_s": round(wall, 3),
            "device_busy_share": round(device_us / 1e6 / wall, 3),
        }
        log(
            f"     {cfg.dtype} {level} streams x {tokens} tokens: wall {wall:.3f} s, device busy "
            f"{device_us / 1e6:.3f} s"
        )
        sort = "self_device_time_total" if cfg.device.startswith("cuda") else "self_cpu_time_total"
        log(events.table(sort_by=sort, row_limit=12, max_name_column_width=60))
        log(events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
    finally:
        await engine.shutdown()


async def grpc_tier(model: Path, device: str) -> None:
    import grpc
    from tiermesh.v1 import tier_pb2, tier_pb2_grpc

    from services.tier.server import start_tier

    server = await start_tier(config("large", model, device, max_running=8, max_queued=16))
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            request = tier_pb2.GenerateRequest(
                request_id="g1", max_tokens=24, messages=[{"role": "user", "content": PROMPTS[1]}]
            )
            chunks = [c async for c in stub.Generate(request)]
            status = await stub.GetStatus(tier_pb2.GetStatusRequest())
        text = "".join(c.text for c in chunks)
        RESULTS["grpc"] = {"text": text, "device": status.device, "model": status.model_id}
        ok = bool(text) and status.device.startswith(device.split(":")[0])
        log(
            f"{'PASS' if ok else 'FAIL'} gRPC tier on {status.device}: {len(chunks)} chunks, "
            f"{text[:80]!r}"
        )
    finally:
        await server.stop(0)


async def step(name: str, run: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """`await run(*args)`; an exception is logged and recorded, and the result is then None."""
    started = time.perf_counter()
    log(f"---- {name}")
    try:
        result = await run(*args)
    except Exception as e:  # one failed step must not stop the others
        RESULTS.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
        log(f"FAIL {name}: {type(e).__name__}: {e}")
        traceback.print_exc()
        result = None
    log(f"     ({time.perf_counter() - started:.1f} s)")
    return result


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument(
        "--profile-only", action="store_true", help="only profile the SmolLM2-shaped model"
    )
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    device = args.device
    RESULTS["env"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": device,
    }
    import transformers

    RESULTS["env"]["transformers"] = transformers.__version__
    log(f"env: {RESULTS['env']}")
    models = {tier: ROOT / "services" / f"tier_{tier}" / "model" for tier in TIERS}
    if args.profile_only:
        folder = Path("/tmp/cuda_check_smollm2_shape")
        await step(
            "build a SmolLM2-shaped model",
            lambda: asyncio.to_thread(smollm2_shape, folder, models["large"]),
        )
        for dtype in ("float32", "bfloat16"):
            for level in levels:
                await step(
                    f"profile {dtype} at {level} streams",
                    lambda d, n: profile(config("large", folder, device, d), n, args.out),
                    dtype,
                    level,
                )
        (args.out / "cuda_check.json").write_text(json.dumps(RESULTS, indent=1))
        return 0
    for tier in TIERS:
        cpu = await step(f"{tier} on cpu", lambda t: answers(config(t, models[t], "cpu")), tier)
        dev = await step(
            f"{tier} on {device}", lambda t: answers(config(t, models[t], device)), tier
        )
        if cpu and dev:
            compare(f"{tier}: {device} alone = cpu alone", cpu["alone"], dev["alone"])
            compare(f"{tier}: {device} batched = {device} alone", dev["alone"], dev["batched"])
            compare(
                f"{tier}: {device} continued = {device} alone",
                [dev["alone"][0]],
                [dev["continued"]],
            )
    throughputs: dict[str, Any] = RESULTS.setdefault("throughput", {})
    large = models["large"]
    throughputs["large_cpu"] = await step(
        "large throughput on cpu", lambda: throughput(config("large", large, "cpu"), levels[:2])
    )
    throughputs["large_" + device] = await step(
        f"large throughput on {device}", lambda: throughput(config("large", large, device), levels)
    )
    folder = Path("/tmp/cuda_check_smollm2_shape")
    built = await step(
        "build a SmolLM2-shaped model", lambda: asyncio.to_thread(smollm2_shape, folder, large)
    )
    if built:
        for dtype in ("float32", "bfloat16"):
            if device == "cpu" and dtype == "float32":
                continue
            throughputs[f"smollm2_shape_{device}_{dtype}"] = await step(
                f"SmolLM2-shaped throughput on {device} {dtype}",
                lambda d: throughput(
                    config("large", folder, device, d, max_tokens=128, max_prompt_tokens=512),
                    levels if device != "cpu" else levels[:1],
                ),
                dtype,
            )
    if built and device.startswith("cuda"):
        for cudnn in (True, False):
            throughputs[f"smollm2_shape_{device}_float32_cudnn_attention_{cudnn}"] = await step(
                f"SmolLM2-shaped float32, cuDNN attention {'on' if cudnn else 'off'}",
                lambda c: throughput(config("large", folder, device), levels, 64, c),
                cudnn,
            )
        torch.backends.cuda.enable_cudnn_sdp(False)
    await step(f"gRPC tier on {device}", lambda: grpc_tier(large, device))
    (args.out / "cuda_check.json").write_text(json.dumps(RESULTS, indent=1))
    failed = [k for k, v in RESULTS.get("compare", {}).items() if v["differ_at"]]
    log(f"done: {len(RESULTS.get('errors', {}))} steps failed, {len(failed)} comparisons differ")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
