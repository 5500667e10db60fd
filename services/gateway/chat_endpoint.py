"""POST /v1/chat/completions as a bare ASGI app, served in front of the FastAPI app (which has
every other route): the request body read with a size limit, the chat started on the router, and
the answer sent as one JSON body or as SSE events, straight through the server's `send`.

Why bare: FastAPI's middleware stack, routing and StreamingResponse's task group cost about as
much per request as the whole rest of the gateway on a small machine, and this is the one route
on the time-to-first-token path. A client that disconnects cancels the router call (one
`receive()` waits for `http.disconnect` while the answer is read).

Knows ASGI messages and the gateway's pieces; chat logic lives in completions.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any

from starlette.types import Receive, Scope, Send
from tiermesh.v1 import router_pb2_grpc

from services.common.config import GatewayConfig
from services.gateway import completions
from services.gateway.chat_request import ChatCompletionRequest, parse_chat_request
from services.gateway.errors import GatewayError
from services.gateway.first_event import first_event
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_wire import DONE, sse
from services.gateway.router_chat import RouterChat, call_metadata, start_span

log = logging.getLogger(__name__)

PATH = "/v1/chat/completions"
REVISIONS_HEADER = "x-tiermesh-revisions"
# a chat request is messages and options; anything near this is not one
MAX_BODY_BYTES = 4 * 1024 * 1024
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


class ChatCompletionsEndpoint:
    """The chat completions route; `handles(scope)` says whether a request is its own."""

    def __init__(
        self,
        router: Callable[[], router_pb2_grpc.RouterServiceStub],
        config: GatewayConfig,
        metrics: GatewayMetrics,
    ) -> None:
        self._router = router
        self._config = config
        self._metrics = metrics

    @staticmethod
    def handles(scope: Scope) -> bool:
        return bool(scope["type"] == "http" and scope["path"] == PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = _Response(send)
        if scope["method"] != "POST":
            error = GatewayError(405, f"{PATH} takes POST, not {scope['method']}")
            await response.json(405, error.body(), {"Allow": "POST"})
            return
        try:
            await self._serve(scope, receive, response)
        except GatewayError as e:
            await response.fail(e)
        except Exception:
            log.exception("chat completion failed")
            await response.fail(
                GatewayError(500, "the gateway failed to serve the request", code="internal")
            )

    async def _serve(self, scope: Scope, receive: Receive, response: _Response) -> None:
        started = time.perf_counter()
        headers = _headers(scope["headers"])
        body = _json_body(await _read_body(receive))
        revisions_header = headers.get(REVISIONS_HEADER, "").lower() in ("1", "true")
        metrics = self._metrics
        try:
            chat_request = parse_chat_request(
                body, max_choices=self._config.max_choices, revisions_header=revisions_header
            )
        except GatewayError as e:
            model = str(body.get("model", "")) if isinstance(body, dict) else ""
            metrics.requests.labels(model, "", e.status).inc()
            raise
        chats = [self._chat(chat_request, i, headers) for i in range(chat_request.n)]
        model, stream_label = chat_request.model, "true" if chat_request.stream else "false"
        # the only message left to receive is http.disconnect: the client left (or the
        # response is complete, and then the watch is cancelled first)
        watch = asyncio.ensure_future(receive())

        def client_left(done: asyncio.Future[Any]) -> None:
            if not done.cancelled():
                for chat in chats:
                    chat.cancel()

        watch.add_done_callback(client_left)
        body_parts: AsyncGenerator[bytes, None] | None = None
        try:
            try:
                if not chat_request.stream:
                    answer = await completions.complete(chats, chat_request, metrics)
                else:
                    firsts = await completions.first_events(chats)
                    body_parts = completions.stream(chats, firsts, chat_request, metrics)
                    # the status waits for the stream's first event: a chat that fails before
                    # any of its output is still an HTTP error, with its Retry-After
                    data: bytes | None
                    data, rest = await first_event(body_parts, lambda error: sse(error.body()))
            except GatewayError as e:
                for chat in chats:
                    chat.cancel()
                metrics.requests.labels(model, stream_label, e.status).inc()
                if body_parts is None:  # else the stream has counted its own duration
                    elapsed = time.perf_counter() - started
                    metrics.duration.labels(model, stream_label).observe(elapsed)
                raise
            metrics.requests.labels(model, stream_label, 200).inc()
            if body_parts is None:
                await response.json(200, answer)
                return
            await response.start(200, SSE_HEADERS)
            last = b""
            while data is not None:
                if data.endswith(DONE):  # the last piece: written with the body's end
                    last = data
                else:
                    await response.body(data)
                data = await anext(rest, None)
            await response.end(last)
        finally:
            watch.cancel()
            if body_parts is not None:
                await body_parts.aclose()

    def _chat(
        self, chat_request: ChatCompletionRequest, index: int, headers: dict[str, str]
    ) -> RouterChat:
        """The router chat of choice `index`, started (each its own call and span)."""
        span, context = start_span(headers, chat_request.model, chat_request.user)
        return RouterChat(
            self._router(),
            chat_request.choice_request(index),
            call_metadata(headers, context),
            self._config.timeout_s,
            self._config.retry_after_s,
            span,
            chat_request.model,
            self._metrics.record_operation,
        )


class _Response:
    """The ASGI `send` of one request, and whether the response has started (a failure after
    that is an error event that ends the stream, not a status)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.ended = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.ended = True
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def json(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        """A complete JSON response."""
        data = _JSON.encode(body).encode()
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        for name, value in (headers or {}).items():
            raw.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        await self.start(status, raw)
        await self.end(data)

    async def fail(self, error: GatewayError) -> None:
        if self.ended:
            return
        if self.started:
            await self.end(sse(error.body()))
        else:
            await self.json(error.status, error.body(), error.headers())


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request's headers by lower-case name (servers send names lower-cased)."""
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}


async def _read_body(receive: Receive) -> bytes:
    """The whole request body; 413 past MAX_BODY_BYTES, 499 when the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(499, "the client closed the connection", code="client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise GatewayError(
                413,
                f"the request body is over {MAX_BODY_BYTES // (1024 * 1024)} MiB",
                code="request_too_large",
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _json_body(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GatewayError(
            400, f"the request body is not valid JSON: {e}", code="invalid_json"
        ) from None
