"""The gateway's wire formats beside chat completions (Messages, Responses, text completions):
requests read into router chats or refused naming the field, errors in each format's shape and
status, and the events of a stream, driven by router events with no server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tiermesh.client import DeltaEvent, FinalEvent, RevisionEndEvent, RevisionStartEvent, RouteEvent

from services.gateway.answer_feed import AnswerFeed
from services.gateway.anthropic_messages import MessagesFormat
from services.gateway.errors import GatewayError
from services.gateway.openai_responses import ResponsesFormat
from services.gateway.text_completions import TextCompletionsFormat
from services.gateway.wire_format import StreamEncoder, WireFormat

USER = [{"role": "user", "content": "Hi"}]
USAGE = [{"tier": "large", "revision": 1, "prompt_tokens": 5, "completion_tokens": 3}]


def messages(**fields: Any) -> dict[str, Any]:
    return {"model": "tiermesh-small", "max_tokens": 8, "messages": USER, **fields}


def refusal(wire: WireFormat, body: dict[str, Any]) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        wire.parse(body, revisions_header=False)
    return caught.value


def test_a_message_request_becomes_a_router_chat() -> None:
    body = messages(
        model="tiermesh-large",
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {}}]},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Refunds?"},
        ],
        stop_sequences=["\n\n"],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        metadata={"user_id": "u-1"},
        stream=True,
    )
    chat = MessagesFormat().parse(body, revisions_header=False).chat
    request = chat.request
    assert (chat.mode, request.tier, chat.stream, chat.user) == ("pinned", "large", True, "u-1")
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief.\n\nBe kind."),
        ("user", "Hi"),
        ("assistant", "Hello"),
        ("user", "Refunds?"),
    ]
    assert request.max_tokens == 8
    assert list(request.sampling.stop) == ["\n\n"]
    assert request.sampling.temperature == pytest.approx(0.5)
    assert request.sampling.top_p == pytest.approx(0.9)
    assert request.sampling.top_k == 40


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"name": "f", "input_schema": {}}]}, "tools"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"stop_sequences": ["x" * 200]}, "stop_sequences"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"metadata": {"tags": ["a"]}}, "metadata.tags"),
        ({"system": [{"type": "image", "source": {}}]}, "system[0].type"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}
                ]
            },
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [*USER, {"role": "assistant", "content": "Sure,"}]}, "messages[1].role"),
    ],
)
def test_what_messages_cannot_honour_is_refused_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    error = refusal(MessagesFormat(), messages(**body))
    assert (error.status, error.param) == (400, param)
    assert error.message.startswith(param)
    status, shape, _ = MessagesFormat().error(error, "")
    assert status == 400
    assert shape == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": error.message},
    }


def test_neutral_values_of_unsupported_fields_are_accepted() -> None:
    body = messages(tools=[], tool_choice={"type": "auto"}, thinking={"type": "disabled"})
    assert MessagesFormat().parse(body, revisions_header=False).chat.model == "tiermesh-small"


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (401, "API_KEY_INVALID", (401, "authentication_error")),
        (403, "SCOPE_MISSING", (403, "permission_error")),
        (404, "", (404, "not_found_error")),
        (429, "RATE_LIMITED", (429, "rate_limit_error")),
        (429, "FAIR_SHARE", (429, "rate_limit_error")),
        (429, "ROUTER_AT_CAPACITY", (529, "overloaded_error")),
        (503, "", (529, "overloaded_error")),
        (504, "", (504, "timeout_error")),
        (502, "", (500, "api_error")),
        (500, "", (500, "api_error")),
    ],
)
def test_message_errors_use_anthropics_statuses_and_types(
    status: int, reason: str, expected: tuple[int, str]
) -> None:
    error = GatewayError(status, "why", retry_after_s=2 if status == 429 else None)
    got, body, headers = MessagesFormat().error(error, reason)
    assert (got, body["error"]["type"]) == expected
    assert body["type"] == "error"
    assert headers == ({"Retry-After": "2"} if status == 429 else {})


def test_a_responses_request_becomes_a_router_chat() -> None:
    body = {
        "model": "tiermesh-progressive",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Shop rules."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
            },
            {"role": "user", "content": "Refunds?"},
        ],
        "max_output_tokens": 12,
        "store": False,
        "text": {"format": {"type": "text"}},
    }
    parsed = ResponsesFormat().parse(body, revisions_header=True)
    request = parsed.chat.request
    assert parsed.chat.mode == "progressive" and parsed.chat.revisions
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("system", "Shop rules."),
        ("user", "Hi"),
        ("assistant", "Hello"),
        ("user", "Refunds?"),
    ]
    assert request.max_tokens == 12
    assert parsed.echo["instructions"] == "Be brief."


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
        ),
    ],
)
def test_what_responses_cannot_honour_is_refused_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    error = refusal(ResponsesFormat(), {"model": "tiermesh-small", "input": "Hi", **body})
    assert (error.status, error.param) == (400, param)
    status, shape, _ = ResponsesFormat().error(error, "")
    assert status == 400 and shape["error"]["param"] == param


def test_a_router_refusal_names_the_formats_own_field() -> None:
    router_error = GatewayError(
        400, "max_tokens: must be in [1, 400], got 1000", param="max_tokens"
    )
    _, body, _ = ResponsesFormat().error(router_error, "")
    assert body["error"]["param"] == "max_output_tokens"
    assert body["error"]["message"] == "max_output_tokens: must be in [1, 400], got 1000"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"stop": 3}, "stop"),
    ],
)
def test_what_text_completions_cannot_honour_is_refused_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    error = refusal(TextCompletionsFormat(), {"model": "tiermesh-small", "prompt": "Hi", **body})
    assert (error.status, error.param) == (400, param)


def test_a_text_prompt_is_one_user_turn() -> None:
    body = {"model": "tiermesh-routed", "prompt": ["Hi"], "stop": ["\n"], "max_tokens": 5}
    request = TextCompletionsFormat().parse(body, revisions_header=False).chat.request
    assert [(m.role, m.content) for m in request.messages] == [("user", "Hi")]
    assert list(request.sampling.stop) == ["\n"]


def progressive_events(finish: str = "stop") -> list[Any]:
    """A progressive chat whose refinement replaces the draft and is the answer."""
    return [
        RouteEvent("r", "progressive", ("small", "large"), 0.5, "p", "why"),
        RevisionStartEvent(0, "small", None, 0),
        DeltaEvent(0, "Dra", ()),
        DeltaEvent(0, "ft", ()),
        RevisionEndEvent(0, "stop", {}, ""),
        RevisionStartEvent(1, "large", 0, 0),
        DeltaEvent(1, "Ref", ()),
        DeltaEvent(1, "ined", ()),
        RevisionEndEvent(1, finish, {}, ""),
        FinalEvent(1, "large", "Refined", "refined", 2, USAGE, {"time_to_final_ms": 5.0}),
    ]


def stream(wire: WireFormat, body: dict[str, Any], revisions: bool = False) -> list[Any]:
    """The events the format sends for progressive_events(): (event name, data) pairs."""
    parsed = wire.parse({**body, "stream": True}, revisions_header=revisions)
    encoder: StreamEncoder = wire.encoder(parsed)
    feed = AnswerFeed(parsed.chat.revisions)
    data = encoder.opening()
    for event in progressive_events():
        data += b"".join(encoder.text(piece) for piece in feed.feed(event))
    assert feed.answer is not None
    data += encoder.closing(feed.answer)
    events = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        payload = lines["data"]
        events.append((lines.get("event"), payload if payload == "[DONE]" else json.loads(payload)))
    return events


def test_a_streamed_message_is_anthropics_event_sequence() -> None:
    events = stream(MessagesFormat(), messages(model="tiermesh-progressive"))
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(name == data["type"] for name, data in events)
    texts = [data["delta"]["text"] for name, data in events if name == "content_block_delta"]
    assert "".join(texts) == "Refined"  # the plain client never sees the draft
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 5, "output_tokens": 3}


def test_a_streamed_message_with_every_revision_carries_tiermesh_objects() -> None:
    events = stream(MessagesFormat(), messages(model="tiermesh-progressive"), revisions=True)
    deltas = [data for name, data in events if name == "content_block_delta"]
    assert [(d["tiermesh"]["revision"], d["delta"]["text"]) for d in deltas] == [
        (0, ""),
        (0, "Dra"),
        (0, "ft"),
        (1, ""),
        (1, "Ref"),
        (1, "ined"),
    ]
    final = events[-2][1]["tiermesh"]
    assert (final["final"], final["revision"], final["tier"]) == (True, 1, "large")


def test_a_streamed_response_numbers_its_events() -> None:
    body = {"model": "tiermesh-progressive", "input": "Hi"}
    events = stream(ResponsesFormat(), body)
    names = [name for name, _ in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(name == data["type"] for name, data in events)
    item_ids = {data["item_id"] for _, data in events if "item_id" in data}
    assert len(item_ids) == 1
    completed = events[-1][1]["response"]
    assert completed["status"] == "completed"
    assert completed["output"][0]["content"][0]["text"] == "Refined"
    assert completed["usage"]["total_tokens"] == 8


def test_a_streamed_text_completion_ends_with_done() -> None:
    body = {
        "model": "tiermesh-progressive",
        "prompt": "Hi",
        "stream_options": {"include_usage": True},
    }
    events = stream(TextCompletionsFormat(), body)
    assert events[-1] == (None, "[DONE]")
    chunks = [data for _, data in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "Refined"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_a_failure_mid_stream_is_the_formats_error_event() -> None:
    error = GatewayError(503, "tier small is down", code="unavailable")
    anthropic = MessagesFormat().encoder(MessagesFormat().parse(messages(), revisions_header=False))
    assert anthropic.failure(error).startswith(b"event: error\ndata: ")
    assert b'"overloaded_error"' in anthropic.failure(error)
    parsed = ResponsesFormat().parse(
        {"model": "tiermesh-small", "input": "Hi"}, revisions_header=False
    )
    failed = ResponsesFormat().encoder(parsed).failure(error).decode()
    payload = json.loads(failed.split("data: ", 1)[1])
    assert payload["type"] == "response.failed"
    assert payload["response"]["error"] == {"code": "unavailable", "message": "tier small is down"}
