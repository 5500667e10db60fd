"""`tiermesh models eval --json` on the tiny real checkpoint: the JSON shape, with accuracy on
seen and unseen phrasings reported apart under the same class keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.main import main
from services.workload import CLASSES


def test_eval_json_reports_seen_and_unseen_accuracy(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "small").symlink_to(tiny_model_dir, target_is_directory=True)
    argv = ["models", "eval", "--json", "--out", str(tmp_path), "--tiers", "small"]
    assert main([*argv, "--limit", "2", "--split", "dev"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    small = report["tiers"]["small"]
    assert set(small["accuracy"]) == set(small["accuracy_unseen"]) == set(CLASSES)
    assert small["counts"] == {"simple": 2, "medium": 2, "complex": 2}
    assert small["counts_unseen"] == {"simple": 2, "medium": 2, "complex": 0}
    assert small["accuracy_unseen"]["complex"] is None  # complex orders have no unseen phrasing
    for accuracy in (*small["accuracy"].values(), *small["accuracy_unseen"].values()):
        assert accuracy is None or 0.0 <= accuracy <= 1.0
    for field in ("params", "bytes", "tokens_per_s", "ttft_ms"):
        assert field in small
    assert main([*argv, "--limit", "1", "--split", "dev", "--phrasing", "unseen"]) == 0
    only_unseen = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tiers"]["small"]
    assert only_unseen["counts"] == {"simple": 0, "medium": 0, "complex": 0}
    assert only_unseen["counts_unseen"] == {"simple": 1, "medium": 1, "complex": 0}
    assert set(only_unseen["accuracy"].values()) == {None}
