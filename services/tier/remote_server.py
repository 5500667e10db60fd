"""One remote OpenAI-compatible server as a remote tier reaches it over HTTP: its served models,
its health, vLLM's load gauges, `/detokenize`, and streamed chat completions. httpx is imported
when a server is opened. Every failure comes out as a tiermesh error (openai_wire.py reads the
server's answers); a stream closed early closes its HTTP response, so the server sees the
disconnect.

Knows the server's URLs and the HTTP client; nothing of the tier's requests, admission or gRPC.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from services.common.config import TierConfig
from services.common.errors import ConfigError, Unavailable
from services.common.extras import MissingExtra
from services.tier.openai_wire import (
    DONE,
    ServedModel,
    SseReader,
    StreamDelta,
    detokenized_text,
    event_payload,
    http_error,
    read_chunk,
    served_models,
)
from services.tier.remote_load import ServerLoad, vllm_load

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # a stream silent this long has failed (UNAVAILABLE)
PROBE_TIMEOUT_S = 2.0  # /health, /v1/models, /metrics, /detokenize


def import_httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise ConfigError(f"engine: {MissingExtra('httpx', 'engine openai')}") from None
    return httpx


class RemoteStream:
    """One streamed chat completion: its chunks (`deltas`), or `close` to leave it."""

    def __init__(self, response: Any, api: str) -> None:
        self._response = response
        self._api = api

    async def deltas(self) -> AsyncGenerator[StreamDelta, None]:
        """The stream's chunks, up to `data: [DONE]` or the end of the body."""
        events = SseReader()
        async for line in self._response.aiter_lines():
            data = events.feed(line)
            if data is None:
                continue
            if data == DONE:
                return
            yield read_chunk(event_payload(data), self._api)
        if (data := events.flush()) is not None and data != DONE:
            yield read_chunk(event_payload(data), self._api)

    async def close(self) -> None:
        await self._response.aclose()


class RemoteServer:
    """The server at `api` (its `/v1` base; `/health`, `/metrics` and `/detokenize` are at
    its root). Use from one event loop; `open` builds it, `close` frees its connections."""

    def __init__(self, api: str, client: Any, httpx: Any) -> None:
        self.api = api.rstrip("/")
        self.root = self.api.removesuffix("/v1")
        self.health_path = "/health"  # "/v1/models" for a server without /health
        self.has_load_gauges = True  # until /metrics shows it has none of vLLM's
        self._client = client
        self._httpx = httpx

    @classmethod
    def open(cls, config: TierConfig, environment: Mapping[str, str]) -> RemoteServer:
        """A client for config.remote_url: the API key from the variable remote_api_key_env
        names (in `environment`), the CA of remote_ca_file; at most max_running streams and a
        few probes at once. Raises ConfigError for a missing key or CA file, or no httpx."""
        httpx = import_httpx()
        headers = {}
        if config.remote_api_key_env:
            key = environment.get(config.remote_api_key_env)
            if not key:
                raise ConfigError(
                    f"remote_api_key_env: the environment variable {config.remote_api_key_env} "
                    "(the remote server's API key) is not set"
                )
            headers["Authorization"] = f"Bearer {key}"
        verify: ssl.SSLContext | bool = True
        if str(config.remote_ca_file) not in ("", "."):
            if not config.remote_ca_file.is_file():
                raise ConfigError(f"remote_ca_file: no file at {config.remote_ca_file}")
            verify = ssl.create_default_context(cafile=str(config.remote_ca_file))
        connections = config.max_running + 4  # the streams, a probe, a detokenize
        client = httpx.AsyncClient(
            headers=headers,
            verify=verify,
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            trust_env=False,  # the config says where and how: no proxy or CA from the env
        )
        return cls(config.remote_url, client, httpx)

    async def close(self) -> None:
        await self._client.aclose()

    async def models(self) -> list[ServedModel]:
        """`/v1/models`; raises Unavailable for any failure."""
        url = self.api + "/models"
        try:
            response = await self._client.get(url, timeout=PROBE_TIMEOUT_S)
        except self._httpx.HTTPError as e:
            raise Unavailable(f"{url}: {describe(e)}") from None
        if response.status_code != 200:
            error = http_error(response.status_code, response.content, None, self.api)
            raise error if isinstance(error, Unavailable) else Unavailable(f"{url}: {error}")
        try:
            return served_models(response.json(), self.api)
        except ValueError:
            raise Unavailable(f"{url} did not answer JSON") from None

    async def healthy(self) -> bool:
        """Whether `/health` answers 200 (`/v1/models`, at a server without `/health`)."""
        try:
            response = await self._client.get(self.root + self.health_path, timeout=PROBE_TIMEOUT_S)
        except self._httpx.HTTPError:
            return False
        if response.status_code in (404, 405) and self.health_path == "/health":
            self.health_path = "/v1/models"
            return await self.healthy()
        return bool(response.status_code == 200)

    async def load(self, model: str) -> ServerLoad | None:
        """vLLM's gauges for `model` from `/metrics`; None when they cannot be read. A server
        whose `/metrics` has none (or that has no `/metrics`) is not asked again."""
        try:
            response = await self._client.get(self.root + "/metrics", timeout=PROBE_TIMEOUT_S)
        except self._httpx.HTTPError:
            return None
        load = vllm_load(response.text, model) if response.status_code == 200 else None
        if load is None and response.status_code in (200, 404):
            self.has_load_gauges = False
        return load

    async def detokenize(self, model: str, token_ids: tuple[int, ...]) -> str | None:
        """The text of token ids from `/detokenize` (vLLM, llama.cpp); None at a server that
        has none. Raises what its failure maps to (openai_wire.http_error)."""
        url = self.root + "/detokenize"
        body = {"model": model, "tokens": list(token_ids)}
        try:
            response = await self._client.post(url, json=body, timeout=PROBE_TIMEOUT_S)
        except self._httpx.HTTPError as e:
            raise Unavailable(f"{url}: {describe(e)}") from None
        if response.status_code in (404, 405):
            return None
        if response.status_code != 200:
            retry_after = response.headers.get("retry-after")
            raise http_error(response.status_code, response.content, retry_after, self.root)
        return detokenized_text(response.json(), self.root)

    @asynccontextmanager
    async def chat(self, body: dict[str, Any]) -> AsyncIterator[RemoteStream]:
        """A streamed `/v1/chat/completions` call. Raises what a refusal maps to (429:
        RESOURCE_EXHAUSTED with its Retry-After, 400: INVALID_ARGUMENT, ...: http_error) before
        it yields, and Unavailable for a connection that fails, then or while it is read.
        Leaving the block closes the response."""
        try:
            async with self._client.stream("POST", self.api + "/chat/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    retry_after = r.headers.get("retry-after")
                    raise http_error(r.status_code, r.content, retry_after, self.api)
                yield RemoteStream(r, self.api)
        except (self._httpx.HTTPError, self._httpx.StreamError) as e:
            raise Unavailable(f"the remote server {self.api}: {describe(e)}") from None


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
