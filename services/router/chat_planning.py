"""What runs for one chat, decided from the request, the router's config and the tiers' live
state: the request checked field by field (ChatRequestFields), then the plan (plan_chat): mode,
tiers (pinned; draft and refine; or the policy's choice with load- and health-aware fallback),
where a failed call moves on, and the RouteDecision the client sees.

Pure functions over plain data: no calls, no clock, no policy of its own (the policy's choice
comes in as an argument). Raises InvalidArgument for a bad request, TiersFull when every tier
that could take the chat reports itself full, TiersLoading when none can take it yet.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import cast

from tiermesh.client.requests import MODE_NAMES, PRIORITY_NAMES
from tiermesh.client.requests import PRIORITIES as PRIORITY_VALUES
from tiermesh.v1 import common_pb2, router_pb2, tier_pb2

from services.common.config import GATES, RouterConfig
from services.common.errors import InvalidArgument
from services.common.tiers import check_tier
from services.common.validation import (
    check_max_tokens,
    check_request_id,
    check_sampling,
    conversation,
)
from services.router.chat_plan import ChatPlan
from services.router.escalation import Escalation
from services.router.fallback import (
    Down,
    Loading,
    choose_with_fallback,
    fallback_chain,
    fallback_order,
)
from services.router.overload import (
    INTERACTIVE,
    Keep,
    Step,
    max_tokens_under_load,
    step_for_load,
    under_load,
)
from services.router.policy import Loads, RouteChoice, RoutingInput

# request mode -> the mode the router runs: the client's named modes, unset meaning routed
MODES: dict[int, router_pb2.Mode] = {router_pb2.MODE_UNSPECIFIED: router_pb2.MODE_ROUTED}
MODES |= {mode: cast("router_pb2.Mode", mode) for mode in MODE_NAMES}
# request priority -> the priority the router runs it at, unset meaning interactive
PRIORITIES: dict[int, str] = {router_pb2.PRIORITY_UNSPECIFIED: INTERACTIVE} | PRIORITY_NAMES


@dataclass(frozen=True)
class ChatRequestFields:
    """A ChatRequest's fields, checked, with the router's defaults filled in."""

    request_id: str
    mode: router_pb2.Mode
    turns: tuple[tuple[str, str], ...]
    max_tokens: int
    max_tokens_set: bool  # False: the default, lowered by each tier to what its context holds
    sampling: common_pb2.SamplingParams
    gate: str
    priority: str  # "interactive", "batch" or "critical"
    tier: str  # PINNED: the tier asked for
    draft_tier: str  # PROGRESSIVE: the tiers asked for (defaults filled in)
    refine_tier: str

    @property
    def routing_input(self) -> RoutingInput:
        """What a routing policy reads of the chat."""
        return RoutingInput(self.turns, self.max_tokens)


def check_chat_request(request: router_pb2.ChatRequest, config: RouterConfig) -> ChatRequestFields:
    """The request's fields, or InvalidArgument naming the first bad one."""
    check_request_id(request.request_id)
    if request.mode not in MODES:
        expected = [router_pb2.Mode.Name(m) for m in MODE_NAMES]
        raise InvalidArgument(
            f"mode: unknown mode {request.mode} "
            f"(expected {', '.join(expected[:-1])} or {expected[-1]})"
        )
    turns = conversation(list(request.messages), request.prompt, config.max_prompt_chars)
    max_tokens = config.default_max_tokens
    if request.HasField("max_tokens"):
        max_tokens = check_max_tokens(request.max_tokens, config.max_tokens)
    check_sampling(request.sampling)
    gate = request.progressive_gate or config.progressive_gate
    if gate not in GATES:
        raise InvalidArgument(f"progressive_gate: {gate!r} is not one of {', '.join(GATES)}")
    if request.priority not in PRIORITIES:
        names = ", ".join(router_pb2.Priority.Name(p) for p in PRIORITIES)
        raise InvalidArgument(f"priority: unknown priority {request.priority} (expected {names})")
    return ChatRequestFields(
        request_id=request.request_id or uuid.uuid4().hex,
        mode=MODES[request.mode],
        turns=tuple(turns),
        max_tokens=max_tokens,
        max_tokens_set=request.HasField("max_tokens"),
        sampling=request.sampling,
        gate=gate,
        priority=PRIORITIES[request.priority],
        tier=request.tier,
        draft_tier=request.draft_tier or config.draft_tier,
        refine_tier=request.refine_tier or config.refine_tier,
    )


def plan_chat(
    chat: ChatRequestFields,
    config: RouterConfig,
    loads: Loads,
    down: Down,
    choice: RouteChoice | None = None,
    loading: Loading | None = None,
    time_remaining_s: float | None = None,
    over_share: bool = False,
) -> ChatPlan:
    """The complete plan of a checked chat. `choice` is the routing policy's for this chat:
    required for ROUTED (it picks the tier); for PINNED and PROGRESSIVE, whose tiers do not
    depend on it, it may be None (RouteDecision.complexity 0: the caller reports it later).
    Given `loading`, a chat no tier can take yet while one is loading raises TiersLoading (the
    caller may wait and plan again); without, it goes to its tier all the same. A ROUTED chat
    whose tier cannot start it in time steps down by its priority (overload.py); its budget is
    what is left of its deadline (`time_remaining_s`), and at most the config's interactive
    budget for an interactive chat; `over_share`: its API key holds more than its fair part
    (fair_share.py), so under load it is refused rather than stepped down."""
    note = ""
    stepped_from = ""
    if chat.mode == router_pb2.MODE_PINNED:
        tiers, fallbacks, policy, reason = _pinned(chat, config, loads, down, loading)
    elif chat.mode == router_pb2.MODE_PROGRESSIVE and chat.gate == ESCALATE:
        if choice is None:
            raise ValueError("a PROGRESSIVE chat with gate escalate is planned with the choice")
        tiers, fallbacks, policy, reason = _escalating(
            escalation_of(config), choice.complexity, config, loads, down, loading
        )
    elif chat.mode == router_pb2.MODE_PROGRESSIVE:
        tiers, fallbacks, policy, reason = _progressive(chat, config, loads, down, loading)
    else:
        if choice is None:
            raise ValueError("a ROUTED chat is planned with the policy's choice")
        budget_ms = _budget_ms(chat.priority, config, time_remaining_s)
        step = step_for_load(choice.tier, loads, config, down, chat.priority, budget_ms, over_share)
        pressed = isinstance(step, Step) or under_load(choice.tier, loads, config, down, budget_ms)
        lowered = max_tokens_under_load(
            chat.max_tokens, chat.max_tokens_set, chat.priority, pressed, config
        )
        lowered_note = ""
        if lowered < chat.max_tokens:
            chat = replace(chat, max_tokens=lowered)
            lowered_note = f"max_tokens lowered to {lowered} under load"
        if isinstance(step, Keep):  # on its tier even when it reads full (a critical chat)
            tier, why = step.tier, ""
            fallbacks = fallback_order(tier, loads, config, down)
        elif step is not None:
            tier, note, stepped_from = step.tier, step.reason, step.stepped_from
            fallbacks = fallback_order(tier, loads, config, down)
            why = f"; {step.reason} → fallback {tier}"
        else:
            tier, why, fallbacks = choose_with_fallback(choice.tier, loads, config, down, loading)
        tiers = (_configured(tier, "tier", config),)
        policy, reason = choice.policy, choice.reason + why
        if lowered_note:
            note = f"{note}; {lowered_note}" if note else lowered_note
            reason += f"; {lowered_note}"
    routed = chat.mode == router_pb2.MODE_ROUTED
    escalating = chat.mode == router_pb2.MODE_PROGRESSIVE and chat.gate == ESCALATE
    generate = tier_pb2.GenerateRequest(
        max_tokens=chat.max_tokens,
        fit_max_tokens_to_context=not chat.max_tokens_set,
        # the tier's wait queue orders by the chat's priority (same values)
        queue_priority=cast("tier_pb2.QueuePriority", PRIORITY_VALUES[chat.priority]),
        sampling=chat.sampling,
        messages=[{"role": role, "content": content} for role, content in chat.turns],
    )
    decision = router_pb2.RouteDecision(
        request_id=chat.request_id,
        mode=chat.mode,
        tiers=tiers,
        complexity=choice.complexity if choice is not None else 0.0,
        policy=policy,
        reason=reason,
        stepped_from=stepped_from,
        priority=cast("router_pb2.Priority", PRIORITY_VALUES[chat.priority]),
    )
    return ChatPlan(
        chat.request_id,
        chat.mode,
        tiers,
        generate,
        decision,
        fallback_tier=fallbacks[0] if fallbacks and routed else None,
        first_token_timeout_s=config.first_token_timeout_ms / 1000,
        fallbacks=fallbacks,
        retry_first_token=routed,
        gate=chat.gate,
        min_confidence=config.min_draft_confidence,
        escalation=escalation_of(config) if escalating else None,
        choice=choice,
        note=note,
        priority=chat.priority,
    )


def _budget_ms(priority: str, config: RouterConfig, time_remaining_s: float | None) -> float | None:
    """How long a chat may wait for its tier to start it: what its deadline leaves, and for an
    interactive chat at most the configured budget."""
    budget = None if time_remaining_s is None else time_remaining_s * 1000
    if priority == INTERACTIVE:
        limit = config.interactive_wait_budget_ms
        budget = limit if budget is None else min(budget, limit)
    return budget


Tiers = tuple[tuple[str, ...], tuple[str, ...], str, str]  # tiers, fallbacks, policy, reason


def _pinned(
    chat: ChatRequestFields, config: RouterConfig, loads: Loads, down: Down, loading: Loading | None
) -> Tiers:
    if not chat.tier:
        raise InvalidArgument("tier: required with MODE_PINNED")
    tier = _configured(chat.tier, "tier", config)
    choose_with_fallback(tier, loads, config, down, loading)  # TiersFull if every tier is full
    # a pinned call's failover follows its own tier's chain, whichever tier could take it
    return (tier,), fallback_order(tier, loads, config, down), "pinned", f"pinned to {tier}"


def _progressive(
    chat: ChatRequestFields, config: RouterConfig, loads: Loads, down: Down, loading: Loading | None
) -> Tiers:
    """(draft, refine), or (refine,) alone when the draft tier is down; a refine tier that is
    down gives way to the first able tier of its fallback chain. The reason says so."""
    draft = _configured(chat.draft_tier, "draft_tier", config)
    refine = _configured(chat.refine_tier, "refine_tier", config)
    if draft == refine:
        raise InvalidArgument(f"refine_tier: must differ from draft_tier ({draft})")
    notes = []
    if (why := down(refine)) is not None:
        chain = fallback_chain(refine, config)
        backup = next((t for t in chain if t != draft and down(t) is None), None)
        if backup is not None:
            notes.append(f"{why} → refined by {backup}")
            refine = backup
    tiers: tuple[str, ...] = (draft, refine)
    if (why := down(draft)) is not None:
        notes.append(f"{why}: no draft")
        tiers = (refine,)
    reason = f"draft from {draft}, refined by {refine}"
    if chat.gate != "always":
        reason += f"; gate {chat.gate} at draft confidence {config.min_draft_confidence:.2f}"
    reason += "".join(f"; {note}" for note in notes)
    # TiersFull if every tier is full; a refine tier still loading holds the chat back only
    # when there is no draft to answer at once (the refinement is then tried all the same)
    choose_with_fallback(refine, loads, config, down, loading if len(tiers) == 1 else None)
    then = fallback_order(refine, loads, config, down)
    # with a draft to keep, a refinement moves on only to tiers able to take it
    fallbacks = then if len(tiers) == 1 else tuple(t for t in then if down(t) is None)
    return tiers, fallbacks, "progressive", reason


ESCALATE = "escalate"


def escalation_of(config: RouterConfig) -> Escalation:
    """The escalate gate's thresholds from the router's config."""
    return Escalation(
        config.escalate_small_below,
        config.escalate_medium_below,
        config.escalate_small_confidence,
        config.escalate_medium_confidence,
    )


def _escalating(
    escalation: Escalation,
    score: float,
    config: RouterConfig,
    loads: Loads,
    down: Down,
    loading: Loading | None,
) -> Tiers:
    """The escalate gate's chain: the score's first tier up to large, the configured tiers that
    are up (a tier down is passed over; none up: the first tier's fallback answers alone)."""
    chain = [t for t in escalation.chain(score) if t in config.tiers]
    able = tuple(t for t in chain if down(t) is None)
    notes = [f"{gone}: passed over" for t in chain if (gone := down(t)) is not None]
    first = able[0] if able else (chain[0] if chain else config.draft_tier)
    tier, why, _ = choose_with_fallback(first, loads, config, down, loading)
    tiers = able or (tier,)
    threshold = escalation.threshold(tiers[0])
    reason = f"escalate: {tiers[0]} first (complexity {score:.2f})"
    if len(tiers) > 1 and threshold is not None:
        reason += f"; an answer under {threshold:.3f} confidence goes on to {tiers[1]}"
    reason += "".join(f"; {note}" for note in notes) + (why if not able else "")
    then = fallback_order(tiers[-1], loads, config, down)
    return tiers, tuple(t for t in then if t not in tiers), "progressive", reason


def _configured(tier: str, field: str, config: RouterConfig) -> str:
    check_tier(tier, field)
    if tier not in config.tiers:
        raise InvalidArgument(f"{field}: tier {tier!r} is not configured on this router")
    return tier
