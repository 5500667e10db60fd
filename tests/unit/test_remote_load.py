"""A remote server's load from its Prometheus exposition (services/tier/remote_load.py): vLLM's
gauges for the tier's model, older and newer KV-cache names, none from other servers, and the
merge into the tier's snapshot."""

from __future__ import annotations

from dataclasses import replace

from services.tier.engine import EngineLoad
from services.tier.remote_load import ServerLoad, vllm_load, with_server_load

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
VLLM = f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 3.0
vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} 1.0
vllm:num_requests_running{{engine="0",model_name="other"}} 9.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 2.0
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.25
vllm:kv_cache_usage_perc{{engine="1",model_name="{MODEL}"}} 0.75
vllm:cache_config_info{{block_size="16",cache_dtype="auto",num_gpu_blocks="1000",\
num_cpu_blocks="None"}} 1.0
vllm:prompt_tokens_total{{model_name="{MODEL}"}} 1234.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="{MODEL}"}} 600.0
vllm:prefix_cache_queries_total{{engine="1",model_name="{MODEL}"}} 400.0
vllm:prefix_cache_queries_total{{engine="0",model_name="other"}} 5000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} 256.0
vllm:prefix_cache_hits_total{{engine="1",model_name="{MODEL}"}} 0.0
"""


def test_vllm_gauges_of_the_tiers_model() -> None:
    assert vllm_load(VLLM, MODEL) == ServerLoad(
        running=4, waiting=2, kv_usage=0.5, kv_capacity_tokens=16_000, prefix_cache_hit_rate=0.256
    )


def test_the_older_kv_cache_name_and_no_cache_info() -> None:
    text = "vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.4\n"
    assert vllm_load(text, MODEL) == ServerLoad(1, 0, 0.4, 0)  # no prefix-cache counters
    queried = text + "vllm:prefix_cache_queries_total 0\nvllm:prefix_cache_hits_total 0\n"
    assert vllm_load(queried, MODEL) == ServerLoad(1, 0, 0.4, 0)  # none asked yet: no rate


def test_a_server_without_vllms_gauges_has_no_load() -> None:
    gateway = (
        "# TYPE tiermesh_gateway_requests_total counter\n"
        'tiermesh_gateway_requests_total{model="tiermesh-small",status="200"} 3.0\n'
    )
    assert vllm_load(gateway, MODEL) is None
    assert vllm_load("", MODEL) is None
    assert vllm_load("vllm:num_requests_running NaN\n", MODEL) is None  # no reading


def test_the_servers_load_raises_the_tiers_running_and_queued() -> None:
    load = EngineLoad(
        model=MODEL, device="cpu", serving=True, running=2, max_running=8, queued=1,
        max_queued=16, ttft_ms_p50=0.0, ttft_ms_p99=0.0, kv_pool_capacity_tokens=0,
        kv_pool_used_tokens=0, kv_pool_peak_tokens=0, weights_bytes=0, kv_pool_bytes=0,
        completed=0, rejected=0, params=0, max_prompt_tokens=512, max_tokens=256,
    )  # fmt: skip
    assert with_server_load(load, None) is load
    busy = with_server_load(load, ServerLoad(running=5, waiting=3, prefix_cache_hit_rate=0.3))
    assert busy == replace(
        load, running=5, queued=4, engine_running=5, engine_waiting=3, prefix_cache_hit_rate=0.3
    )
    quiet = with_server_load(load, ServerLoad(running=1, waiting=0))
    assert quiet == replace(load, running=2, queued=1, engine_running=1)  # its own still count
