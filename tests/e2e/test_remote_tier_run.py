"""`tiermesh run --engine echo --engine large=openai --model large=URL,URL`: the large tier is a
remote OpenAI-compatible server (here tiermesh's own gateway over echo tiers, in this test's
process), served by one tier process per URL, each its own config; `tiermesh chat` through the
mesh's router gets the remote's answer, and the remote tier processes never load torch."""

from __future__ import annotations

import json
from pathlib import Path

from services.launcher.local_mesh import free_base_port
from services.tier.echo_engine import echo_answer, echo_text
from tests.e2e.run_process import chat_json, tiermesh_run
from tests.integration.gateway_mesh import GatewayMesh

PROMPT = "Where is my order?"
ECHO = {"engine": "echo", "model_path": "echo", "echo_ttft_ms": 2.0, "echo_tokens_per_s": 0.0}


def test_run_serves_a_tier_from_a_remote_server(tmp_path: Path) -> None:
    remote = GatewayMesh.start(Path("echo"), tier_options=ECHO)
    try:
        url = f"{remote.url}/v1"
        base = free_base_port()
        args = ["--base-port", str(base), "--engine", "echo", "--echo-ttft-ms", "2"]
        args += ["--engine", "large=openai", "--model", f"large={url},{url}"]
        run_dir = tmp_path / "run"
        with tiermesh_run(args, {"TIERMESH_RUN_DIR": str(run_dir)}) as (_, output):
            assert "tiermesh is up" in "".join(output)
            router = f"127.0.0.1:{base}"
            events = chat_json(router, "--mode", "pinned", "--tier", "large", "--max-tokens", "7",
                               PROMPT)  # fmt: skip
            pids = json.loads((run_dir / "pids.json").read_text())
            maps = {name: Path(f"/proc/{pids[name]}/maps").read_text() for name in pids}
    finally:
        remote.stop()
    final = next(e for e in events if e["type"] == "final")
    rendered = tuple(f"user: {PROMPT}\nassistant:".encode())  # as the remote's echo tier sees it
    assert final["text"] == echo_text(echo_answer(rendered, 7))
    assert final["tier"] == "large"
    logs = run_dir / "logs"
    assert (logs / "large-openai.toml").is_file() and (logs / "large-2-openai.toml").is_file()
    assert {"large", "large-2"} <= set(pids)
    for name in ("large", "large-2"):
        assert "libtorch" not in maps[name], f"the remote tier {name} loaded torch"
