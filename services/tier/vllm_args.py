"""What a vLLM tier asks of vLLM, from its config and each request: the engine arguments, the
environment its engine process needs, the sampling parameters, and the running bound.

Pure functions over plain values: knows nothing of vLLM's classes, asyncio or gRPC.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.config import TierConfig
from services.tier.engine import Sampling
from services.tier.queue_order import rank_of


def engine_args(config: TierConfig) -> dict[str, Any]:
    """vLLM's AsyncEngineArgs for the tier: the pass-through keys as set (0 or "" left to
    vLLM), eager mode on CPU (no graph capture there), at most max_num_seqs running, and
    scheduling by each request's priority (vllm_priority)."""
    args: dict[str, Any] = {
        "model": str(config.model_path),
        "dtype": config.dtype,
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        # the tier's critical slots on top of what it admits others to (its Admission)
        "max_num_seqs": max_num_seqs(config) + config.critical_slots,
        "enable_prefix_caching": config.enable_prefix_caching,
        "disable_log_stats": False,
        "scheduling_policy": "priority",
    }
    if config.device == "cpu":
        args["enforce_eager"] = True
    if config.max_model_len:
        args["max_model_len"] = config.max_model_len
    if config.distributed_executor_backend:
        args["distributed_executor_backend"] = config.distributed_executor_backend
    if config.quantization:
        args["quantization"] = config.quantization
    return args


def vllm_priority(priority: str) -> int:
    """A request's priority as vLLM's priority scheduling takes it (lower goes first): critical
    0, interactive 1, batch 2. vLLM schedules waiting requests in that order and, short of
    KV-cache blocks, preempts the running request of the lowest priority (the newest among
    equals) first."""
    return rank_of(priority)


def max_num_seqs(config: TierConfig) -> int:
    """Requests vLLM runs at once: the config's max_num_seqs, else the tier's max_running."""
    return config.max_num_seqs or config.max_running


def engine_environment(config: TierConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables vLLM reads at start that the tier sets unless the caller's environment
    has them: the CPU KV-cache size (GiB) and the threads per CPU worker."""
    wanted: dict[str, str] = {}
    if "VLLM_CPU_KVCACHE_SPACE" not in environ:
        wanted["VLLM_CPU_KVCACHE_SPACE"] = f"{config.cpu_kvcache_space_gib:g}"
    if config.device == "cpu" and "OMP_NUM_THREADS" not in environ:
        wanted["OMP_NUM_THREADS"] = str(config.torch_threads)
    return wanted


def sampling_args(sampling: Sampling, max_tokens: int, stop_ids: frozenset[int]) -> dict[str, Any]:
    """vLLM's SamplingParams for one request: the tier's sampling (greedy = temperature 0),
    the sampled token's log-probability always (logprobs 0) and top_logprobs alternatives when
    asked; token ids only (the tier detokenizes) and the tier's own end-of-sequence ids."""
    return {
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "seed": sampling.seed,
        "logprobs": sampling.top_logprobs or 0,
        "detokenize": False,
        "stop_token_ids": sorted(stop_ids),
        "skip_special_tokens": False,
    }


def top_alternatives(
    ranked: Mapping[int, tuple[float, int | None]], k: int
) -> tuple[tuple[int, float], ...]:
    """The k most likely tokens of one step as (token id, log-probability), most likely first,
    from vLLM's {token id: (log-probability, rank)} (it adds the sampled token, whatever its
    rank)."""
    best = sorted(ranked.items(), key=lambda item: (item[1][1] or 1 << 30, -item[1][0]))
    return tuple((token, logprob) for token, (logprob, _) in best[:k])
