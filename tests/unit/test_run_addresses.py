"""The run directory's mesh.json (services/launcher/run_addresses.py): which launcher children
are tiers, the file written and read back, and anything else read as no file at all."""

from __future__ import annotations

from pathlib import Path

from services.launcher.run_addresses import (
    RunAddresses,
    read_run_addresses,
    remove_run_addresses,
    run_addresses,
    tier_of,
    write_run_addresses,
)

CHILDREN = [
    ("small", "127.0.0.1:46010"),
    ("small-2", "127.0.0.1:46099"),
    ("medium", "127.0.0.1:46011"),
    ("large", "127.0.0.1:46012"),
    ("control-plane", "127.0.0.1:46030"),
    ("gateway", "127.0.0.1:46040"),
    ("router", "127.0.0.1:46000"),
]


def test_tiers_and_their_replicas_are_told_from_other_services() -> None:
    assert [tier_of(name) for name, _ in CHILDREN] == [
        "small", "small", "medium", "large", None, None, None,
    ]  # fmt: skip
    assert tier_of("small-") is None and tier_of("huge-2") is None


def test_written_then_read_back(tmp_path: Path) -> None:
    addresses = run_addresses(CHILDREN)
    assert addresses == RunAddresses(
        "127.0.0.1:46000",
        "127.0.0.1:46040",
        {
            "small": ["127.0.0.1:46010", "127.0.0.1:46099"],
            "medium": ["127.0.0.1:46011"],
            "large": ["127.0.0.1:46012"],
        },
    )
    path = write_run_addresses(tmp_path, addresses)
    assert path == tmp_path / "mesh.json" and not (tmp_path / "mesh.tmp").exists()
    assert read_run_addresses(tmp_path) == addresses
    assert addresses.replicas()[:2] == [("small", "127.0.0.1:46010"), ("small", "127.0.0.1:46099")]
    remove_run_addresses(tmp_path)
    assert read_run_addresses(tmp_path) is None
    remove_run_addresses(tmp_path)  # already gone: nothing to do


def test_a_file_of_another_shape_reads_as_none(tmp_path: Path) -> None:
    for text in ("{not json", "[]", '{"router": "x"}', '{"router": "x", "tiers": []}'):
        (tmp_path / "mesh.json").write_text(text)
        assert read_run_addresses(tmp_path) is None, text
