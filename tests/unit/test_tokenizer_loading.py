"""Tokenizer-only helpers import no torch: chunking and tokenizer loading stay light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.tier.tokenizer_loading import (
    IncrementalDetokenizer,
    encode_prompt,
    eos_token_ids,
    load_tokenizer,
    render_prompt,
)

ROOT = Path(__file__).resolve().parents[2]


def _torch_loaded_after(code: str) -> bool:
    result = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\nprint('torch' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1] == "True"


def test_importing_chunking_loads_no_torch() -> None:
    assert not _torch_loaded_after("import services.tier.chunking")


def test_loading_a_tokenizer_and_rendering_a_prompt_loads_no_torch(tiny_model_dir: Path) -> None:
    code = (
        "from pathlib import Path\n"
        "from services.tier.tokenizer_loading import encode_prompt, load_tokenizer, render_prompt\n"
        f"t = load_tokenizer(Path({str(tiny_model_dir)!r}))\n"
        "assert encode_prompt(t, render_prompt(t, [('user', 'Hi')]))"
    )
    assert not _torch_loaded_after(code)


def test_loaded_tokenizer_round_trips(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    assert render_prompt(tokenizer, [("user", "Hi")]) == "user: Hi\nassistant:"  # no template
    ids = encode_prompt(tokenizer, "What is your return policy?")
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.add([i]) for i in ids) == "What is your return policy?"
    assert eos_token_ids(tiny_model_dir, tokenizer) == {tokenizer.eos_token_id}
