"""OpenAI's chat-completions wire as a remote tier speaks it (services/tier/openai_wire.py): the
request body, server-sent events, chunks as vLLM and a tiermesh gateway write them, served
models, and error answers mapped to tiermesh errors. Pure functions, driven by tables of real
shapes."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest

from services.common.errors import ConfigError, InvalidArgument, Unavailable
from services.tier.admission import QueueRefused
from services.tier.engine import Sampling, TokenLogprob, TopLogprob
from services.tier.openai_wire import (
    DEFAULT_RETRY_S,
    MAX_SEED,
    MalformedAnswer,
    ServedModel,
    ServerUsage,
    SseReader,
    StreamDelta,
    chat_body,
    detokenized_text,
    error_message,
    event_payload,
    http_error,
    pick_model,
    read_chunk,
    retry_after_s,
    served_models,
    stream_error,
)

SERVER = "http://127.0.0.1:8000/v1"
MESSAGES = (("system", "Be brief."), ("user", "Where is my order?"))


def test_the_body_streams_with_usage_logprobs_and_the_sampling_asked() -> None:
    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=20, seed=2**64 - 1, stop=("\n\n",))
    body = chat_body(model="m", messages=MESSAGES, max_tokens=64, sampling=sampling, token_ids=True)
    assert body == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where is my order?"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 64,
        "temperature": 0.7,
        "logprobs": True,
        "top_logprobs": 0,
        "top_p": 0.9,
        "top_k": 20,
        "seed": MAX_SEED,  # a signed 64-bit seed, as servers take it
        "stop": ["\n\n"],
        "return_token_ids": True,
    }


def test_greedy_leaves_the_neutral_fields_out_and_top_logprobs_asks_for_alternatives() -> None:
    body = chat_body(
        model="m",
        messages=MESSAGES[1:],
        max_tokens=8,
        sampling=Sampling(top_logprobs=3),
        token_ids=False,
    )
    assert body["temperature"] == 0.0 and body["top_logprobs"] == 3
    assert not {"top_p", "top_k", "seed", "stop", "return_token_ids"} & set(body)


def test_a_continuation_sends_the_answer_so_far_as_the_last_assistant_turn() -> None:
    body = chat_body(
        model="m",
        messages=MESSAGES[1:],
        max_tokens=8,
        sampling=Sampling(),
        token_ids=True,
        partial_answer="It ships",
    )
    assert body["messages"][-1] == {"role": "assistant", "content": "It ships"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_server_sent_events_are_read_line_by_line() -> None:
    lines = [": keep-alive", "event: chunk", "data: {\"a\":", "data: 1}", "", "id: 7", "",
             "data:[DONE]", ""]  # fmt: skip
    reader = SseReader()
    events = [data for line in lines if (data := reader.feed(line)) is not None]
    assert events == ['{"a":\n1}', "[DONE]"]
    reader.feed("data: tail")
    assert reader.flush() == "tail" and reader.flush() is None


# A vLLM stream with `return_token_ids` and `logprobs` (top_logprobs 2), as its server writes it
VLLM_CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}], "prompt_token_ids": [1, 2, 3]},
    {"choices": [{"index": 0, "delta": {"content": " Hello"}, "finish_reason": None,
                  "token_ids": [9906],
                  "logprobs": {"content": [{"token": " Hello", "logprob": -0.25, "bytes": [],
                                            "top_logprobs": [
                                                {"token": " Hello", "logprob": -0.25},
                                                {"token": " Hi", "logprob": -1.75}]}]}}]},
    {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop",
                  "stop_reason": None, "token_ids": [2],
                  "logprobs": {"content": [{"token": "", "logprob": -9999.0,
                                            "top_logprobs": []}]}}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
]  # fmt: skip


def test_vllm_chunks_carry_token_ids_logprobs_and_the_usage() -> None:
    deltas = [read_chunk(chunk, SERVER) for chunk in VLLM_CHUNKS]
    assert deltas[0].empty  # the role-only first chunk
    hello = deltas[1]
    assert (hello.text, hello.token_ids, hello.logprobs) == (" Hello", (9906,), (-0.25,))
    top = (TopLogprob(0, " Hello", -0.25), TopLogprob(0, " Hi", -1.75))
    assert hello.entries == (TokenLogprob(" Hello", -0.25, top),)
    assert deltas[2].finish_reason == "stop" and deltas[2].token_ids == (2,)
    assert deltas[3] == StreamDelta(usage=ServerUsage(3, 2)) and deltas[3].empty


def test_a_gateway_chunk_without_token_ids_is_text_with_logprobs() -> None:
    chunk = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": " order days"}, "finish_reason": None,
                     "logprobs": {"content": [{"token": " order", "logprob": -0.01},
                                              {"token": " days", "logprob": -0.01}]}}],
        "usage": None,
    }  # fmt: skip
    delta = read_chunk(chunk, SERVER)
    assert delta.text == " order days" and delta.token_ids == () and delta.usage is None
    assert delta.logprobs == (-0.01, -0.01)


@pytest.mark.parametrize(
    ("reason", "finish"),
    [(None, None), ("length", "length"), ("stop", "stop"), ("eos", "stop"),
     ("content_filter", "stop")],
)  # fmt: skip
def test_finish_reasons_become_the_tiers(reason: str | None, finish: str | None) -> None:
    chunk = {"choices": [{"delta": {"content": "x"}, "finish_reason": reason}]}
    assert read_chunk(chunk, SERVER).finish_reason == finish


def test_an_aborted_answer_is_unavailable() -> None:
    with pytest.raises(Unavailable, match="aborted"):
        read_chunk({"choices": [{"delta": {}, "finish_reason": "abort"}]}, SERVER)


@pytest.mark.parametrize(
    "data",
    ["not json", "[1, 2]", '{"choices": [{"delta": {"content": 5}}]}',
     '{"choices": [{"delta": {}, "token_ids": ["x"]}]}',
     '{"choices": [{"delta": {}, "logprobs": {"content": [{"logprob": -1}]}}]}'],
)  # fmt: skip
def test_a_malformed_event_is_unavailable_saying_so(data: str) -> None:
    with pytest.raises(MalformedAnswer):
        read_chunk(event_payload(data), SERVER)


@pytest.mark.parametrize(
    ("payload", "kind"),
    [({"error": {"message": "over its limit", "type": "rate_limit_error",
                 "code": "resource_exhausted"}}, QueueRefused),
     ({"error": {"message": "the tier broke", "type": "server_error", "code": "unavailable"}},
      Unavailable),
     ({"object": "error", "message": "engine dead", "type": "InternalServerError", "code": 500},
      Unavailable)],
)  # fmt: skip
def test_an_error_event_mid_stream_breaks_the_answer(
    payload: dict[str, object], kind: type
) -> None:
    with pytest.raises(kind) as raised:
        read_chunk(payload, SERVER)
    assert isinstance(stream_error(payload, SERVER), kind)
    assert SERVER in str(raised.value)


def _body(message: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": "x", "param": param}}).encode()


def test_429_is_resource_exhausted_with_its_retry_after() -> None:
    error = http_error(429, _body("over its limit"), "7", SERVER)
    assert isinstance(error, QueueRefused) and error.status == "RESOURCE_EXHAUSTED"
    assert error.retry_after_s == 7.0 and "over its limit" in str(error)
    assert http_error(429, b"", None, SERVER).retry_after_s == DEFAULT_RETRY_S  # type: ignore[attr-defined]


def test_400_is_invalid_argument_naming_the_field() -> None:
    error = http_error(400, _body("must be >= 1", "max_tokens"), None, SERVER)
    assert isinstance(error, InvalidArgument)
    assert str(error).startswith("max_tokens: must be >= 1")
    named = http_error(400, _body("max_tokens: must be >= 1", "max_tokens"), None, SERVER)
    assert str(named).startswith("max_tokens: must be >= 1 (")  # named once
    vllm = b'{"object": "error", "message": "context is 2048 tokens", "code": 400}'
    assert "context is 2048 tokens" in str(http_error(400, vllm, None, SERVER))
    assert isinstance(http_error(422, b'{"detail": "bad"}', None, SERVER), InvalidArgument)


@pytest.mark.parametrize(("status", "says"), [(401, "API key"), (403, "API key"),
                                              (404, "does not serve"), (500, "failed"),
                                              (503, "failed")])  # fmt: skip
def test_other_failures_are_unavailable(status: int, says: str) -> None:
    error = http_error(status, b"<html>Bad Gateway</html>", None, SERVER)
    assert isinstance(error, Unavailable) and says in str(error) and f"HTTP {status}" in str(error)


def test_error_messages_of_each_shape() -> None:
    assert error_message(_body("m", "p")) == ("m", "p")
    assert error_message(b'{"detail": "d"}') == ("d", None)
    assert error_message(b'{"error": "plain"}') == ("plain", None)
    assert error_message(b"Bad Gateway") == ("Bad Gateway", None)
    assert error_message(b"") == ("no message", None)


def test_retry_after_in_seconds_or_as_a_date() -> None:
    now = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s("3", now) == 3.0
    assert retry_after_s("Fri, 04 Dec 2026 12:00:30 GMT", now) == 30.0
    assert retry_after_s("Fri, 04 Dec 2026 11:00:00 GMT", now) == 0.0  # past: at once
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("inf") is None and retry_after_s("-4") == 0.0


def test_served_models_and_the_one_a_tier_picks() -> None:
    vllm = {"object": "list", "data": [{"id": "qwen", "object": "model", "max_model_len": 4096},
                                       {"id": "lora-a", "object": "model"}]}  # fmt: skip
    models = served_models(vllm, SERVER)
    assert models == [ServedModel("qwen", 4096), ServedModel("lora-a")]
    assert pick_model(models, "", SERVER).id == "qwen"
    assert pick_model(models, "lora-a", SERVER).id == "lora-a"
    with pytest.raises(ConfigError, match=r"remote_model: 'other' is not served.*qwen, lora-a"):
        pick_model(models, "other", SERVER)
    with pytest.raises(Unavailable):
        pick_model([], "", SERVER)
    with pytest.raises(MalformedAnswer):
        served_models({"models": []}, SERVER)


def test_detokenized_text_of_vllm_and_llama_cpp() -> None:
    assert detokenized_text({"prompt": " It ships"}, SERVER) == " It ships"
    assert detokenized_text({"content": "x"}, SERVER) == "x"
    with pytest.raises(MalformedAnswer):
        detokenized_text({"tokens": [1]}, SERVER)


def test_a_logprob_past_zero_is_cut_and_nan_refused() -> None:
    chunk = {"choices": [{"delta": {"content": "a"},
                          "logprobs": {"content": [{"token": "a", "logprob": 1e-7}]}}]}  # fmt: skip
    assert read_chunk(chunk, SERVER).logprobs == (0.0,)
    chunk["choices"][0]["logprobs"]["content"][0]["logprob"] = math.nan  # type: ignore[index]
    with pytest.raises(MalformedAnswer):
        read_chunk(chunk, SERVER)
