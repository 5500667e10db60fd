"""Which model architectures decode over the KV-cache pool (continuous batching), and the
forward passes each brings; the batch scheduler is the same for all of them.

A pooled architecture is a module with `unsupported(model, max_len)`, `prepare(model)` (lays
the weights out for its passes, once, in place) and the three passes below; `pooled_passes`
picks one from the checkpoint's config or says why none fits (the model then decodes each
request on its own thread). Knows nothing of requests, sampling or gRPC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from services.tier.kv_pool import KvCachePool, PrefillBatch


@dataclass(frozen=True)
class PooledPasses:
    """One architecture's forward passes over a KvCachePool."""

    architecture: str  # the config's model_type
    # (model) -> None: lays the weights out for these passes, in place, before the pool
    prepare: Callable[[Any], None]
    # (model, slots, max_len) -> the pool, allocated once
    create_pool: Callable[[Any, int, int], KvCachePool]
    # (model, pool, prompts packed for their slots) -> each prompt's last-position logits (B, V)
    prefill: Callable[[Any, KvCachePool, PrefillBatch], torch.Tensor]
    # (model, pool, slots, one token per slot) -> logits (B, V); every slot grows by one
    decode_step: Callable[[Any, KvCachePool, list[int], list[int]], torch.Tensor]


def layout_extra_bytes(model: Any) -> int:
    """Bytes a prepared model holds beyond its parameters (a copy its layout needed, e.g. a
    tied head packed apart from the embeddings); 0 for a model not prepared."""
    return int(getattr(model, "tiermesh_extra_bytes", 0))


def pooled_passes(model: Any, max_len: int) -> PooledPasses | str:
    """The passes for `model` with pool slots of `max_len` positions, or why it has none."""
    from services.tier import gpt2_pooled, llama_pooled

    model_type = str(getattr(model.config, "model_type", "?"))
    for module in (gpt2_pooled, llama_pooled):
        if model_type in module.MODEL_TYPES:
            reason = module.unsupported(model, max_len)
            if reason is not None:
                return f"{model_type}: {reason}"
            return PooledPasses(
                architecture=model_type,
                prepare=module.prepare,
                create_pool=module.create_pool,
                prefill=module.prefill,
                decode_step=module.decode_step,
            )
    return f"no pooled forward pass for model_type {model_type!r}"
