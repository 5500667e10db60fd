"""Growing a trained GPT-2 deeper keeps its outputs, keeps its cache working, and then trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from services.training.growth import grow, grow_depth, source_layers, widen
from services.training.trainer import load_trained, save_checkpoint


def _model(n_layer: int, n_embd: int = 32, seed: int = 0, n_head: int = 4) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=50,
        n_positions=32,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    model.train(False)
    return model


def test_source_layers_spread_in_order() -> None:
    assert source_layers(4, 10) == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert source_layers(3, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="deeper"):
        source_layers(5, 4)


def test_grown_model_gives_the_trained_models_logits_and_generations() -> None:
    trained = _model(2, seed=1)
    grown = grow_depth(trained, _model(5, seed=2))
    ids = torch.randint(1, 50, (3, 12))
    with torch.no_grad():
        assert torch.allclose(trained(ids).logits, grown(ids).logits, atol=1e-5)
    # each block keeps its own layer index, so the KV cache of generation still lines up
    assert [block.attn.layer_idx for block in grown.transformer.h] == list(range(5))
    prompt = ids[:1, :4]
    greedy = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(trained.generate(prompt, **greedy), grown.generate(prompt, **greedy))
    assert grown.lm_head.weight.data_ptr() == grown.transformer.wte.weight.data_ptr()


def test_new_blocks_learn_after_growth() -> None:
    grown = grow_depth(_model(1, seed=1), _model(3, seed=2)).train()
    ids = torch.randint(1, 50, (4, 10))
    grown(input_ids=ids, labels=ids).loss.backward()
    new_projection = grown.transformer.h[1].mlp.c_proj.weight
    assert torch.count_nonzero(new_projection) == 0
    assert new_projection.grad is not None and torch.count_nonzero(new_projection.grad) > 0


def test_growth_refuses_another_width() -> None:
    with pytest.raises(ValueError, match="n_embd 32 != 64"):
        grow_depth(_model(1), _model(2, n_embd=64))


def test_widened_model_computes_what_the_narrow_one_does() -> None:
    narrow = _model(2, seed=1)
    ids = torch.randint(1, 50, (3, 12))
    exact = widen(narrow, _model(2, n_embd=64, n_head=8, seed=2), noise=0.0)
    jittered = widen(narrow, _model(2, n_embd=64, n_head=8, seed=3))
    with torch.no_grad():
        reference = narrow(ids).logits
        assert torch.allclose(reference, exact(ids).logits, atol=1e-5)
        # the default noise tells duplicates apart but keeps the function nearly the same
        assert not torch.allclose(reference, jittered(ids).logits, atol=1e-5)
        assert torch.allclose(reference, jittered(ids).logits, atol=0.05)
    halves = jittered.transformer.h[0].mlp.c_fc.weight.detach().split(32, dim=0)
    assert not torch.equal(halves[0], halves[1])


def test_widening_only_doubles_at_the_same_depth() -> None:
    with pytest.raises(ValueError, match="doubles width and heads"):
        widen(_model(2), _model(2, n_embd=48, n_head=6))
    with pytest.raises(ValueError, match="doubles width and heads"):
        widen(_model(2), _model(3, n_embd=64, n_head=8))


def test_grow_widens_then_deepens() -> None:
    narrow = _model(1, seed=1)

    def build(n_layer: int, n_embd: int, n_head: int) -> GPT2LMHeadModel:
        return _model(n_layer, n_embd=n_embd, n_head=n_head, seed=5)

    grown = grow(narrow, _model(3, n_embd=64, n_head=8, seed=4), build)
    assert grown.config.n_layer == 3 and grown.config.n_embd == 64
    ids = torch.randint(1, 50, (2, 10))
    with torch.no_grad():
        assert torch.allclose(narrow(ids).logits, grown(ids).logits, atol=0.05)


def test_load_trained_refuses_a_missing_folder_or_another_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    with pytest.raises(FileNotFoundError, match="train it first"):
        load_trained(tmp_path / "nowhere", tokenizer=None)
    small = Path(__file__).resolve().parents[2] / "services" / "tier_small" / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(small))
    model = GPT2LMHeadModel.from_pretrained(str(small))
    save_checkpoint(model, tokenizer, tmp_path / "copy")
    loaded = load_trained(tmp_path / "copy", tokenizer)
    assert loaded.dtype == torch.float32 and loaded.config.n_layer == model.config.n_layer
    other = dict(tokenizer.get_vocab())
    other.pop(next(iter(other)))
    with pytest.raises(ValueError, match="another tokenizer"):
        load_trained(tmp_path / "copy", _VocabOnly(other))


class _VocabOnly:
    """Stands in for a different tokenizer: only its vocabulary is compared."""

    def __init__(self, vocab: dict[str, int]):
        self._vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self._vocab
