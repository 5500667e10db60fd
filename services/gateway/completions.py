"""POST /v1/chat/completions: runs a completion's chats on the router (one per choice, `n`)
and answers in OpenAI's format, as one `chat.completion` or as SSE `chat.completion.chunk`
events ending with `data: [DONE]`.

Errors before the stream starts are HTTP statuses (no header is sent before the stream's first
piece: a chat refused, or failed before any of its output, is an HTTP error with its
Retry-After); a failure after it is one `{"error": ...}` event, then the stream ends, and the
other choices' chats are cancelled. Leaving the stream (a client that
disconnects) cancels the router calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

from tiermesh.client import DeltaEvent, Event, FinalEvent, RevisionStartEvent, TokenLogprob

from services.gateway.answer_stream import AnswerReplaced, PlainAnswer, RevisionTracker
from services.gateway.chat_request import ChatCompletionRequest
from services.gateway.errors import GatewayError
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_wire import DONE, Choice, ChunkWriter, completion, sse, usage
from services.gateway.router_chat import RouterChat

T = TypeVar("T")
# what a choice's piece of the SSE body is: more follows, its answer ended, or it failed (the
# piece then ends with the error event, and the stream with it)
MORE, ENDED, FAILED = "more", "ended", "failed"
Piece = tuple[bytes, str]


async def complete(
    chats: list[RouterChat], request: ChatCompletionRequest, metrics: GatewayMetrics
) -> dict[str, Any]:
    """The non-streamed answer: reads every choice's chat to its Final."""
    started = time.perf_counter()
    try:
        choices = await all_of([_answer(chat, request) for chat in chats])
    finally:
        for chat in chats:
            chat.cancel()
    metrics.duration.labels(request.model, "false").observe(time.perf_counter() - started)
    for choice in choices:
        metrics.completion_tokens.labels(request.model).inc(
            usage(choice.final)["completion_tokens"]
        )
    return completion(request.model, choices, request.service_tier)


async def _answer(chat: RouterChat, request: ChatCompletionRequest) -> Choice:
    tracker = RevisionTracker()
    entries: dict[int, list[TokenLogprob]] = {}  # per revision, when the request asked
    final = None
    async for event in _events(chat, await chat.first()):
        tracker.feed(event)
        if isinstance(event, FinalEvent):
            final = event
        elif request.logprobs and isinstance(event, DeltaEvent):
            entries.setdefault(event.revision, []).extend(event.token_logprobs)
    if final is None:
        raise GatewayError(502, "the router's stream ended without a final answer")
    extra = tracker.final_fields(final) if request.revisions else None
    answer = entries.get(final.revision, []) if request.logprobs else None
    return Choice(final, tracker.finish_reason(final), extra, answer, tracker.stop_sequence(final))


async def first_events(chats: list[RouterChat]) -> list[Event]:
    """Every chat's first event (the route decision); the first refusal is raised."""
    return await all_of([chat.first() for chat in chats])


async def all_of(awaitables: list[Awaitable[T]]) -> list[T]:
    """Every result, in order, awaited together; the first failure cancels the rest and is
    raised. One awaitable is awaited as it is (no task: the common `n` = 1)."""
    if len(awaitables) == 1:
        return [await awaitables[0]]
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await _stopped(tasks)


async def _stopped(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancels `tasks` and waits until each has ended (what it raised is dropped)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def stream(
    chats: list[RouterChat],
    firsts: list[Event],
    request: ChatCompletionRequest,
    metrics: GatewayMetrics,
) -> AsyncGenerator[bytes, None]:
    """The SSE body of a streamed completion whose chats' first router events are `firsts`, in
    pieces that are each one write: a choice's role chunk goes out with its first content, an
    event's chunks together, and the last answer's final chunks with the usage chunk and
    `[DONE]` (the last piece, and the only one ending with DONE), so a short answer costs few
    writes and wake-ups of the client. With several choices, their pieces go out as they come.
    A choice's failure raises its GatewayError (first_event makes it an HTTP status before the
    first piece, the stream's error event after)."""
    started = time.perf_counter()
    writer = ChunkWriter(request.model, service_tier=request.service_tier)
    first_content = _FirstContent(metrics, request.model, started)
    relays = [
        _StreamRelay(request, metrics, writer.for_choice(i) if i else writer, first_content)
        for i in range(len(chats))
    ]
    sources = [
        _choice(chat, first, relay)
        for chat, first, relay in zip(chats, firsts, relays, strict=True)
    ]
    pieces = _interleaved(sources)
    metrics.active_streams.inc()
    running = len(chats)
    try:
        async for piece, state in pieces:
            if state == FAILED:
                yield piece
                return
            if state == ENDED:
                running -= 1
                if not running:
                    finals = [relay.final for relay in relays if relay.final is not None]
                    tail = sse(writer.usage_chunk(finals)) if request.include_usage else b""
                    yield piece + tail + DONE
                    return
            if piece:
                yield piece
    finally:
        await pieces.aclose()
        for chat in chats:
            chat.cancel()
        metrics.active_streams.dec()
        metrics.duration.labels(request.model, "true").observe(time.perf_counter() - started)


async def _choice(
    chat: RouterChat, first: Event, relay: _StreamRelay
) -> AsyncGenerator[Piece, None]:
    """One choice's pieces of the SSE body; its last is ENDED, or FAILED when the call failed
    after the choice's Final. A failure before that raises its GatewayError."""
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
                except GatewayError as e:
                    yield last + sse(e.body()), FAILED  # the answer as it stands, the error
                    return
                yield last, ENDED
                return
            if events:
                yield pending + b"".join(events), MORE
                pending = b""
        raise GatewayError(502, "the router's stream ended without a final answer")
    except AnswerReplaced as e:
        raise GatewayError(502, str(e), code="answer_replaced") from None


async def _interleaved(
    sources: list[AsyncGenerator[Piece, None]],
) -> AsyncGenerator[Piece, None]:
    """The pieces of every choice as each comes (a bounded queue: a choice waits while the
    client is behind); a choice's failure is raised here, after its pieces. One choice's pieces are
    passed on as they are (no task, no queue: the common `n` = 1)."""
    if len(sources) == 1:
        async for piece in sources[0]:
            yield piece
        return
    queue: asyncio.Queue[Piece | BaseException] = asyncio.Queue(maxsize=len(sources))

    async def pump(source: AsyncGenerator[Piece, None]) -> None:
        try:
            async for piece in source:
                await queue.put(piece)
        except Exception as e:
            await queue.put(e)

    tasks = [asyncio.ensure_future(pump(source)) for source in sources]
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        await _stopped(tasks)


async def _events(chat: RouterChat, first: Event) -> AsyncIterator[Event]:
    yield first
    async for event in chat.rest():
        yield event


class _FirstContent:
    """Records, once per streamed completion (whichever choice sends it), the time to the first
    answer text."""

    def __init__(self, metrics: GatewayMetrics, model: str, started: float) -> None:
        self._histogram = metrics.time_to_first_content.labels(model)
        self._started = started
        self._seen = False

    def observe(self, text: str) -> None:
        if text and not self._seen:
            self._seen = True
            self._histogram.observe(time.perf_counter() - self._started)


class _StreamRelay:
    """Turns one choice's router events into its chunks of a streamed completion."""

    def __init__(
        self,
        request: ChatCompletionRequest,
        metrics: GatewayMetrics,
        writer: ChunkWriter,
        first_content: _FirstContent,
    ) -> None:
        self.request = request
        self.metrics = metrics
        self.writer = writer
        self.plain = PlainAnswer()
        self.tracker = RevisionTracker()
        self.first_content = first_content
        self.include_usage = request.include_usage
        self.final: FinalEvent | None = None

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
        self.final = final
        self.metrics.completion_tokens.labels(self.request.model).inc(
            usage(final)["completion_tokens"]
        )
        return chunks

    def _plain_content(self, text: str) -> bytes:
        self.first_content.observe(text)
        return self.writer.content_event(text, with_usage_field=self.include_usage)

    def _content(
        self,
        text: str,
        tiermesh: dict[str, Any] | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        self.first_content.observe(text)
        return self.writer.chunk(
            {"content": text},
            tiermesh=tiermesh,
            with_usage_field=self.include_usage,
            logprobs=logprobs,
        )
