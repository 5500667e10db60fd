"""The gateway's HTTP application (FastAPI): the OpenAI-compatible API, health, metrics and the
chat page. It reaches the router through one grpc.aio channel over the public RouterService API.

Knows HTTP routes and the gateway's config; chat logic lives in completions.py, request parsing in
chat_request.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tiermesh.v1 import router_pb2_grpc

from services.common.config import GatewayConfig
from services.gateway import completions
from services.gateway.chat_request import MODELS, parse_chat_request
from services.gateway.errors import GatewayError
from services.gateway.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from services.gateway.openai_wire import model_card, model_list
from services.gateway.router_chat import RouterChat, call_metadata, router_stub, start_span
from services.security.settings import ServiceSecurity

CHAT_PAGE = Path(__file__).with_name("chat_page.html")
REVISIONS_HEADER = "x-tiermesh-revisions"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class RouterConnection:
    """The channel to the router, opened in the server's event loop at start-up, and its
    RouterService stub."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.channel: grpc.aio.Channel | None = None
        self.stub: router_pb2_grpc.RouterServiceStub | None = None

    def open(self) -> grpc.aio.Channel:
        """Plaintext, or TLS with this gateway's certificate when TIERMESH_TLS_* say so."""
        credentials = ServiceSecurity.from_env().channel_credentials()
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(self.target)
        else:
            self.channel = grpc.aio.secure_channel(self.target, credentials)
        self.stub = router_stub(self.channel)
        return self.channel

    def get(self) -> grpc.aio.Channel:
        if self.channel is None:
            raise GatewayError(503, "the gateway is not connected to the router yet")
        return self.channel

    def router(self) -> router_pb2_grpc.RouterServiceStub:
        if self.stub is None:
            raise GatewayError(503, "the gateway is not connected to the router yet")
        return self.stub

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
            self.stub = None


def create_app(config: GatewayConfig) -> FastAPI:
    router = RouterConnection(config.router)
    metrics = GatewayMetrics()
    page = CHAT_PAGE.read_bytes()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        router.open()
        try:
            yield
        finally:
            await router.close()

    app = FastAPI(title="tiermesh gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.metrics = metrics

    @app.exception_handler(GatewayError)
    async def gateway_error(_request: Request, error: GatewayError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers())

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = await _router_health(router.get())
        ok = status == "SERVING"
        body = {
            "status": "ok" if ok else "unavailable",
            "router": config.router,
            "router_status": status,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics_page() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(model_list(list(MODELS)))

    @app.get("/v1/models/{model}")
    async def model(model: str) -> JSONResponse:
        if model not in MODELS:
            raise GatewayError(
                404, f"The model `{model}` does not exist", param="model", code="model_not_found"
            )
        return JSONResponse(model_card(model))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        started = time.perf_counter()
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GatewayError(
                400, f"the request body is not valid JSON: {e}", code="invalid_json"
            ) from None
        revisions_header = request.headers.get(REVISIONS_HEADER, "").lower() in ("1", "true")
        try:
            chat_request = parse_chat_request(body, revisions_header=revisions_header)
        except GatewayError as e:
            metrics.requests.labels(
                str(body.get("model", "")) if isinstance(body, dict) else "", "", e.status
            ).inc()
            raise
        span, context = start_span(request.headers, chat_request.model, chat_request.user)
        chat = RouterChat(
            router.router(),
            chat_request.request,
            call_metadata(request.headers, context),
            config.timeout_s,
            config.retry_after_s,
            span,
            chat_request.model,
            metrics.record_operation,
        )
        stream_label = "true" if chat_request.stream else "false"
        try:
            if not chat_request.stream:
                answer = await completions.complete(chat, chat_request, metrics)
                metrics.requests.labels(chat_request.model, stream_label, 200).inc()
                return JSONResponse(answer)
            first = await chat.first()
        except GatewayError as e:
            chat.cancel()
            metrics.requests.labels(chat_request.model, stream_label, e.status).inc()
            metrics.duration.labels(chat_request.model, stream_label).observe(
                time.perf_counter() - started
            )
            raise
        metrics.requests.labels(chat_request.model, stream_label, 200).inc()
        body_stream = completions.stream(chat, first, chat_request, metrics)
        return StreamingResponse(body_stream, media_type="text/event-stream", headers=SSE_HEADERS)

    return app


async def _router_health(channel: grpc.aio.Channel) -> str:
    """The router's gRPC health status name (SERVING, NOT_SERVING, ...) or UNREACHABLE."""
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=1.0
        )
    except grpc.aio.AioRpcError as e:
        return "UNREACHABLE" if e.code() == grpc.StatusCode.UNAVAILABLE else e.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
