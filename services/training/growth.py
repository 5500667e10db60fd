"""Grows a trained GPT-2 model wider or deeper, keeping what it computes, to warm-start a tier.

Deeper (grow_depth): each new block is a copy of the old block it follows with its two output
projections (attention and MLP `c_proj`) zeroed, so it adds nothing to the residual stream.
Wider (widen): twice the width and heads, every unit duplicated and the weights reading them
halved, plus a little noise so the duplicates can learn apart. The grown model gives the trained
one's logits, and training carries on from there with more parameters.
Knows transformers' GPT-2 module layout; nothing of files, data or serving.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def source_layers(old_depth: int, new_depth: int) -> list[int]:
    """Which old block each new block starts from: evenly spread, in order (4 -> 10 gives
    0,0,0,1,1,2,2,2,3,3); the first block taken from each old block is the original."""
    if not 0 < old_depth <= new_depth:
        raise ValueError(f"can only grow a model deeper: {old_depth} -> {new_depth} layers")
    return [i * old_depth // new_depth for i in range(new_depth)]


def grow_depth(trained: Any, model: Any) -> Any:
    """Loads `trained` (a GPT2LMHeadModel) into the deeper, same-width `model` and returns it.

    Embeddings, final layer norm and the head are copied; blocks follow source_layers.
    """
    old, new = trained.config, model.config
    mismatched = [
        f"{key} {getattr(old, key)} != {getattr(new, key)}"
        for key in ("n_embd", "n_head", "vocab_size", "n_positions")
        if getattr(old, key) != getattr(new, key)
    ]
    if mismatched:
        raise ValueError(f"grown model must match the trained one's shape: {', '.join(mismatched)}")
    with torch.no_grad():
        model.transformer.wte.load_state_dict(trained.transformer.wte.state_dict())
        model.transformer.wpe.load_state_dict(trained.transformer.wpe.state_dict())
        model.transformer.ln_f.load_state_dict(trained.transformer.ln_f.state_dict())
        seen: set[int] = set()
        for index, source in enumerate(source_layers(old.n_layer, new.n_layer)):
            block = model.transformer.h[index]  # keeps its own layer index (the KV cache's key)
            block.load_state_dict(trained.transformer.h[source].state_dict())
            if source in seen:
                for projection in (block.attn.c_proj, block.mlp.c_proj):
                    projection.weight.zero_()
                    projection.bias.zero_()
            seen.add(source)
        model.tie_weights()
    return model


def widen(trained: Any, model: Any, *, noise: float = 0.01, seed: int = 0) -> Any:
    """Loads `trained` into `model` of twice the width (and heads), same depth, and returns it.

    Every residual dimension, head and MLP unit is duplicated, and weights that read duplicated
    inputs are halved, so the wide model computes what the trained one does (layer norms see the
    same mean and variance; the final norm is halved because the head shares the doubled
    embedding). Duplicates would get equal gradients forever, so every weight matrix gets noise
    of `noise` x its own standard deviation to tell them apart.
    """
    old, new = trained.config, model.config
    if new.n_embd != 2 * old.n_embd or new.n_head != 2 * old.n_head or new.n_layer != old.n_layer:
        raise ValueError(
            "widening doubles width and heads at the same depth: "
            f"{old.n_layer}x{old.n_embd}/{old.n_head} -> {new.n_layer}x{new.n_embd}/{new.n_head}"
        )
    generator = torch.Generator().manual_seed(seed)

    def doubled(weight: torch.Tensor, chunks: int = 1) -> torch.Tensor:
        # Conv1D weights are (in, out): inputs doubled (rows, halved), outputs doubled (columns;
        # `chunks` splits them first, for q, k and v), then the noise
        parts = weight.reshape(weight.shape[0], chunks, -1)
        out = torch.cat([parts, parts], dim=2).reshape(weight.shape[0], -1)
        out = torch.cat([out, out], dim=0) / 2
        return out + torch.randn(out.shape, generator=generator) * noise * float(out.std())

    def bias(values: torch.Tensor, chunks: int = 1) -> torch.Tensor:
        parts = values.reshape(chunks, -1)
        return torch.cat([parts, parts], dim=1).reshape(-1)

    source = trained.state_dict()
    with torch.no_grad():
        for name, target in model.state_dict().items():
            if name == "lm_head.weight":
                continue  # tied to transformer.wte
            value = source[name].float()
            if name.endswith(("wte.weight", "wpe.weight")):
                grown = torch.cat([value, value], dim=1)
            elif ".ln_f." in name:
                grown = torch.cat([value, value]) / 2
            elif ".ln_" in name:
                grown = torch.cat([value, value])
            elif name.endswith("attn.c_attn.weight"):
                grown = doubled(value, chunks=3)
            elif name.endswith("attn.c_attn.bias"):
                grown = bias(value, chunks=3)
            elif name.endswith(".weight"):  # attn.c_proj, mlp.c_fc, mlp.c_proj
                grown = doubled(value)
            elif name.endswith(".bias"):
                grown = bias(value)
            else:
                raise ValueError(f"do not know how to widen {name}")
            if grown.shape != target.shape:
                raise ValueError(f"{name}: widened to {tuple(grown.shape)}, need {target.shape}")
            target.copy_(grown.to(target.dtype))
        model.tie_weights()
    return model


def grow(trained: Any, model: Any, build: Callable[[int, int, int], Any]) -> Any:
    """Grows `trained` into `model`: twice as wide first if needed, then deeper.

    `build(n_layer, n_embd, n_head)` makes a fresh model of another shape (the wide step, when
    the model also grows deeper).
    """
    old, new = trained.config, model.config
    if new.n_embd != old.n_embd:
        if new.n_layer == old.n_layer:
            return widen(trained, model)
        trained = widen(trained, build(old.n_layer, new.n_embd, new.n_head))
    return grow_depth(trained, model)
