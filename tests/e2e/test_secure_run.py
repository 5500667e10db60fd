"""`tiermesh run --secure` end to end, as the README shows it: the mesh comes up with TLS
everywhere and API keys at the router; `tiermesh keys create` prints a key; `tiermesh chat
--api-key KEY --ca ...` answers; without the key it is UNAUTHENTICATED; a plaintext client gets
no answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from services.launcher.local_mesh import free_base_port
from tests.e2e.run_process import ROOT, TIERMESH, tiermesh_run
from tests.tiny_model import build_tiny_model

pytestmark = pytest.mark.timeout(400)  # five or six processes start on a busy 2-core machine


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


def test_secure_run_with_the_mesh_serves_xds_over_mtls(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`--secure --mesh`: the router gets its tiers from the control plane over mTLS (its xDS
    bootstrap's `tls` channel credentials) and answers; the control plane's status needs an
    admin key."""
    base = free_base_port()
    run_dir = tmp_path / "run"
    env = {"TIERMESH_RUN_DIR": str(run_dir)}
    models = [a for t in ("small", "medium", "large") for a in ("--model", f"{t}={tiny_model_dir}")]
    args = ["--secure", "--mesh", "--base-port", str(base), *models]
    certs = run_dir / "certs"
    ca = certs / "ca.pem"
    with tiermesh_run(args, env) as (_process, output):
        printed = "".join(output)
        assert "--api-key ADMIN_KEY" in printed
        chat_key = _tiermesh(["keys", "create", "--name", "app", "--scopes", "chat"], env)
        admin_key = _tiermesh(["keys", "create", "--name", "ops", "--scopes", "admin"], env)
        chat = ["chat", "--router", f"localhost:{base}", "--json", "--mode", "pinned"]
        chat += ["--tier", "small", "--max-tokens", "8", "--ca", str(ca), "Where is my order?"]
        answered = _tiermesh([*chat, "--api-key", chat_key.stdout.strip()], env)
        assert answered.returncode == 0, answered.stdout + answered.stderr
        assert json.loads(answered.stdout.splitlines()[-1])["type"] == "final"

        status = ["mesh", "status", "--json", "--address", f"127.0.0.1:{base + 30}"]
        status += ["--ca", str(ca), "--cert", str(certs / "launcher.pem")]
        status += ["--key", str(certs / "launcher-key.pem")]
        shown = _tiermesh([*status, "--api-key", admin_key.stdout.strip()], env)
        assert shown.returncode == 0, shown.stderr
        (router,) = [
            n for n in json.loads(shown.stdout)["nodes"] if n["node_id"].startswith("router")
        ]
        assert {t["state"] for t in router["types"]} == {"ACKED"}
        denied = _tiermesh([*status, "--api-key", chat_key.stdout.strip()], env)
        assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr

        # an operator's hot swap of a tier: TLS with a certificate of the mesh's CA, admin key
        swap = ["tier", "swap", "small", str(tiny_model_dir), "--json"]
        swap += ["--address", f"127.0.0.1:{base + 10}", *status[5:]]
        swapped = _tiermesh([*swap, "--api-key", admin_key.stdout.strip()], env)
        assert swapped.returncode == 0, swapped.stdout + swapped.stderr
        refused = _tiermesh([*swap, "--api-key", chat_key.stdout.strip()], env)
        assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr, refused.stderr
