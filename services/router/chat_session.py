"""One chat through the router: the driver of its session core (session_core.py). It carries
out the core's actions (opens tier calls, reads them, cancels them, arms the first-token timer,
yields the events) and feeds back what happens, each with the time it happened.

Makes no decision of its own: which call streams as which revision, failover, the progressive
gate and every timeout are the core's. Knows gRPC and asyncio; knows nothing of telemetry or
learning, which watch the events it yields (chat_events.py).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from typing import Any

import grpc
from tiermesh.v1 import router_pb2, tier_pb2

from services.router.chat_events import RefinementSettled, SessionEvent, TierCallEnded
from services.router.chat_outcomes import UpstreamFailed, tier_error
from services.router.chat_plan import ChatPlan, SessionClock
from services.router.session_actions import (
    Action,
    CancelCall,
    Fail,
    OpenCall,
    ReadCall,
    StartTimer,
    StopTimer,
)
from services.router.session_core import SessionCore
from services.router.tier_calls import TierCall, TierClient

Chunks = AsyncIterator[tier_pb2.GenerateChunk]
EMITTED = (router_pb2.ChatEvent, TierCallEnded, RefinementSettled)  # actions that are events


class ChatSession:
    """One chat; read it once with events(). Not thread-safe: one event loop."""

    def __init__(
        self,
        plan: ChatPlan,
        tiers: TierClient,
        refine_budget_s: float,
        time_remaining_s: float | None,
        clock: SessionClock,
        call_timeout_s: float | None = None,
        stall_s: float | None = None,
        room: Callable[[str, Collection[str]], bool] | None = None,
        queueing: Callable[[str], bool] | None = None,
    ) -> None:
        """Tier calls carry the client's deadline, else `call_timeout_s` (None: none); a call
        with no chunk for `stall_s` fails (None: never). `room(tier, tried)`: whether a replica
        of the tier, none of those tried, would start a call at once; a call refused for
        overload (RESOURCE_EXHAUSTED) moves on only to such a tier, else the refusal is the
        answer (None: it moves on like any failure). `queueing(endpoint)`: whether the replica
        reports requests waiting, so a call to it with no chunk yet may be queued there rather
        than stalled (None: every silent call is stalled after `stall_s`)."""
        self._plan = plan
        self._tiers = tiers
        self._stall_s = stall_s
        self._room = room
        self._queueing = queueing
        named = {*plan.tiers, *plan.fallbacks, *filter(None, [plan.fallback_tier])}
        replicas = {tier: len(tiers.endpoints(tier)) for tier in named}
        # the deadline from now: time_remaining_s was read just before (after any wait to plan)
        deadline = None if time_remaining_s is None else time.perf_counter() + time_remaining_s
        self._core = SessionCore(plan, replicas, refine_budget_s, clock, deadline, call_timeout_s)
        self._calls: dict[int, TierCall] = {}
        self._reading: dict[int, Chunks] = {}  # the calls the core reads, by its ids
        self._pending: dict[int, asyncio.Future[Any]] = {}  # next-chunk reads in flight
        self._timer: asyncio.Future[None] | None = None

    async def events(self) -> AsyncGenerator[SessionEvent, None]:
        """The chat's events, RouteDecision first and Final last; raises UpstreamFailed. Closing
        the iterator early (the client left) cancels every upstream call."""
        core = self._core
        try:
            actions = core.start(time.perf_counter())
            while True:
                for action in actions:
                    if isinstance(action, EMITTED):
                        yield action
                    elif isinstance(action, OpenCall):
                        yield action.opening  # observers add their metadata to it
                        self._open(action)
                    else:
                        await self._carry_out(action)
                if core.done:
                    return
                actions = await self._next()
        finally:
            for action in core.client_left():
                await self._carry_out(action)
            for future in self._pending.values():
                future.cancel()
            if self._timer is not None:
                self._timer.cancel()

    def _open(self, action: OpenCall) -> None:
        opening = action.opening
        request = tier_pb2.GenerateRequest()
        request.CopyFrom(self._plan.generate)
        request.request_id = opening.request_id
        if (continued := action.continuation) is not None:
            request.continue_token_ids.extend(continued.token_ids)
            request.continue_text_chars = continued.text_chars
            if request.sampling.HasField("top_logprobs"):  # for the held tokens' entries
                request.continue_logprobs.extend(continued.logprobs)
            request.continue_model = continued.model  # a replica of another model refuses
            request.continue_model_fingerprint = continued.model_fingerprint
        tier = opening.tier
        tried = {call.endpoint for call in self._calls.values()}
        endpoint = self._tiers.pick(tier, tried) or self._tiers.endpoints(tier)[0]
        queued = None if self._queueing is None else functools.partial(self._queueing, endpoint)
        self._calls[action.call] = TierCall(
            self._tiers,
            tier,
            endpoint,
            request,
            action.timeout_s,
            opening.metadata,
            self._stall_s,
            queued,
        )
        self._core.opened(action.call, endpoint)

    async def _carry_out(self, action: Action) -> None:
        if isinstance(action, ReadCall):
            self._reading[action.call] = self._calls[action.call].chunks()
        elif isinstance(action, CancelCall):
            self._calls[action.call].cancel()
            await self._stop_reading(action.call)
        elif isinstance(action, StartTimer):
            self._timer = asyncio.ensure_future(asyncio.sleep(action.seconds))
        elif isinstance(action, StopTimer):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        elif isinstance(action, Fail):
            raise UpstreamFailed(action.tier, action.error)

    async def _stop_reading(self, call: int) -> None:
        chunks = self._reading.pop(call, None)
        pending = self._pending.pop(call, None)
        if pending is not None:
            pending.cancel()  # the read's task closes the stream
        elif chunks is not None:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def _next(self) -> list[Action]:
        """Waits for what happens next to the calls being read (or the timer) and tells the
        core. One call read and no timer: its next chunk, directly."""
        if len(self._reading) == 1 and self._timer is None:
            call = next(iter(self._reading))
            pending = self._pending.pop(call, None)
            return await self._read(call, pending or anext(self._reading[call]))
        for call, chunks in self._reading.items():
            if call not in self._pending:
                self._pending[call] = asyncio.ensure_future(anext(chunks))
        waiting: set[asyncio.Future[Any]] = set(self._pending.values())
        if self._timer is not None:
            waiting.add(self._timer)
        assert waiting, "the session waits on nothing"
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for call, future in list(self._pending.items()):
            if future.done():
                del self._pending[call]
                return await self._read(call, future)
        self._timer = None
        return self._core.timer(time.perf_counter())

    async def _read(self, call: int, next_chunk: Any) -> list[Action]:
        """The core's actions for the call's next chunk, its end or its failure."""
        core = self._core
        try:
            chunk = await next_chunk
        except StopAsyncIteration:
            del self._reading[call]
            return core.ended(call, time.perf_counter())
        except grpc.aio.AioRpcError as e:
            del self._reading[call]
            error = tier_error(e)
            return core.failed(call, error, time.perf_counter(), self._room_for(call, error.code))
        return core.chunk(call, chunk, time.perf_counter())

    def _room_for(self, call: int, code: str) -> frozenset[str] | None:
        """For a refusal (RESOURCE_EXHAUSTED), the tiers with a replica not yet tried that
        would start a call at once; None when any may be tried."""
        if self._room is None or code != "RESOURCE_EXHAUSTED":
            return None
        tried = {c.endpoint for c in self._calls.values()}
        candidates = {self._calls[call].tier, *self._plan.fallbacks}
        return frozenset(tier for tier in candidates if self._room(tier, tried))
