"""The gRPC xDS bootstrap `tiermesh mesh bootstrap` writes: every node field the gRPC xDS
bootstrap design lists (locality included, which some non-Python clients require), and
`--validate` naming what a file lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mesh.bootstrap import bootstrap_problems, grpc_bootstrap


def test_written_bootstrap_has_a_locality_and_validates() -> None:
    bootstrap = grpc_bootstrap("10.0.0.5:50081", "router-1", zone="z1", region="r1")
    assert bootstrap["node"]["locality"] == {"region": "r1", "zone": "z1", "sub_zone": ""}
    assert bootstrap["node"]["id"] == "router-1"
    assert bootstrap_problems(bootstrap) == []


def test_problems_name_each_missing_or_wrong_field() -> None:
    bootstrap = grpc_bootstrap("h:1", "n")
    del bootstrap["node"]["locality"]
    bootstrap["xds_servers"][0]["channel_creds"] = [{"type": "plaintext"}]
    bootstrap["xds_servers"][0]["server_features"] = []
    problems = bootstrap_problems(bootstrap)
    assert any(p.startswith("node.locality: missing") for p in problems), problems
    assert any(p.startswith("xds_servers[0].channel_creds: no entry") for p in problems)
    assert any("xds_v3" in p for p in problems)
    assert bootstrap_problems({"node": {"id": ""}}) == [
        "xds_servers: must be a non-empty list of control plane servers",
        "node.id: must be a non-empty string",
        'node.locality: missing (some xDS clients refuse a node without it; {"region": "", '
        '"zone": "", "sub_zone": ""} will do)',
    ]
    assert bootstrap_problems([]) == ["the bootstrap must be a JSON object"]


def _tiermesh(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "services.cli", "mesh", "bootstrap", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_cli_output_passes_validate_and_a_bad_file_fails(tmp_path: Path) -> None:
    written = _tiermesh("--node-id", "r1", "--zone", "z")
    assert written.returncode == 0, written.stderr
    good = tmp_path / "good.json"
    good.write_text(written.stdout)
    assert json.loads(written.stdout)["node"]["locality"]["zone"] == "z"
    checked = _tiermesh("--validate", str(good))
    assert checked.returncode == 0, checked.stderr
    assert "a valid gRPC xDS bootstrap" in checked.stdout

    bad = tmp_path / "bad.json"
    doc = json.loads(written.stdout)
    del doc["node"]["locality"]
    bad.write_text(json.dumps(doc))
    refused = _tiermesh("--validate", str(bad))
    assert refused.returncode == 1
    assert f"{bad}: node.locality: missing" in refused.stderr

    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert _tiermesh("--validate", str(broken)).returncode == 1
