"""`tiermesh chaos` end to end: a short run of echo tiers (no model), a tier SIGKILLed mid-stream
and poison requests, checked through the JSON object it prints last: its shape, every request
accounted for, no token lost or duplicated, the supervisor's restart seen, and no process of the
mesh left running afterwards."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from services.common.child_process import stop_process
from tests.e2e.run_process import ROOT, TIERMESH

pytestmark = pytest.mark.timeout(400)


def _run_chaos(args: list[str], run_dir: Path) -> tuple[int, str, str]:
    """Runs the command; SIGTERM (it stops its mesh), then SIGKILL, however the test ends."""
    process = subprocess.Popen(
        [*TIERMESH, "chaos", "--run-dir", str(run_dir), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(timeout=360)
    finally:
        stop_process(process, grace_s=30)
    return process.returncode, out, err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_chaos_run_with_a_killed_tier_and_poison_loses_no_token(tmp_path: Path) -> None:
    code, out, err = _run_chaos(
        [
            "--engine",
            "echo",
            "--duration",
            "16",
            "--rate",
            "8",
            "--faults",
            "kill-tier,poison",
            "--tiers",
            "small",
            "--fault-every",
            "6",
            "--json",
        ],
        tmp_path,
    )
    assert code == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])

    assert {"faults", "requests", "tokens", "availability", "step_downs", "memory"} <= set(report)
    for fault in report["faults"]:
        assert {"kind", "target", "at_s", "recovered_ms"} <= set(fault)
    kinds = [(f["kind"], f["target"]) for f in report["faults"]]
    assert kinds == [("kill-tier", "small"), ("poison", "router")], kinds
    kill, poison = report["faults"]
    assert kill["recovered_ms"] is not None and kill["restarted_ms"] is not None, kill
    assert kill["routed_around_ms"] >= 0, kill
    # a kill may fail a chat UNAVAILABLE (its every fallback refused it); never otherwise
    assert set(kill["failed_during"]) <= {"UNAVAILABLE"}, kill
    assert poison["requests"]["invalid UTF-8 prompt"] == "INVALID_ARGUMENT"
    assert poison["requests"]["temperature 1e-40"] == "INVALID_ARGUMENT"
    # poison fails alone: nothing in flight with it fails as a poisoned request would
    collateral = {"INVALID_ARGUMENT", "UNKNOWN", "INTERNAL"} & set(poison["failed_during"])
    assert not collateral, poison

    requests = report["requests"]
    assert requests["sent"] > 0
    assert requests["completed"] + sum(requests["failed"].values()) == requests["sent"]
    assert report["availability"] == requests["completed"] / requests["sent"]
    tokens = report["tokens"]
    assert tokens["lost"] == 0 and tokens["duplicated"] == 0, tokens
    assert tokens["text_mismatches"] == 0
    assert tokens["checked_requests"] + tokens["unchecked_requests"] == requests["completed"]
    assert tokens["checked_requests"] > 0, tokens
    assert set(requests["failed"]) <= {"UNAVAILABLE"}, report.get("failure_examples")
    assert set(report["memory"]) == {"small", "medium", "large", "router"}
    assert all(isinstance(v, int) and v > 0 for v in report["memory"].values())

    pids = json.loads((tmp_path / "pids.json").read_text())
    assert set(pids) == {"small", "medium", "large", "router"}
    assert not [name for name, pid in pids.items() if _alive(pid)], "left running"
