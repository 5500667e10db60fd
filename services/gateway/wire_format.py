"""What an HTTP API other than chat completions (Anthropic's Messages, OpenAI's Responses, legacy
text completions) supplies to be served by answer_endpoint.py: how its request body becomes a
router chat, how an answer, a stream and an error look on its wire. Also the checks those APIs
share: fields refused by name, text content blocks.

Every format reads its body into the chat-completions request that chat_request.py parses, so
model names, sampling limits, stop sequences and the revisions opt-in are checked in one place;
a 400 from there, or one the router names a field in, is renamed to the format's own field.

Pure: no I/O. Knows the shared shapes; each format's fields live in its own module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.gateway.answer_feed import Answer, TextPiece
from services.gateway.chat_request import ChatCompletionRequest, parse_chat_request
from services.gateway.errors import GatewayError, bad_request, openai_param
from services.gateway.openai_wire import sse

# the field a message starts with, and its index: "sampling.stop[1]: must be ..."
_LEADING_FIELD = re.compile(r"^([a-z_]+(?:\.[a-z_]+)*)(\[\d+\])?(?=: )")
# values that mean "not asked for" whatever the field: a field left at one of them is accepted
EMPTY: tuple[Any, ...] = (None, [], {})


@dataclass(frozen=True)
class ParsedRequest:
    """A request of some wire format: its router chat (with model, mode, stream and the
    revisions opt-in) and the fields its answer repeats back (`echo`)."""

    chat: ChatCompletionRequest
    echo: dict[str, Any] = field(default_factory=dict)


class StreamEncoder(Protocol):
    """The SSE events of one streamed answer, in order: `opening` (sent with the first text),
    `text` per piece, then `closing` or `failure` (each ends the stream)."""

    def opening(self) -> bytes: ...

    def text(self, piece: TextPiece) -> bytes: ...

    def closing(self, answer: Answer) -> bytes: ...

    def failure(self, error: GatewayError) -> bytes: ...


class WireFormat(Protocol):
    """One HTTP API served by AnswerEndpoint at `path`."""

    path: str
    # a header that carries the API key bare (Anthropic's x-api-key), passed to the router as
    # `authorization: Bearer <key>` when the request has no Authorization header; None: none
    api_key_header: str | None

    def parse(self, body: Any, *, revisions_header: bool) -> ParsedRequest:
        """The request the body asks for; raises GatewayError naming this format's field."""
        ...

    def answer(self, request: ParsedRequest, answer: Answer) -> dict[str, Any]:
        """The non-streamed response body."""
        ...

    def encoder(self, request: ParsedRequest) -> StreamEncoder: ...

    def error(self, error: GatewayError, reason: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        """HTTP status, body and headers of a failure before the response started; `reason` is
        the router's ErrorInfo reason when it refused the chat (e.g. RATE_LIMITED), else ""."""
        ...


def chat_request(
    fields: dict[str, Any], renames: Mapping[str, str], *, revisions_header: bool
) -> ChatCompletionRequest:
    """The chat of a chat-completions body `fields` built from another format's request (one
    choice); a refusal names that format's field (`renames`: chat-completions name -> its)."""
    try:
        return parse_chat_request(fields, max_choices=1, revisions_header=revisions_header)
    except GatewayError as e:
        raise renamed(e, renames) from None


def renamed(error: GatewayError, renames: Mapping[str, str]) -> GatewayError:
    """`error` with its field (and the message's leading field name) in another format's
    terms: `max_tokens` -> `max_output_tokens`, `stop[1]` -> `stop_sequences[1]`."""
    param = error.param
    if not param:
        return error
    base, cut = param, len(param)
    if param not in renames:
        for i, char in enumerate(param):
            if char in ".[":
                base, cut = param[:i], i
                break
    if base not in renames:
        return error
    new = renames[base] + param[cut:]
    message = error.message
    named = _LEADING_FIELD.match(message)  # the router's name: `sampling.stop[0]: ...`
    if named and openai_param(named.group(1)) in (base, param):
        message = renames[base] + (named.group(2) or "") + message[named.end() :]
    return GatewayError(
        error.status, message, param=new, code=error.code, retry_after_s=error.retry_after_s
    )


def refuse_unsupported(
    body: Mapping[str, Any],
    accepted: frozenset[str],
    neutral: Mapping[str, tuple[Any, ...]],
    api: str,
) -> None:
    """A 400 naming the first field outside `accepted` that is set to something other than
    an empty value or one of its `neutral` values (tools, images, ...: text generation is
    all tiermesh does)."""
    for name, value in body.items():
        if name in accepted or _is_neutral(value, EMPTY) or _is_neutral(value, neutral.get(name)):
            continue
        raise bad_request(
            name,
            f"not supported by tiermesh's {api} (text in, text out); leave it unset",
            "unsupported_parameter",
        )


def _is_neutral(value: Any, neutral: tuple[Any, ...] | None) -> bool:
    # bool and int compare equal (False == 0): a neutral value must have the value's own type
    return bool(neutral) and any(
        type(value) is type(candidate) and value == candidate for candidate in neutral or ()
    )


def text_of_blocks(
    value: Any,
    param: str,
    text_types: tuple[str, ...],
    ignored: frozenset[str] = frozenset(),
    *,
    allow_string: bool = True,
) -> str:
    """The text of a content value: a string, or a list of blocks `{"type": one of
    text_types, "text": ...}` joined by a blank line. A block of another type (an image, a
    file, a tool result) or with another field is refused naming it; fields in `ignored`
    (cache hints, annotations) are accepted and have no effect."""
    if isinstance(value, str) and allow_string:
        return value
    if not isinstance(value, list):
        kinds = "a string or a list of text blocks" if allow_string else "a list of text blocks"
        raise bad_request(param, f"must be {kinds}")
    texts = []
    for j, block in enumerate(value):
        where = f"{param}[{j}]"
        if not isinstance(block, dict):
            raise bad_request(where, "must be an object with type and text")
        kind = block.get("type")
        if kind not in text_types:
            raise bad_request(
                f"{where}.type",
                f"{kind!r} content is not supported by tiermesh; only text "
                f"({', '.join(text_types)})",
                "unsupported_content",
            )
        text = block.get("text")
        if not isinstance(text, str):
            raise bad_request(f"{where}.text", "must be a string")
        for name, setting in block.items():
            if name not in ("type", "text") and name not in ignored and setting not in EMPTY:
                raise bad_request(
                    f"{where}.{name}", "not supported by tiermesh", "unsupported_parameter"
                )
        texts.append(text)
    return "\n\n".join(texts)


def integer(body: Mapping[str, Any], name: str, low: int, *, required: bool = False) -> int | None:
    """An integer >= low, or None when absent (a 400 when `required`)."""
    value = body.get(name)
    if value is None:
        if required:
            raise bad_request(name, "required", "missing_required_parameter")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise bad_request(name, f"must be an integer >= {low}, got {value!r}")
    return value


def optional_fields(**fields: Any) -> dict[str, Any]:
    """The fields that are set (not None): a chat-completions body leaves the rest out."""
    return {name: value for name, value in fields.items() if value is not None}


def named_event(name: str, payload: dict[str, Any]) -> bytes:
    """One server-sent event with an `event:` line (Anthropic's and the Responses API's)."""
    return b"event: " + name.encode() + b"\n" + sse(payload)
