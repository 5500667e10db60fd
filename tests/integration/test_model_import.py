"""`tiermesh models import` on what needs no GGUF file: an HF folder (the tiny GPT-2 and a tiny
Llama) into a tier model folder in the chosen dtype, and the errors that name what was wrong.
The real GGUF import is in test_real_checkpoint.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from services.cli.main import main as tiermesh
from services.common.cpu_features import cpu_flags, fastest_cpu_dtype
from services.tier.model_loading import imported_dtype, load_causal_lm
from services.training.model_import import (
    ORIGIN_FILE,
    ImportFailed,
    import_model,
    package_gguf,
    sha256_of,
)
from tests.tiny_llama import build_tiny_llama


def test_an_hf_folder_imports_in_bfloat16(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = build_tiny_llama(tmp_path / "source", tiny_model_dir, tie_word_embeddings=False)
    out = tmp_path / "imported"
    origin = import_model(source, out, "bfloat16")
    assert (origin.source_format, origin.architecture, origin.dtype) == ("hf", "llama", "bfloat16")
    assert origin.source_sha256 == sha256_of(sorted(source.glob("*.safetensors")))
    assert json.loads((out / ORIGIN_FILE).read_text())["params"] == origin.params
    assert imported_dtype(out) == "bfloat16"
    loaded = load_causal_lm(out, dtype="bfloat16")
    original = load_causal_lm(source)
    assert loaded.params == original.params
    for name, weight in original.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], weight.to(torch.bfloat16)), name


def test_the_command_writes_the_folder_in_the_cpus_fastest_dtype(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "gpt2"
    code = tiermesh(["models", "import", str(tiny_model_dir), "--out", str(out), "--json"])
    assert code == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out.strip().splitlines()[-1])
    fastest, why = fastest_cpu_dtype(cpu_flags())
    assert (printed["architecture"], printed["dtype"]) == ("gpt2", fastest)
    assert printed["dtype_choice"] == f"auto: {why}"
    assert f"({fastest}; auto: {why})" in captured.err
    assert imported_dtype(out) == fastest
    assert load_causal_lm(out, dtype=fastest).params == printed["params"]


def test_a_dtype_asked_for_is_the_one_written(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "gpt2"
    args = ["models", "import", str(tiny_model_dir), "--out", str(out), "--dtype", "float32"]
    assert tiermesh([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (printed["dtype"], printed["dtype_choice"]) == ("float32", "asked")
    assert imported_dtype(out) == "float32"


def test_import_errors_name_what_was_wrong(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ImportFailed, match=r"neither a \.gguf file nor a model folder"):
        import_model(tmp_path / "missing.bin", tmp_path / "out")
    with pytest.raises(ImportFailed, match=r"no config\.json"):
        import_model(tmp_path, tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ImportFailed, match="exists and is not empty"):
        import_model(tiny_model_dir, tmp_path / "full")
    with pytest.raises(ImportFailed, match="'no-such-package-here' is not installed"):
        package_gguf("no-such-package-here")
    with pytest.raises(ImportFailed, match=r"ships no \.gguf file"):
        package_gguf("pytest")


def test_the_command_wants_one_source(tmp_path: Path, capsys) -> None:
    assert tiermesh(["models", "import", "--out", str(tmp_path / "o")]) == 2
    assert "give SOURCE or --from-package" in capsys.readouterr().err
    code = tiermesh(["models", "import", "x.gguf", "--from-package", "p", "--out", "o"])
    assert code == 2
