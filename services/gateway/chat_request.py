"""Reads an OpenAI chat-completions request body into a router ChatRequest, rejecting what
tiermesh cannot honour with a 400 that names the field.

Pure: no I/O. Knows the model names (`tiermesh-routed`, `tiermesh-progressive`, one per tier) and
OpenAI's request fields; nothing of HTTP or gRPC calls.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tiermesh.client.requests import MODES
from tiermesh.v1 import common_pb2, router_pb2

from services.common.errors import InvalidArgument
from services.common.tiers import TIER_NAMES
from services.common.validation import MAX_TOP_LOGPROBS, check_sampling
from services.gateway.errors import GatewayError, bad_request

MODEL_PREFIX = "tiermesh-"
# model id -> (mode, pinned tier)
MODELS: dict[str, tuple[str, str]] = {
    f"{MODEL_PREFIX}routed": ("routed", ""),
    f"{MODEL_PREFIX}progressive": ("progressive", ""),
    **{f"{MODEL_PREFIX}{tier}": ("pinned", tier) for tier in TIER_NAMES},
}
# OpenAI's service_tier -> (the router's priority, the tier echoed back as served)
SERVICE_TIERS: dict[str, tuple[router_pb2.Priority, str]] = {
    "auto": (router_pb2.PRIORITY_INTERACTIVE, "default"),
    "default": (router_pb2.PRIORITY_INTERACTIVE, "default"),
    "flex": (router_pb2.PRIORITY_BATCH, "flex"),
    "priority": (router_pb2.PRIORITY_CRITICAL, "priority"),
}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_SEED = 2**64 - 1
# fields accepted only at their neutral value: (name, neutral values)
NEUTRAL_ONLY: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("presence_penalty", (None, 0, 0.0)),
    ("frequency_penalty", (None, 0, 0.0)),
    ("logit_bias", (None, {})),
    ("tools", (None, [])),
    ("functions", (None, [])),
    ("tool_choice", (None, "none")),
    ("function_call", (None, "none")),
    ("response_format", (None, {"type": "text"})),
)


@dataclass(frozen=True)
class ChatCompletionRequest:
    """What the gateway needs to run one chat completion."""

    model: str
    mode: str
    request: router_pb2.ChatRequest
    stream: bool
    include_usage: bool
    revisions: bool  # the client opted in to every revision (the `tiermesh` object)
    user: str
    logprobs: bool = False  # each token's log-probability (and top_logprobs) in the choices
    n: int = 1  # choices: one router chat each
    service_tier: str = "default"  # echoed in the response: default, flex or priority

    def choice_request(self, index: int) -> router_pb2.ChatRequest:
        """The router request of choice `index`: the request itself for the first; for the
        others with a `seed`, the seed plus the index (so sampled choices differ, and each is
        as repeatable as the first; past 2**64 - 1 it wraps to 1, as 0 means no seed)."""
        seed = self.request.sampling.seed
        if index == 0 or not seed:
            return self.request
        request = router_pb2.ChatRequest()
        request.CopyFrom(self.request)
        request.sampling.seed = (seed - 1 + index) % MAX_SEED + 1
        return request


def parse_chat_request(
    body: Any, *, max_choices: int, revisions_header: bool = False
) -> ChatCompletionRequest:
    """The chat the body asks for, with at most `max_choices` choices (`n`); raises
    GatewayError (400, or 404 for an unknown model)."""
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model", "required (see GET /v1/models)", "missing_required_parameter")
    if model not in MODELS:
        raise GatewayError(
            404,
            f"The model `{model}` does not exist; use one of {', '.join(MODELS)}",
            param="model",
            code="model_not_found",
        )
    mode, tier = MODELS[model]
    for name, neutral in NEUTRAL_ONLY:
        if name in body and body[name] not in neutral:
            raise bad_request(
                name, f"not supported by tiermesh; leave it unset (got {body[name]!r})"
            )
    stream = _bool(body, "stream")
    include_usage = _include_usage(body, stream)
    priority, service_tier = _service_tier(body)
    request = router_pb2.ChatRequest(
        messages=_messages(body.get("messages")),
        mode=MODES[mode],  # type: ignore[arg-type]
        tier=tier,
        sampling=_sampling(body),
        priority=priority,
    )
    max_tokens = _max_tokens(body)
    if max_tokens is not None:
        request.max_tokens = max_tokens
    logprobs = _bool(body, "logprobs")
    top = _top_logprobs(body, logprobs)
    if logprobs:
        request.sampling.top_logprobs = top
    extension = body.get("tiermesh")
    if extension is not None and not isinstance(extension, dict):
        raise bad_request("tiermesh", 'must be an object such as {"revisions": true}')
    revisions = revisions_header or _bool(extension or {}, "revisions", "tiermesh.revisions")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("user", "must be a string")
    return ChatCompletionRequest(
        model,
        mode,
        request,
        stream,
        include_usage,
        revisions,
        user or "",
        logprobs,
        _choices(body, max_choices),
        service_tier,
    )


def _service_tier(body: dict[str, Any]) -> tuple[router_pb2.Priority, str]:
    """OpenAI's `service_tier`: "flex" runs as a batch chat, "priority" as a critical one,
    "auto" and "default" (or none) as interactive; with the tier to echo."""
    value = body.get("service_tier")
    if value is None:
        return SERVICE_TIERS["auto"]
    if value not in SERVICE_TIERS:
        raise bad_request(
            "service_tier", f"must be one of {', '.join(SERVICE_TIERS)}, got {value!r}"
        )
    return SERVICE_TIERS[value]


def _choices(body: dict[str, Any], max_choices: int) -> int:
    """OpenAI's `n`: how many choices, 1 (the default) to `max_choices`."""
    value = body.get("n")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= max_choices:
        raise bad_request("n", f"must be an integer in [1, {max_choices}], got {value!r}")
    return value


def _top_logprobs(body: dict[str, Any], logprobs: bool) -> int:
    """OpenAI's `top_logprobs`: 0 to MAX_TOP_LOGPROBS alternatives per token; more than 0 only
    with `logprobs: true`."""
    value = body.get("top_logprobs")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise bad_request(
            "top_logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}"
        )
    if value and not logprobs:
        raise bad_request("top_logprobs", "needs logprobs: true")
    return value


def _bool(body: dict[str, Any], name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(param or name, f"must be true or false, got {value!r}")
    return value


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options", "only allowed when stream is true")
    if not isinstance(options, dict):
        raise bad_request("stream_options", "must be an object")
    return _bool(options, "include_usage", "stream_options.include_usage")


def checked_messages(value: Any, roles: Collection[str]) -> list[tuple[int, dict[str, Any], str]]:
    """A body's `messages`: a non-empty list of objects whose role is one of `roles`, as
    (index, message, role); else a 400 naming the first that is not."""
    if not isinstance(value, list) or not value:
        raise bad_request("messages", "required: a non-empty list", "missing_required_parameter")
    checked: list[tuple[int, dict[str, Any], str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise bad_request(f"messages[{i}]", "must be an object with role and content")
        role = message.get("role")
        if role not in roles:
            raise bad_request(
                f"messages[{i}].role", f"must be one of {', '.join(roles)}, got {role!r}"
            )
        checked.append((i, message, str(role)))
    return checked


def _messages(value: Any) -> list[common_pb2.ChatMessage]:
    return [
        common_pb2.ChatMessage(role=ROLES[role], content=_content(message.get("content"), i))
        for i, message, role in checked_messages(value, ROLES)
    ]


def _content(value: Any, i: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(f"messages[{i}].content", "only text parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request(f"messages[{i}].content", "a text part needs a text string")
            texts.append(text)
        return "".join(texts)
    raise bad_request(f"messages[{i}].content", "must be a string or a list of text parts")


def number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    """A number in [low, high], or None when absent; else a 400 naming the field."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise bad_request(name, f"must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _sampling(body: dict[str, Any]) -> common_pb2.SamplingParams:
    sampling = common_pb2.SamplingParams()
    temperature = number(body, "temperature", 0.0, 2.0)
    if temperature is not None:
        sampling.temperature = temperature
    top_p = number(body, "top_p", 0.0, 1.0)
    if top_p is not None:
        if top_p == 0.0:
            raise bad_request("top_p", "must be > 0")
        sampling.top_p = top_p
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise bad_request("seed", f"must be an integer in [0, 2**64 - 1], got {seed!r}")
        sampling.seed = seed
    sampling.stop.extend(_stop(body.get("stop")))
    return sampling


def _stop(value: Any) -> list[str]:
    """OpenAI's `stop`: null, one string or a list of them (an empty string is none), within
    the mesh's own limits (services.common.validation.check_sampling)."""
    if value is None or value == "":
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop", f"must be a string or a list of strings, got {value!r}")
    try:
        check_sampling(common_pb2.SamplingParams(stop=stops))
    except InvalidArgument as e:
        raise GatewayError(400, str(e), param="stop", code="invalid_value") from None
    return stops


def _max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**32:
            raise bad_request(name, f"must be an integer >= 1, got {value!r}")
        return value
    return None
