"""`tiermesh bench --scenario overload` end to end at a tiny scale: its own mesh of echo tiers
with 4 running slots and 8 queued each, over TLS with two API keys (one at 4x the other's rate),
an unloaded pass, a two-step capacity ramp and 8x that rate for a few seconds; the JSON's shape
(per priority and per key), and overload moving or refusing chats. (The numbers are for the
benchmark, not the test.)"""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.run_process import ROOT, TIERMESH, json_command

PRIORITIES = ("interactive", "batch", "critical")


@pytest.mark.timeout(300)
def test_overload_scenario_with_small_echo_tiers(tmp_path) -> None:
    # 8x for 5 s: 35 capacity-seconds of chats more than the mesh answers meanwhile, past what
    # the tiers' slots and queues hold (3 x (4 + 8)) once capacity is over 1 req/s: some are
    # moved or refused whatever the machine's speed
    command = ["bench", "--scenario", "overload", "--load", "8", "--duration", "5"]
    command += ["--capacity-s", "4", "--unloaded-s", "2", "--max-tokens", "20"]
    command += ["--engine", "echo", "--echo-tokens-per-s", "10"]
    command += ["--echo-max-running", "4", "--echo-max-queued", "8", "--json"]
    command += ["--keys", "2", "--key-rate-ratio", "4"]
    command += ["--priority-mix", "interactive=5,batch=4,critical=1"]
    report, _ = json_command(command, tmp_path / "run", timeout=280)
    assert report["benchmark"] == "overload" and report["load"] == 8.0
    assert report["capacity_rps"] > 0 and report["answered_rps"] > 0
    assert report["rate_rps"] == pytest.approx(8 * report["capacity_rps"], rel=1e-3)
    for priority in PRIORITIES:
        row = report[priority]
        assert set(row) >= {"sent", "answered_share", "stepped_down_share"}
        assert set(row) >= {"quality_vs_unloaded", "ttft_ms"}
        assert set(row["ttft_ms"]) == set(row["router_ttft_ms"]) == {"p50", "p99"}
    assert sum(report[p]["sent"] for p in PRIORITIES) == report["scenario"]["requests_scheduled"]
    mix = {"interactive": 0.5, "batch": 0.4, "critical": 0.1}
    assert report["scenario"]["priority_mix"] == mix
    assert set(report["refusal_ms"]) == {"p50", "p99"}
    assert all("->" in move for move in report["step_downs"])
    # past capacity the router moves interactive chats to another tier, or refuses some
    assert report["step_downs"] or report["refusals"] > 0
    keys = report["per_key_share"]
    assert list(keys) == ["bench-key-1", "bench-key-2"]
    assert [keys[k]["rate_share"] for k in keys] == [0.2, 0.8]
    assert all(set(keys[k]) >= {"sent", "answered_share", "rate_share"} for k in keys)
    assert sum(keys[k]["sent"] for k in keys) == report["scenario"]["requests_scheduled"]
    assert set(report["targets"]) == {
        "interactive_answered_share",
        "interactive_quality_vs_unloaded",
        "critical_ttft_p99_x_unloaded",
        "refusal_p99_ms",
        "slower_key_answered_share",
    }
    assert report["unloaded"]["answered"] > 0 and report["capacity"]["ramp"]


def test_overload_needs_a_load() -> None:
    command = [*TIERMESH, "bench", "--scenario", "overload", "--engine", "echo"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--scenario overload needs --load X" in run.stdout + run.stderr
