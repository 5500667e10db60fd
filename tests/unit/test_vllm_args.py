"""What a vLLM tier asks of vLLM (vllm_args.py) and how the launcher starts one (vllm_tiers.py,
`--engine TIER=vllm`): tables of configs and requests against the arguments they give."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

import pytest

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.common.errors import ConfigError
from services.launcher.run_options import engine_option, tier_engines, vllm_tiers
from services.launcher.vllm_tiers import require_python, vllm_python, write_vllm_config
from services.tier.engine import Sampling
from services.tier.vllm_args import (
    engine_args,
    engine_environment,
    max_num_seqs,
    sampling_args,
    top_alternatives,
    vllm_priority,
)


def tier(**fields: Any) -> TierConfig:
    return build_config(
        TierConfig, {"name": "large", "model_path": "/m", "engine": "vllm", **fields}
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {},
            {
                "model": "/m",
                "max_num_seqs": 4,
                "enforce_eager": True,
                "tensor_parallel_size": 1,
                "scheduling_policy": "priority",
            },
        ),
        ({"max_running": 8}, {"max_num_seqs": 8}),
        ({"max_num_seqs": 32, "max_running": 8}, {"max_num_seqs": 32}),
        # critical requests' slots beyond what the tier admits the others to
        ({"max_running": 16, "critical_reserve": 0.25}, {"max_num_seqs": 20}),
        ({"device": "cuda", "tensor_parallel_size": 2}, {"tensor_parallel_size": 2}),
        (
            {"max_model_len": 2048, "dtype": "bfloat16"},
            {"max_model_len": 2048, "dtype": "bfloat16"},
        ),
        ({"distributed_executor_backend": "ray"}, {"distributed_executor_backend": "ray"}),
        (
            {"quantization": "fp8", "enable_prefix_caching": False},
            {"quantization": "fp8", "enable_prefix_caching": False},
        ),
        (
            {"pipeline_parallel_size": 2, "gpu_memory_utilization": 0.5},
            {"pipeline_parallel_size": 2, "gpu_memory_utilization": 0.5},
        ),
    ],
)
def test_engine_args(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    args = engine_args(tier(**fields))
    assert {key: args.get(key) for key in expected} == expected


@pytest.mark.parametrize(
    ("fields", "absent"),
    [
        ({"device": "cuda"}, "enforce_eager"),
        ({}, "max_model_len"),
        ({}, "quantization"),
        ({}, "distributed_executor_backend"),
    ],
)
def test_engine_args_leave_vllms_defaults(fields: dict[str, Any], absent: str) -> None:
    assert absent not in engine_args(tier(**fields))


@pytest.mark.parametrize(
    ("fields", "environ", "expected"),
    [
        ({}, {}, {"VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "1"}),
        (
            {"cpu_kvcache_space_gib": 0.5, "torch_threads": 2},
            {},
            {"VLLM_CPU_KVCACHE_SPACE": "0.5", "OMP_NUM_THREADS": "2"},
        ),
        ({}, {"OMP_NUM_THREADS": "8"}, {"VLLM_CPU_KVCACHE_SPACE": "2"}),
        ({"device": "cuda"}, {}, {"VLLM_CPU_KVCACHE_SPACE": "2"}),
    ],
)
def test_engine_environment(
    fields: dict[str, Any], environ: dict[str, str], expected: dict[str, str]
) -> None:
    assert engine_environment(tier(**fields), environ) == expected


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        (Sampling(), {"temperature": 0.0, "top_k": -1, "seed": None, "logprobs": 0}),
        (Sampling(temperature=0.7, top_k=40, seed=3), {"temperature": 0.7, "top_k": 40, "seed": 3}),
        (Sampling(top_logprobs=5), {"logprobs": 5}),
        (Sampling(stop=("\n",)), {"stop_token_ids": [2, 7]}),  # stop sequences are the tier's
    ],
)
def test_sampling_args(sampling: Sampling, expected: dict[str, Any]) -> None:
    args = sampling_args(sampling, 16, frozenset({7, 2}))
    assert args["max_tokens"] == 16 and args["detokenize"] is False and "stop" not in args
    assert {key: args[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("ranked", "k", "expected"),
    [
        ({5: (-0.1, 1), 9: (-2.0, 2), 3: (-3.0, 3)}, 2, ((5, -0.1), (9, -2.0))),
        ({7: (-4.0, 12), 5: (-0.1, 1), 9: (-2.0, 2)}, 2, ((5, -0.1), (9, -2.0))),  # sampled 7
        ({5: (-0.1, 1)}, 3, ((5, -0.1),)),
        ({5: (-0.1, 1)}, 0, ()),
    ],
)
def test_top_alternatives(
    ranked: dict[int, tuple[float, int]], k: int, expected: tuple[tuple[int, float], ...]
) -> None:
    assert top_alternatives(ranked, k) == expected


def test_max_num_seqs_bounds_the_running_requests() -> None:
    assert max_num_seqs(tier()) == 4
    assert max_num_seqs(tier(max_num_seqs=2)) == 2


@pytest.mark.parametrize(
    ("fields", "environ", "expected"),
    [
        ({}, {}, "/checkout/.venv-vllm/bin/python"),
        ({}, {"TIERMESH_VLLM_PYTHON": "/opt/v/bin/python"}, "/opt/v/bin/python"),
        ({"vllm_python": "/x/python"}, {"TIERMESH_VLLM_PYTHON": "/y"}, "/x/python"),
    ],
)
def test_the_interpreter(fields: dict[str, Any], environ: dict[str, str], expected: str) -> None:
    assert vllm_python(tier(**fields), environ, Path("/checkout")) == Path(expected)


def test_a_missing_interpreter_names_make_setup_vllm(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make setup-vllm"):
        require_python(tmp_path / "bin" / "python")


def test_the_launcher_writes_the_tiers_config_on_vllm(tmp_path: Path) -> None:
    source = tmp_path / "config.toml"
    source.write_text('name = "large"\nmodel_path = "m"\nmax_running = 2\nmax_num_seqs = 8\n')
    written = write_vllm_config(source, tmp_path / "out", tmp_path / "model")
    config = build_config(TierConfig, tomllib.loads(written.read_text()))
    assert (config.engine, config.max_running, config.max_num_seqs) == ("vllm", 2, 8)
    assert config.model_path == (tmp_path / "model").resolve()


@pytest.mark.parametrize(
    ("values", "remote", "vllm"),
    [
        (["large=vllm"], set(), {"large"}),
        (["small=openai", "large=vllm"], {"small"}, {"large"}),
        (["model"], set(), set()),
    ],
)
def test_engine_options(values: list[str], remote: set[str], vllm: set[str]) -> None:
    assert [engine_option(v) for v in values] == values
    assert tier_engines(values)[1] == remote
    assert vllm_tiers(values) == vllm


@pytest.mark.parametrize("bad", ["large=sglang", "huge=vllm"])
def test_bad_engine_options(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        engine_option(bad)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"distributed_executor_backend": "slurm"}, "distributed_executor_backend"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"cpu_kvcache_space_gib": 0}, "cpu_kvcache_space_gib"),
    ],
)
def test_bad_vllm_fields_are_named(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        tier(**fields)


@pytest.mark.parametrize(
    ("priority", "expected"), [("critical", 0), ("interactive", 1), ("batch", 2), ("", 1)]
)
def test_vllm_schedules_critical_then_interactive_then_batch(priority: str, expected: int) -> None:
    assert vllm_priority(priority) == expected
