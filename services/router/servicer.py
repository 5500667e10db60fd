"""RouterService over gRPC: validates a chat, plans it (mode, tiers, policy), relays its session's
events to the client and to the chat's observers (telemetry, the routing lessons).

Bounded: past max_inflight chats a new one gets RESOURCE_EXHAUSTED at once. A tier's error is
relayed with the tier's own status code. The first tier call goes out before anything not needed
to start it: a PINNED or PROGRESSIVE chat's tiers do not depend on the routing policy, so its
choice (the complexity RouteDecision reports, what the routing lessons learn from) is computed
while that call is in flight, just before RouteDecision is sent. Knows nothing of how answers
are scored: the comparison the routing lessons use is given to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace
from typing import cast

import grpc
from tiermesh.client.requests import MODE_NAMES
from tiermesh.v1 import router_pb2, router_pb2_grpc, tier_pb2

from services.common.answers import answers_agree
from services.common.config import GATES, RouterConfig
from services.common.errors import InvalidArgument, PermissionDenied, TiermeshError
from services.common.grpc_service import Undecodable
from services.common.status_details import OVERLOAD_RETRY_S, abort_error, abort_with_details
from services.common.tiers import check_tier
from services.common.validation import (
    check_max_tokens,
    check_request_id,
    check_sampling,
    conversation,
)
from services.router.chat_events import ChatObserver
from services.router.chat_outcomes import UpstreamFailed
from services.router.chat_plan import ChatPlan, SessionClock
from services.router.chat_session import ChatSession
from services.router.chat_telemetry import NO_TELEMETRY, chat_telemetry
from services.router.fallback import choose_with_fallback, fallback_chain, fallback_order
from services.router.learning import AnswersAgree, RoutingLessons
from services.router.policy import Loads, RoutingInput, RoutingPolicy
from services.router.tier_calls import TierClient
from services.router.tier_health import TierHealth
from services.security.api_key_auth import current_api_key

log = logging.getLogger(__name__)

# request mode -> the mode the router runs: the client's named modes, unset meaning routed
MODES: dict[int, router_pb2.Mode] = {router_pb2.MODE_UNSPECIFIED: router_pb2.MODE_ROUTED}
MODES |= {mode: cast("router_pb2.Mode", mode) for mode in MODE_NAMES}


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(
        self,
        config: RouterConfig,
        tiers: TierClient,
        policy: RoutingPolicy,
        loads: Loads | None = None,
        answers_agree: AnswersAgree = answers_agree,
        health: TierHealth | None = None,
    ) -> None:
        """`answers_agree` tells whether a draft and its refinement give the same final answer
        (the progressive learning signal); `health` whether a tier may take a call (none: every
        tier may, by its load alone)."""
        self._config = config
        self._tiers = tiers
        self._policy = policy
        self._loads: Loads = loads if loads is not None else dict.fromkeys(config.tiers)
        self._health = health if health is not None else TierHealth()
        self._down = self._health.down
        self._lessons = RoutingLessons(policy, answers_agree)
        self.inflight = 0

    def plan(
        self, request: router_pb2.ChatRequest | Undecodable, route_now: bool = True
    ) -> ChatPlan:
        """Validates the request and decides mode and tiers; raises InvalidArgument. With
        `route_now` False, a mode whose tiers do not depend on the routing policy leaves the
        policy's choice to `routed` (plan.choice None, RouteDecision.complexity 0)."""
        if isinstance(request, Undecodable):
            raise InvalidArgument(request.message)
        config = self._config
        check_request_id(request.request_id)
        if request.mode not in MODES:
            expected = [router_pb2.Mode.Name(m) for m in MODE_NAMES]
            raise InvalidArgument(
                f"mode: unknown mode {request.mode} "
                f"(expected {', '.join(expected[:-1])} or {expected[-1]})"
            )
        mode = MODES[request.mode]
        turns = conversation(list(request.messages), request.prompt, config.max_prompt_chars)
        max_tokens = config.default_max_tokens
        if request.HasField("max_tokens"):
            max_tokens = check_max_tokens(request.max_tokens, config.max_tokens)
        check_sampling(request.sampling)
        request_id = request.request_id or uuid.uuid4().hex
        gate = request.progressive_gate or config.progressive_gate
        if gate not in GATES:
            raise InvalidArgument(f"progressive_gate: {gate!r} is not one of {', '.join(GATES)}")
        choice = None
        if route_now or mode == router_pb2.MODE_ROUTED:
            choice = self._policy.route(RoutingInput(tuple(turns), max_tokens), self._loads)
        complexity = choice.complexity if choice is not None else 0.0
        fallbacks: tuple[str, ...] = ()
        if mode == router_pb2.MODE_PINNED:
            if not request.tier:
                raise InvalidArgument("tier: required with MODE_PINNED")
            tiers: tuple[str, ...] = (self._configured(request.tier, "tier"),)
            policy, reason = "pinned", f"pinned to {request.tier}"
            choose_with_fallback(tiers[0], self._loads, config, self._down)  # TiersFull if all are
            # a pinned call's failover follows its own tier's chain, whichever tier could take it
            fallbacks = fallback_order(tiers[0], self._loads, config, self._down)
        elif mode == router_pb2.MODE_PROGRESSIVE:
            draft = self._configured(request.draft_tier or config.draft_tier, "draft_tier")
            refine = self._configured(request.refine_tier or config.refine_tier, "refine_tier")
            if draft == refine:
                raise InvalidArgument(f"refine_tier: must differ from draft_tier ({draft})")
            tiers, notes = self._progressive_tiers(draft, refine)
            policy, reason = "progressive", f"draft from {draft}, refined by {tiers[-1]}"
            if gate != "always":
                reason += f"; gate {gate} at draft confidence {config.min_draft_confidence:.2f}"
            reason += "".join(f"; {note}" for note in notes)
            choose_with_fallback(tiers[-1], self._loads, config, self._down)  # TiersFull if all are
            then = fallback_order(tiers[-1], self._loads, config, self._down)
            # with a draft to keep, a refinement moves on only to tiers able to take it
            fallbacks = then if len(tiers) == 1 else tuple(t for t in then if not self._down(t))
        else:
            assert choice is not None
            tier, note, fallbacks = choose_with_fallback(
                choice.tier, self._loads, config, self._down
            )
            tiers = (self._configured(tier, "tier"),)
            policy, reason = choice.policy, choice.reason + note
        generate = tier_pb2.GenerateRequest(
            max_tokens=max_tokens,
            sampling=request.sampling,
            messages=[{"role": role, "content": content} for role, content in turns],
        )
        decision = router_pb2.RouteDecision(
            request_id=request_id,
            mode=mode,
            tiers=tiers,
            complexity=complexity,
            policy=policy,
            reason=reason,
        )
        return ChatPlan(
            request_id,
            mode,
            tiers,
            generate,
            decision,
            fallback_tier=fallbacks[0] if fallbacks and mode == router_pb2.MODE_ROUTED else None,
            first_token_timeout_s=config.first_token_timeout_ms / 1000,
            fallbacks=fallbacks,
            retry_first_token=mode == router_pb2.MODE_ROUTED,
            gate=gate,
            min_confidence=config.min_draft_confidence,
            choice=choice,
        )

    def routed(self, plan: ChatPlan, decision: router_pb2.RouteDecision) -> ChatPlan:
        """`plan` with the policy's choice, computed now if `plan` left it for later, and
        `decision` (the RouteDecision about to be sent) given its complexity."""
        if plan.choice is not None:
            return plan
        messages = plan.generate.messages
        turns = tuple((m.role, m.content) for m in messages)
        choice = self._policy.route(RoutingInput(turns, plan.generate.max_tokens), self._loads)
        decision.complexity = choice.complexity
        plan.decision.complexity = choice.complexity
        return replace(plan, choice=choice)

    def _progressive_tiers(self, draft: str, refine: str) -> tuple[tuple[str, ...], list[str]]:
        """(draft, refine), or (refine,) alone when the draft tier is down; a refine tier that
        is down gives way to the first able tier of its fallback chain. With notes saying so."""
        notes = []
        if (why := self._down(refine)) is not None:
            chain = fallback_chain(refine, self._config)
            backup = next((t for t in chain if t != draft and self._down(t) is None), None)
            if backup is not None:
                notes.append(f"{why} → refined by {backup}")
                refine = backup
        if (why := self._down(draft)) is not None:
            notes.append(f"{why}: no draft")
            return (refine,), notes
        return (draft, refine), notes

    def _configured(self, tier: str, field: str) -> str:
        check_tier(tier, field)
        if tier not in self._config.tiers:
            raise InvalidArgument(f"{field}: tier {tier!r} is not configured on this router")
        return tier

    async def Chat(
        self, request: router_pb2.ChatRequest | Undecodable, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.ChatEvent]:
        clock = SessionClock()
        start_ns = time.time_ns()
        telemetry = chat_telemetry(context.invocation_metadata(), start_ns)
        code, message = "OK", ""
        if self.inflight >= self._config.max_inflight:
            code = "RESOURCE_EXHAUSTED"
            message = (
                f"router at capacity: {self.inflight} chats in flight "
                f"(limit {self._config.max_inflight})"
            )
            telemetry.finish(code, message)
            await abort_with_details(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                message,
                reason="ROUTER_AT_CAPACITY",
                retry_after_s=OVERLOAD_RETRY_S,
            )
        self.inflight += 1
        unrouted: ChatPlan | None = None  # planned, RouteDecision not sent yet
        try:
            try:
                plan = self.plan(request, route_now=False)
            except TiermeshError as e:
                code, message = e.status, str(e)
                await abort_error(context, e)
                raise AssertionError("abort raises") from None
            unrouted = plan
            clock.route_ms = clock.ms()
            session = ChatSession(
                plan,
                self._tiers,
                self._config.refine_budget_ms / 1000,
                context.time_remaining(),
                clock,
                call_timeout_s=self._config.tier_call_timeout_s,
                stall_s=self._config.stall_timeout_ms / 1000,
                room=self._health.has_room,
            )
            observers: list[ChatObserver] = [self._health]
            if telemetry is not NO_TELEMETRY:
                observers.append(telemetry)
            try:
                async with aclosing(session.events()) as events:
                    async for event in events:
                        if unrouted is not None and isinstance(event, router_pb2.ChatEvent):
                            unrouted = None  # the session's first ChatEvent: RouteDecision
                            # the first tier call was just made: one turn of the loop lets
                            # grpc send its request before the policy runs and this is written
                            await asyncio.sleep(0)
                            plan = self.routed(plan, event.route)
                            telemetry.route(event.route, plan.generate.max_tokens, start_ns)
                            observers.append(self._lessons.observer(plan, _caller()))
                        for observer in observers:
                            observer.observe(event)
                        if isinstance(event, router_pb2.ChatEvent):
                            yield event
            except UpstreamFailed as e:
                code, message = e.code.name, e.details
                await context.abort(e.code, e.details, trailing_metadata=e.trailing_metadata)
        except (asyncio.CancelledError, GeneratorExit):
            code = "CANCELLED"
            raise
        finally:
            self.inflight -= 1
            if unrouted is not None:  # stopped before RouteDecision: the plan as it is
                telemetry.route(unrouted.decision, unrouted.generate.max_tokens, start_ns)
            telemetry.finish(code, message)

    async def Feedback(
        self, request: router_pb2.FeedbackRequest | Undecodable, context: grpc.aio.ServicerContext
    ) -> router_pb2.FeedbackResponse:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            raise AssertionError("abort raises")
        if not 0.0 <= request.score <= 1.0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"score: must be in [0, 1], got {request.score}"
            )
        try:
            accepted = self._lessons.feedback(request.request_id, request.score, _caller())
        except PermissionDenied as e:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
            raise AssertionError("abort raises") from None
        return router_pb2.FeedbackResponse(accepted=accepted)


def _caller() -> str:
    """Who is calling: the API key's id when the router enforces keys, else empty."""
    key = current_api_key()
    return key.id if key is not None else ""
