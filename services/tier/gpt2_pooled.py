"""GPT-2 forward passes that read and write a KvCachePool: batched decode of many sequences
at different lengths in one step, and batched prefill of several prompts into their slots.

`prepare` turns each block's four Conv1D layers into the passes' own linear layers, once, in
place (`linear_kernels`: the layout measured fastest on this host), and releases the modules'
weights, and runs the MLP's activation as one kernel (`fused_activation`); the rest of the
transformers GPT2LMHeadModel (embeddings, layer norms, the tied head) is used as it is.
On the built-in large tier (7 layers of 384, one thread) packing took a prefill of 16 prompts of
30 tokens from 173 to 127 ms and a decode step of 16 streams from 9.8 to 7.5 ms (batch 1: 3.0 ms
either way). Knows nothing of tokenizers, sampling, requests or gRPC. Matches transformers' own
GPT-2 forward (eval mode, no dropout).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from services.tier import linear_kernels
from services.tier.kv_pool import KvCachePool, PrefillBatch
from services.tier.prefill_attention import padded_prompts, prompt_attention

log = logging.getLogger(__name__)

MODEL_TYPES = frozenset({"gpt2"})


def unsupported(model: Any, max_len: int) -> str | None:
    """None for the GPT-2 configurations these passes reproduce exactly, else why not."""
    config = model.config
    if not config.scale_attn_weights:
        return "scale_attn_weights is off"
    if config.scale_attn_by_inverse_layer_idx or config.reorder_and_upcast_attn:
        return "per-layer attention scaling or upcast reordering is on"
    return None


@dataclass(frozen=True, slots=True)
class _Layer:
    """One block's linear layers as the passes run them."""

    attn: linear_kernels.Linear  # queries, keys and values: (..., 3C)
    proj: linear_kernels.Linear
    fc: linear_kernels.Linear
    mlp_proj: linear_kernels.Linear
    act: Callable[[torch.Tensor], torch.Tensor]


def fused_activation(act: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The block's activation as one kernel where transformers writes it as several: GPT-2's
    `gelu_new` is the tanh approximation of GELU in eight elementwise ops (pow, mul, add, tanh,
    ...), each a pass over the MLP's widest activations; `F.gelu(approximate="tanh")` is the
    same formula in one pass (float32: within one ulp of it, or two ulps of 1.0 near zero,
    on about 1% of elements). Any other activation is kept as it is."""
    from transformers.activations import GELUTanh, NewGELUActivation

    if isinstance(act, NewGELUActivation | GELUTanh):
        return _gelu_tanh
    return cast(Callable[[torch.Tensor], torch.Tensor], act)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


@torch.no_grad()
def prepare(model: Any) -> None:
    """Makes each block's linear layers the passes' own (see the module's docstring); calling
    it again does nothing. Afterwards the model runs through these passes only."""
    if getattr(model, "tiermesh_layers", None) is not None:
        return
    gpt = model.transformer
    convs = [
        [block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj] for block in gpt.h
    ]
    linear_kernels.own_memory(model, [conv.weight for block in convs for conv in block])
    width = model.config.n_embd
    widest = (int(model.config.n_inner or 4 * width), width)  # the MLP's first layer (out, in)
    kernels = linear_kernels.LinearMaker.for_model(gpt.wte.weight, widest)

    def own(conv: Any) -> linear_kernels.Linear:
        linear = kernels.linear(conv.weight.t(), conv.bias)  # Conv1D holds (in, out)
        linear_kernels.release(conv)
        return linear

    layers = [
        _Layer(own(attn), own(proj), own(fc), own(mlp_proj), fused_activation(block.mlp.act))
        for block, (attn, proj, fc, mlp_proj) in zip(gpt.h, convs, strict=True)
    ]
    model.tiermesh_layers = layers
    model.tiermesh_linear_layout = kernels.choice
    log.info("%s: %d linear layers %s", type(model).__name__, 4 * len(layers), kernels.kind)


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
def prefill(model: Any, pool: KvCachePool, batch: PrefillBatch) -> torch.Tensor:
    """Runs the batch's prompts, packed into one sequence of N tokens, into their slots; returns
    each prompt's last-position logits (B, V). Linear layers see all N tokens at once; each
    prompt attends causally within itself only."""
    gpt = model.transformer
    heads, width = model.config.n_head, model.config.n_embd
    x = gpt.wte(batch.tokens) + gpt.wpe(batch.positions)  # (1, N, C)
    padded = padded_prompts(batch, x.device)
    for index, (block, layer) in enumerate(zip(gpt.h, model.tiermesh_layers, strict=True)):
        q, k, v = layer.attn(block.ln_1(x)).split(width, dim=2)  # 3 x (1, N, C)
        q, k, v = (_split_heads(t, heads) for t in (q, k, v))  # (1, nh, N, hs)
        y = prompt_attention(pool, batch, padded, index, q, k, v)  # (1, nh, N, hs)
        y = y.transpose(1, 2).reshape(1, -1, width)  # (1, N, C)
        x = x + layer.proj(y)
        x = x + layer.mlp_proj(layer.act(layer.fc(block.ln_2(x))))
    pool.finish_prompts(batch)
    last = gpt.ln_f(x[0, batch.last])  # (B, C)
    logits: torch.Tensor = model.lm_head(last)  # (B, V)
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
    step = pool.decode_batch(slots)
    token = torch.tensor(tokens, dtype=torch.long, device=device)[:, None]  # (B, 1)
    x = gpt.wte(token) + gpt.wpe(step.position[:, None])  # (B, 1, C)
    for index, (block, layer) in enumerate(zip(gpt.h, model.tiermesh_layers, strict=True)):
        q, k, v = layer.attn(block.ln_1(x)).split(width, dim=2)  # 3 x (B, 1, C)
        q, k, v = (_split_heads(t, heads) for t in (q, k, v))  # (B, nh, 1, hs)
        keys, values = pool.append(index, step, k, v)  # (B, nh, W, hs)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=step.mask)  # (B, nh, 1, hs)
        y = y.transpose(1, 2).reshape(step.size, 1, width)  # (B, 1, C)
        x = x + layer.proj(y)
        x = x + layer.mlp_proj(layer.act(layer.fc(block.ln_2(x))))
    pool.finish_step(step)
    logits: torch.Tensor = model.lm_head(gpt.ln_f(x))[:, 0]  # (B, V)
    return logits
