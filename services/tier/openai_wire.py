"""OpenAI's chat-completions wire as a remote tier speaks it (openai_engine.py): the request body
of one prepared request, server-sent events read line by line, each `chat.completion.chunk`
turned into plain fields, the served models, the text of detokenized ids, and the server's error
answers (an HTTP status with OpenAI's error body, or an error event mid-stream) turned into
tiermesh errors.

Pure: dicts, strings and numbers in, plain data out; no sockets, HTTP client or gRPC. vLLM's
extensions (`return_token_ids`, `continue_final_message`) are optional fields of the body.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from services.common.errors import (
    ConfigError,
    InvalidArgument,
    PromptTooLong,
    TiermeshError,
    Unavailable,
)
from services.tier.admission import QueueRefused
from services.tier.context_overflow import ContextOverflow, context_overflow
from services.tier.engine import Sampling, TokenLogprob, TopLogprob
from services.tier.prepared_request import LENGTH, STOP

DONE = "[DONE]"  # the data of the last event of an OpenAI stream
DEFAULT_RETRY_S = 1.0  # a 429 without a Retry-After the tier can read
MAX_SEED = 2**63 - 1  # servers take a signed 64-bit seed; tiermesh's are unsigned


class AnswerOverContext(InvalidArgument):
    """The server refused max_tokens: the prompt fits its model's context, but not with that
    many answer tokens after it. A request that lets the context lower its max_tokens asks
    again for `overflow.room`."""

    def __init__(self, message: str, overflow: ContextOverflow) -> None:
        super().__init__(message)
        self.overflow = overflow


class MalformedAnswer(Unavailable):
    """The server answered something that is not OpenAI's wire format (a broken proxy, the
    wrong URL): the tier cannot serve from it."""


def chat_body(
    *,
    model: str,
    messages: Sequence[tuple[str, str]],
    max_tokens: int,
    sampling: Sampling,
    token_ids: bool,
    partial_answer: str | None = None,
) -> dict[str, Any]:
    """The body of a streamed `/v1/chat/completions` call. Every answer asks for its tokens'
    log-probabilities (the router's confidence gate reads them), with `top_logprobs`
    alternatives when the request wants per-token detail, and for the usage in a last chunk.
    `token_ids`: also ask for the answer's token ids (vLLM's `return_token_ids`).
    `partial_answer`: the answer so far, sent as the last assistant turn for the server to go
    on from (vLLM's `continue_final_message`, with no new generation prompt)."""
    turns = [{"role": role, "content": content} for role, content in messages]
    body: dict[str, Any] = {
        "model": model,
        "messages": turns,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "logprobs": True,
        "top_logprobs": sampling.top_logprobs or 0,
    }
    if sampling.top_p < 1.0:
        body["top_p"] = sampling.top_p
    if sampling.top_k:
        body["top_k"] = sampling.top_k  # not OpenAI's, but vLLM, SGLang and llama.cpp take it
    if sampling.seed is not None:
        body["seed"] = sampling.seed & MAX_SEED
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if token_ids:
        body["return_token_ids"] = True
    if partial_answer is not None:
        turns.append({"role": "assistant", "content": partial_answer})
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    return body


class SseReader:
    """Server-sent events from a stream's lines: feed() each line (without its newline) and
    get an event's data (its `data:` lines joined) when the blank line that ends it comes.
    Comments and other fields (`event:`, `id:`, `retry:`) are skipped."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value.removeprefix(" "))
        return None

    def flush(self) -> str | None:
        """The data of an event the stream ended without its blank line, if any."""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


@dataclass(frozen=True)
class ServerUsage:
    """The token counts of a stream's usage chunk."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class StreamDelta:
    """One `chat.completion.chunk` of the first choice, as plain fields."""

    text: str = ""
    token_ids: tuple[int, ...] = ()  # vLLM's `token_ids`; () from a server that sends none
    logprobs: tuple[float, ...] = ()  # one per token of `logprobs.content`
    entries: tuple[TokenLogprob, ...] = ()  # the same tokens with their alternatives
    finish_reason: str | None = None  # "stop" or "length" (the tier's), on the finishing chunk
    usage: ServerUsage | None = None  # on the usage chunk (no choices) or the finishing one

    @property
    def empty(self) -> bool:
        """Nothing for the tier's stream: a role-only first chunk, a usage chunk."""
        return not (self.text or self.token_ids or self.finish_reason)


def event_payload(data: str) -> dict[str, Any]:
    """An event's data as JSON; raises MalformedAnswer."""
    try:
        payload = json.loads(data)
    except json.JSONDecodeError as e:
        raise MalformedAnswer(f"the remote server sent an event that is not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise MalformedAnswer(f"the remote server sent an event that is not an object: {data!r}")
    return payload


def read_chunk(payload: dict[str, Any], server: str) -> StreamDelta:
    """The first choice of a chunk (usage too). Raises what an error event says (stream_error)
    and MalformedAnswer for a chunk out of shape."""
    if "error" in payload or payload.get("object") == "error":
        raise stream_error(payload, server)
    try:
        usage = _usage(payload.get("usage"))
        choices = payload.get("choices") or []
        if not choices:
            return StreamDelta(usage=usage)
        choice = choices[0]
        text = (choice.get("delta") or {}).get("content") or ""
        ids = tuple(int(token) for token in choice.get("token_ids") or ())
        content = (choice.get("logprobs") or {}).get("content") or ()
        entries = tuple(_entry(entry) for entry in content)
        finish = tier_finish(choice.get("finish_reason"), server)
        if not isinstance(text, str):
            raise TypeError(f"delta.content is {type(text).__name__}")
    except (AttributeError, TypeError, ValueError, KeyError) as e:
        raise MalformedAnswer(f"the remote server {server} sent a malformed chunk: {e}") from None
    logprobs = tuple(entry.logprob for entry in entries)
    return StreamDelta(text, ids, logprobs, entries, finish, usage)


def tier_finish(reason: Any, server: str) -> str | None:
    """The tier's finish reason for the server's: "length" stays, an `abort` (the server
    dropped the request) is UNAVAILABLE, any other end ("stop", "eos", "content_filter") is
    "stop"; None while it goes on."""
    if reason is None:
        return None
    if reason == "length":
        return LENGTH
    if reason == "abort":
        raise Unavailable(f"the remote server {server} aborted the answer")
    return STOP


def _entry(entry: dict[str, Any]) -> TokenLogprob:
    top = tuple(
        # the wire names alternatives by their text only: their ids are not known here
        TopLogprob(0, str(alt["token"]), _logprob(alt["logprob"]))
        for alt in entry.get("top_logprobs") or ()
    )
    return TokenLogprob(str(entry["token"]), _logprob(entry["logprob"]), top)


def _logprob(value: Any) -> float:
    """A log-probability (at most 0: a server's rounding above it is cut)."""
    number = float(value)
    if math.isnan(number):
        raise ValueError("a log-probability is NaN")
    return min(number, 0.0)


def _usage(value: Any) -> ServerUsage | None:
    if not isinstance(value, dict):
        return None
    return ServerUsage(int(value.get("prompt_tokens") or 0), int(value["completion_tokens"]))


@dataclass(frozen=True)
class ServedModel:
    """One entry of `/v1/models`: its name and, where the server says (vLLM), its context."""

    id: str
    max_model_len: int | None = None


def served_models(payload: Any, server: str) -> list[ServedModel]:
    """The models of a `/v1/models` answer; raises MalformedAnswer."""
    try:
        return [
            ServedModel(str(entry["id"]), _positive(entry.get("max_model_len")))
            for entry in payload["data"]
        ]
    except (TypeError, KeyError, ValueError) as e:
        raise MalformedAnswer(
            f"{server}/models did not answer a model list ({type(e).__name__}: {e})"
        ) from None


def pick_model(models: list[ServedModel], wanted: str, server: str) -> ServedModel:
    """The served model a tier uses: `wanted` (the config's remote_model), else the first.
    Raises ConfigError naming remote_model when it is not served, Unavailable for none."""
    if not models:
        raise Unavailable(f"{server}/models lists no model yet")
    if not wanted:
        return models[0]
    for model in models:
        if model.id == wanted:
            return model
    names = ", ".join(model.id for model in models)
    raise ConfigError(f"remote_model: {wanted!r} is not served by {server} (it serves: {names})")


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value > 0 else None


def detokenized_text(payload: Any, server: str) -> str:
    """The text of a `/detokenize` answer: vLLM's `prompt`, llama.cpp's `content`."""
    if isinstance(payload, dict):
        for key in ("prompt", "content", "text"):
            if isinstance(payload.get(key), str):
                return str(payload[key])
    raise MalformedAnswer(f"{server}/detokenize did not answer a text: {payload!r}"[:300])


def http_error(
    status: int, body: bytes, retry_after: str | None, server: str, now: datetime | None = None
) -> TiermeshError:
    """The tiermesh error for a non-2xx answer: 429 is RESOURCE_EXHAUSTED with its Retry-After
    as the retry delay; 400, 413 and 422 are INVALID_ARGUMENT naming the field the server
    named (the request is wrong anywhere), except a chat the model's context cannot hold: a
    prompt too long on its own is PromptTooLong (the router moves the chat on to a tier that
    may hold it), a max_tokens too large for the room the prompt leaves AnswerOverContext; the
    rest (a refused API key, an unknown model, 5xx) is UNAVAILABLE: this tier cannot serve,
    another may."""
    message, param = error_message(body)
    if status == 429:
        wait = retry_after_s(retry_after, now)
        return QueueRefused(
            f"the remote server {server} is at capacity (HTTP 429): {message}",
            DEFAULT_RETRY_S if wait is None else wait,
        )
    if status in (400, 413, 422):
        overflow = context_overflow(message, _error_object(body))
        if overflow is not None and overflow.room == 0:
            return PromptTooLong(overflow.prompt_tokens, overflow.context_tokens - 1)
        named = f"{param}: " if param and not message.startswith(f"{param}:") else ""
        refusal = f"{named}{message} (the remote server {server}, HTTP {status})"
        if overflow is not None:
            return AnswerOverContext(refusal, overflow)
        return InvalidArgument(refusal)
    if status in (401, 403):
        why = "refused this tier's API key (see the tier's remote_api_key_env)"
    elif status == 404:
        why = "does not serve this (its URL or remote_model is wrong)"
    else:
        why = "failed"
    return Unavailable(f"the remote server {server} {why} (HTTP {status}): {message}")


def stream_error(payload: dict[str, Any], server: str) -> TiermeshError:
    """The error an error event mid-stream says: a rate limit is RESOURCE_EXHAUSTED, a chat the
    model's context cannot hold (a server that starts its stream before its model refuses)
    what http_error makes of it, anything else UNAVAILABLE (the answer broke; another replica
    may continue it)."""
    message, _ = error_message(json.dumps(payload).encode())
    inner = payload.get("error")
    error: dict[str, Any] = inner if isinstance(inner, dict) else payload
    overflow = context_overflow(message, error)
    if overflow is not None and overflow.room == 0:
        return PromptTooLong(overflow.prompt_tokens, overflow.context_tokens - 1)
    if overflow is not None:
        return AnswerOverContext(f"{message} (the remote server {server})", overflow)
    kind = f"{error.get('type', '')} {error.get('code', '')}".lower()
    if "rate_limit" in kind or "resource_exhausted" in kind or "429" in kind:
        return QueueRefused(
            f"the remote server {server} is at capacity: {message}", DEFAULT_RETRY_S
        )
    return Unavailable(f"the remote server {server} broke off the answer: {message}")


def error_message(body: bytes) -> tuple[str, str | None]:
    """The message and parameter of an error body: OpenAI's `{"error": {message, param}}`,
    vLLM's older `{"object": "error", "message"}`, FastAPI's `{"detail"}`, or its text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return (text[:300] or "no message"), None
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail")
            param = error.get("param")
            if message is not None:
                return str(message)[:500], str(param) if param else None
        elif isinstance(error, str):
            return error[:500], None
    return text[:300], None


def _error_object(body: bytes) -> dict[str, Any] | None:
    """The `error` object of a JSON error body, if it has one."""
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else None


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a Retry-After header says to wait: a number of seconds, or an HTTP date (from
    `now`, UTC by default); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        now = now or datetime.now(when.tzinfo)
        seconds = (when - now).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None
