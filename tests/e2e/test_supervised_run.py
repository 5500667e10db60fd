"""End to end: `tiermesh run` with tiny models in a child process; the small tier's process
(its pid from the run directory's pids.json) is SIGKILLed. The router keeps answering (the
fallback tier), the supervisor restarts small and says so, and chats pinned to small succeed
again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from tiermesh.client import ChatError, ChatResult, RouteEvent, RouterClient

from services.common.tiers import TIER_NAMES
from services.launcher.local_mesh import free_base_port
from services.launcher.run_options import TIER_NICE
from tests.e2e.run_process import tiermesh_run

PROMPT = "What is your return policy?"  # the router's default policy routes it to small
EVENTUALLY_S = 120.0  # bound on waiting for a restart (a tier loads torch and its model)
pytestmark = pytest.mark.timeout(400)  # six processes start, one again, on a busy 2-core machine


class Lines:
    """Collects a process's output lines on a thread, so a test can wait for one."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self._stdout = process.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stdout:
            self.lines.append(line)

    def wait_for(self, text: str) -> str:
        deadline = time.monotonic() + EVENTUALLY_S
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} in:\n{''.join(self.lines)}")


def thread_nice_levels(pid: int) -> list[int]:
    """The nice value of each of a process's threads (Linux: a nice value is per thread); a
    thread that ends while they are read is left out."""
    levels = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            levels.append(os.getpriority(os.PRIO_PROCESS, int(task.name)))
    return sorted(levels)


def assert_lowered_but_its_lane(pid: int) -> None:
    """A torch tier `tiermesh run` started: every thread TIER_NICE levels (or more: the model's
    threads) below the launcher, but two at its priority: the critical lane and the idle thread
    that made it."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    levels = thread_nice_levels(pid)
    assert levels[:2] == [own, own] and levels[2] >= min(own + TIER_NICE, 19), levels
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(own + TIER_NICE, 19)


def route_reason(result: ChatResult) -> str:
    route = result.events[0]
    assert isinstance(route, RouteEvent)
    return route.reason


def pinned_to_small(client: RouterClient) -> ChatResult:
    """A chat pinned to small, tried until the router's channel has found the new process."""
    deadline = time.monotonic() + EVENTUALLY_S
    while True:
        try:
            return client.chat(PROMPT, mode="pinned", tier="small", max_tokens=8, timeout=30)
        except ChatError as e:
            assert e.code == "UNAVAILABLE" and time.monotonic() < deadline, e
            time.sleep(0.2)


def test_killed_tier_is_restarted_while_the_router_falls_back(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    base = free_base_port()
    models = [a for tier in TIER_NAMES for a in ("--model", f"{tier}={tiny_model_dir}")]
    with tiermesh_run(["--base-port", str(base), *models], {"TIERMESH_RUN_DIR": str(run_dir)}) as (
        process,
        _,
    ):
        lines = Lines(process)
        pids = json.loads((run_dir / "pids.json").read_text())
        assert set(pids) >= {*TIER_NAMES, "router"}
        for tier in TIER_NAMES:
            assert_lowered_but_its_lane(pids[tier])
        with RouterClient(f"127.0.0.1:{base}") as client:
            assert client.chat(PROMPT, max_tokens=8, timeout=30).tier == "small"
            os.kill(pids["small"], signal.SIGKILL)
            during = [client.chat(PROMPT, max_tokens=8, timeout=30) for _ in range(5)]
            lines.wait_for("restarting small in")
            lines.wait_for("small serving again")
            restarted = json.loads((run_dir / "pids.json").read_text())
            assert restarted["small"] != pids["small"]
            assert restarted["router"] == pids["router"]  # the others kept serving
            assert pinned_to_small(client).tier == "small"
            assert_lowered_but_its_lane(restarted["small"])  # restarted as it started
        assert process.poll() is None
    for result in during:
        assert result.tier in ("medium", "large"), result.final.reason
        named = "fallback" in route_reason(result) or "retried on" in result.final.reason
        assert named, (route_reason(result), result.final.reason)
    assert any("small killed by SIGKILL" in line for line in lines.lines)


def test_killed_replica_leaves_pinned_chats_answered_by_the_other(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    base = free_base_port()
    models = [a for tier in TIER_NAMES for a in ("--model", f"{tier}={tiny_model_dir}")]
    args = ["--base-port", str(base), "--replicas", "small=2", *models]
    with tiermesh_run(args, {"TIERMESH_RUN_DIR": str(run_dir)}) as (process, output):
        lines = Lines(process)
        assert any("small-2" in line for line in output)  # in the table of services
        pids = json.loads((run_dir / "pids.json").read_text())
        with RouterClient(f"127.0.0.1:{base}") as client:
            os.kill(pids["small-2"], signal.SIGKILL)
            during = [
                client.chat(PROMPT, mode="pinned", tier="small", max_tokens=8, timeout=30)
                for _ in range(8)
            ]
            lines.wait_for("small-2 serving again")
            assert json.loads((run_dir / "pids.json").read_text())["small"] == pids["small"]
    for result in during:  # every pinned chat answered by small: the live replica
        assert result.tier == "small", result.final.reason
        assert result.final.revisions == 1
