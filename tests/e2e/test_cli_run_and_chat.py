"""End to end through the console script: `tiermesh run` in a child process, then
`tiermesh chat --json` against it, then SIGTERM stops every service."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tiny_model import build_tiny_model

TIERMESH = [sys.executable, "-m", "services.router.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _free_base_port() -> int:
    """A base port B with B and B+10..12 free (the layout `tiermesh run --base-port` uses)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + 12 > 65535:
            continue
        try:
            for port in (base + 10, base + 11, base + 12):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port layout found")


@pytest.fixture
def mesh_process(tiny_model_dir: Path, tmp_path: Path):
    other = build_tiny_model(tmp_path / "large-model", seed=7)
    base = _free_base_port()
    env = {**os.environ, "TIERMESH_RUN_DIR": str(tmp_path / "run")}
    command = [
        *TIERMESH,
        "run",
        "--no-demo",
        "--base-port",
        str(base),
        "--model",
        f"small={tiny_model_dir}",
        "--model",
        f"medium={tiny_model_dir}",
        "--model",
        f"large={other}",
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
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
    else:
        process.kill()
    assert process.poll() is None, "".join(output)
    yield process, f"127.0.0.1:{base}", output
    if process.poll() is None:  # the test failed midway: stop the mesh the normal way first
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_run_then_chat_json_then_sigterm(mesh_process) -> None:
    process, router, output = mesh_process
    assert "tiermesh is up" in "".join(output)
    args = ["--mode", "progressive", "--json", "--max-tokens", "16", "What is your return policy?"]
    chat = subprocess.run(
        [*TIERMESH, "chat", "--router", router, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert chat.returncode == 0, chat.stderr
    events = [json.loads(line) for line in chat.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "route" and types[-1] == "final"
    starts = [e for e in events if e["type"] == "revision_start"]
    assert [(s["revision"], s["tier"], s["replaces"]) for s in starts] == [
        (0, "small", None),
        (1, "large", 0),
    ]
    assert all(isinstance(e["t_ms"], float | int) for e in events)
    assert [e["t_ms"] for e in events] == sorted(e["t_ms"] for e in events)
    revision1 = "".join(e["text"] for e in events if e["type"] == "delta" and e["revision"] == 1)
    assert events[-1]["revision"] == 1 and events[-1]["text"] == revision1

    bad = subprocess.run(
        [*TIERMESH, "chat", "--router", router, "--json", "--max-tokens", "0", "hi"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    error = json.loads(bad.stdout.splitlines()[-1])
    assert error["type"] == "error" and error["code"] == "INVALID_ARGUMENT"
    assert error["message"].startswith("max_tokens:")

    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0, rest
    assert "stopping every service" in rest
