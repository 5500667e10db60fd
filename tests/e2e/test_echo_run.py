"""`tiermesh run --engine echo`: the whole mesh with echo tiers (no model) in child processes,
then `tiermesh chat --json` through the router: answers of max_tokens echo words, the same
each time, from the tier asked for; the tier processes never load torch, and run at a lower CPU
priority than the router and gateway."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from services.common.tiers import TIER_NAMES
from services.launcher.local_mesh import free_base_port
from services.launcher.run_options import TIER_NICE
from services.tier.echo_engine import ECHO_WORDS
from tests.e2e.run_process import chat_json, tiermesh_run


def _chat(router: str, *args: str) -> dict[str, Any]:
    return next(e for e in chat_json(router, *args, "Where is my order?") if e["type"] == "final")


def test_run_with_echo_tiers_answers_through_the_router(tmp_path: Path) -> None:
    base = free_base_port()
    args = ["--base-port", str(base), "--engine", "echo", "--echo-ttft-ms", "2"]
    args += ["--echo-tokens-per-s", "0"]
    with tiermesh_run(args, {"TIERMESH_RUN_DIR": str(tmp_path / "run")}) as (_, output):
        assert "tiermesh is up" in "".join(output)
        ready = [line.split()[1] for line in "".join(output).splitlines() if "✓" in line]
        # the front doors are reported serving only after every tier
        assert set(ready[-2:]) == {"router", "gateway"} and set(ready[:-2]) == set(TIER_NAMES)
        router = f"127.0.0.1:{base}"
        pinned = [_chat(router, "--mode", "pinned", "--tier", "small", "--max-tokens", "6")]
        pinned.append(_chat(router, "--mode", "pinned", "--tier", "small", "--max-tokens", "6"))
        progressive = _chat(router, "--mode", "progressive", "--max-tokens", "9")
        pids = json.loads((tmp_path / "run" / "pids.json").read_text())
        tier_libraries = {t: Path(f"/proc/{pids[t]}/maps").read_text() for t in TIER_NAMES}
        nice = {name: os.getpriority(os.PRIO_PROCESS, pid) for name, pid in pids.items()}
    words = str(pinned[0]["text"]).split()
    assert len(words) == 6 and set(words) <= set(ECHO_WORDS)
    assert pinned[0]["text"] == pinned[1]["text"]
    assert pinned[0]["tier"] == "small"
    assert len(str(progressive["text"]).split()) == 9
    assert (tmp_path / "run" / "logs" / "small-echo.toml").is_file()
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the tiers run below the router and gateway
    assert nice == {t: min(own + TIER_NICE, 19) for t in TIER_NAMES} | {
        "gateway": own,
        "router": own,
    }
    for tier, maps in tier_libraries.items():  # no model: torch is never loaded
        assert "libtorch" not in maps, f"the echo tier {tier} loaded torch"
