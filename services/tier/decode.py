"""Token-by-token decoding of a causal LM with a KV cache: greedy or sampled, with log-probs.

Knows torch and a Hugging Face-style model (`model(input_ids, cache, use_cache)`);
knows nothing of tokenizers, text, gRPC or asyncio. Runs on whatever device the model is on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from services.common.errors import InvalidArgument
from services.tier.engine import Sampling

__all__ = [
    "NonFiniteLogits",
    "Sampling",
    "choose_token",
    "choose_token_with_top",
    "decode_steps",
    "most_likely",
]

# the k most likely tokens at a step: (token id, log-prob), most likely first
Alternatives = tuple[tuple[int, float], ...]


class NonFiniteLogits(InvalidArgument):
    """This request's logits overflowed (inf or NaN): it fails alone (in a batch, the others go
    on). INVALID_ARGUMENT: the same request would overflow the same model anywhere, so a router
    neither retries it elsewhere nor counts it against the tier's health."""


def choose_token(
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
    *,
    known_finite: bool = False,
) -> tuple[int, float]:
    """Picks the next token from one position's logits (V,) and returns (id, log-prob).

    The log-prob is the model's own (temperature 1) log-probability of the chosen token, so
    confidence reads the same whatever the sampling settings. Raises NonFiniteLogits when any
    logit is inf or NaN, unless the caller says it checked already (`known_finite`).
    """
    token, logprob, _ = choose_token_with_top(
        logits, sampling, generator, 0, known_finite=known_finite
    )
    return token, logprob


def most_likely(logprobs: torch.Tensor, k: int) -> Alternatives:
    """The k most likely tokens of one position's log-probabilities (V,), most likely first."""
    if k <= 0:
        return ()
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]))
    return tuple(zip(ids.tolist(), values.tolist(), strict=True))


def choose_token_with_top(
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
    top: int,
    *,
    known_finite: bool = False,
) -> tuple[int, float, Alternatives]:
    """choose_token, and the `top` most likely tokens at this position (most_likely)."""
    if not known_finite and not bool(torch.isfinite(logits).all()):
        raise NonFiniteLogits("non-finite logits (this request overflows the model)")
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (V,)
    alternatives = most_likely(logprobs, top)
    if sampling.greedy:
        token = int(torch.argmax(logprobs).item())
        return token, float(logprobs[token].item()), alternatives
    scores = logits.float() / sampling.temperature  # (V,)
    if sampling.top_k > 0:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1])).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if 0.0 < sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_scores, dim=-1), dim=-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) > sampling.top_p
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = torch.softmax(scores, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator).item())
    return token, float(logprobs[token].item()), alternatives


def decode_steps(
    model: Any,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    eos_token_ids: frozenset[int],
    should_stop: Callable[[], bool] = lambda: False,
    top: int = 0,
) -> Iterator[tuple[int, float, Alternatives]]:
    """Yields (token_id, log-prob, the `top` most likely tokens) for up to max_new_tokens new
    tokens after prompt_ids.

    Steps: one prefill forward over the whole prompt, then one forward per new token that feeds
    only that token and reuses the KV cache. Stops after an end-of-sequence token (which is
    yielded), after max_new_tokens, or as soon as should_stop() returns True (checked before
    every forward, so an abort costs at most one step).
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    device = next(model.parameters()).device
    generator: torch.Generator | None = None
    if not sampling.greedy and sampling.seed is not None:
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
    with torch.inference_mode():
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, T)
        cache: Any = None  # the model's KV cache, grown by one position per step
        for _ in range(max_new_tokens):
            if should_stop():
                return
            out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
            cache = out.cache
            logits = out.logits[0, -1]  # (V,)
            token, logprob, alternatives = choose_token_with_top(logits, sampling, generator, top)
            yield token, logprob, alternatives
            if token in eos_token_ids:
                return
            input_ids = torch.tensor([[token]], dtype=torch.long, device=device)  # (1, 1)
