"""A remote server's refusal of a chat its model's context cannot hold, read from each server's
words (vLLM, OpenAI, SGLang, TGI, llama.cpp, tiermesh's gateway), and what the tier makes of it:
a prompt too long on its own is PROMPT_TOO_LONG (the router moves the chat on), a max_tokens too
large for the room left is INVALID_ARGUMENT that a request fitting its max_tokens asks again."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument, PromptTooLong
from services.tier.context_overflow import ContextOverflow, context_overflow
from services.tier.openai_wire import AnswerOverContext, http_error

SERVER = "http://10.0.0.7:8000/v1"

# (server, its message, the overflow read: (prompt tokens, context tokens), or None)
MESSAGES = [
    (
        "vLLM, prompt alone",
        "This model's maximum context length is 2048 tokens. However, your prompt contains 2100 "
        "input tokens, which exceeds this limit even without any output tokens. Please reduce "
        "the length of the input prompt.",
        (2100, 2048),
    ),
    (
        "vLLM, truncated count",
        "This model's maximum context length is 2048 tokens. However, your prompt contains at "
        "least 2049 input tokens, which exceeds this limit even without any output tokens.",
        (2049, 2048),
    ),
    (
        "vLLM, older check",
        "Input length (4,100) exceeds model's maximum context length (4,096).",
        (4100, 4096),
    ),
    (
        "OpenAI, with the answer",
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
        "(8800 in the messages, 200 in the completion). Please reduce the length of the "
        "messages or completion.",
        (8800, 8192),
    ),
    (
        "OpenAI, max_tokens the part too large",
        "This model's maximum context length is 4097 tokens. However, you requested 4200 tokens "
        "(4000 in the messages, 200 in the completion).",
        (4000, 4097),
    ),
    (
        "OpenAI, messages alone",
        "This model's maximum context length is 4097 tokens. However, your messages resulted in "
        "5000 tokens. Please reduce the length of the messages.",
        (5000, 4097),
    ),
    (
        "SGLang, prompt alone",
        "The input (3000 tokens) is longer than the model's context length (2048 tokens).",
        (3000, 2048),
    ),
    (
        "SGLang, with the answer",
        "Requested token count exceeds the model's maximum context length of 2048 tokens. You "
        "requested a total of 2300 tokens: 2000 tokens from the input messages and 300 tokens "
        "for the completion.",
        (2000, 2048),
    ),
    (
        "TGI",
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: "
        "4000 `inputs` tokens and 200 `max_new_tokens`",
        (4000, 4096),
    ),
    (
        "tiermesh, one tier",
        "prompt: 300 tokens exceeds this tier's limit of 255 tokens",
        (300, 256),
    ),
    (
        "tiermesh, every tier",
        "prompt: 900 tokens exceeds the largest context of the tiers that could take it (511 "
        "tokens)",
        (900, 512),
    ),
    (
        "tiermesh, max_tokens",
        "max_tokens: prompt of 50 tokens + max_tokens 400 exceeds the model's context of 256 "
        "tokens",
        (50, 256),
    ),
    ("about something else", "max_tokens: must be >= 1", None),
    ("a number of tokens, no context", "top_logprobs: at most 20 tokens", None),
]


@pytest.mark.parametrize(("server", "message", "read"), MESSAGES, ids=[m[0] for m in MESSAGES])
def test_each_servers_words(server: str, message: str, read: tuple[int, int] | None) -> None:
    overflow = context_overflow(message)
    assert overflow == (None if read is None else ContextOverflow(*read))


def test_llama_cpp_says_it_in_fields() -> None:
    error = {
        "code": 400,
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 4096,
        "message": "the request exceeds the available context size",
    }
    assert context_overflow(error["message"], error) == ContextOverflow(5000, 4096)


@pytest.mark.parametrize(
    ("overflow", "room"),
    [
        (ContextOverflow(2100, 2048), 0),
        (ContextOverflow(2048, 2048), 0),
        (ContextOverflow(2000, 2048), 48),
    ],
)
def test_the_room_a_prompt_leaves(overflow: ContextOverflow, room: int) -> None:
    assert overflow.room == room


def _body(message: str, **error: object) -> bytes:
    return json.dumps({"error": {"message": message, "type": "BadRequestError", **error}}).encode()


def test_a_prompt_no_context_holds_is_prompt_too_long() -> None:
    error = http_error(400, _body(MESSAGES[0][1], param="input_tokens"), None, SERVER)
    assert isinstance(error, PromptTooLong)
    assert error.metadata == {"prompt_tokens": "2100", "limit_tokens": "2047"}
    llama = _body(
        "the request exceeds the available context size", n_prompt_tokens=5000, n_ctx=4096
    )
    assert isinstance(http_error(400, llama, None, SERVER), PromptTooLong)


def test_a_max_tokens_past_the_room_left_is_an_answer_over_context() -> None:
    error = http_error(400, _body(MESSAGES[4][1]), None, SERVER)
    assert isinstance(error, AnswerOverContext) and isinstance(error, InvalidArgument)
    assert error.overflow.room == 97 and "4097 tokens" in str(error) and SERVER in str(error)


def test_other_refusals_stay_invalid_argument() -> None:
    error = http_error(400, _body("must be >= 1", param="max_tokens"), None, SERVER)
    assert type(error) is InvalidArgument and str(error).startswith("max_tokens: must be >= 1")
