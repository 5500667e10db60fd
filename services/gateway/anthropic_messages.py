"""POST /v1/messages: Anthropic's Messages API as a WireFormat (wire_format.py). The request's
`system`, `messages` (text content), `max_tokens` (required), `stop_sequences`, `temperature`
(0-1), `top_p`, `top_k`, `metadata.user_id` and `stream` become one router chat; `model` names a
mode or a pinned tier as in chat completions. The answer is a `message`, or the event sequence
message_start, content_block_start, content_block_delta (text_delta)..., content_block_stop,
message_delta (stop_reason, usage), message_stop. Errors are `{"type": "error", "error":
{"type", "message"}}` with Anthropic's statuses; the key may come as `x-api-key`.

stop_reason: "stop_sequence" (with `stop_sequence` the one that matched) when one of the
request's stop sequences ended the answer, "max_tokens" when it hit max_tokens, else "end_turn".

Pure: no I/O. Knows Anthropic's field names and shapes.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from services.common.validation import MAX_TOP_K
from services.gateway.answer_feed import Answer, TextPiece
from services.gateway.chat_request import checked_messages, number
from services.gateway.errors import GatewayError, bad_request
from services.gateway.wire_format import (
    ParsedRequest,
    chat_request,
    integer,
    named_event,
    optional_fields,
    refuse_unsupported,
    renamed,
    text_of_blocks,
)

PATH = "/v1/messages"
# prompt caching hints (of the request, of a block): accepted, they change nothing here
CACHE_HINT = "cache_control"
API = "Messages API"
ACCEPTED = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "metadata",
        "tiermesh",
        CACHE_HINT,
    }
)
# fields accepted at these values, which ask for nothing tiermesh lacks
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "thinking": ({"type": "disabled"},),
    "tool_choice": ({"type": "none"}, {"type": "auto"}),
    "service_tier": ("auto", "standard_only"),
}
IGNORED_BLOCK_FIELDS = frozenset({CACHE_HINT})
ROLES = ("user", "assistant")
# chat-completions field (or the router's) -> this API's
RENAMES = {"stop": "stop_sequences", "sampling.top_k": "top_k"}
# HTTP status -> (Anthropic's status, error type)
STATUSES: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    413: (413, "request_too_large"),
    429: (429, "rate_limit_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
}
OVERLOADED = (529, "overloaded_error")
# the router's reasons for refusing a key's chat for what that key asks (its rate limits, more
# than its fair share of a loaded mesh): a rate limit; other refusals for load are an overload
KEY_LIMITS = frozenset({"RATE_LIMITED", "FAIR_SHARE"})
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(answer: Answer) -> str:
    """Anthropic's stop_reason: a stop sequence, max_tokens, or the model's own end."""
    if answer.stop_sequence:
        return "stop_sequence"
    return "max_tokens" if answer.finish_reason == "length" else "end_turn"


def usage(answer: Answer) -> dict[str, int]:
    return {
        "input_tokens": answer.usage["prompt_tokens"],
        "output_tokens": answer.usage["completion_tokens"],
    }


class MessagesFormat:
    """Anthropic's Messages API."""

    path: str = PATH
    api_key_header: str | None = "x-api-key"

    def parse(self, body: Any, *, revisions_header: bool) -> ParsedRequest:
        if not isinstance(body, dict):
            raise GatewayError(400, "the request body must be a JSON object", code="invalid_body")
        refuse_unsupported(body, ACCEPTED, NEUTRAL, API)
        max_tokens = integer(body, "max_tokens", 1, required=True)
        top_k = integer(body, "top_k", 0)
        if top_k is not None and top_k > MAX_TOP_K:
            raise bad_request("top_k", f"must be an integer in [0, {MAX_TOP_K}], got {top_k}")
        messages = _messages(body.get("messages"))
        system = body.get("system")
        if system is not None:
            text = text_of_blocks(system, "system", ("text",), IGNORED_BLOCK_FIELDS)
            messages.insert(0, {"role": "system", "content": text})
        fields = optional_fields(
            model=body.get("model"),
            messages=messages,
            max_tokens=max_tokens,
            temperature=number(body, "temperature", 0.0, 1.0),
            top_p=number(body, "top_p", 0.0, 1.0),
            stop=_stop_sequences(body.get("stop_sequences")),
            stream=body.get("stream"),
            tiermesh=body.get("tiermesh"),
            user=_user(body.get("metadata")),
        )
        if "model" not in fields:
            raise bad_request(
                "model", "required (see GET /v1/models)", "missing_required_parameter"
            )
        chat = chat_request(fields, RENAMES, revisions_header=revisions_header)
        if top_k:
            chat.request.sampling.top_k = top_k
        return ParsedRequest(chat)

    def answer(self, request: ParsedRequest, answer: Answer) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": message_id(),
            "type": "message",
            "role": "assistant",
            "model": request.chat.model,
            "content": [{"type": "text", "text": answer.text}],
            "stop_reason": stop_reason(answer),
            "stop_sequence": answer.stop_sequence or None,
            "usage": usage(answer),
        }
        if answer.tiermesh is not None:
            body["tiermesh"] = answer.tiermesh
        return body

    def encoder(self, request: ParsedRequest) -> MessageEvents:
        return MessageEvents(request.chat.model)

    def error(self, error: GatewayError, reason: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        error = renamed(error, RENAMES)
        status, kind = STATUSES.get(error.status, (500, "api_error"))
        if error.status == 429 and reason not in KEY_LIMITS:
            status, kind = OVERLOADED  # the router or a tier at capacity, not the key's limit
        return status, error_body(kind, error), error.headers()


def error_body(kind: str, error: GatewayError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": error.message}}


class MessageEvents:
    """The events of one streamed message: one text content block (index 0)."""

    _DELTA_HEAD = (
        b"event: content_block_delta\n"
        b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
    )

    def __init__(self, model: str) -> None:
        self.id = message_id()
        self.model = model

    def opening(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # the prompt's tokens are counted by the tier that answers: in message_delta
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        block = {"type": "text", "text": ""}
        return named_event("message_start", {"type": "message_start", "message": message}) + (
            named_event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            )
        )

    def text(self, piece: TextPiece) -> bytes:
        if piece.revision is None:  # the common case, once per token: only the text encoded
            return self._DELTA_HEAD + _COMPACT.encode(piece.text).encode() + b"}}\n\n"
        delta = {"type": "text_delta", "text": piece.text}
        payload = {"type": "content_block_delta", "index": 0, "delta": delta}
        return named_event("content_block_delta", {**payload, "tiermesh": piece.revision})

    def closing(self, answer: Answer) -> bytes:
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(answer),
                "stop_sequence": answer.stop_sequence or None,
            },
            "usage": usage(answer),
        }
        if answer.tiermesh is not None:
            delta["tiermesh"] = answer.tiermesh
        return (
            named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + named_event("message_delta", delta)
            + named_event("message_stop", {"type": "message_stop"})
        )

    def failure(self, error: GatewayError) -> bytes:
        _status, kind = STATUSES.get(error.status, (500, "api_error"))
        return named_event("error", error_body(kind, error))


def _messages(value: Any) -> list[dict[str, str]]:
    messages = []
    for i, message, role in checked_messages(value, ROLES):
        for name in message:
            if name not in ("role", "content"):
                raise bad_request(f"messages[{i}].{name}", "not supported", "unsupported_parameter")
        where = f"messages[{i}].content"
        content = text_of_blocks(message.get("content"), where, ("text",), IGNORED_BLOCK_FIELDS)
        messages.append({"role": role, "content": content})
    if messages[-1]["role"] != "user":
        raise bad_request(
            f"messages[{len(messages) - 1}].role",
            "the last message must be the user's: continuing an assistant turn (prefill) is "
            "not supported by tiermesh",
        )
    return messages


def _stop_sequences(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad_request("stop_sequences", f"must be a list of strings, got {value!r}")
    return value


def _user(metadata: Any) -> str | None:
    """metadata.user_id (recorded on the request's span); no other metadata is defined."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise bad_request("metadata", 'must be an object such as {"user_id": "..."}')
    for name in metadata:
        if name != "user_id":
            raise bad_request(f"metadata.{name}", "not supported", "unsupported_parameter")
    user = metadata.get("user_id")
    if user is not None and not isinstance(user, str):
        raise bad_request("metadata.user_id", "must be a string")
    return user
