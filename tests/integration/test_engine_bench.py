"""`tiermesh bench engine` end to end on a tiny real model: the JSON contract and that our
batched engine's greedy outputs equal sequential generate's. (Speed is for the benchmark.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from services.tier.linear_kernels import LINEAR_LAYOUT_ENV

ROOT = Path(__file__).resolve().parents[2]


def _bench_engine(args: list[str]) -> tuple[dict[str, Any], str]:
    """`tiermesh bench engine --json ARGS` in its own process: (the JSON report, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != LINEAR_LAYOUT_ENV}  # measured layout
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "engine", "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def test_bench_engine_json(tiny_model_dir: Path) -> None:
    report, stderr = _bench_engine(
        ["--model", str(tiny_model_dir), "--concurrency", "1,3", "--max-tokens", "6"]
        + ["--no-transformers-batching", "--rounds", "2"]
    )
    assert report["levels"] == [1, 3]
    engines = {(row["engine"], row["concurrency"]) for row in report["rows"]}
    assert engines == {("tiermesh", 1), ("tiermesh", 3), ("hf_generate", 1), ("hf_generate", 3)}
    assert all(row["matches_generate"] for row in report["rows"])
    # our engine ran each level twice after its warm-up burst; sequential generate once
    assert report["rounds"] == 2
    rows = {(row["engine"], row["concurrency"]): row for row in report["rows"]}
    for level in (1, 3):
        assert rows[("tiermesh", level)]["tokens"] == 2 * rows[("hf_generate", level)]["tokens"]
    assert report["ratio_vs_generate_at_3"] > 0
    assert report["bandwidth"]["fraction_of_bound"] > 0
    assert report["bandwidth"]["decode_fraction_of_bound"] > 0
    # which layout the engine's linear layers took on this host, and that it was measured
    assert report["linear_layout"] in ("packed (measured)", "input-major (measured)")
    assert "engine benchmark" in stderr


def test_bench_engine_runs_the_dtype_asked_for(tiny_model_dir: Path) -> None:
    reports = [
        _bench_engine(
            ["--dtype", dtype, "--model", str(tiny_model_dir), "--concurrency", "1"]
            + ["--max-tokens", "4", "--no-transformers-batching"]
        )[0]
        for dtype in ("float32", "bfloat16")
    ]
    assert [r["dtype"] for r in reports] == ["float32", "bfloat16"]
    weights = [r["bandwidth"]["weights_bytes"] for r in reports]
    assert weights[0] == 2 * weights[1]  # the same parameters in half the bytes


def test_bench_engine_refuses_zero_rounds(tiny_model_dir: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "engine", "--rounds", "0"]
        + ["--model", str(tiny_model_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "--rounds must be >= 1" in run.stdout + run.stderr
