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
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc
from tiermesh.v1 import router_pb2, router_pb2_grpc

from services.common.answers import answers_agree
from services.common.config import RouterConfig
from services.common.errors import InvalidArgument, PermissionDenied, TiermeshError
from services.common.grpc_service import Undecodable
from services.common.status_details import abort_error, abort_with_details
from services.router.chat_events import ChatObserver
from services.router.chat_outcomes import UpstreamFailed
from services.router.chat_plan import ChatPlan, SessionClock
from services.router.chat_planning import (
    ESCALATE,
    PRIORITIES,
    check_chat_request,
    plan_chat,
)
from services.router.chat_session import ChatSession
from services.router.chat_telemetry import NO_TELEMETRY, chat_telemetry, route_explanation
from services.router.drain_rate import DrainRate
from services.router.fair_share import FairShare
from services.router.fallback import TiersLoading
from services.router.learning import AnswersAgree, RoutingLessons
from services.router.overload import INTERACTIVE, inflight_limit, priority_allowed
from services.router.policy import Loads, LoadsSeenBy, RouteChoice, RoutingInput, RoutingPolicy
from services.router.tier_calls import TierClient
from services.router.tier_health import TierHealth
from services.security.api_key_auth import current_api_key

log = logging.getLogger(__name__)
LOADING_MARGIN_S = 0.5  # of the client's deadline, kept back from waiting for a loading tier


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
        self._drain = DrainRate()  # how fast chats in flight finish: a refusal's retry delay
        self._fair = FairShare()  # each API key's chats in flight, by priority

    def plan(
        self,
        request: router_pb2.ChatRequest | Undecodable,
        route_now: bool = True,
        wait_for_loading: bool = False,
        time_remaining_s: float | None = None,
    ) -> ChatPlan:
        """Checks the request and plans it (chat_planning.py); raises InvalidArgument or
        TiersFull, and with `wait_for_loading` TiersLoading. With `route_now` False, a mode whose
        tiers do not depend on the routing policy is planned without its choice (see assess)."""
        if isinstance(request, Undecodable):
            raise InvalidArgument(request.message)
        chat = check_chat_request(request, self._config)
        key = current_api_key()
        ceiling = key.max_priority if key is not None else None
        if not priority_allowed(chat.priority, ceiling):
            raise PermissionDenied(
                f"priority: this API key may ask for {ceiling} at most, not {chat.priority}"
            )
        loads = LoadsSeenBy(self._loads, chat.priority)  # batch queued counts for batch alone
        choice = None
        if route_now or chat.mode == router_pb2.MODE_ROUTED or chat.gate == ESCALATE:
            choice = self._policy.route(chat.routing_input, loads)
        loading = self._health.loading if wait_for_loading else None
        caller, weight = _caller(), key.weight if key is not None else 1.0
        over = self._fair.over_share(caller, chat.priority, weight)
        return plan_chat(
            chat, self._config, loads, self._down, choice, loading, time_remaining_s, over
        )

    async def _plan_when_serving(
        self, request: router_pb2.ChatRequest | Undecodable, time_remaining_s: float | None
    ) -> ChatPlan:
        """The chat's plan; while no tier can take it yet because tiers are loading, planned
        again each time one starts serving, for up to loading_wait_s within the deadline (then
        it goes to its tier all the same)."""
        start = time.monotonic()
        deadline = None if time_remaining_s is None else start + time_remaining_s
        wait_s = self._config.loading_wait_s
        if time_remaining_s is not None:
            wait_s = min(wait_s, time_remaining_s - LOADING_MARGIN_S)
        while True:
            now = time.monotonic()
            left = start + wait_s - now
            remaining = None if deadline is None else deadline - now
            try:
                return self.plan(request, False, left > 0, remaining)
            except TiersLoading:
                await self._health.changed(left)

    def assess(self, plan: ChatPlan) -> RouteChoice:
        """The policy's choice for a chat: the plan's, or (a mode planned without it) the
        policy's view now, for RouteDecision.complexity and the routing lessons."""
        if plan.choice is not None:
            return plan.choice
        turns = tuple((m.role, m.content) for m in plan.generate.messages)
        return self._policy.route(RoutingInput(turns, plan.generate.max_tokens), self._loads)

    async def Chat(
        self, request: router_pb2.ChatRequest | Undecodable, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.ChatEvent]:
        clock = SessionClock()
        start_ns = time.time_ns()
        telemetry = chat_telemetry(context.invocation_metadata(), start_ns)
        code, message = "OK", ""
        priority = _priority_of(request)
        limit = inflight_limit(priority, self._config.max_inflight)
        if self.inflight >= limit:
            code = "RESOURCE_EXHAUSTED"
            message = (
                f"router at capacity: {self.inflight} chats in flight "
                f"(limit {limit} for {priority} chats, of max_inflight "
                f"{self._config.max_inflight})"
            )
            telemetry.finish(code, message)
            await abort_with_details(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                message,
                reason="ROUTER_AT_CAPACITY",
                retry_after_s=self._drain.retry_after_s(),
            )
        self.inflight += 1
        unrouted: ChatPlan | None = None  # planned, RouteDecision not sent yet
        counted: tuple[str, str] | None = None  # (caller, priority) in its key's fair share
        try:
            try:
                plan = await self._plan_when_serving(request, context.time_remaining())
            except TiermeshError as e:
                code, message = e.status, str(e)
                await abort_error(context, e)
                raise AssertionError("abort raises") from None
            key, counted = current_api_key(), (_caller(), plan.priority)
            self._fair.start(*counted, key.weight if key is not None else 1.0)
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
                queueing=self._health.queueing,
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
                            choice = self.assess(plan)
                            if plan.choice is None:
                                event = _with_complexity(event, choice.complexity)
                            explained = route_explanation(
                                self._policy, self._loads, plan.escalation
                            )
                            telemetry.route(
                                event.route, plan.generate.max_tokens, start_ns, explained
                            )
                            observers.append(self._lessons.observer(plan, choice, _caller()))
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
            self._drain.finished()
            if counted is not None:
                self._fair.end(*counted)
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


def _with_complexity(event: router_pb2.ChatEvent, complexity: float) -> router_pb2.ChatEvent:
    """A copy of a RouteDecision event with the policy's complexity (the plan's stays as is)."""
    routed = router_pb2.ChatEvent()
    routed.CopyFrom(event)
    routed.route.complexity = complexity
    return routed


def _priority_of(request: router_pb2.ChatRequest | Undecodable) -> str:
    """The priority a chat asks for, as far as the router's own limit goes (an unknown value
    counts as interactive here; planning refuses it)."""
    if isinstance(request, Undecodable):
        return INTERACTIVE
    return PRIORITIES.get(request.priority, INTERACTIVE)


def _caller() -> str:
    """Who is calling: the API key's id when the router enforces keys, else empty."""
    key = current_api_key()
    return key.id if key is not None else ""
