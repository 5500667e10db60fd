"""The control plane's last good topology on disk: saved on every publish, served at start when
the topology file has since become invalid, and refused loudly when neither is usable."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh.control_plane import ControlPlane
from mesh.last_good import last_good_path, load_or_last_good, save_last_good
from mesh.topology import dump_yaml, local_topology
from services.common.errors import ConfigError

BROKEN = """\
tiers:
  small:
    clusters:
      - name: small-v1
        weight: heavy
        endpoints: []
"""


def _resolve(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]


def test_saved_topology_is_served_when_the_file_turns_invalid(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    topology = local_topology({"small": 7001, "medium": 7002, "large": 7003})
    path.write_text(dump_yaml(topology))
    saved = save_last_good(topology, path)
    assert saved == tmp_path / "topology.last-good.yaml"
    assert {p.name for p in tmp_path.iterdir()} == {"topology.yaml", saved.name}  # no temporary
    path.write_text(BROKEN)
    loaded = load_or_last_good(path)
    assert loaded.topology == topology
    assert "weight" in loaded.fallback_reason
    assert "serving the last good topology" in loaded.fallback_reason


def test_invalid_file_with_no_saved_copy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(BROKEN)
    with pytest.raises(ConfigError, match="weight"):
        load_or_last_good(path)


def test_the_plane_saves_each_published_file_and_starts_from_it(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    first = local_topology({"small": 7001, "medium": 7002, "large": 7003})
    path.write_text(dump_yaml(first))
    plane = ControlPlane(resolve=_resolve)
    plane.load_at_start(path)
    assert plane.last_error == ""
    second = local_topology({"small": 7101, "medium": 7102, "large": 7103})
    path.write_text(dump_yaml(second))
    assert plane.reload(path)
    path.write_text(BROKEN)
    assert not plane.reload(path)

    restarted = ControlPlane(resolve=_resolve)
    restarted.load_at_start(path)
    assert restarted.source == second
    assert "serving the last good topology" in restarted.last_error
    assert last_good_path(path).is_file()
