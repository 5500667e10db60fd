"""Starts `tiermesh run` as a child process for end-to-end tests and stops it the normal way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.common.child_process import stop_process
from services.common.parent_watch import child_environment

TIERMESH = [sys.executable, "-m", "services.cli"]
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def tiermesh_run(
    args: list[str], env: dict[str, str]
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Yields the process once it serves, and the lines it printed until then."""
    process = subprocess.Popen(
        [*TIERMESH, "run", "--no-demo", *args],
        cwd=ROOT,
        env=child_environment({**os.environ, **env}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    deadline = time.monotonic() + 120
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        if "serving; Ctrl-C" in line:
            break
    try:
        assert process.poll() is None, "".join(output)
        yield process, output
    finally:
        # the test failed midway: stop the mesh the normal way first (a tiermesh command stops
        # its own children on SIGTERM), SIGKILL after 30 s
        stop_process(process, grace_s=30)


def chat_json(router: str, *args: str, timeout: float = 60) -> list[dict[str, Any]]:
    """`tiermesh chat --router ROUTER --json ARGS...`: its event lines, after asserting exit 0."""
    chat = subprocess.run(
        [*TIERMESH, "chat", "--router", router, "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert chat.returncode == 0, chat.stdout + chat.stderr
    return [json.loads(line) for line in chat.stdout.splitlines()]


def json_command(args: list[str], run_dir: Path, timeout: float) -> tuple[dict[str, Any], str]:
    """`tiermesh ARGS` with its meshes under `run_dir`: the JSON object it prints last, and its
    stderr, after asserting exit 0."""
    run = subprocess.run(
        [*TIERMESH, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TIERMESH_RUN_DIR": str(run_dir)},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return report, run.stderr
