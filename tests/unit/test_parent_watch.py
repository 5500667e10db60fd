"""A child started with `child_environment` gets SIGTERM when its parent is SIGKILLed, so a
killed launcher leaves no server behind; a variable inherited from further up arms nothing."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.common.parent_watch import ENV, child_environment

ROOT = Path(__file__).resolve().parents[2]

# The child: arms the watch, says so, then sleeps until a signal ends it.
CHILD = (
    "import sys, time\n"
    "from services.common.parent_watch import stop_with_parent\n"
    "print('armed' if stop_with_parent() else 'not armed', flush=True)\n"
    "time.sleep(120)\n"
)
# The parent: starts the child with its own pid in the environment, prints the child's pid and
# what it said, then waits to be killed.
PARENT = (
    "import os, subprocess, sys, time\n"
    "from services.common.parent_watch import child_environment\n"
    f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], stdout=subprocess.PIPE,\n"
    "    text=True, env=child_environment(os.environ))\n"
    "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
    "time.sleep(120)\n"
)


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_child_stops_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    pid_text, said = parent.stdout.readline().split(" ", 1)
    child = int(pid_text)
    try:
        assert said.strip() == "armed"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone(child), "the child outlived its killed parent"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        if not _gone(child, 0.1):
            os.kill(child, signal.SIGKILL)


def test_a_variable_inherited_from_a_live_ancestor_arms_nothing() -> None:
    # This test process is alive but is not the child's parent (the shell in between is).
    env = {**os.environ, ENV: str(os.getpid())}
    quick_child = CHILD.replace("time.sleep(120)", "pass")
    shell = f"{shlex.quote(sys.executable)} -c {shlex.quote(quick_child)}; true"
    out = subprocess.run(
        ["sh", "-c", shell], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "not armed", out.stderr


def test_child_environment_names_this_process() -> None:
    assert child_environment({"A": "1"}) == {"A": "1", ENV: str(os.getpid())}
