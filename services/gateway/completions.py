"""POST /v1/chat/completions: runs one chat on the router and answers in OpenAI's format, as
one `chat.completion` or as SSE `chat.completion.chunk` events ending with `data: [DONE]`.

Errors before the stream starts are HTTP statuses (the first router event is awaited before any
header is sent); a failure after it is one `{"error": ...}` event, then the stream ends. Leaving
the stream (a client that disconnects) cancels the router call.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from tiermesh.client import DeltaEvent, Event, FinalEvent, RevisionStartEvent, TokenLogprob

from services.gateway.answer_stream import AnswerReplaced, PlainAnswer, RevisionTracker
from services.gateway.chat_request import ChatCompletionRequest
from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_wire import DONE, ChunkWriter, completion, sse, usage
from services.gateway.router_chat import RouterChat


async def complete(
    chat: RouterChat, request: ChatCompletionRequest, metrics: GatewayMetrics
) -> dict[str, Any]:
    """The non-streamed answer: reads the chat to its Final."""
    started = time.perf_counter()
    tracker = RevisionTracker()
    entries: dict[int, list[TokenLogprob]] = {}  # per revision, when the request asked
    try:
        final = None
        async for event in _events(chat, await chat.first()):
            tracker.feed(event)
            if isinstance(event, FinalEvent):
                final = event
            elif request.logprobs and isinstance(event, DeltaEvent):
                entries.setdefault(event.revision, []).extend(event.token_logprobs)
        if final is None:
            raise GatewayError(502, "the router's stream ended without a final answer")
    finally:
        chat.cancel()
    metrics.duration.labels(request.model, "false").observe(time.perf_counter() - started)
    metrics.completion_tokens.labels(request.model).inc(usage(final)["completion_tokens"])
    extra = tracker.final_fields(final) if request.revisions else None
    answer = entries.get(final.revision, []) if request.logprobs else None
    return completion(request.model, final, tracker.finish_reason(final), extra, answer)


async def stream(
    chat: RouterChat, first: Event, request: ChatCompletionRequest, metrics: GatewayMetrics
) -> AsyncIterator[bytes]:
    """The SSE body of a streamed completion whose first router event is `first`, in pieces
    that are each one write: the role chunk goes out with the first content, an event's chunks
    together, and the Final's chunks with `[DONE]` (the last piece, and the only one ending with
    DONE), so a short answer costs few writes and wake-ups of the client."""
    relay = _StreamRelay(request, metrics)
    metrics.active_streams.inc()
    pending = sse(  # the role chunk, sent with the first content
        relay.writer.chunk(
            {"role": "assistant", "content": ""}, with_usage_field=relay.include_usage
        )
    )
    try:
        async for event in _events(chat, first):
            events = relay.feed(event)
            if isinstance(event, FinalEvent):
                last, pending = pending + b"".join(events), b""
                try:
                    await chat.next()  # the call's OK status, which follows Final
                except GatewayError:
                    yield last  # the answer as it stands, then the error event below
                    raise
                yield last + DONE
                return
            if events:
                yield pending + b"".join(events)
                pending = b""
        raise GatewayError(502, "the router's stream ended without a final answer")
    except (GatewayError, AnswerReplaced) as e:
        error = (
            e if isinstance(e, GatewayError) else GatewayError(502, str(e), code="answer_replaced")
        )
        yield pending + sse(error.body())
    finally:
        chat.cancel()
        metrics.active_streams.dec()
        metrics.duration.labels(request.model, "true").observe(relay.elapsed_s())


async def _events(chat: RouterChat, first: Event) -> AsyncIterator[Event]:
    yield first
    async for event in chat.rest():
        yield event


class _StreamRelay:
    """Turns router events into the chunks of one streamed completion."""

    def __init__(self, request: ChatCompletionRequest, metrics: GatewayMetrics) -> None:
        self.request = request
        self.metrics = metrics
        self.writer = ChunkWriter(request.model)
        self.plain = PlainAnswer()
        self.tracker = RevisionTracker()
        self.started = time.perf_counter()
        self.first_content = False
        self.include_usage = request.include_usage

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def feed(self, event: Event) -> list[bytes]:
        """The SSE events to send for `event` (often none)."""
        self.tracker.feed(event)
        if self.request.revisions:
            chunks = [sse(chunk) for chunk in self._revision_chunks(event)]
        else:
            text = self.plain.feed(event)
            if self.request.logprobs:
                entries = self.plain.pop_entries()
                chunks = [sse(self._content(text, logprobs=entries))] if text or entries else []
            else:
                chunks = [self._plain_content(text)] if text else []
        if isinstance(event, FinalEvent):
            chunks += [sse(chunk) for chunk in self._final_chunks(event)]
        return chunks

    def _revision_chunks(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, RevisionStartEvent):
            return [self._content("", self.tracker.revision_fields(event.revision))]
        if isinstance(event, DeltaEvent) and (event.text or event.token_logprobs):
            entries = list(event.token_logprobs) if self.request.logprobs else None
            fields = self.tracker.revision_fields(event.revision)
            return [self._content(event.text, fields, entries)]
        return []

    def _final_chunks(self, final: FinalEvent) -> list[dict[str, Any]]:
        chunks = []
        if not self.request.revisions:
            rest = self.plain.finish(final)
            entries = self.plain.pop_entries() if self.request.logprobs else None
            if rest or entries:
                chunks.append(self._content(rest, logprobs=entries))
        extra = self.tracker.final_fields(final) if self.request.revisions else None
        reason = self.tracker.finish_reason(final)
        chunks.append(
            self.writer.chunk(
                {}, finish_reason=reason, tiermesh=extra, with_usage_field=self.include_usage
            )
        )
        if self.request.include_usage:
            chunks.append(self.writer.usage_chunk(final))
        self.metrics.completion_tokens.labels(self.request.model).inc(
            usage(final)["completion_tokens"]
        )
        return chunks

    def _plain_content(self, text: str) -> bytes:
        self._observe_first(text)
        return self.writer.content_event(text, with_usage_field=self.include_usage)

    def _observe_first(self, text: str) -> None:
        if text and not self.first_content:
            self.first_content = True
            self.metrics.time_to_first_content.labels(self.request.model).observe(self.elapsed_s())

    def _content(
        self,
        text: str,
        tiermesh: dict[str, Any] | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        self._observe_first(text)
        return self.writer.chunk(
            {"content": text},
            tiermesh=tiermesh,
            with_usage_field=self.include_usage,
            logprobs=logprobs,
        )
