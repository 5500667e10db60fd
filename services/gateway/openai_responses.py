"""POST /v1/responses: OpenAI's Responses API, text only, as a WireFormat (wire_format.py).
`instructions`, `input` (a string, or messages whose content is text), `max_output_tokens`,
`temperature`, `top_p`, `user`, `metadata` and `stream` become one router chat; `model` names a
mode or a pinned tier as in chat completions. The answer is a `response` object with one
assistant message (the SDK's `output_text`), or the events response.created,
response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta..., response.output_text.done, response.content_part.done,
response.output_item.done and response.completed (response.incomplete when the answer hit
max_output_tokens), each with its `sequence_number`. Errors are OpenAI's error body.

Nothing is stored: `store: true`, `previous_response_id`, tools, reasoning and non-text input
are refused naming the field.

Pure: no I/O. Knows the Responses API's field names and shapes.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from services.gateway.answer_feed import Answer, TextPiece
from services.gateway.chat_request import number
from services.gateway.errors import GatewayError, bad_request
from services.gateway.openai_wire import created_now
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

PATH = "/v1/responses"
API = "Responses API"
ACCEPTED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "user",
        "metadata",
        "tiermesh",
    }
)
TEXT_FORMAT = {"format": {"type": "text"}}
# fields accepted at these values, which ask for nothing tiermesh lacks
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "store": (False,),
    "background": (False,),
    "text": (TEXT_FORMAT,),
    "truncation": ("disabled",),
    "parallel_tool_calls": (True, False),
    "tool_choice": ("none", "auto"),
    "service_tier": ("auto", "default"),
}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")
# fields of input items and parts that change nothing here (what a client sends back of an
# earlier response: its ids, status and annotations)
IGNORED_ITEM_FIELDS = frozenset({"type", "role", "content", "id", "status"})
IGNORED_PART_FIELDS = frozenset({"annotations", "logprobs"})
# chat-completions field (or the router's) -> this API's
RENAMES = {"max_tokens": "max_output_tokens", "messages": "input"}
_COMPACT = json.JSONEncoder(separators=(",", ":"))


class ResponsesFormat:
    """OpenAI's Responses API, text only."""

    path: str = PATH
    api_key_header: str | None = None

    def parse(self, body: Any, *, revisions_header: bool) -> ParsedRequest:
        if not isinstance(body, dict):
            raise GatewayError(400, "the request body must be a JSON object", code="invalid_body")
        refuse_unsupported(body, ACCEPTED, NEUTRAL, API)
        messages = _input(body.get("input"))
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise bad_request("instructions", "must be a string")
            messages.insert(0, {"role": "system", "content": instructions})
        metadata = body.get("metadata")
        if metadata is not None and (
            not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
        ):
            raise bad_request("metadata", "must be an object of string values")
        max_output_tokens = integer(body, "max_output_tokens", 1)
        temperature = number(body, "temperature", 0.0, 2.0)
        top_p = number(body, "top_p", 0.0, 1.0)
        fields = optional_fields(
            model=body.get("model"),
            messages=messages,
            max_tokens=max_output_tokens,
            temperature=temperature,
            top_p=top_p,
            stream=body.get("stream"),
            tiermesh=body.get("tiermesh"),
            user=body.get("user"),
        )
        chat = chat_request(fields, RENAMES, revisions_header=revisions_header)
        echo = {
            "instructions": instructions,
            "max_output_tokens": max_output_tokens,
            "metadata": metadata or {},
            "temperature": 1.0 if temperature is None else temperature,
            "top_p": 1.0 if top_p is None else top_p,
            "user": body.get("user"),
        }
        return ParsedRequest(chat, echo)

    def answer(self, request: ParsedRequest, answer: Answer) -> dict[str, Any]:
        shapes = ResponseShapes(request)
        return shapes.response(answer)

    def encoder(self, request: ParsedRequest) -> ResponseEvents:
        return ResponseEvents(ResponseShapes(request))

    def error(self, error: GatewayError, reason: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        error = renamed(error, RENAMES)
        return error.status, error.body(), error.headers()


class ResponseShapes:
    """The response object and its output item of one request (one id, one time)."""

    def __init__(self, request: ParsedRequest) -> None:
        self.request = request
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = created_now()

    def response(
        self,
        answer: Answer | None = None,
        *,
        status: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response object: in progress (no answer yet), finished with `answer`, or
        `status` "failed" with `error`."""
        incomplete = answer is not None and answer.finish_reason == "length"
        if status is None and answer is None:
            status = "in_progress"
        elif status is None:
            status = "incomplete" if incomplete else "completed"
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.request.chat.model,
            "output": [] if answer is None else [self.item(answer)],
            "parallel_tool_calls": False,
            "tool_choice": "none",
            "tools": [],
            "text": TEXT_FORMAT,
            "truncation": "disabled",
            "store": False,
            "usage": None if answer is None else usage(answer),
            **self.request.echo,
        }
        if answer is not None and answer.tiermesh is not None:
            body["tiermesh"] = answer.tiermesh
        return body

    def item(self, answer: Answer | None = None) -> dict[str, Any]:
        """The assistant message: in progress and empty, or with the answer."""
        if answer is None:
            status, content = "in_progress", []
        else:
            status = "incomplete" if answer.finish_reason == "length" else "completed"
            content = [part(answer.text)]
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }


def part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage(answer: Answer) -> dict[str, Any]:
    return {
        "input_tokens": answer.usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": answer.usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": answer.usage["total_tokens"],
    }


class ResponseEvents:
    """The events of one streamed response, numbered from 0 (`sequence_number`)."""

    def __init__(self, shapes: ResponseShapes) -> None:
        self.shapes = shapes
        self.sequence = 0
        item = {"item_id": shapes.item_id, "output_index": 0, "content_index": 0}
        # a delta event around its text and sequence number, encoded once
        head = named_event("response.output_text.delta", {"type": "response.output_text.delta"})
        self._delta_head = head[: -len(b"}\n\n")] + b"," + _COMPACT.encode(item)[1:-1].encode()
        self._item = item

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return named_event(kind, payload)

    def opening(self) -> bytes:
        shapes = self.shapes
        return (
            self._event("response.created", response=shapes.response())
            + self._event("response.in_progress", response=shapes.response())
            + self._event("response.output_item.added", output_index=0, item=shapes.item())
            + self._event("response.content_part.added", **self._item, part=part(""))
        )

    def text(self, piece: TextPiece) -> bytes:
        if piece.revision is not None:
            return self._event(
                "response.output_text.delta",
                **self._item,
                delta=piece.text,
                logprobs=[],
                tiermesh=piece.revision,
            )
        sequence, self.sequence = self.sequence, self.sequence + 1
        return (
            self._delta_head
            + b',"delta":'
            + _COMPACT.encode(piece.text).encode()
            + b',"logprobs":[],"sequence_number":'
            + str(sequence).encode()
            + b"}\n\n"
        )

    def closing(self, answer: Answer) -> bytes:
        shapes = self.shapes
        done = "response.incomplete" if answer.finish_reason == "length" else "response.completed"
        return (
            self._event("response.output_text.done", **self._item, text=answer.text, logprobs=[])
            + self._event("response.content_part.done", **self._item, part=part(answer.text))
            + self._event("response.output_item.done", output_index=0, item=shapes.item(answer))
            + self._event(done, response=shapes.response(answer))
        )

    def failure(self, error: GatewayError) -> bytes:
        failed = {"code": error.code or error.type, "message": error.message}
        response = self.shapes.response(status="failed", error=failed)
        return self._event("response.failed", response=response)


def _input(value: Any) -> list[dict[str, str]]:
    """`input`: a string (one user message) or a list of messages with text content."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        message = "required: a string or a non-empty list of messages"
        raise bad_request("input", message, "missing_required_parameter")
    messages = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(where, "must be a message object with role and content")
        kind = item.get("type", "message")
        if kind != "message":
            raise bad_request(
                f"{where}.type",
                f"{kind!r} items are not supported by tiermesh; only messages with text",
                "unsupported_content",
            )
        role = item.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        for name in item:
            if name not in IGNORED_ITEM_FIELDS:
                raise bad_request(f"{where}.{name}", "not supported", "unsupported_parameter")
        content = text_of_blocks(
            item.get("content"), f"{where}.content", TEXT_PARTS, IGNORED_PART_FIELDS
        )
        messages.append({"role": ROLES[role], "content": content})
    return messages
