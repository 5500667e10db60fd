"""The router's Python clients, async (grpc.aio) and sync, over plaintext or TLS channels.

Both have the same methods: `chat_stream` yields events as they arrive (leaving the loop early
cancels the chat upstream), `chat` reads to the final event and returns the answer, `feedback`
sends a quality score for a finished chat. Failures raise ChatError.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
from tiermesh.client.errors import ChatError
from tiermesh.client.events import ChatResult, Event, event_from_proto
from tiermesh.client.requests import build_request
from tiermesh.client.tracing import end_span, start_chat_span
from tiermesh.v1 import router_pb2, router_pb2_grpc

DEFAULT_ROUTER_ADDRESS = "127.0.0.1:50051"
ROUTER_ADDRESS_ENV = "TIERMESH_ROUTER"
API_KEY_ENV = "TIERMESH_API_KEY"
# Every chat has a deadline unless the caller passes timeout=None: a client never waits forever
# on a stuck call, and the router and tiers stop work nobody waits for. Two minutes cover a
# refined answer from a slow tier; pass a shorter one where latency matters.
DEFAULT_TIMEOUT_S = 120.0
FEEDBACK_TIMEOUT_S = 10.0


def router_address() -> str:
    """The router address to use when none is given: $TIERMESH_ROUTER, else 127.0.0.1:50051."""
    return os.environ.get(ROUTER_ADDRESS_ENV, DEFAULT_ROUTER_ADDRESS)


def tls_credentials(
    ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials trusting the CA in file `ca`; with `cert` and `key`, the client
    presents that certificate too (mTLS)."""
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )


def _open_channel(module: Any, address: str, credentials: grpc.ChannelCredentials | None) -> Any:
    """A channel from `module` (grpc or grpc.aio): plaintext, or TLS with `credentials`."""
    if credentials is None:
        return module.insecure_channel(address)
    return module.secure_channel(address, credentials)


def _key_metadata(api_key: str | None) -> list[tuple[str, str]]:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return [("authorization", f"Bearer {key}")] if key else []


class AsyncRouterClient:
    """Client of RouterService on a grpc.aio channel; use it inside the event loop it was
    created in. `credentials` (tls_credentials(...)) makes the channel TLS; `api_key` (default
    $TIERMESH_API_KEY) is sent as `authorization: Bearer` on every call."""

    def __init__(
        self,
        address: str | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        api_key: str | None = None,
    ) -> None:
        self.address = address or router_address()
        self._auth = _key_metadata(api_key)
        self._channel = _open_channel(grpc.aio, self.address, credentials)
        self._stub = router_pb2_grpc.RouterServiceStub(self._channel)

    async def chat_stream(
        self,
        prompt: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        **options: Any,
    ) -> AsyncIterator[Event]:
        """The chat's events as they arrive; options are build_request's keywords."""
        request = build_request(prompt, **options)
        span, metadata = start_chat_span(options.get("mode", "routed"))
        call = self._stub.Chat(request, timeout=timeout, metadata=[*metadata, *self._auth])
        code = "CANCELLED"
        try:
            async for event in call:
                yield event_from_proto(event)
            code = "OK"
        except grpc.aio.AioRpcError as e:
            code = e.code().name
            raise ChatError.from_rpc_error(e) from None
        finally:
            call.cancel()
            end_span(span, code)

    async def chat(
        self,
        prompt: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        **options: Any,
    ) -> ChatResult:
        """Reads the chat to its final event and returns the answer."""
        events = [e async for e in self.chat_stream(prompt, timeout=timeout, **options)]
        return ChatResult.from_events(events)

    async def feedback(self, request_id: str, score: float) -> bool:
        """Scores a finished chat in [0, 1]; False when the router no longer remembers it."""
        request = router_pb2.FeedbackRequest(request_id=request_id, score=score)
        try:
            response = await self._stub.Feedback(
                request, metadata=self._auth, timeout=FEEDBACK_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as e:
            raise ChatError.from_rpc_error(e) from None
        return bool(response.accepted)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncRouterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RouterClient:
    """Client of RouterService on a blocking channel; safe to share between threads. Takes the
    same `credentials` and `api_key` as AsyncRouterClient."""

    def __init__(
        self,
        address: str | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        api_key: str | None = None,
    ) -> None:
        self.address = address or router_address()
        self._auth = _key_metadata(api_key)
        self._channel = _open_channel(grpc, self.address, credentials)
        self._stub = router_pb2_grpc.RouterServiceStub(self._channel)

    def chat_stream(
        self,
        prompt: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        **options: Any,
    ) -> Iterator[Event]:
        """The chat's events as they arrive; options are build_request's keywords."""
        request = build_request(prompt, **options)
        span, metadata = start_chat_span(options.get("mode", "routed"))
        call = self._stub.Chat(request, timeout=timeout, metadata=[*metadata, *self._auth])
        code = "CANCELLED"
        try:
            for event in call:
                yield event_from_proto(event)
            code = "OK"
        except grpc.RpcError as e:
            error = ChatError.from_rpc_error(e)
            code = error.code
            raise error from None
        finally:
            call.cancel()
            end_span(span, code)

    def chat(
        self,
        prompt: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        **options: Any,
    ) -> ChatResult:
        """Reads the chat to its final event and returns the answer."""
        return ChatResult.from_events(list(self.chat_stream(prompt, timeout=timeout, **options)))

    def feedback(self, request_id: str, score: float) -> bool:
        """Scores a finished chat in [0, 1]; False when the router no longer remembers it."""
        request = router_pb2.FeedbackRequest(request_id=request_id, score=score)
        try:
            response = self._stub.Feedback(request, metadata=self._auth, timeout=FEEDBACK_TIMEOUT_S)
            return bool(response.accepted)
        except grpc.RpcError as e:
            raise ChatError.from_rpc_error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
