"""The first-token race of a routed chat: its call is late with a first token, so a call on the
fallback tier races it, and the first to stream answers; one that ends or fails before its first
chunk loses. Plain state: it says which calls lose and which one answers; the session core
(session_core.py) cancels, reports and streams them. No gRPC, asyncio or clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.router.session_calls import CallState


@dataclass(frozen=True)
class RaceStep:
    """What the race decided on one input."""

    stop_timer: bool = False  # the first-token timer is no longer wanted
    cancel: tuple[CallState, ...] = ()  # racers that lost while still running
    answer: CallState | None = None  # set once the race is over: the call that answers


class FirstTokenRace:
    """The calls racing for a chat's first token: none until begin(), and none again once the
    race is settled. Not thread-safe."""

    def __init__(self) -> None:
        self.racing: list[CallState] = []  # the calls still in the race
        self.timer_armed = False  # the first call waits for its first token; no backup yet
        self.reason = ""  # Final.reason when a call other than the first answered
        self._first: CallState | None = None
        self._timeout_s = 0.0

    @property
    def running(self) -> bool:
        return bool(self.racing)

    def begin(self, first: CallState, timeout_s: float) -> None:
        """`first` is raced unless it streams within `timeout_s` (the caller arms the timer)."""
        self.racing, self.timer_armed = [first], True
        self._first, self._timeout_s = first, timeout_s

    def join(self, backup: CallState) -> None:
        """The timer fired: `backup`, on the fallback tier, races the late call."""
        self.racing.append(backup)
        self.timer_armed = False

    def streamed(self, winner: CallState) -> RaceStep:
        """`winner` streamed first: the other racers are cancelled and it answers."""
        losers = tuple(c for c in self.racing if c is not winner)
        step = RaceStep(self.timer_armed, losers, winner)
        self._settle(winner)
        return step

    def left(self, call: CallState) -> RaceStep:
        """`call` ended or failed before its first chunk. While others race it loses (the last
        one left answers); if it raced alone, its end is the answer's (`answer` is `call`)."""
        others = [c for c in self.racing if c is not call]
        if not others:
            step = RaceStep(stop_timer=self.timer_armed, answer=call)
            self._settle(call)
            return step
        self.racing = others
        if len(others) > 1:
            return RaceStep()
        self._settle(others[0])
        return RaceStep(answer=others[0])

    def _settle(self, answer: CallState) -> None:
        first = self._first
        assert first is not None
        if answer is not first:
            ms = self._timeout_s * 1000
            self.reason = (
                f"no first token from {first.tier} within {ms:.0f} ms; answered by {answer.tier}"
            )
        self.racing, self.timer_armed = [], False
