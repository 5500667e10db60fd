"""A remote server's own load, read from its Prometheus `/metrics` where it has vLLM's gauges
(requests running and waiting, KV-cache use and size, prefix-cache hits), and merged into the
load snapshot a remote tier reports (openai_engine.py).

Pure: the exposition's text in, plain numbers out. Knows vLLM's metric names; a server without
them (SGLang, TGI, llama.cpp, Ollama, a tiermesh gateway) simply has no server load.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from services.tier.engine import EngineLoad

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# the KV cache's share in use, in [0, 1]: its name in vLLM's V1 engine, then in earlier releases
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_INFO = "vllm:cache_config_info"  # labels block_size and num_gpu_blocks
# prompt tokens looked up in the prefix cache and found there, counted since the server started
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class ServerLoad:
    """What the server reports of all its requests, this tier's and any other client's."""

    running: int
    waiting: int
    kv_usage: float | None = None  # share of the KV cache in use, [0, 1]; None = not reported
    kv_capacity_tokens: int = 0  # block_size x num_gpu_blocks; 0 = not reported
    # the share of prompt tokens its prefix cache held, since it started; None = not reported
    prefix_cache_hit_rate: float | None = None


def vllm_load(exposition: str, model: str) -> ServerLoad | None:
    """The server load in a Prometheus text exposition, summed over the engines serving
    `model` (series whose `model_name` label names another model are left out); None when it
    has none of vLLM's request gauges."""
    samples: dict[str, list[float]] = {}
    capacity = 0
    for line in exposition.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels_text, value_text = match.groups()
        labels = dict(_LABEL.findall(labels_text or ""))
        if labels.get("model_name", model) != model:
            continue
        if name == CACHE_INFO:
            capacity += _int(labels.get("block_size")) * _int(labels.get("num_gpu_blocks"))
            continue
        try:
            value = float(value_text)
        except ValueError:
            continue
        if math.isfinite(value):
            samples.setdefault(name, []).append(value)
    if RUNNING not in samples and WAITING not in samples:
        return None
    usage = next((samples[name] for name in KV_USAGE if name in samples), None)
    queries, hits = sum(samples.get(PREFIX_QUERIES, ())), sum(samples.get(PREFIX_HITS, ()))
    return ServerLoad(
        running=int(sum(samples.get(RUNNING, ()))),
        waiting=int(sum(samples.get(WAITING, ()))),
        kv_usage=min(1.0, max(0.0, sum(usage) / len(usage))) if usage else None,
        kv_capacity_tokens=capacity,
        prefix_cache_hit_rate=min(1.0, max(0.0, hits / queries)) if queries > 0 else None,
    )


def _int(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def with_server_load(load: EngineLoad, server: ServerLoad | None) -> EngineLoad:
    """The tier's snapshot with the server's load: running the larger of the tier's streams and
    the server's running requests, queued the tier's queue plus the server's waiting ones (so
    a server busy with other clients shows as busy to the router); the engine's own scheduler
    counts and prefix-cache hit rate are the server's."""
    if server is None:
        return load
    return replace(
        load,
        running=max(load.running, server.running),
        queued=load.queued + server.waiting,
        engine_running=server.running,
        engine_waiting=server.waiting,
        prefix_cache_hit_rate=(
            load.prefix_cache_hit_rate
            if server.prefix_cache_hit_rate is None
            else server.prefix_cache_hit_rate
        ),
    )
