"""Python client of the router, async and sync, with plain event types.

    async with AsyncRouterClient("127.0.0.1:50051") as client:
        async for event in client.chat_stream("What is your return policy?", mode="progressive"):
            ...
        result = await client.chat("Hi")          # reads to Final, returns the answer

The sync RouterClient has the same methods. Failures raise ChatError with the gRPC status name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from tiermesh.v1 import common_pb2, router_pb2, router_pb2_grpc

from services.common import env
from services.common.telemetry import end_span, inject_metadata, tracer

MODES = {
    "routed": router_pb2.MODE_ROUTED,
    "progressive": router_pb2.MODE_PROGRESSIVE,
    "pinned": router_pb2.MODE_PINNED,
}
MODE_NAMES = {value: name for name, value in MODES.items()}


class ChatError(Exception):
    """The chat ended with a gRPC error status; `code` is its name, e.g. "UNAVAILABLE"."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class RouteEvent:
    request_id: str
    mode: str
    tiers: tuple[str, ...]
    complexity: float
    policy: str
    reason: str


@dataclass(frozen=True)
class RevisionStartEvent:
    revision: int
    tier: str
    replaces: int | None
    kept_prefix_chars: int


@dataclass(frozen=True)
class DeltaEvent:
    revision: int
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class RevisionEndEvent:
    revision: int
    finish_reason: str
    usage: dict[str, Any]
    error: str


@dataclass(frozen=True)
class FinalEvent:
    revision: int
    tier: str
    text: str
    reason: str
    revisions: int
    usage: list[dict[str, Any]]
    timings: dict[str, float]


Event = RouteEvent | RevisionStartEvent | DeltaEvent | RevisionEndEvent | FinalEvent


def _usage(message: common_pb2.Usage) -> dict[str, Any]:
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def event_from_proto(event: router_pb2.ChatEvent) -> Event:
    kind = event.WhichOneof("event")
    if kind == "route":
        r = event.route
        return RouteEvent(
            r.request_id,
            MODE_NAMES.get(r.mode, "routed"),
            tuple(r.tiers),
            r.complexity,
            r.policy,
            r.reason,
        )
    if kind == "revision_start":
        s = event.revision_start
        replaces = s.replaces if s.HasField("replaces") else None
        return RevisionStartEvent(s.revision, s.tier, replaces, s.kept_prefix_chars)
    if kind == "delta":
        d = event.delta
        return DeltaEvent(d.revision, d.text, tuple(d.token_ids))
    if kind == "revision_end":
        e = event.revision_end
        return RevisionEndEvent(e.revision, e.finish_reason, _usage(e.usage), e.error)
    if kind == "final":
        f = event.final
        usage = [
            {
                "tier": u.tier,
                "revision": u.revision if u.HasField("revision") else None,
                "cancelled": u.cancelled,
                **_usage(u.usage),
            }
            for u in f.usage
        ]
        timings = MessageToDict(
            f.timings, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        return FinalEvent(f.revision, f.tier, f.text, f.reason, f.revisions, usage, timings)
    raise ChatError("INTERNAL", f"unknown chat event {kind!r}")


EVENT_TYPES = {
    RouteEvent: "route",
    RevisionStartEvent: "revision_start",
    DeltaEvent: "delta",
    RevisionEndEvent: "revision_end",
    FinalEvent: "final",
}


def event_to_json(event: Event, t_ms: float) -> dict[str, Any]:
    """The `tiermesh chat --json` form of an event: {"type", "t_ms", ...its fields}."""
    fields = dict(event.__dict__)
    if isinstance(event, DeltaEvent | RouteEvent):
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
    return {"type": EVENT_TYPES[type(event)], "t_ms": round(t_ms, 3), **fields}


@dataclass
class ChatResult:
    """The answer of a chat: the final revision's text, and every event that led to it."""

    text: str
    tier: str
    revision: int
    final: FinalEvent
    events: list[Event] = field(default_factory=list)


def build_request(
    prompt: str | None = None,
    *,
    messages: list[tuple[str, str]] | None = None,
    mode: str = "routed",
    tier: str = "",
    max_tokens: int | None = None,
    request_id: str = "",
    temperature: float = 0.0,
    draft_tier: str = "",
    refine_tier: str = "",
) -> router_pb2.ChatRequest:
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    request = router_pb2.ChatRequest(
        request_id=request_id,
        prompt=prompt or "",
        messages=[{"role": r, "content": c} for r, c in (messages or [])],
        mode=MODES[mode],
        tier=tier,
        draft_tier=draft_tier,
        refine_tier=refine_tier,
        sampling=common_pb2.SamplingParams(temperature=temperature),
    )
    if max_tokens is not None:
        request.max_tokens = max_tokens
    return request


def _result(events: list[Event]) -> ChatResult:
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return ChatResult(final.text, final.tier, final.revision, final, events)


def _client_span(request: router_pb2.ChatRequest) -> tuple[trace.Span, list[tuple[str, str]]]:
    """The SDK's client span for one chat, and the metadata carrying its trace context."""
    span = tracer().start_span(
        "chat",
        kind=trace.SpanKind.CLIENT,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": "tiermesh.v1.RouterService",
            "rpc.method": "Chat",
            "gen_ai.operation.name": "chat",
            "tiermesh.mode": MODE_NAMES.get(request.mode, "routed"),
        },
    )
    return span, inject_metadata(trace.set_span_in_context(span))


def _chat_error(error: grpc.RpcError) -> ChatError:
    code = error.code()
    return ChatError(code.name if code else "UNKNOWN", error.details() or "")


class AsyncRouterClient:
    def __init__(self, address: str | None = None) -> None:
        self.address = address or env.router_address()
        self._channel = grpc.aio.insecure_channel(self.address)
        self._stub = router_pb2_grpc.RouterServiceStub(self._channel)

    async def chat_stream(
        self, prompt: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> AsyncIterator[Event]:
        """The chat's events as they arrive; leaving the loop early cancels the chat."""
        request = build_request(prompt, **options)
        span, metadata = _client_span(request)
        call = self._stub.Chat(request, timeout=timeout, metadata=metadata)
        code = "CANCELLED"
        try:
            async for event in call:
                yield event_from_proto(event)
            code = "OK"
        except grpc.aio.AioRpcError as e:
            code = e.code().name
            raise _chat_error(e) from None
        finally:
            call.cancel()
            end_span(span, code)

    async def chat(
        self, prompt: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> ChatResult:
        return _result([e async for e in self.chat_stream(prompt, timeout=timeout, **options)])

    async def feedback(self, request_id: str, score: float) -> bool:
        request = router_pb2.FeedbackRequest(request_id=request_id, score=score)
        try:
            response = await self._stub.Feedback(request)
        except grpc.aio.AioRpcError as e:
            raise _chat_error(e) from None
        return bool(response.accepted)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncRouterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RouterClient:
    def __init__(self, address: str | None = None) -> None:
        self.address = address or env.router_address()
        self._channel = grpc.insecure_channel(self.address)
        self._stub = router_pb2_grpc.RouterServiceStub(self._channel)

    def chat_stream(
        self, prompt: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> Iterator[Event]:
        """The chat's events as they arrive; leaving the loop early cancels the chat."""
        request = build_request(prompt, **options)
        span, metadata = _client_span(request)
        call = self._stub.Chat(request, timeout=timeout, metadata=metadata)
        code = "CANCELLED"
        try:
            for event in call:
                yield event_from_proto(event)
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name if e.code() else "UNKNOWN"
            raise _chat_error(e) from None
        finally:
            call.cancel()
            end_span(span, code)

    def chat(
        self, prompt: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> ChatResult:
        return _result(list(self.chat_stream(prompt, timeout=timeout, **options)))

    def feedback(self, request_id: str, score: float) -> bool:
        request = router_pb2.FeedbackRequest(request_id=request_id, score=score)
        try:
            return bool(self._stub.Feedback(request).accepted)
        except grpc.RpcError as e:
            raise _chat_error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
