"""Llama-family forward passes that read and write a KvCachePool: batched decode of many
sequences at different lengths in one step, and batched prefill of several prompts into their
slots.

The Llama architecture: RMSNorm, rotary position embeddings (the model's own rotary module, so
the config's rope_theta and static rope scaling hold), grouped-query attention (the pool keeps
only the key/value heads), SwiGLU MLP, tied or untied lm_head. Qwen2 (biased q/k/v) and Mistral
share it while their sliding window, if any, covers the whole pool slot. Knows nothing of
tokenizers, sampling, requests or gRPC.

`prepare` turns the transformers model's linear layers into the passes' own, once, in place
(`linear_kernels`): in the layout measured fastest on this host, packed by oneDNN or stored
input-major; a layer's queries, keys
and values in one matrix (one product instead of three), its gate and up in another. A decode
step is a chain of matrix-vector products over the whole model, so how the weights are laid
out sets its speed: on this project's CPU (AVX2, one thread) SmolLM2-135M's batch-1 decode step
took 33.5 ms with transformers' layout, 26 ms input-major and 25 ms packed (the linear layers
~23 ms of it, everything else ~2 ms). The model's own copies of those weights are released, so
a prepared model runs through these passes only. Packed, the head is packed too, a tied one
apart from the embeddings, which keep a plain copy for the lookup (a packed matrix cannot be
indexed by token): SmolLM2's 49,152 x 576 head took 4.0 ms a token input-major and 2.5 ms packed in
float32, 4.0 and 0.9 ms in bfloat16 (two threads, AVX-512 BF16), for 113 MB (56 MB) more memory.
Input-major (GPUs, and CPUs where that measures faster) a tied head stays one matrix the lookup
reads a column of.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from services.tier import linear_kernels
from services.tier.kv_pool import KvCachePool, PrefillBatch
from services.tier.prefill_attention import padded_prompts, prompt_attention

log = logging.getLogger(__name__)

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


@torch.no_grad()
def prepare(model: Any) -> None:
    """Lays `model`'s weights out for these passes, in place (see the module's docstring);
    calling it again does nothing. Afterwards the model runs through these passes only: its
    linear layers' own weights are released (transformers' forward would fail on them)."""
    llama = model.model
    if getattr(model, "tiermesh_layers", None) is not None:
        return
    head, embeddings = model.lm_head, llama.embed_tokens
    tied = head.weight is embeddings.weight
    projections = [linear for block in llama.layers for linear in _block_linears(block)]
    config = model.config
    widest = (2 * int(config.intermediate_size), int(config.hidden_size))  # gate and up (out, in)
    kernels = linear_kernels.LinearMaker.for_model(embeddings.weight, widest)
    # Input-major (GPUs, or where it measured faster) a tied head and the lookup share one
    # matrix. Packed, a tied head cannot serve the lookup (a packed matrix is not indexed by
    # token): the matrix stays with the embeddings, copied into memory of its own like every
    # weight that stays.
    shared = tied and not kernels.pack
    moving = [p.weight for p in projections]
    if shared or not tied:
        moving.append(head.weight)
    linear_kernels.own_memory(model, moving)
    model.tiermesh_layers = [_layer(block, kernels) for block in llama.layers]
    model.tiermesh_final_norm = (llama.norm.weight, llama.norm.variance_epsilon)
    head_note = ""
    if shared:
        matrix = kernels.input_major(head.weight)  # the lookup reads a column
        head.weight = torch.nn.Parameter(matrix.t(), requires_grad=False)
        embeddings.weight = head.weight
        model.tiermesh_head = linear_kernels.PlainLinear(head.weight, head.bias)
        head_note = ", the head (tied to the embeddings) input-major"
    else:
        model.tiermesh_head = kernels.linear(head.weight, head.bias)
        linear_kernels.release(head)  # the embeddings keep the matrix when it was tied
        if tied:
            extra = embeddings.weight.numel() * embeddings.weight.element_size()
            model.tiermesh_extra_bytes = extra
            form = "packed" if kernels.pack else "input-major"  # packing may fail on the head
            head_note = f", the head {form} apart from the embeddings (+{extra / 2**20:.0f} MiB)"
    model.tiermesh_linear_layout = kernels.choice  # after the head: packing may fail there
    log.info(
        "%s: %d linear layers %s%s",
        type(model).__name__,
        len(projections) + 1,
        kernels.kind,
        head_note,
    )


def _block_linears(block: Any) -> list[Any]:
    attention, mlp = block.self_attn, block.mlp
    return [
        attention.q_proj,
        attention.k_proj,
        attention.v_proj,
        attention.o_proj,
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    ]


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's prepared weights and shapes, read in the passes without a module
    attribute lookup."""

    input_norm: tuple[torch.Tensor, float]  # RMSNorm weight and epsilon
    qkv: linear_kernels.Linear  # queries, keys and values in one product
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    o: linear_kernels.Linear
    post_norm: tuple[torch.Tensor, float]
    gate_up: linear_kernels.Linear  # gate and up in one product: (..., 2 * intermediate)
    intermediate: int
    down: linear_kernels.Linear
    act: Callable[[torch.Tensor], torch.Tensor]


def _layer(block: Any, kernels: linear_kernels.LinearMaker) -> _Layer:
    attention, mlp = block.self_attn, block.mlp
    qkv = [attention.q_proj, attention.k_proj, attention.v_proj]
    layer = _Layer(
        input_norm=(block.input_layernorm.weight, block.input_layernorm.variance_epsilon),
        qkv=kernels.linear(torch.cat([p.weight for p in qkv]), _joined_bias(qkv)),
        heads=attention.config.num_attention_heads,
        kv_heads=attention.config.num_key_value_heads,
        head_dim=attention.head_dim,
        scaling=attention.scaling,
        o=kernels.linear(attention.o_proj.weight, attention.o_proj.bias),
        post_norm=(
            block.post_attention_layernorm.weight,
            block.post_attention_layernorm.variance_epsilon,
        ),
        gate_up=kernels.linear(
            torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            _joined_bias([mlp.gate_proj, mlp.up_proj]),
        ),
        intermediate=mlp.gate_proj.out_features,
        down=kernels.linear(mlp.down_proj.weight, mlp.down_proj.bias),
        act=mlp.act_fn,
    )
    for linear in _block_linears(block):
        linear_kernels.release(linear)
    return layer


def _joined_bias(linears: list[Any]) -> torch.Tensor | None:
    """The biases of linear layers joined into one product, zeros for those without."""
    if all(p.bias is None for p in linears):
        return None
    return torch.cat(
        [torch.zeros_like(p.weight[:, 0]) if p.bias is None else p.bias for p in linears]
    )


def _rotary(
    llama: Any, x: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, T, hs) for rotating heads at `positions` (B, T), sin with its first half
    negated: x * cos + roll(x, hs / 2) * sin is then transformers' x * cos + rotate_half(x) *
    sin, bit for bit, in fewer steps."""
    cos, sin = llama.rotary_emb(x, positions)  # (B, T, hs)
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos, sin


def _qkv(
    layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries (..., nh, hs), rotated keys and values (..., nkv, hs) of normed input x (..., C),
    from the prepared q/k/v matrix in one product; cos and sin broadcast over the heads."""
    heads, kv_heads = layer.heads, layer.kv_heads
    qkv = layer.qkv(x)
    qkv = qkv.view(*x.shape[:-1], heads + 2 * kv_heads, layer.head_dim)  # (..., H, hs)
    qk = qkv[..., : heads + kv_heads, :]
    qk = qk * cos + torch.roll(qk, layer.head_dim // 2, dims=-1) * sin  # q and k at once
    return qk[..., :heads, :], qk[..., heads:, :], qkv[..., heads + kv_heads :, :]


def _norm(norm: tuple[torch.Tensor, float], x: torch.Tensor) -> torch.Tensor:
    """transformers' Llama RMSNorm, step for step: in float32, then back to x's dtype, then the
    weight. (F.rms_norm gives the same float32 numbers but not the same bfloat16 ones, and a
    bfloat16 model's greedy answer then parts from `generate`'s within a few tokens.)"""
    weight, epsilon = norm
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + epsilon)
    return weight * h.to(x.dtype)


def _mlp(layer: _Layer, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: down(act(gate(x)) * up(x)), gate and up from one product."""
    gate_up = layer.gate_up(x)
    gate, up = gate_up[..., : layer.intermediate], gate_up[..., layer.intermediate :]
    return layer.down(layer.act(gate) * up)


@torch.inference_mode()
def prefill(model: Any, pool: KvCachePool, batch: PrefillBatch) -> torch.Tensor:
    """Runs the batch's prompts, packed into one sequence of N tokens, into their slots; returns
    each prompt's last-position logits (B, V). Linear layers see all N tokens at once; each
    prompt attends causally within itself only, rotated by its own positions."""
    llama = model.model
    x = F.embedding(batch.tokens, llama.embed_tokens.weight)  # (1, N, C)
    cos, sin = (t[:, :, None] for t in _rotary(llama, x, batch.positions))  # (1, N, 1, hs)
    padded = padded_prompts(batch, x.device)
    for index, layer in enumerate(model.tiermesh_layers):
        q, k, v = _qkv(layer, _norm(layer.input_norm, x), cos, sin)  # (1, N, nh|nkv, hs)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (1, nh|nkv, N, hs)
        y = prompt_attention(pool, batch, padded, index, q, k, v, scale=layer.scaling)
        y = y.transpose(1, 2).reshape(1, x.shape[1], -1)  # (1, N, C)
        x = x + layer.o(y)
        x = x + _mlp(layer, _norm(layer.post_norm, x))
    pool.finish_prompts(batch)
    logits: torch.Tensor = model.tiermesh_head(_norm(model.tiermesh_final_norm, x[0, batch.last]))
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
    token = torch.tensor(tokens, dtype=torch.long, device=device)  # (B,)
    x = F.embedding(token, llama.embed_tokens.weight)  # (B, C): one row a sequence
    cos, sin = (t[:, 0, None] for t in _rotary(llama, x, step.position[:, None]))  # (B, 1, hs)
    for index, layer in enumerate(model.tiermesh_layers):
        q, k, v = _qkv(layer, _norm(layer.input_norm, x), cos, sin)  # q (B, nh, hs)
        keys, values = pool.append(index, step, k[:, :, None], v[:, :, None])  # (B, nkv, W, hs)
        q = q.reshape(batch, layer.kv_heads, -1, layer.head_dim)  # (B, nkv, group, hs)
        y = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=step.mask, scale=layer.scaling
        )  # (B, nkv, group, hs)
        x = x + layer.o(y.reshape(batch, -1))  # (B, C)
        x = x + _mlp(layer, _norm(layer.post_norm, x))
    pool.finish_step(step)
    logits: torch.Tensor = model.tiermesh_head(_norm(model.tiermesh_final_norm, x))
    return logits
