"""A model folder's fingerprint: the same checkpoint anywhere, under any folder name, has the
same one; other weights, another tokenizer or config, or a weights file changed at its end, a
different one; the import record does not count. Real tiny checkpoints written by the test."""

from __future__ import annotations

import shutil
from pathlib import Path

from services.tier.model_fingerprint import SAMPLE_BYTES, folder_fingerprint
from tests.tiny_model import build_tiny_model


def test_a_checkpoint_keeps_its_fingerprint_wherever_it_lies(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(tiny_model_dir, tmp_path / "elsewhere" / "renamed")
    (copy / "tiermesh.json").write_text('{"origin": "copied"}')  # the import record: left out
    fingerprint = folder_fingerprint(tiny_model_dir)
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert folder_fingerprint(copy) == fingerprint


def test_other_weights_config_or_tokenizer_change_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    fingerprint = folder_fingerprint(tiny_model_dir)
    retrained = build_tiny_model(tmp_path / "a" / tiny_model_dir.name, seed=1)  # same name
    assert folder_fingerprint(retrained) != fingerprint
    for name in ("config.json", "tokenizer.json"):
        changed = shutil.copytree(tiny_model_dir, tmp_path / f"changed-{name}")
        (changed / name).write_text((changed / name).read_text() + " ")
        assert folder_fingerprint(changed) != fingerprint, name


def test_a_weights_file_changed_past_its_first_mib_changes_it(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    weights = bytearray(3 * SAMPLE_BYTES)
    (folder / "model.safetensors").write_bytes(weights)
    before = folder_fingerprint(folder)
    weights[-1] = 1  # the last MiB is read too
    (folder / "model.safetensors").write_bytes(weights)
    assert folder_fingerprint(folder) != before
