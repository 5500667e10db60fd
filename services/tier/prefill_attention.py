"""Attention of a packed prefill: each prompt attends causally within itself only, and its keys
and values go into its KV-pool slot. One prompt (or prompts of very different lengths) runs as
it always did, one attention call a prompt; several of similar lengths run as one call over the
prompts padded to the longest, with a mask for each prompt's own causal window, and their keys
and values reach the pool in one write per tensor instead of one per prompt.

Why: a prefill of 16 short prompts on the built-in large tier made 112 attention calls and 224
pool writes, each a few tens of microseconds of fixed cost; padded, 7 and 14. Knows tensor shapes
and the pool's bookkeeping; nothing of models, weights or requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.tier.kv_pool import KvCachePool, PrefillBatch

# pad only while the padded prompts hold at most this many times the batch's real positions
# (attention over padding is wasted work that grows with the longest prompt squared)
MAX_PADDING_RATIO = 2.0


@dataclass(frozen=True)
class PaddedPrompts:
    """Where each of a batch's N packed positions sits when its B prompts are padded to T."""

    steps: int  # T: the longest prompt
    gather: torch.Tensor  # (B * T,) packed position of each padded one; N (a zero row) = padding
    scatter: torch.Tensor  # (N,) padded position (b * T + t) of each packed one
    mask: torch.Tensor  # (B, 1, T, T) True where a query may attend: causal, within its prompt


def padded_prompts(batch: PrefillBatch, device: torch.device) -> PaddedPrompts | None:
    """The padded layout of `batch`, or None when one attention call a prompt is the better
    plan (a single prompt, or padding past MAX_PADDING_RATIO)."""
    lengths = [end - start for start, end in batch.segments]
    steps, total = max(lengths), sum(lengths)
    if len(lengths) == 1 or len(lengths) * steps > MAX_PADDING_RATIO * total:
        return None
    gather: list[int] = []
    scatter: list[int] = []
    for row, ((start, _), length) in enumerate(zip(batch.segments, lengths, strict=True)):
        gather.extend(range(start, start + length))
        gather.extend([total] * (steps - length))
        scatter.extend(range(row * steps, row * steps + length))
    position = torch.arange(steps, device=device)
    causal = position[None, :] <= position[:, None]  # (T, T) query row, key column
    valid = position[None, :] < torch.tensor(lengths, device=device)[:, None]  # (B, T) keys
    return PaddedPrompts(
        steps=steps,
        gather=torch.tensor(gather, dtype=torch.long, device=device),
        scatter=torch.tensor(scatter, dtype=torch.long, device=device),
        mask=(causal[None] & valid[:, None, :])[:, None],  # (B, 1, T, T)
    )


def prompt_attention(
    pool: KvCachePool,
    batch: PrefillBatch,
    padded: PaddedPrompts | None,
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Each prompt's causal attention within itself, its keys and values stored in its slot.
    q (1, nh, N, hs), k and v (1, nkv, N, hs) with nkv dividing nh (grouped-query attention);
    returns (1, nh, N, hs)."""
    gqa = q.shape[1] != k.shape[1]
    if padded is None:
        parts = []
        for row, (start, end) in enumerate(batch.segments):
            qs, ks, vs = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]  # (1,h,T,hs)
            pool.store_prompt(layer, batch, row, ks, vs)
            parts.append(
                F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa
                )
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)  # (1, nh, N, hs)
    qp, kp, vp = (_pad(t, padded, batch.size) for t in (q, k, v))  # (B, h, T, hs)
    pool.store_prompts(layer, batch, kp, vp)
    y = F.scaled_dot_product_attention(
        qp, kp, vp, attn_mask=padded.mask, scale=scale, enable_gqa=gqa
    )  # (B, nh, T, hs)
    heads, hs = y.shape[1], y.shape[3]
    flat = y.transpose(0, 1).reshape(heads, -1, hs)  # (nh, B * T, hs)
    return flat.index_select(1, padded.scatter)[None]  # (1, nh, N, hs)


def _pad(t: torch.Tensor, padded: PaddedPrompts, prompts: int) -> torch.Tensor:
    """(1, h, N, hs) packed -> (B, h, T, hs) padded with zeros."""
    heads, hs = t.shape[1], t.shape[3]
    with_zero = torch.cat([t[0], t.new_zeros(heads, 1, hs)], dim=1)  # (h, N + 1, hs)
    rows = with_zero.index_select(1, padded.gather)  # (h, B * T, hs)
    return rows.view(heads, prompts, padded.steps, hs).transpose(0, 1)  # (B, h, T, hs)
