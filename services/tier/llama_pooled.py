"""Llama-family forward passes that read and write a KvCachePool: batched decode of many
sequences at different lengths in one step, and batched prefill of several prompts into their
slots.

The Llama architecture: RMSNorm, rotary position embeddings (the model's own rotary module, so
the config's rope_theta and static rope scaling hold), grouped-query attention (the pool keeps
only the key/value heads), SwiGLU MLP, tied or untied lm_head. Qwen2 (biased q/k/v) and Mistral
share it while their sliding window, if any, covers the whole pool slot. Uses the weights of the
transformers model as they are; knows nothing of tokenizers, sampling, requests or gRPC.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from services.tier.kv_pool import KvCachePool, PrefillBatch

MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
# rope types whose frequencies are fixed at load; "dynamic" and "longrope" change them with the
# longest position in the batch, so a batched row would not match the same request alone
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def unsupported(model: Any, max_len: int) -> str | None:
    """None when these passes reproduce `model`'s own forward over slots of `max_len`."""
    config = model.config
    rope_type = str(getattr(model.model.rotary_emb, "rope_type", "?"))
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope type {rope_type!r} is not one of {', '.join(sorted(STATIC_ROPE_TYPES))}"
    window = _sliding_window(config)
    if window is not None and window < max_len:
        return f"sliding window of {window} is shorter than the pool's {max_len} positions"
    return None


def _sliding_window(config: Any) -> int | None:
    """The attention window when some layer slides (Mistral, Qwen2 with it on), else None."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None  # Qwen2 with use_sliding_window off, or no layer past max_window_layers
    return int(window)


def create_pool(model: Any, slots: int, max_len: int) -> KvCachePool:
    attention = model.model.layers[0].self_attn
    weight = model.model.embed_tokens.weight
    return KvCachePool(
        layers=len(model.model.layers),
        slots=slots,
        heads=model.config.num_key_value_heads,
        max_len=max_len,
        head_dim=attention.head_dim,
        dtype=weight.dtype,
        device=weight.device,
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _qkv(
    attention: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries (B, nh, T, hs), rotated keys and values (B, nkv, T, hs) of normed input x."""
    batch, steps, _ = x.shape  # (B, T, C)
    shape = (batch, steps, -1, attention.head_dim)
    q = attention.q_proj(x).view(shape).transpose(1, 2)  # (B, nh, T, hs)
    k = attention.k_proj(x).view(shape).transpose(1, 2)  # (B, nkv, T, hs)
    v = attention.v_proj(x).view(shape).transpose(1, 2)  # (B, nkv, T, hs)
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, hs)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q, k, v


@torch.inference_mode()
def prefill(model: Any, pool: KvCachePool, batch: PrefillBatch) -> torch.Tensor:
    """Runs the batch's prompts, packed into one sequence of N tokens, into their slots; returns
    each prompt's last-position logits (B, V). Linear layers see all N tokens at once; each
    prompt attends causally within itself only, rotated by its own positions."""
    llama = model.model
    x = llama.embed_tokens(batch.tokens)  # (1, N, C)
    cos, sin = llama.rotary_emb(x, batch.positions)  # (1, N, hs)
    for layer, block in enumerate(llama.layers):
        attention = block.self_attn
        q, k, v = _qkv(attention, block.input_layernorm(x), cos, sin)  # (1, nh|nkv, N, hs)
        parts = []
        for row, (start, end) in enumerate(batch.segments):
            qs, ks, vs = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
            pool.store_prompt(layer, batch, row, ks, vs)
            parts.append(
                F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=attention.scaling, enable_gqa=True
                )
            )  # (1, nh, T, hs)
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # (1, nh, N, hs)
        x = x + attention.o_proj(y.transpose(1, 2).reshape(1, x.shape[1], -1))  # (1, N, C)
        x = x + block.mlp(block.post_attention_layernorm(x))
    pool.finish_prompts(batch)
    logits: torch.Tensor = model.lm_head(llama.norm(x[0, batch.last]))  # (B, V)
    return logits


@torch.inference_mode()
def decode_step(model: Any, pool: KvCachePool, slots: list[int], tokens: list[int]) -> torch.Tensor:
    """Feeds one new token per slot (each at its own position) and returns logits (B, V).

    Every slot's sequence grows by one position. Each key/value head attends for its group of
    query heads at once (B, nkv, group, hs): no copy of the keys per query head. Rows shorter
    than the batch's window are masked.
    """
    llama = model.model
    device = llama.embed_tokens.weight.device
    step = pool.decode_batch(slots)
    batch = step.size
    token = torch.tensor(tokens, dtype=torch.long, device=device)[:, None]  # (B, 1)
    x = llama.embed_tokens(token)  # (B, 1, C)
    cos, sin = llama.rotary_emb(x, step.position[:, None])  # (B, 1, hs)
    for layer, block in enumerate(llama.layers):
        attention = block.self_attn
        q, k, v = _qkv(attention, block.input_layernorm(x), cos, sin)  # q (B, nh, 1, hs)
        keys, values = pool.append(layer, step, k, v)  # (B, nkv, W, hs)
        q = q.reshape(batch, keys.shape[1], -1, attention.head_dim)  # (B, nkv, group, hs)
        y = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=step.mask, scale=attention.scaling
        )  # (B, nkv, group, hs)
        x = x + attention.o_proj(y.reshape(batch, 1, -1))  # (B, 1, C)
        x = x + block.mlp(block.post_attention_layernorm(x))
    pool.finish_step(step)
    logits: torch.Tensor = model.lm_head(llama.norm(x))[:, 0]  # (B, V)
    return logits
