"""The echo engine: no model; streams a deterministic answer derived from the prompt at a set
time to first token and token rate, so the router and the mesh can be loaded far past what real
models on a few cores allow (`engine = "echo"` in a tier's config).

Everything around decoding is the shared engine lifecycle's (engine_lifecycle.py), as for the
torch engine: prompt limits, bounded admission (RESOURCE_EXHAUSTED past the queue), usage, the
TTFT window and the load snapshot. Prompt tokens are the rendered prompt's UTF-8 bytes; the
answer's k-th token is a word of ECHO_WORDS picked by a generator seeded from the prompt's bytes
(and the request's sampling seed), so the same request always gets the same answer
(`echo_answer`). It never ends on its own: every answer is max_tokens long ("length").
Knows nothing of gRPC or torch.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import AsyncGenerator
from typing import Any

from services.common.config import TierConfig
from services.tier.engine import GenerationChunk, TokenLogprob, TopLogprob
from services.tier.engine_lifecycle import EngineLifecycle, ModelFootprint
from services.tier.prepared_request import (
    LENGTH,
    PreparedRequest,
    PromptFormat,
    held_back_entries,
    held_back_text,
)

ECHO_WORDS = (
    "order",
    "refund",
    "policy",
    "return",
    "item",
    "days",
    "store",
    "receipt",
    "account",
    "shipping",
    "price",
    "support",
    "delivery",
    "invoice",
    "label",
    "package",
    "warranty",
    "exchange",
    "credit",
    "payment",
    "customer",
    "service",
    "product",
    "answer",
    "please",
    "thank",
    "you",
    "within",
    "thirty",
    "the",
    "a",
    "of",
    "to",
    "and",
    "is",
    "for",
)
WORD_BASE = 256  # ids below are prompt bytes; answer word i has id WORD_BASE + i
ECHO_LOGPROB = -0.01  # every answer token's log-probability: a confident draft


class EchoTokenizer:
    """UTF-8 bytes as token ids (prompts), ECHO_WORDS as ids from WORD_BASE (answers). Has the
    two methods and the attribute preparing a request uses; no chat template."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], **_: Any) -> str:
        words = [ECHO_WORDS[i - WORD_BASE] for i in ids if i >= WORD_BASE]
        prompt = bytes(i for i in ids if i < WORD_BASE).decode("utf-8", errors="replace")
        return prompt + "".join(f" {word}" for word in words)


def echo_answer(prompt_ids: tuple[int, ...], count: int, seed: int | None = None) -> list[int]:
    """The first `count` answer token ids for a prompt (and sampling seed): what the engine
    streams for that request."""
    words = random.Random(_seed(prompt_ids, seed))
    return [WORD_BASE + words.randrange(len(ECHO_WORDS)) for _ in range(count)]


def echo_text(token_ids: list[int] | tuple[int, ...]) -> str:
    """The text of answer token ids: each word with a leading space."""
    return "".join(f" {ECHO_WORDS[i - WORD_BASE]}" for i in token_ids)


def echo_token_logprobs(
    token_ids: list[int], held: str, held_entries: tuple[TokenLogprob, ...], top: int
) -> tuple[TokenLogprob, ...]:
    """Per-token detail of echo tokens: each word's text, ECHO_LOGPROB, and as the only likely
    token itself (an echo answer has no alternatives). First the entries of continued tokens
    not streamed yet (`held_entries`), or without them their text (`held`) before the first
    word."""
    entries = list(held_entries)
    for n, token in enumerate(token_ids):
        word = echo_text([token])
        alone = (TopLogprob(token, word, ECHO_LOGPROB),) if top > 0 else ()
        lead = held if n == 0 and not held_entries else ""
        entries.append(TokenLogprob(lead + word, ECHO_LOGPROB, alone))
    return tuple(entries)


def _seed(prompt_ids: tuple[int, ...], seed: int | None) -> int:
    return zlib.crc32(bytes(prompt_ids)) ^ ((seed or 0) * 0x9E3779B1 & 0xFFFFFFFF)


class EchoEngine(EngineLifecycle):
    name = "echo"

    def __init__(self, config: TierConfig) -> None:
        super().__init__(config)
        self._ttft_s = config.echo_ttft_ms / 1000
        self._token_s = 1 / config.echo_tokens_per_s if config.echo_tokens_per_s else 0.0
        self._aborted: set[str] = set()
        self._running: set[str] = set()

    async def _start_model(self) -> PromptFormat:
        return PromptFormat(EchoTokenizer(), frozenset(), None, WORD_BASE + len(ECHO_WORDS))

    async def _decode(self, prepared: PreparedRequest) -> AsyncGenerator[GenerationChunk, None]:
        """The answer's tokens: the first alone after echo_ttft_ms, then tokens_per_chunk at a
        time, each chunk when the rate says its last token is due (times kept from the first
        token, so a late chunk does not delay the rest). abort() ends the stream unfinished."""
        rid = prepared.request_id
        self._running.add(rid)
        try:
            done = len(prepared.continued)  # a continued answer: the same words, after those
            ids = echo_answer(
                prepared.rendered_prompt_ids, done + prepared.max_tokens, prepared.sampling.seed
            )[done:]
            # the text of the continued tokens the caller does not have yet comes first
            assert self._prompt_format is not None
            held = held_back_text(prepared, self._prompt_format) if done else ""
            held_entries = held_back_entries(prepared, self._prompt_format.tokenizer)
            top = prepared.sampling.top_logprobs
            await asyncio.sleep(self._ttft_s)
            first_at = time.perf_counter()
            sent = 0
            while sent < len(ids):
                if rid in self._aborted:
                    return
                size = 1 if sent == 0 else prepared.tokens_per_chunk
                chunk = ids[sent : sent + size]
                due = first_at + (sent + len(chunk) - 1) * self._token_s
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                if rid in self._aborted:
                    return
                sent += len(chunk)
                entries = (
                    echo_token_logprobs(chunk, held, held_entries, top) if top is not None else ()
                )
                held_entries = ()
                text, held = held + echo_text(chunk), ""
                yield GenerationChunk(
                    tuple(chunk),
                    text,
                    (ECHO_LOGPROB,) * len(chunk),
                    LENGTH if sent == len(ids) else None,
                    token_logprobs=entries,
                )
        finally:
            self._running.discard(rid)
            self._aborted.discard(rid)

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    def _footprint(self) -> ModelFootprint:
        return ModelFootprint(model="echo")

    async def _stop_model(self) -> None:
        self._aborted.update(self._running)
