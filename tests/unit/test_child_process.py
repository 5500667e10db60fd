"""Child processes (services.common.child_process) and free ports (services.common.ports), with
real tiny processes: a child's output goes to its log and it is told to stop with its parent; a
stop continues a stopped process, waits for those that leave on SIGTERM and kills one that does
not; a free port layout is free."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

from services.common.child_process import Child, spawn, stop_process, stop_processes
from services.common.parent_watch import ENV
from services.common.ports import free_port, free_port_layout

SLEEPER = "import time; time.sleep(60)"
STUBBORN = (  # ignores SIGTERM
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_output_goes_to_the_log_and_the_child_stops_with_this_process(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"
    code = f"import os; print('hello'); print(os.environ.get({ENV!r}))"
    process = spawn(python(code), log, env={"PATH": "/usr/bin"})
    assert process.wait(30) == 0
    assert log.read_text().split() == ["hello", str(os.getpid())]
    spawn(python("print('again')"), log, append=True).wait(30)
    assert log.read_text().split()[-1] == "again"


def test_a_stop_continues_a_stopped_child_and_kills_one_that_ignores_sigterm(
    tmp_path: Path,
) -> None:
    stopped = spawn(python(SLEEPER))
    stopped.send_signal(signal.SIGSTOP)
    stubborn = spawn(python(STUBBORN), tmp_path / "stubborn.log")
    deadline = time.monotonic() + 30
    while "ready" not in (tmp_path / "stubborn.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    stop_processes([stopped, stubborn], grace_s=1.0)
    assert stopped.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_a_child_starts_again_and_stops(tmp_path: Path) -> None:
    child = Child("sleeper", "127.0.0.1:1", python(SLEEPER), tmp_path / "sleeper.log")
    child.stop()  # never started: nothing to do
    child.start()
    assert child.exited() is None
    child.stop(grace_s=5)
    assert child.exited() == -signal.SIGTERM
    child.start(append=True)
    assert child.process is not None
    stop_process(child.process, grace_s=5)
    assert child.exited() == -signal.SIGTERM


def test_free_ports_are_free() -> None:
    offsets = (0, 10, 11, 40)
    base = free_port_layout(offsets)
    for port in [free_port(), *(base + offset for offset in offsets)]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
