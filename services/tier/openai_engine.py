"""The openai engine: a remote OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, Ollama,
another tiermesh gateway) as the tier's model, so tiermesh routes, drafts, refines and fails
over in front of servers a team already runs (`engine = "openai"`, `remote_url = ".../v1"`).

Each request is one streamed `/v1/chat/completions` call (openai_wire.py builds and reads it,
remote_server.py makes the HTTP calls):
the server's chunks become the tier's, with token ids where the server sends them (vLLM's
`return_token_ids`), else text with the token counts of the server's usage. A stream the caller
leaves is closed, and the server sees the disconnect. A continuation sends the text of the tokens
already streamed (from the server's `/detokenize`) as a partial assistant turn. The tier is
NOT_SERVING until the server answers `/v1/models`; then a probe reads `/health` (or
`/v1/models`) and, where the server has vLLM's gauges, `/metrics` for the load snapshot.

Admission, stop sequences, usage and the TTFT window are the shared engine lifecycle's
(engine_lifecycle.py). The server renders the chat and counts tokens: this tier has no
tokenizer, so prompts are checked by the server (400: INVALID_ARGUMENT). Knows nothing of gRPC
or of HTTP itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field, replace

from services.common.config import TierConfig
from services.common.errors import InvalidArgument, TiermeshError, Unavailable
from services.tier.engine import EngineLoad, GenerationChunk, GenerationRequest, GenerationUsage
from services.tier.engine_lifecycle import EngineLifecycle, ModelFootprint
from services.tier.openai_wire import (
    AnswerOverContext,
    ServedModel,
    ServerUsage,
    StreamDelta,
    chat_body,
    pick_model,
)
from services.tier.prepared_request import LENGTH, PreparedRequest, PromptFormat
from services.tier.remote_load import ServerLoad, with_server_load
from services.tier.remote_server import RemoteServer, RemoteStream

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 2.0  # health and /metrics while serving
START_RETRY_S = (0.25, 5.0)  # first and longest wait between attempts to reach the server


class ContinuationRefused(TiermeshError):
    """This tier cannot continue the answer (the server streamed no token ids, or cannot tell
    their text): the router goes on elsewhere, as for a continuation of another model."""

    status = "FAILED_PRECONDITION"


@dataclass
class ServerCounts:
    """A request's token counts as the server's usage chunk gave them, once it has."""

    usage: ServerUsage | None = None


@dataclass(frozen=True)
class RemoteRequest(PreparedRequest):
    """A request for the server: the conversation itself (the server renders it), the
    continued tokens' characters as asked (checked once their text is known), and where its
    stream puts the server's counts. prompt_ids holds only the continued tokens."""

    messages: tuple[tuple[str, str], ...] = ()
    continue_chars: int | None = None
    decode_nothing: bool = False  # every token was streamed: only the held-back text is left
    fit_to_context: bool = False  # the context may lower max_tokens (GenerationRequest's)
    counts: ServerCounts = field(default_factory=ServerCounts)


class OpenAiEngine(EngineLifecycle):
    name = "openai"

    def __init__(self, config: TierConfig, environment: Mapping[str, str]) -> None:
        """`environment` holds the variable config.remote_api_key_env names (os.environ)."""
        super().__init__(config)
        self._environment = environment
        self._api = config.remote_url.rstrip("/")
        self._server: RemoteServer | None = None
        self._model: ServedModel | None = None
        self._server_load: ServerLoad | None = None
        self._kv_peak = 0
        self._remote_up = False
        self._probe: asyncio.Task[None] | None = None
        self._streams: dict[str, RemoteStream] = {}  # by request id, while open
        self._aborted: set[str] = set()
        self._counts: dict[int, ServerCounts] = {}  # by id() of the GenerationRequest
        self.startup_s: dict[str, float] = {}

    # -- start, health, load ---------------------------------------------------------------

    async def _start_model(self) -> PromptFormat:
        """Waits until the server answers `/v1/models` (retrying: the tier stays NOT_SERVING
        meanwhile), picks the served model, then probes the server in the background."""
        started = time.perf_counter()
        server = RemoteServer.open(self._config, self._environment)
        try:
            self._model = await self._wait_for_model(server)
        except BaseException:
            await server.close()
            raise
        self._server, self._remote_up = server, True
        self.startup_s["remote"] = time.perf_counter() - started
        log.info("tier %s: serving %s from %s", self._config.name, self._model.id, self._api)
        self._probe = asyncio.get_running_loop().create_task(self._probe_forever())
        return PromptFormat(None, frozenset(), self._model.max_model_len)

    async def _wait_for_model(self, server: RemoteServer) -> ServedModel:
        wait, attempts = START_RETRY_S[0], 0
        while True:
            try:
                return pick_model(await server.models(), self._config.remote_model, self._api)
            except Unavailable as e:
                attempts += 1
                if attempts == 1 or attempts % 10 == 0:
                    log.warning(
                        "tier %s: no answer from %s yet (%s); NOT_SERVING until it answers",
                        self._config.name,
                        self._api,
                        e,
                    )
            await asyncio.sleep(wait)
            wait = min(wait * 2, START_RETRY_S[1])

    async def _probe_forever(self) -> None:
        """Every PROBE_INTERVAL_S: the server's health, then its load gauges while it has."""
        assert self._server is not None and self._model is not None
        server = self._server
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            try:
                up = await server.healthy()
                if up != self._remote_up:
                    state = "answers again" if up else "stopped answering: NOT_SERVING"
                    log.warning("tier %s: %s %s", self._config.name, self._api, state)
                self._remote_up = up
                load = await server.load(self._model.id) if up and server.has_load_gauges else None
            except Exception:  # a probe never stops probing
                log.exception("tier %s: probing %s failed", self._config.name, self._api)
                continue
            if load is not None and load.kv_usage is not None:
                self._kv_peak = max(self._kv_peak, round(load.kv_usage * load.kv_capacity_tokens))
            self._server_load = load

    def check_health(self) -> None:
        if self._model is None and not self._closing:
            raise Unavailable(
                f"tier {self._config.name}: waiting for the remote server {self._api} to "
                "answer /models"
            )
        super().check_health()
        if not self._remote_up:
            path = self._server.health_path if self._server else "/health"
            raise Unavailable(
                f"tier {self._config.name}: the remote server {self._api} does not answer {path}"
            )

    def load(self) -> EngineLoad:
        """The lifecycle's snapshot, serving only while the server answers its probe, with the
        server's own load where it reports vLLM's gauges (remote_load.py)."""
        load = with_server_load(super().load(), self._server_load)
        return replace(load, serving=load.serving and self._remote_up)

    def _footprint(self) -> ModelFootprint:
        server = self._server_load
        model = self._model.id if self._model else (self._config.remote_model or "remote")
        if server is None or server.kv_usage is None or not server.kv_capacity_tokens:
            return ModelFootprint(model=model)
        return ModelFootprint(
            model=model,
            kv_pool_capacity_tokens=server.kv_capacity_tokens,
            kv_pool_used_tokens=round(server.kv_usage * server.kv_capacity_tokens),
            kv_pool_peak_tokens=self._kv_peak,
        )

    # -- requests --------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """The lifecycle's stream, with the server's token counts on the last chunk's usage
        and, from a server that streams no token ids, the first text as the first token (its
        time to first token, the chunk naming the model)."""
        counts = ServerCounts()
        self._counts[id(request)] = counts
        received = time.perf_counter()
        ttft_ms: float | None = None
        try:
            stream = super().generate(request)
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    if ttft_ms is None and (chunk.text or chunk.token_ids):
                        ttft_ms = (time.perf_counter() - received) * 1000
                        if not chunk.token_ids:  # text only: the lifecycle saw no token
                            self._ttfts.add(ttft_ms)
                            chunk = self._named(chunk)
                    if chunk.usage is not None:
                        chunk = replace(chunk, usage=_with_counts(chunk.usage, counts, ttft_ms))
                    yield chunk
        finally:
            del self._counts[id(request)]

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """The request as the server takes it (no tokenizer here: the server renders and
        counts). Continuing an answer needs its token ids: a request with characters of an
        answer but no ids (one this tier streamed as text only) is FAILED_PRECONDITION."""
        self.check_health()
        continued = request.continue_ids
        if not continued and request.continue_chars:
            raise ContinuationRefused(
                f"continue_token_ids: none, with {request.continue_chars} characters of an "
                f"answer: {self._api} streams text without token ids, so this tier cannot "
                "continue an answer"
            )
        if len(continued) > request.max_tokens:
            raise InvalidArgument(
                f"continue_token_ids: {len(continued)} tokens are more than max_tokens "
                f"{request.max_tokens}"
            )
        context = self._model.max_model_len if self._model else None
        max_tokens = request.max_tokens
        if request.fit_to_context and context is not None:
            max_tokens = min(max_tokens, context - 1)  # the server says how much the prompt left
        if context is not None and max_tokens >= context:
            raise InvalidArgument(
                f"max_tokens: {request.max_tokens} leaves no room for a prompt in the model's "
                f"context of {context} tokens"
            )
        messages = request.messages or (("user", request.prompt),)
        left = max_tokens - len(continued)
        return RemoteRequest(
            request_id=request.request_id,
            prompt_ids=tuple(continued),
            max_tokens=max(1, left),  # 0 left: decode_nothing, the lifecycle still runs it
            sampling=request.sampling,
            tokens_per_chunk=1,
            eos_token_ids=frozenset(),
            continued=tuple(continued),
            messages=messages,
            continue_chars=request.continue_chars,
            decode_nothing=left == 0,
            fit_to_context=request.fit_to_context,
            counts=self._counts.get(id(request), ServerCounts()),
        )

    async def _decode(self, prepared: PreparedRequest) -> AsyncGenerator[GenerationChunk, None]:
        """One streamed chat call: the server's chunks as the tier's. The finishing chunk is
        held until the usage chunk after it has come; a stream that ends without one raises
        Unavailable. Closed early (the caller left, a stop sequence, abort), it closes the
        HTTP stream."""
        assert isinstance(prepared, RemoteRequest) and self._model is not None
        partial, held = None, ""
        if prepared.continued:
            partial, held = await self._continued_text(prepared)
        if prepared.decode_nothing:
            yield GenerationChunk((), held, (), LENGTH)
            return
        body = chat_body(
            model=self._model.id,
            messages=prepared.messages,
            max_tokens=prepared.max_tokens,
            sampling=prepared.sampling,
            token_ids=self._config.remote_token_ids,
            partial_answer=partial,
        )
        rid = prepared.request_id
        detail = prepared.sampling.top_logprobs is not None
        last: GenerationChunk | None = None
        assert self._server is not None
        asked, fitted = body, False
        while True:
            started = False
            try:
                async with self._server.chat(asked) as stream:
                    self._streams[rid] = stream
                    async for delta in stream.deltas():
                        if delta.usage is not None:
                            prepared.counts.usage = delta.usage
                        if delta.empty or last is not None:
                            continue
                        chunk = _chunk(delta, held, detail)
                        held, started = "", True
                        if chunk.finish_reason is not None:
                            last = chunk  # the usage chunk comes after it
                        else:
                            yield chunk
                break
            except AnswerOverContext as e:
                if started or fitted or not prepared.fit_to_context:
                    raise
                # the prompt leaves less room than max_tokens: ask again for that room
                asked, fitted = {**body, "max_tokens": e.overflow.room}, True
            except Unavailable:
                if rid in self._aborted:  # its stream was closed under it: it just ends
                    return
                raise
            finally:
                self._streams.pop(rid, None)
                self._aborted.discard(rid)
        if last is None:
            raise Unavailable(f"the remote server {self._api} ended the answer unfinished")
        yield last

    async def _continued_text(self, prepared: RemoteRequest) -> tuple[str, str]:
        """The answer so far as the server goes on from it (the text of the continued tokens,
        from its `/detokenize`), and that text's part the caller does not have yet (past
        continue_chars; by default all of it but a split last character)."""
        assert self._server is not None and self._model is not None
        text = await self._server.detokenize(self._model.id, prepared.continued)
        if text is None:
            raise ContinuationRefused(
                f"continue_token_ids: {self._server.root} has no /detokenize, so this tier "
                "cannot tell the text of the answer to continue"
            )
        text = text.rstrip("\ufffd")
        chars = prepared.continue_chars
        if chars is not None and chars > len(text):
            raise InvalidArgument(
                f"continue_text_chars: {chars} characters, but those tokens make {len(text)}"
            )
        return text, text[len(text) if chars is None else chars :]

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            self._aborted.add(request_id)
            await stream.close()

    async def _stop_model(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        for request_id in list(self._streams):
            await self.abort(request_id)
        if self._server is not None:
            await self._server.close()


def _chunk(delta: StreamDelta, held: str, detail: bool) -> GenerationChunk:
    """A delta as the tier's chunk, after the text `held` back from a broken answer (at the
    front of its text, and of its first token's entry)."""
    entries = delta.entries if detail else ()
    if held and entries:
        entries = (replace(entries[0], text=held + entries[0].text), *entries[1:])
    return GenerationChunk(
        delta.token_ids,
        held + delta.text,
        delta.logprobs,
        delta.finish_reason,
        token_logprobs=entries,
    )


def _with_counts(
    usage: GenerationUsage, counts: ServerCounts, ttft_ms: float | None
) -> GenerationUsage:
    """The lifecycle's usage with the server's token counts (when it sent them) and, for a
    stream of text only, the first text's time as the time to first token."""
    if counts.usage is not None:
        usage = replace(
            usage,
            prompt_tokens=counts.usage.prompt_tokens,
            completion_tokens=counts.usage.completion_tokens,
        )
    if not usage.ttft_ms and ttft_ms is not None:
        usage = replace(usage, ttft_ms=ttft_ms)
    return usage
