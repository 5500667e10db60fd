"""The KV-cached decode loop against transformers' own generate, on a real tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.tier.decode import NonFiniteLogits, choose_token, decode_steps
from services.tier.engine import Sampling
from services.tier.model_loading import load_causal_lm
from services.tier.tokenizer_loading import IncrementalDetokenizer, encode_prompt


def test_greedy_decode_matches_generate(tiny_model_dir: Path) -> None:
    loaded = load_causal_lm(tiny_model_dir)
    prompt = encode_prompt(loaded.tokenizer, "user: What is your return policy?\nassistant:")
    ours = [
        token
        for token, _, _ in decode_steps(
            loaded.model,
            prompt,
            max_new_tokens=20,
            sampling=Sampling(),
            eos_token_ids=frozenset(),
        )
    ]
    with torch.inference_mode():
        reference = loaded.model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert ours == reference


def test_logprobs_are_log_probabilities(tiny_model_dir: Path) -> None:
    loaded = load_causal_lm(tiny_model_dir)
    prompt = encode_prompt(loaded.tokenizer, "Hello")
    steps = list(
        decode_steps(
            loaded.model, prompt, max_new_tokens=5, sampling=Sampling(), eos_token_ids=frozenset()
        )
    )
    assert len(steps) == 5
    assert all(logprob <= 0.0 for _, logprob, _ in steps)


def test_seeded_sampling_is_reproducible_and_stop_is_honoured(tiny_model_dir: Path) -> None:
    loaded = load_causal_lm(tiny_model_dir)
    prompt = encode_prompt(loaded.tokenizer, "Hello")
    sampling = Sampling(temperature=1.0, top_p=0.9, top_k=50, seed=3)

    def run() -> list[int]:
        steps = decode_steps(
            loaded.model, prompt, max_new_tokens=12, sampling=sampling, eos_token_ids=frozenset()
        )
        return [token for token, _, _ in steps]

    assert run() == run()
    calls = iter(range(100))
    stopped = decode_steps(
        loaded.model,
        prompt,
        max_new_tokens=12,
        sampling=Sampling(),
        eos_token_ids=frozenset(),
        should_stop=lambda: next(calls) >= 3,
    )
    assert len(list(stopped)) == 3


def test_incremental_detokenizer_holds_back_split_characters(tiny_model_dir: Path) -> None:
    loaded = load_causal_lm(tiny_model_dir)
    text = "price: 5€ ok"
    ids = encode_prompt(loaded.tokenizer, text)
    detok = IncrementalDetokenizer(loaded.tokenizer)
    deltas = [detok.add([token]) for token in ids]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_non_finite_logits_are_refused_naming_the_cause() -> None:
    logits = torch.zeros(8)
    logits[3] = float("nan")
    for sampling in (Sampling(), Sampling(temperature=1.0, seed=1)):
        with pytest.raises(NonFiniteLogits, match="non-finite logits"):
            choose_token(logits, sampling, None)
