"""`tiermesh run --secure` end to end, as the README shows it: the mesh comes up with TLS
everywhere and API keys at the router; `tiermesh keys create` prints a key; `tiermesh chat
--api-key KEY --ca ...` answers; without the key it is UNAUTHENTICATED; a plaintext client gets
no answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from services.launcher.local_mesh import free_base_port
from tests.e2e.run_process import ROOT, TIERMESH, tiermesh_run
from tests.tiny_model import build_tiny_model


def _tiermesh(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TIERMESH, *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_secure_run_keys_tls_and_refusals(tiny_model_dir: Path, tmp_path: Path) -> None:
    large = build_tiny_model(tmp_path / "large-model", seed=7)
    base = free_base_port()
    run_dir = tmp_path / "run"
    env = {"TIERMESH_RUN_DIR": str(run_dir)}
    models = [f"small={tiny_model_dir}", f"medium={tiny_model_dir}", f"large={large}"]
    args = ["--secure", "--base-port", str(base), *(a for m in models for a in ("--model", m))]
    router = f"localhost:{base}"
    ca = run_dir / "certs" / "ca.pem"
    with tiermesh_run(args, env) as (_process, output):
        printed = "".join(output)
        assert "secure: TLS on every service" in printed
        assert all((run_dir / "certs" / f).stat().st_mode & 0o777 == 0o600 for f in ("ca.pem",))

        created = _tiermesh(["keys", "create", "--name", "demo", "--scopes", "chat"], env)
        assert created.returncode == 0, created.stderr
        key = created.stdout.strip()
        assert key.startswith("tmk_")

        chat = ["chat", "--router", router, "--json", "--mode", "pinned", "--tier", "small"]
        chat += ["--max-tokens", "8", "What is your return policy?"]
        answered = _tiermesh([*chat, "--api-key", key, "--ca", str(ca)], env)
        assert answered.returncode == 0, answered.stdout + answered.stderr
        final = json.loads(answered.stdout.splitlines()[-1])
        assert final["type"] == "final" and final["tier"] == "small"

        refused = _tiermesh([*chat, "--ca", str(ca)], {**env, "TIERMESH_API_KEY": ""})
        error = json.loads(refused.stdout.splitlines()[-1])
        assert refused.returncode == 1 and error["code"] == "UNAUTHENTICATED"

        plaintext = _tiermesh([*chat, "--api-key", key], env)
        error = json.loads(plaintext.stdout.splitlines()[-1])
        assert plaintext.returncode == 1 and error["code"] == "UNAVAILABLE"
