"""The protobuf contract gate: scripts/proto_breaking.sh fails on a removed field, naming it."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / ".tools" / "node_modules" / ".bin" / "buf"
SCRIPT = ROOT / "scripts" / "proto_breaking.sh"


def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(
        [
            "git",
            "-c",
            "user.name=proto gate test",
            "-c",
            "user.email=proto-gate@example.invalid",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def test_removed_field_fails_the_breaking_check(tmp_path: Path) -> None:
    if not BUF.exists():
        pytest.skip(f"buf is not installed at {BUF} (make setup installs it)")
    clone = tmp_path / "repo"
    _git(tmp_path, "clone", "--quiet", str(ROOT), str(clone))
    # main = the committed state under test, whatever branch the source checkout is on
    _git(clone, "checkout", "--quiet", "-B", "main")
    base = _git(clone, "rev-parse", "HEAD")
    _git(clone, "checkout", "--quiet", "-b", "drop-field")
    router = clone / "protos" / "tiermesh" / "v1" / "router.proto"
    text, removed = re.subn(r"\n *string progressive_gate = 10;", "", router.read_text())
    assert removed == 1, "router.proto no longer has ChatRequest.progressive_gate = 10"
    router.write_text(text)
    _git(clone, "commit", "--quiet", "-am", "Drop ChatRequest.progressive_gate")

    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(
        [str(SCRIPT), str(BUF)],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert f"buf breaking: protos/ against {base}" in out, out
    deleted = 'field "10" with name "progressive_gate" on message "ChatRequest" was deleted'
    assert deleted in out, out
