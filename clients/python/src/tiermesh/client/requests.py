"""Builds a router ChatRequest from keyword options, and the one name table of chat modes and
of priorities."""

from __future__ import annotations

from collections.abc import Sequence

from tiermesh.v1 import common_pb2, router_pb2

MODES: dict[str, int] = {
    "routed": router_pb2.MODE_ROUTED,
    "progressive": router_pb2.MODE_PROGRESSIVE,
    "pinned": router_pb2.MODE_PINNED,
}
MODE_NAMES: dict[int, str] = {value: name for name, value in MODES.items()}
PRIORITIES: dict[str, int] = {
    "interactive": router_pb2.PRIORITY_INTERACTIVE,
    "batch": router_pb2.PRIORITY_BATCH,
    "critical": router_pb2.PRIORITY_CRITICAL,
}
PRIORITY_NAMES: dict[int, str] = {value: name for name, value in PRIORITIES.items()}


def build_request(
    prompt: str | None = None,
    *,
    messages: list[tuple[str, str]] | None = None,
    mode: str = "routed",
    tier: str = "",
    max_tokens: int | None = None,
    request_id: str = "",
    temperature: float = 0.0,
    stop: Sequence[str] = (),
    top_logprobs: int | None = None,
    draft_tier: str = "",
    refine_tier: str = "",
    progressive_gate: str = "",
    priority: str = "interactive",
) -> router_pb2.ChatRequest:
    """A ChatRequest: a single `prompt` or `messages` as (role, content) pairs; `mode` one of
    MODES; `tier` for pinned mode; `max_tokens` None for the router's default; `temperature`
    0 for greedy decoding; `stop` up to 4 stop sequences (each answer ends just before the
    first it would contain); `top_logprobs` (0-20) for every token's text and log-probability
    with that many of the most likely tokens at each step, on each DeltaEvent
    (`token_logprobs`); `progressive_gate` always, race, cascade or escalate (empty: the
    router's); `priority` interactive, batch or critical (who goes first under overload). The
    router validates the rest and answers INVALID_ARGUMENT."""
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if priority not in PRIORITIES:
        raise ValueError(f"priority: {priority!r} is not one of {', '.join(PRIORITIES)}")
    if isinstance(stop, str):  # one stop sequence, not one per character
        stop = [stop]
    request = router_pb2.ChatRequest(
        request_id=request_id,
        prompt=prompt or "",
        messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in (messages or [])],
        mode=MODES[mode],  # type: ignore[arg-type]
        tier=tier,
        draft_tier=draft_tier,
        refine_tier=refine_tier,
        progressive_gate=progressive_gate,
        priority=PRIORITIES[priority],  # type: ignore[arg-type]
        sampling=common_pb2.SamplingParams(temperature=temperature, stop=list(stop)),
    )
    if max_tokens is not None:
        request.max_tokens = max_tokens
    if top_logprobs is not None:
        if top_logprobs < 0:
            raise ValueError(f"top_logprobs: must be 0 or more, got {top_logprobs}")
        request.sampling.top_logprobs = top_logprobs
    return request
