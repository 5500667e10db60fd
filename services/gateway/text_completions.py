"""POST /v1/completions: OpenAI's legacy text completions as a WireFormat (wire_format.py). The
`prompt` (one string) is sent as one user turn: the tiers serve chat models, so the answer
follows the prompt as a reply would rather than continuing its text. `max_tokens`, `stop`,
`temperature`, `top_p`, `seed`, `user`, `stream` and `stream_options.include_usage` mean what
they mean in chat completions. The answer is a `text_completion`, streamed as `data:` chunks
of the same object ending with `data: [DONE]`. Errors are OpenAI's error body.

One choice only: `n`, `best_of` above 1, `echo`, `suffix` and `logprobs` are refused naming
the field.

Pure: no I/O. Knows the legacy API's field names and shapes.
"""

from __future__ import annotations

import uuid
from typing import Any

from services.gateway.answer_feed import Answer, TextPiece
from services.gateway.errors import GatewayError, bad_request
from services.gateway.openai_wire import DONE, created_now, sse
from services.gateway.wire_format import (
    ParsedRequest,
    chat_request,
    optional_fields,
    refuse_unsupported,
    renamed,
)

PATH = "/v1/completions"
API = "completions API"
# passed on to chat completions' parser, which checks them (and refuses penalties and biases)
PASSED_ON = (
    "model",
    "max_tokens",
    "stop",
    "temperature",
    "top_p",
    "seed",
    "stream",
    "stream_options",
    "user",
    "tiermesh",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
)
ACCEPTED = frozenset({*PASSED_ON, "prompt"})
# fields accepted at these values, which ask for nothing tiermesh lacks
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
}
RENAMES = {"messages": "prompt"}


class TextCompletionsFormat:
    """OpenAI's legacy completions API, one text prompt and one choice."""

    path: str = PATH
    api_key_header: str | None = None

    def parse(self, body: Any, *, revisions_header: bool) -> ParsedRequest:
        if not isinstance(body, dict):
            raise GatewayError(400, "the request body must be a JSON object", code="invalid_body")
        refuse_unsupported(body, ACCEPTED, NEUTRAL, API)
        fields = optional_fields(**{name: body.get(name) for name in PASSED_ON})
        fields["messages"] = [{"role": "user", "content": _prompt(body.get("prompt"))}]
        return ParsedRequest(chat_request(fields, RENAMES, revisions_header=revisions_header))

    def answer(self, request: ParsedRequest, answer: Answer) -> dict[str, Any]:
        body = TextCompletionChunks(request).chunk(answer.text, answer.finish_reason)
        body["usage"] = answer.usage
        if answer.tiermesh is not None:
            body["tiermesh"] = answer.tiermesh
        return body

    def encoder(self, request: ParsedRequest) -> TextCompletionChunks:
        return TextCompletionChunks(request)

    def error(self, error: GatewayError, reason: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        error = renamed(error, RENAMES)
        return error.status, error.body(), error.headers()


class TextCompletionChunks:
    """The `text_completion` objects of one request (one id, one time): the whole answer, or
    the chunks of a stream."""

    def __init__(self, request: ParsedRequest) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.model = request.chat.model
        self.created = created_now()
        self.include_usage = request.chat.include_usage

    def chunk(
        self,
        text: str,
        finish_reason: str | None = None,
        tiermesh: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if tiermesh is not None:
            body["tiermesh"] = tiermesh
        return body

    def _event(self, chunk: dict[str, Any]) -> bytes:
        if self.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    def opening(self) -> bytes:
        return b""

    def text(self, piece: TextPiece) -> bytes:
        return self._event(self.chunk(piece.text, tiermesh=piece.revision))

    def closing(self, answer: Answer) -> bytes:
        last = self._event(self.chunk("", answer.finish_reason, answer.tiermesh))
        if self.include_usage:
            usage = {**self.chunk(""), "choices": [], "usage": answer.usage}
            last += sse(usage)
        return last + DONE

    def failure(self, error: GatewayError) -> bytes:
        return sse(error.body())


def _prompt(value: Any) -> str:
    """One prompt: a string, or a list holding one string."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        return value
    if value is None:
        raise bad_request("prompt", "required: a string", "missing_required_parameter")
    raise bad_request(
        "prompt",
        "must be one string: several prompts in one request and token ids are not supported "
        "by tiermesh",
    )
