"""`tiermesh bench sweep --cost-curve` end to end at a tiny scale: its own mesh of echo tiers and
two router processes, levels 1 and 4 for a few seconds; the JSON contract as the last line and
the files --out writes. (The numbers are for the benchmark, not the test.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.run_process import ROOT, TIERMESH, json_command


@pytest.mark.timeout(400)
def test_cost_curve_with_echo_tiers_and_two_routers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = ["bench", "sweep", "--cost-curve"]
    command += ["--engine", "echo", "--echo-ttft-ms", "2", "--echo-tokens-per-s", "200"]
    command += ["--clients", "1,4", "--duration", "2", "--warmup", "0.5", "--max-tokens", "8"]
    command += ["--routers", "2", "--json", "--out", str(out)]
    report, _ = json_command(command, tmp_path / "run", timeout=360)
    assert report["benchmark"] == "router_cost_curve"
    assert report["levels"] == [1, 4] and report["routers"] == ["router", "router-2"]
    assert report["engine"] == "echo" and report["tier"] == "small"
    # the first chats are spread over one echo chat (2 ms + 7 tokens at 200/s), not the warm-up
    assert report["ramp_s"] == pytest.approx(0.002 + 7 / 200)
    for row, clients in zip(report["rows"], (1, 4), strict=True):
        assert row["clients"] == clients
        assert row["direct"]["chats"] > 0 and row["direct"]["errors"] == {}
        for name in ("router", "routers_2"):
            run_report = row[name]
            assert run_report["chats"] > 0
            assert run_report["errors"] == {}
            assert run_report["ttft_ms"]["p50"] is not None
            assert set(run_report["overhead_ms"]) == {"p50", "p99"}
            assert run_report["router_cpu_s_per_1000_chats"] > 0
            assert all(v and v > 0 for v in run_report["router_rss_bytes"].values())
        assert set(row["routers_2"]["router_rss_bytes"]) == {"router", "router-2"}
    assert json.loads((out / "cost_curve.json").read_text())["levels"] == [1, 4]
    assert (out / "cost_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "router TTFT minus the direct tier" in (out / "cost_curve.md").read_text()


def test_a_ramp_longer_than_the_warmup_is_refused() -> None:
    command = [*TIERMESH, "bench", "sweep", "--cost-curve", "--warmup", "2", "--ramp", "3"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--ramp must be in [0, --warmup = 2], got 3" in run.stdout + run.stderr
