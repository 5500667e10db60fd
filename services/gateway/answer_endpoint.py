"""POST endpoints of the APIs beside chat completions (`/v1/messages`, `/v1/responses`,
`/v1/completions`) as bare ASGI apps like chat_endpoint.py, one class for all of them: the body
read with the same size limit, parsed by the endpoint's WireFormat into a router chat, the chat
run through the gateway's RouterChat (authorization and trace context forwarded, cancelled when
the client leaves), and the answer sent as the format's JSON body or SSE events.

The non-streamed answer is completions.complete's (the chat read to its Final); a stream is
the router's events through AnswerFeed (the plain answer, or every revision for clients that
opt in) into the format's StreamEncoder. Refusals before the stream starts are HTTP statuses in
the format's error shape; a failure after it is the format's error event, then the end.

Knows ASGI, the gateway's pieces and the WireFormat protocol; no API's field names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import grpc
from starlette.types import Receive, Scope, Send
from tiermesh.client import ChatError, Event, FinalEvent
from tiermesh.v1 import router_pb2_grpc

from services.common.config import GatewayConfig
from services.gateway import completions
from services.gateway.answer_feed import Answer, AnswerFeed
from services.gateway.answer_stream import AnswerReplaced
from services.gateway.chat_endpoint import (
    REVISIONS_HEADER,
    SSE_HEADERS,
    _headers,
    _json_body,
    _read_body,
    _Response,
)
from services.gateway.errors import GatewayError
from services.gateway.first_event import first_event
from services.gateway.metrics import GatewayMetrics
from services.gateway.router_chat import RouterChat, call_metadata, start_span
from services.gateway.wire_format import ParsedRequest, StreamEncoder, WireFormat

log = logging.getLogger(__name__)


class ReasonedRouterChat(RouterChat):
    """A RouterChat that also keeps the ErrorInfo reason of the router's refusal (`reason`),
    so that a format can tell a key's rate limit (RATE_LIMITED) from an overloaded mesh."""

    reason = ""

    def _error(self, error: grpc.aio.AioRpcError) -> GatewayError:
        self.reason = ChatError.from_rpc_error(error).details.reason
        return super()._error(error)


class AnswerEndpoint:
    """The route of one WireFormat; `handles(scope)` says whether a request is its own."""

    def __init__(
        self,
        wire: WireFormat,
        router: Callable[[], router_pb2_grpc.RouterServiceStub],
        config: GatewayConfig,
        metrics: GatewayMetrics,
    ) -> None:
        self.wire = wire
        self._router = router
        self._config = config
        self._metrics = metrics

    def handles(self, scope: Scope) -> bool:
        return bool(scope["type"] == "http" and scope["path"] == self.wire.path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = _Response(send)
        try:
            if scope["method"] != "POST":
                raise GatewayError(
                    405,
                    f"{self.wire.path} takes POST, not {scope['method']}",
                    code="method_not_allowed",
                )
            await self._serve(scope, receive, response)
        except GatewayError as e:
            await self._refuse(response, e)
        except Exception:
            log.exception("%s failed", self.wire.path)
            error = GatewayError(500, "the gateway failed to serve the request", code="internal")
            await self._refuse(response, error)

    async def _refuse(self, response: _Response, error: GatewayError, reason: str = "") -> None:
        """The error response in the format's shape; after the response started (a failure
        the stream did not turn into its error event), only the end of the body."""
        if response.ended:
            return
        if response.started:
            await response.end()
            return
        status, body, headers = self.wire.error(error, reason)
        if status == 405:
            headers = {**headers, "Allow": "POST"}
        await response.json(status, body, headers)

    async def _serve(self, scope: Scope, receive: Receive, response: _Response) -> None:
        started = time.perf_counter()
        headers = _headers(scope["headers"])
        body = _json_body(await _read_body(receive))
        revisions_header = headers.get(REVISIONS_HEADER, "").lower() in ("1", "true")
        metrics = self._metrics
        try:
            request = self.wire.parse(body, revisions_header=revisions_header)
        except GatewayError as e:
            model = str(body.get("model", "")) if isinstance(body, dict) else ""
            metrics.requests.labels(model, "", e.status).inc()
            raise
        chat_request = request.chat
        model, stream_label = chat_request.model, "true" if chat_request.stream else "false"
        chat = self._chat(request, headers)
        # the only message left to receive is http.disconnect: the client left (or the
        # response is complete, and then the watch is cancelled first)
        watch = asyncio.ensure_future(receive())

        def client_left(done: asyncio.Future[Any]) -> None:
            if not done.cancelled():
                chat.cancel()

        watch.add_done_callback(client_left)
        try:
            body_parts: AsyncGenerator[tuple[bytes, bool], None] | None = None
            try:
                if not chat_request.stream:
                    completion = await completions.complete([chat], chat_request, metrics)
                else:
                    first = await chat.first()
                    encoder = self.wire.encoder(request)
                    body_parts = self._stream(chat, first, request, encoder, started)
                    # the status waits for the stream's first event: a chat that fails before
                    # it is still an HTTP error, with its Retry-After
                    opening, rest = await first_event(
                        body_parts, lambda error: (encoder.failure(error), True)
                    )
            except GatewayError as e:
                chat.cancel()
                metrics.requests.labels(model, stream_label, e.status).inc()
                if body_parts is None:  # else the stream has counted its own duration
                    elapsed = time.perf_counter() - started
                    metrics.duration.labels(model, stream_label).observe(elapsed)
                await self._refuse(response, e, chat.reason)
                return
            metrics.requests.labels(model, stream_label, 200).inc()
            if body_parts is None:
                answer = Answer.from_completion(completion)
                await response.json(200, self.wire.answer(request, answer))
                return
            await response.start(200, SSE_HEADERS)
            data, last = opening
            while not last:
                await response.body(data)
                data, last = await anext(rest)
            await response.end(data)
        finally:
            watch.cancel()
            if body_parts is not None:
                await body_parts.aclose()  # its chat cancelled, its gauges settled

    def _chat(self, request: ParsedRequest, headers: dict[str, str]) -> ReasonedRouterChat:
        """The router chat of `request`, started, with the caller's key as `authorization`."""
        chat_request = request.chat
        key_header = self.wire.api_key_header
        if key_header and "authorization" not in headers and headers.get(key_header):
            headers = {**headers, "authorization": f"Bearer {headers[key_header]}"}
        span, context = start_span(headers, chat_request.model, chat_request.user)
        return ReasonedRouterChat(
            self._router(),
            chat_request.request,
            call_metadata(headers, context),
            self._config.timeout_s,
            self._config.retry_after_s,
            span,
            chat_request.model,
            self._metrics.record_operation,
        )

    async def _stream(
        self,
        chat: RouterChat,
        first: Event,
        request: ParsedRequest,
        encoder: StreamEncoder,
        started: float,
    ) -> AsyncGenerator[tuple[bytes, bool], None]:
        """The SSE body in pieces of one write each, the last flagged: the opening events (and
        any piece without text) go out with the first text, an event's pieces together, the
        closing events with the answer's last text. A failure raises its GatewayError (first_event
        makes it an HTTP status before the first text, the stream's error event after), except
        an answer replaced midway: that is the stream's error event."""
        metrics, model = self._metrics, request.chat.model
        feed = AnswerFeed(request.chat.revisions)
        pending = encoder.opening()
        seen_text = False  # from the first text on, each event's pieces go out as they come
        metrics.active_streams.inc()
        try:
            event: Event | None = first
            while event is not None:
                pieces = feed.feed(event)  # raises AnswerReplaced at a Final it cannot show
                data = pending + b"".join(encoder.text(piece) for piece in pieces)
                if not seen_text and any(piece.text for piece in pieces):
                    seen_text = True
                    metrics.time_to_first_content.labels(model).observe(
                        time.perf_counter() - started
                    )
                if isinstance(event, FinalEvent) and feed.answer is not None:
                    metrics.completion_tokens.labels(model).inc(
                        feed.answer.usage["completion_tokens"]
                    )
                    await chat.next()  # the call's OK status, which follows Final
                    yield data + encoder.closing(feed.answer), True
                    return
                if seen_text:
                    yield data, False
                    pending = b""
                else:  # pieces without text (a revision's start) go out with the first text
                    pending = data
                event = await chat.next()
            raise GatewayError(502, "the router's stream ended without a final answer")
        except AnswerReplaced as e:
            error = GatewayError(502, str(e), code="answer_replaced")
            yield pending + encoder.failure(error), True
        except GatewayError:
            raise
        except Exception:
            log.exception("%s stream failed", request.chat.model)
            raise GatewayError(
                500, "the gateway failed to serve the request", code="internal"
            ) from None
        finally:
            chat.cancel()
            metrics.active_streams.dec()
            metrics.duration.labels(model, "true").observe(time.perf_counter() - started)
