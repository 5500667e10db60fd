"""`tiermesh bench` end to end: it starts its own mesh of child processes on tiny models, runs
single, hybrid (with the router's configured policy and, restarted, with another policy) and
progressive under one short seeded schedule, prints the JSON contract as the last line and writes
the report files. (Speed and quality are for the benchmark, not the test.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from services.bench.report import TARGETS
from services.common.config import RouterConfig
from services.common.config_loading import load_config
from services.router.server import DEFAULT_CONFIG
from services.workload import load_split, score
from tests.e2e.run_process import ROOT, TIERMESH, json_command
from tests.tiny_model import build_tiny_model

# the policy configuration between two that use the router's own, so the router is restarted
# on "keyword" and then back on its configured policy
CONFIGS = ("single", "hybrid:keyword", "hybrid", "progressive")
pytestmark = pytest.mark.timeout(240)  # the fixture starts a whole mesh and runs the bench


@pytest.fixture(scope="module")
def bench_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bench")
    large = build_tiny_model(tmp / "large-model", seed=7)
    out = tmp / "report"
    command = ["bench", "--json", "--out", str(out)]
    command += ["--scenario", "long-tail", "--rate", "5", "--duration", "3", "--warmup", "0.5"]
    command += ["--max-tokens", "6", "--seed", "11", "--configs", ",".join(CONFIGS)]
    for tier, model in (("small", tiny_model_dir), ("medium", tiny_model_dir), ("large", large)):
        command += ["--model", f"{tier}={model}"]
    report, stderr = json_command(command, tmp / "run", timeout=180)
    return report, out, stderr


def test_json_contract(bench_run) -> None:
    report, _, _ = bench_run
    assert report["benchmark"] == "hybrid_vs_single"
    assert list(report["configurations"]) == list(CONFIGS)
    for name in ("hybrid_vs_single", "progressive_vs_single"):
        assert set(report["ratios"][name]) >= {"simple_p99_ttft", "throughput", "cost", "quality"}
        for key in ("quality_ci95", "quality_all_ci95"):  # null where single scored nothing
            interval = report["ratios"][name][key]
            assert interval is None or interval[0] <= interval[1], (name, key)
    assert report["scenario"]["name"] == "long-tail" and report["scenario"]["seed"] == 11
    assert report["mesh"]["started_by_bench"] is True
    # a configuration that lost over 5% of its requests is named in the warnings, no other
    overloaded = {
        name
        for name, c in report["configurations"].items()
        if c["requests"]["failed"] + c["requests"]["shed"] > 0.05 * c["requests"]["scheduled"]
    }
    assert {warning.split(": ")[0] for warning in report["warnings"]} == overloaded
    for name, config in report["configurations"].items():
        requests = config["requests"]
        assert requests["completed"] > 0, name
        assert (
            requests["scheduled"] == requests["completed"] + requests["failed"] + requests["shed"]
        )
        assert config["throughput_rps"] > 0
        assert config["latency"]["simple"]["ttft_ms"]["p99"] > 0
        assert set(config["cpu_seconds"]) == {"small", "medium", "large", "router"}
        assert config["cost_per_1m_output_tokens"]["cpu"] > 0
        assert config["cost_per_1m_output_tokens"]["a100"] > 0
        large = config["memory"]["large"]
        assert large["rss_peak_bytes"] > 0 and large["kv_pool_bytes"] > 0
        assert large["weights_bytes"] > 0 and "kv_pool_peak_tokens" in large
    single = report["configurations"]["single"]
    assert single["answered_by"] == {"large": single["requests"]["completed"]}
    ratio = report["ratios"]["hybrid_vs_single"]["throughput"]
    assert ratio == pytest.approx(
        report["configurations"]["hybrid"]["throughput_rps"] / single["throughput_rps"], rel=1e-3
    )
    assert [key for key, _, _ in TARGETS] == ["simple_p99_ttft", "throughput", "cost", "quality"]


def test_every_configuration_saw_the_same_requests(bench_run) -> None:
    _, out, _ = bench_run
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    sequences = {
        name: [
            (r["index"], r["item_id"], r["scheduled_at_s"])
            for r in rows
            if r["configuration"] == name
        ]
        for name in CONFIGS
    }
    assert sequences["single"] == sequences["hybrid"] == sequences["progressive"]
    assert sequences["hybrid:keyword"] == sequences["single"]
    assert len(sequences["single"]) > 0


def test_a_policy_configuration_runs_the_router_on_that_policy_and_then_back(bench_run) -> None:
    report, out, _ = bench_run
    configured = load_config(RouterConfig, DEFAULT_CONFIG).policy
    assert configured != "keyword"
    assert report["configurations"]["hybrid:keyword"]["policy"] == "keyword"
    assert report["configurations"]["hybrid"]["policy"] is None
    assert "hybrid:keyword_vs_single" in report["ratios"]
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    decided = {
        name: {r["policy"] for r in rows if r["configuration"] == name and r["status"] == "OK"}
        for name in ("hybrid:keyword", "hybrid")
    }
    assert decided == {"hybrid:keyword": {"keyword"}, "hybrid": {configured}}
    routed = [r for r in rows if r["configuration"] == "hybrid" and r["status"] == "OK"]
    assert routed and all(r["route_reason"] for r in routed)  # the route decision's reason
    assert all(0.0 <= r["complexity"] <= 1.0 for r in routed)
    if configured in ("threshold", "cost_target"):  # "complexity 0.91 >= 0.80[; fallback]"
        for r in routed:
            said = float(r["route_reason"].removeprefix("complexity ").split()[0])
            assert abs(said - r["complexity"]) <= 0.006


def test_a_policy_configuration_needs_the_benchs_own_mesh(tmp_path: Path) -> None:
    command = [*TIERMESH, "bench", "--router", "127.0.0.1:1", "--configs", "single,hybrid:keyword"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "need the bench's own mesh" in run.stdout + run.stderr
    unknown = [*TIERMESH, "bench", "--configs", "hybrid:nope"]
    run = subprocess.run(unknown, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "hybrid:<policy> with a policy from" in run.stderr and "cost_target" in run.stderr


def test_accuracy_is_the_scorers_on_the_recorded_answers(bench_run) -> None:
    report, out, _ = bench_run
    items = {item.id: item for item in load_split("test")}
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    warmup, end = report["scenario"]["warmup_s"], report["scenario"]["duration_s"]
    for name, config in report["configurations"].items():
        done = [
            r
            for r in rows
            if r["configuration"] == name and r["status"] == "OK"
            and warmup <= r["scheduled_at_s"] < end
        ]  # fmt: skip
        recount = sum(score(items[r["item_id"]], r["text"]) for r in done) / len(done)
        accuracy = config["quality"]["accuracy"]
        assert isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0
        assert accuracy == pytest.approx(recount, abs=1e-4)
        assert config["quality"]["scored"] == len(done)
        measured = [
            r for r in rows if r["configuration"] == name and warmup <= r["scheduled_at_s"] < end
        ]
        correct = sum(score(items[r["item_id"]], r["text"]) for r in done)
        assert config["quality"]["accuracy_all"] == pytest.approx(correct / len(measured), abs=1e-4)


def test_report_files_and_tables(bench_run) -> None:
    _, out, stderr = bench_run
    for name in ("latency_cdf.png", "cost_vs_quality.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "report.md").read_text()
    assert "latency by request class" in markdown and "![latency_cdf.png]" in markdown
    assert json.loads((out / "report.json").read_text())["benchmark"] == "hybrid_vs_single"
    assert "ratios against single" in stderr
