"""The gateway's HTTP application (FastAPI): the OpenAI-compatible API, health, metrics and the
chat page. It reaches the router through one grpc.aio channel over the public RouterService API.

Knows HTTP routes and the gateway's config; the chat completions route is the bare ASGI endpoint
of chat_endpoint.py, served ahead of FastAPI; chat logic lives in completions.py, request parsing
in chat_request.py. The Messages, Responses and text completions routes are answer_endpoint.py's,
one per wire format (anthropic_messages.py, openai_responses.py, text_completions.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send
from tiermesh.v1 import router_pb2_grpc

from services.common.config import GatewayConfig
from services.common.tiers import TIER_NAMES, tier_health_name
from services.gateway.answer_endpoint import AnswerEndpoint
from services.gateway.anthropic_messages import MessagesFormat
from services.gateway.chat_endpoint import ChatCompletionsEndpoint
from services.gateway.chat_request import MODELS
from services.gateway.errors import GatewayError
from services.gateway.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from services.gateway.openai_responses import ResponsesFormat
from services.gateway.openai_wire import model_card, model_list
from services.gateway.router_chat import router_stub
from services.gateway.text_completions import TextCompletionsFormat
from services.security.settings import ServiceSecurity

CHAT_PAGE = Path(__file__).with_name("chat_page.html")
# what a request for any other path is told the gateway serves
ROUTES = (
    "POST /v1/chat/completions, POST /v1/messages, POST /v1/responses, POST /v1/completions, "
    "GET /v1/models, GET /v1/models/{model}, GET /health, GET /metrics"
)
# the APIs served beside chat completions, each by an AnswerEndpoint
ANSWER_FORMATS = (MessagesFormat(), ResponsesFormat(), TextCompletionsFormat())

# requests FastAPI does not trace: load balancers' and supervisors' probes, Prometheus scrapes
PROBE_PATHS = frozenset({"/health", "/metrics"})


def _is_probe(scope: MutableMapping[str, Any]) -> bool:
    return scope.get("path") in PROBE_PATHS


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


class GatewayApp:
    """The gateway's ASGI app: POST /v1/chat/completions goes straight to its bare endpoint,
    as do the other answer APIs (`answers`); everything else (and the lifespan) to FastAPI.
    `api` is the FastAPI app."""

    def __init__(
        self,
        api: FastAPI,
        chat: ChatCompletionsEndpoint,
        answers: tuple[AnswerEndpoint, ...] = (),
    ) -> None:
        self.api = api
        self.chat = chat
        self.answers = answers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.chat.handles(scope):
            await self.chat(scope, receive, send)
            return
        for endpoint in self.answers:
            if endpoint.handles(scope):
                await endpoint(scope, receive, send)
                return
        await self.api(scope, receive, send)


def create_app(config: GatewayConfig) -> GatewayApp:
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

    app = FastAPI(
        title="tiermesh gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # FastAPI traces its routes when a tracer is installed: one span per request, not its
        # dependency and endpoint steps, and none for health probes and scrapes (under
        # `tiermesh run` they came every second, three spans each, into the trace file)
        telemetry={"exclude": _is_probe, "operation_spans": False},
    )
    app.state.metrics = metrics

    @app.exception_handler(GatewayError)
    async def gateway_error(_request: Request, error: GatewayError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers())

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        """FastAPI's own 404 and 405 in OpenAI's error shape, naming what is served."""
        path = request.url.path
        if error.status_code == 404:
            message = f"no route {request.method} {path}; this gateway serves {ROUTES}"
            gateway_error = GatewayError(404, message, code="not_found")
        elif error.status_code == 405:
            message = f"{path} does not take {request.method}"
            gateway_error = GatewayError(405, message, code="method_not_allowed")
        else:
            gateway_error = GatewayError(error.status_code, str(error.detail))
        return JSONResponse(
            gateway_error.body(), status_code=error.status_code, headers=error.headers
        )

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> JSONResponse:
        channel = router.get()
        status = await _health_status(channel, "")
        tiers = await _tier_statuses(channel) if status == "SERVING" else {}
        serving = [tier for tier, tier_status in tiers.items() if tier_status == "SERVING"]
        ok = status == "SERVING" and (bool(serving) or not tiers)
        state = "unavailable" if not ok else "ok" if len(serving) == len(tiers) else "degraded"
        body = {"status": state, "router": config.router, "router_status": status, "tiers": tiers}
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

    answers = tuple(AnswerEndpoint(f, router.router, config, metrics) for f in ANSWER_FORMATS)
    return GatewayApp(app, ChatCompletionsEndpoint(router.router, config, metrics), answers)


async def _health_status(channel: grpc.aio.Channel, service: str) -> str:
    """The router's gRPC health status name for `service` (SERVING, NOT_SERVING, NOT_FOUND, ...)
    or UNREACHABLE."""
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=1.0
        )
    except grpc.aio.AioRpcError as e:
        return "UNREACHABLE" if e.code() == grpc.StatusCode.UNAVAILABLE else e.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


async def _tier_statuses(channel: grpc.aio.Channel) -> dict[str, str]:
    """Each tier's health as the router publishes it (tier name -> status name); a tier the
    router does not report (not configured there) is left out."""
    statuses = await asyncio.gather(
        *(_health_status(channel, tier_health_name(tier)) for tier in TIER_NAMES)
    )
    return {
        tier: status
        for tier, status in zip(TIER_NAMES, statuses, strict=True)
        if status != "NOT_FOUND"
    }
