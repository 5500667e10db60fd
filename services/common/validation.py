"""Checks of request fields shared by the router and the tiers; each error names its field."""

from __future__ import annotations

from tiermesh.v1 import common_pb2

from services.common.errors import InvalidArgument

MAX_REQUEST_ID_CHARS = 128
ROLES = ("system", "user", "assistant")
# Sizes and counts a request may have wherever it arrives (a tier can be called directly, so
# it checks them too): they bound the work done before the tokenizer's own limits apply.
MAX_MESSAGES = 256  # messages in one request
MAX_MESSAGE_CHARS = 32_000  # one message's content, or a single prompt
MAX_TIER_PROMPT_CHARS = 100_000  # all messages together, at a tier (the router has its own)


# Sampling ranges, the same at the router and at the tiers. A temperature below the minimum
# divides logits into overflow (1e-40 turns them to inf), so it is refused, not clamped.
MIN_TEMPERATURE = 0.05  # the smallest sampled temperature; 0 itself means greedy
MAX_TEMPERATURE = 2.0
MAX_TOP_K = 100_000  # past any vocabulary; bounds the top-k work
MAX_STOP_SEQUENCES = 4  # as OpenAI's API allows
MAX_STOP_CHARS = 128  # one stop sequence; bounds the text a tier holds back
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's limit)


def check_sampling(params: common_pb2.SamplingParams) -> None:
    """temperature: 0 (greedy) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]; top_p: 0 (unset, = 1)
    or in (0, 1]; top_k: 0 (off) up to MAX_TOP_K; stop: at most MAX_STOP_SEQUENCES strings of
    1 to MAX_STOP_CHARS characters; top_logprobs: unset or up to MAX_TOP_LOGPROBS. NaN and
    infinities are out of every range."""
    temperature, top_p = params.temperature, params.top_p
    if temperature != 0.0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise InvalidArgument(
            f"sampling.temperature: must be 0 (greedy) or in [{MIN_TEMPERATURE}, "
            f"{MAX_TEMPERATURE}], got {temperature}"
        )
    if not 0.0 <= top_p <= 1.0:
        raise InvalidArgument(f"sampling.top_p: must be in (0, 1] (0 = unset), got {top_p}")
    if params.top_k > MAX_TOP_K:
        raise InvalidArgument(f"sampling.top_k: must be in [0, {MAX_TOP_K}], got {params.top_k}")
    if len(params.stop) > MAX_STOP_SEQUENCES:
        raise InvalidArgument(
            f"sampling.stop: at most {MAX_STOP_SEQUENCES} stop sequences, got {len(params.stop)}"
        )
    for i, stop in enumerate(params.stop):
        if not 1 <= len(stop) <= MAX_STOP_CHARS:
            raise InvalidArgument(
                f"sampling.stop[{i}]: must be 1 to {MAX_STOP_CHARS} characters, got {len(stop)}"
            )
    if params.HasField("top_logprobs") and params.top_logprobs > MAX_TOP_LOGPROBS:
        raise InvalidArgument(
            f"sampling.top_logprobs: must be in [0, {MAX_TOP_LOGPROBS}], got {params.top_logprobs}"
        )


def check_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(f"request_id: longer than {MAX_REQUEST_ID_CHARS} characters")


def check_max_tokens(value: int, limit: int) -> int:
    if not 1 <= value <= limit:
        raise InvalidArgument(f"max_tokens: must be in [1, {limit}], got {value}")
    return value


def conversation(
    messages: list[common_pb2.ChatMessage], prompt: str, max_chars: int
) -> list[tuple[str, str]]:
    """The (role, content) turns of a request given as messages or as a single prompt.

    Refused, naming the field: no messages and no prompt; a prompt that is only whitespace;
    more than MAX_MESSAGES messages; a role not in ROLES; a message or prompt longer than
    MAX_MESSAGE_CHARS; an empty last message (what the model answers); all of it together
    longer than `max_chars`."""
    if not messages:
        if not prompt:
            raise InvalidArgument("messages: no messages and no prompt given")
        if not prompt.strip():
            raise InvalidArgument("prompt: must not be empty or only whitespace")
        _check_size("prompt", prompt)
        turns = [("user", prompt)]
    else:
        if len(messages) > MAX_MESSAGES:
            raise InvalidArgument(
                f"messages: {len(messages)} messages exceeds the limit of {MAX_MESSAGES}"
            )
        turns = []
        for i, message in enumerate(messages):
            if message.role not in ROLES:
                raise InvalidArgument(
                    f"messages[{i}].role: {message.role!r} is not one of {', '.join(ROLES)}"
                )
            _check_size(f"messages[{i}].content", message.content)
            turns.append((message.role, message.content))
        if not turns[-1][1].strip():
            raise InvalidArgument(f"messages[{len(turns) - 1}].content: must not be empty")
    chars = sum(len(content) for _, content in turns)
    if chars > max_chars:
        raise InvalidArgument(f"prompt: {chars} characters exceeds the limit of {max_chars}")
    return turns


def _check_size(field: str, text: str) -> None:
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidArgument(
            f"{field}: {len(text)} characters exceeds the limit of {MAX_MESSAGE_CHARS}"
        )
