"""`tiermesh bench engine --engine torch,vllm` end to end on SmolLM2-135M-Instruct (bfloat16):
the torch engine and vLLM (from `.venv-vllm`), each in its own process, get the same requests;
the report has a row per engine with its process's memory, both give `generate`'s greedy ids,
and the torch-over-vLLM ratios are there. (Speed is for the benchmark.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.launcher.vllm_tiers import PYTHON_ENV
from tests.integration.vllm_env import smollm2, vllm_python

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]


def test_torch_and_vllm_side_by_side() -> None:
    model, python = smollm2(), vllm_python()
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "engine", "--engine", "torch,vllm"]
        + ["--model", str(model), "--concurrency", "1", "--max-tokens", "8", "--rounds", "1"]
        + ["--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=800,
        env={**os.environ, PYTHON_ENV: str(python)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert (report["engines"], report["levels"], report["dtype"]) == (
        ["torch", "vllm"],
        [1],
        "bfloat16",
    )
    rows = {row["engine"]: row for row in report["rows"]}
    assert sorted(rows) == ["hf_generate", "torch", "vllm"]
    for name in ("torch", "vllm"):
        row = rows[name]
        assert row["concurrency"] == 1 and 0 < row["tokens"] <= 8
        assert row["matches_generate"] and row["streams_matching_generate"] == 1
        assert row["tokens_per_s"] > 0 and row["ttft_ms_p50"] > 0
        assert row["rss_mb"] > 100 and row["load_s"] > 0
    assert rows["hf_generate"]["rss_mb"] is None  # it runs in the bench's own process
    assert report["torch_vs_vllm_tokens_per_s_at_1"] > 0
    assert report["torch_vs_vllm_ttft_p99_at_1"] > 0
    assert report["ratio_vs_generate_at_1"] > 0  # the default report's fields are all there
    assert report["vllm_python"] == str(python)
    assert "vllm: loaded in" in run.stderr  # progress while it runs


def test_an_unknown_engine_is_refused(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "engine", "--engine", "torch,sglang"]
        + ["--model", str(smollm2())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "unknown engine sglang" in run.stdout + run.stderr
