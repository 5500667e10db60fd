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


def test_a_continued_detokenizer_sends_what_the_broken_stream_held_back(
    tiny_model_dir: Path,
) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    text = "Café crème: 3 € each, ça va?"
    ids = encode_prompt(tokenizer, text)
    first = IncrementalDetokenizer(tokenizer)
    had = [first.add([i]) for i in ids]  # one token per chunk, as a broken stream sent them
    assert "".join(had) + first.add([], final=True) == text
    assert any(delta == "" for delta in had), "the text should split a character somewhere"
    for k in range(1, len(ids)):
        sent = "".join(had[:k])
        rest = IncrementalDetokenizer(tokenizer, ids[:k], len(sent))
        tail = "".join(rest.add([i]) for i in ids[k:]) + rest.add([], final=True)
        assert sent + tail == text, k
