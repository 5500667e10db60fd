"""GPT-2 forward passes that read and write a KvCachePool: batched decode of many sequences
at different lengths in one step, and prefill of one prompt into its slot.

Uses the weights of a transformers GPT2LMHeadModel as they are; knows nothing of tokenizers,
sampling, requests or gRPC. Matches transformers' own GPT-2 forward (eval mode, no dropout).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from services.tier.kv_pool import KvCachePool


def supports(model: Any) -> bool:
    """True for the GPT-2 configurations these passes reproduce exactly."""
    config = model.config
    return bool(
        config.model_type == "gpt2"
        and config.scale_attn_weights
        and not config.scale_attn_by_inverse_layer_idx
        and not config.reorder_and_upcast_attn
    )


def create_pool(model: Any, slots: int, max_len: int) -> KvCachePool:
    config = model.config
    weight = model.transformer.wte.weight
    return KvCachePool(
        layers=config.n_layer,
        slots=slots,
        heads=config.n_head,
        max_len=max_len,
        head_dim=config.n_embd // config.n_head,
        dtype=weight.dtype,
        device=weight.device,
    )


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    batch, steps, width = x.shape  # (B, T, C)
    return x.view(batch, steps, heads, width // heads).transpose(1, 2)  # (B, nh, T, hs)


@torch.inference_mode()
def prefill(model: Any, pool: KvCachePool, slot: int, prompt_ids: list[int]) -> torch.Tensor:
    """Runs the prompt through the model into `slot`; returns the last position's logits (V,)."""
    gpt = model.transformer
    heads, width = model.config.n_head, model.config.n_embd
    device = gpt.wte.weight.device
    steps = len(prompt_ids)
    tokens = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, T)
    positions = torch.arange(steps, device=device)[None, :]  # (1, T)
    x = gpt.wte(tokens) + gpt.wpe(positions)  # (1, T, C)
    for layer, block in enumerate(gpt.h):
        q, k, v = block.attn.c_attn(block.ln_1(x)).split(width, dim=2)  # 3 x (1, T, C)
        q, k, v = (_split_heads(t, heads) for t in (q, k, v))  # (1, nh, T, hs)
        pool.keys[layer, slot, :, :steps] = k[0]
        pool.values[layer, slot, :, :steps] = v[0]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, nh, T, hs)
        y = y.transpose(1, 2).reshape(1, steps, width)  # (1, T, C)
        x = x + block.attn.c_proj(y)
        x = x + block.mlp(block.ln_2(x))
    pool.lengths[slot] = steps
    last = gpt.ln_f(x[:, -1:])  # (1, 1, C)
    logits: torch.Tensor = model.lm_head(last)[0, 0]  # (V,)
    return logits


@torch.inference_mode()
def decode_step(model: Any, pool: KvCachePool, slots: list[int], tokens: list[int]) -> torch.Tensor:
    """Feeds one new token per slot (each at its own position) and returns logits (B, V).

    Every slot's sequence grows by one position. Attention reads positions [0, length] of each
    slot; the longer tail of the batch's window is masked out.
    """
    gpt = model.transformer
    heads, width = model.config.n_head, model.config.n_embd
    device = gpt.wte.weight.device
    batch = len(slots)
    slot_index = torch.tensor(slots, dtype=torch.long, device=device)  # (B,)
    lengths = [pool.lengths[s] for s in slots]
    position = torch.tensor(lengths, dtype=torch.long, device=device)  # (B,)
    window = max(lengths) + 1
    mask: torch.Tensor | None = None  # every row sees its whole window: no mask needed
    if min(lengths) != window - 1:
        mask = torch.arange(window, device=device)[None, :] <= position[:, None]  # (B, W)
        mask = mask[:, None, None, :]  # (B, 1, 1, W)
    first = slots[0]
    contiguous = slots == list(range(first, first + batch))  # then slices are views, not copies
    token = torch.tensor(tokens, dtype=torch.long, device=device)[:, None]  # (B, 1)
    x = gpt.wte(token) + gpt.wpe(position[:, None])  # (B, 1, C)
    for layer, block in enumerate(gpt.h):
        q, k, v = block.attn.c_attn(block.ln_1(x)).split(width, dim=2)  # 3 x (B, 1, C)
        q, k, v = (_split_heads(t, heads) for t in (q, k, v))  # (B, nh, 1, hs)
        pool.keys[layer, slot_index, :, position] = k[:, :, 0]  # (B, nh, hs) into (S, nh, T, hs)
        pool.values[layer, slot_index, :, position] = v[:, :, 0]
        if contiguous:
            keys = pool.keys[layer, first : first + batch, :, :window]  # (B, nh, W, hs)
            values = pool.values[layer, first : first + batch, :, :window]  # (B, nh, W, hs)
        else:
            keys = pool.keys[layer, slot_index, :, :window]  # (B, nh, W, hs)
            values = pool.values[layer, slot_index, :, :window]  # (B, nh, W, hs)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, nh, 1, hs)
        y = y.transpose(1, 2).reshape(batch, 1, width)  # (B, 1, C)
        x = x + block.attn.c_proj(y)
        x = x + block.mlp(block.ln_2(x))
    for s in slots:
        pool.lengths[s] += 1
    logits: torch.Tensor = model.lm_head(gpt.ln_f(x))[:, 0]  # (B, V)
    return logits
