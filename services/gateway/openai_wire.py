"""OpenAI's response shapes: `chat.completion`, `chat.completion.chunk`, usage, the model list
and SSE framing (`data: {...}` lines, `data: [DONE]`).

Pure builders of plain dicts and bytes; nothing of the router or of HTTP servers.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tiermesh.client import FinalEvent, TokenLogprob

DONE = b"data: [DONE]\n\n"
# one encoder for every event: json.dumps with a non-default argument builds one per call
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def created_now() -> int:
    return int(time.time())


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying `payload` as JSON."""
    return b"data: " + _COMPACT.encode(payload).encode() + b"\n\n"


def usage(final: FinalEvent) -> dict[str, int]:
    """OpenAI usage of the answer: the tokens of the tier call whose revision is the answer
    (the per-tier usage of every call is in the `tiermesh` final object)."""
    answer = next((u for u in final.usage if u.get("revision") == final.revision), None)
    prompt = int(answer.get("prompt_tokens", 0)) if answer else 0
    completion = int(answer.get("completion_tokens", 0)) if answer else 0
    return _usage(prompt, completion)


def total_usage(finals: list[FinalEvent]) -> dict[str, int]:
    """OpenAI usage of a completion's choices: the prompt once (every choice answers the same
    one; the most any choice's tier counted), their completion tokens summed."""
    each = [usage(final) for final in finals]
    prompt = max(u["prompt_tokens"] for u in each)
    return _usage(prompt, sum(u["completion_tokens"] for u in each))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@dataclass(frozen=True)
class Choice:
    """One answered choice of a non-streamed completion."""

    final: FinalEvent
    finish_reason: str
    tiermesh: dict[str, Any] | None = None  # the revisions opt-in's final object
    logprobs: list[TokenLogprob] | None = None  # the answer's tokens, when the request asked
    stop_sequence: str = ""  # the stop sequence that ended the answer, when one did


class ChunkWriter:
    """Builds the chunks of one choice of a streamed completion (every choice's chunks have the
    same id, model and created time; `for_choice` gives the writer of another choice)."""

    def __init__(
        self,
        model: str,
        index: int = 0,
        id: str | None = None,
        created: int | None = None,
        service_tier: str = "default",
    ) -> None:
        self.id = id or completion_id()
        self.model = model
        self.service_tier = service_tier
        self.created = created_now() if created is None else created
        self.index = index
        # a content chunk's event around its text, encoded once: the bytes sse(chunk(...)) gives
        head = self.chunk({"content": ""})
        encoded = sse(head)
        cut = encoded.index(b'"content":""') + len(b'"content":')
        self._content_head = encoded[:cut]
        self._content_tail = encoded[cut + 2 :]
        with_usage = sse({**head, "usage": None})
        self._content_tail_usage = with_usage[cut + 2 :]

    def for_choice(self, index: int) -> ChunkWriter:
        """The writer of choice `index` of the same completion."""
        return ChunkWriter(self.model, index, self.id, self.created, self.service_tier)

    def chunk(
        self,
        delta: dict[str, Any],
        *,
        finish_reason: str | None = None,
        tiermesh: dict[str, Any] | None = None,
        with_usage_field: bool = False,
        logprobs: list[TokenLogprob] | None = None,
    ) -> dict[str, Any]:
        """One chunk; `logprobs` (the request asked for them): its tokens' entries."""
        payload: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "service_tier": self.service_tier,
            "choices": [
                {
                    "index": self.index,
                    "delta": delta,
                    "logprobs": None if logprobs is None else logprobs_field(logprobs),
                    "finish_reason": finish_reason,
                }
            ],
        }
        if with_usage_field:
            payload["usage"] = None
        if tiermesh is not None:
            payload["tiermesh"] = tiermesh
        return payload

    def content_event(self, text: str, *, with_usage_field: bool = False) -> bytes:
        """The SSE event of the chunk `chunk({"content": text})`: the same bytes as encoding
        that dict, with only the text encoded per call (this runs once per token)."""
        tail = self._content_tail_usage if with_usage_field else self._content_tail
        return self._content_head + _COMPACT.encode(text).encode() + tail

    def usage_chunk(self, finals: list[FinalEvent]) -> dict[str, Any]:
        """The last chunk `stream_options.include_usage` asks for: no choices, the usage of
        every choice (`finals`)."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "service_tier": self.service_tier,
            "choices": [],
            "usage": total_usage(finals),
        }


def logprobs_field(entries: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's `logprobs` of a choice: each token's text, log-probability, UTF-8 bytes and
    its step's most likely tokens."""
    return {
        "content": [
            {
                "token": e.text,
                "logprob": e.logprob,
                "bytes": list(e.text.encode()),
                "top_logprobs": [
                    {"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode())}
                    for t in e.top
                ],
            }
            for e in entries
        ],
        "refusal": None,
    }


def completion(model: str, choices: list[Choice], service_tier: str = "default") -> dict[str, Any]:
    """The non-streamed `chat.completion` whose messages are the choices' answers. With the
    revisions opt-in, the top-level `tiermesh` object is the first choice's, and with more than
    one choice each also carries its own."""
    body: dict[str, Any] = {
        "id": completion_id(),
        "object": "chat.completion",
        "created": created_now(),
        "model": model,
        "service_tier": service_tier,
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": choice.final.text},
                "logprobs": None if choice.logprobs is None else logprobs_field(choice.logprobs),
                "finish_reason": choice.finish_reason,
                # as vLLM's server: the stop string that ended the answer, else null
                "stop_reason": choice.stop_sequence or None,
                **(
                    {"tiermesh": choice.tiermesh}
                    if len(choices) > 1 and choice.tiermesh is not None
                    else {}
                ),
            }
            for index, choice in enumerate(choices)
        ],
        "usage": total_usage([choice.final for choice in choices]),
    }
    if choices[0].tiermesh is not None:
        body["tiermesh"] = choices[0].tiermesh
    return body


def model_list(models: list[str]) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(name) for name in models]}


def model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tiermesh"}
