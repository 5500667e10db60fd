"""The client distribution as a user installs it: the wheel `make client` builds, in a brand-new
venv, installs no server dependency, imports, and chats with a `tiermesh run` mesh (built-in
models) through its own RouterClient: the same answer the project's own CLI gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from services.launcher.local_mesh import free_base_port
from tests.e2e.run_process import ROOT, TIERMESH, tiermesh_run

SERVER_ONLY = {"torch", "transformers", "numpy", "scikit-learn", "matplotlib", "xds-protos"}
PROMPT = "What is your return policy?"


def _run(command: list[str], cwd: Path, timeout: float = 300) -> str:
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        command, cwd=cwd, env=clean_env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the tiermesh-client wheel and what it depends on."""
    work = tmp_path_factory.mktemp("client")
    dist = work / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["-w", str(dist), str(ROOT / "clients" / "python")],
        cwd=ROOT,
    )
    wheels = list(dist.glob("tiermesh_client-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheels[0])], cwd=work)
    return python


def test_wheel_carries_stubs_and_sdk_without_server_dependencies(client_venv: Path) -> None:
    listed = json.loads(
        _run([str(client_venv), "-m", "pip", "list", "--format", "json"], cwd=client_venv.parent)
    )
    installed = {p["name"].lower().replace("_", "-") for p in listed}
    assert "tiermesh-client" in installed
    assert {"grpcio", "protobuf"} <= installed
    assert not installed & SERVER_ONLY, installed & SERVER_ONLY
    probe = textwrap.dedent(
        """
        import sys
        from tiermesh.client import RouterClient, AsyncRouterClient, ChatError
        from tiermesh.v1 import router_pb2, router_pb2_grpc, tier_pb2, common_pb2
        import tiermesh.client, tiermesh.v1.router_pb2 as generated
        assert "site-packages" in tiermesh.client.__file__, tiermesh.client.__file__
        assert "site-packages" in generated.__file__, generated.__file__
        assert router_pb2.ChatRequest(prompt="x").prompt == "x"
        print(sorted(m for m in ("services", "mesh", "torch") if m in sys.modules))
        """
    )
    # run from the venv's folder so nothing of the repository is importable
    out = _run([str(client_venv), "-c", probe], cwd=client_venv.parent)
    assert out.strip() == "[]"


def test_wheel_client_chats_with_a_running_mesh(client_venv: Path, tmp_path: Path) -> None:
    base = free_base_port()
    router = f"127.0.0.1:{base}"
    chat = textwrap.dedent(
        f"""
        import json
        from tiermesh.client import RouterClient
        with RouterClient({router!r}) as client:
            result = client.chat({PROMPT!r}, mode="progressive", timeout=60)
        print(json.dumps({{"text": result.text, "tier": result.tier,
                          "revision": result.revision,
                          "events": [type(e).__name__ for e in result.events]}}))
        """
    )
    env = {"TIERMESH_RUN_DIR": str(tmp_path / "run")}
    with tiermesh_run(["--base-port", str(base)], env):
        answer = json.loads(_run([str(client_venv), "-c", chat], cwd=client_venv.parent))
        cli = _run(
            [*TIERMESH, "chat", "--router", router, "--mode", "progressive", "--json", PROMPT],
            cwd=ROOT,
        )
    final = json.loads(cli.splitlines()[-1])
    assert final["type"] == "final"
    assert answer["events"][0] == "RouteEvent" and answer["events"][-1] == "FinalEvent"
    assert answer["text"].strip(), answer
    assert (answer["text"], answer["tier"], answer["revision"]) == (
        final["text"],
        final["tier"],
        final["revision"],
    )
