"""What the chat session's core asks its driver to do: open a tier call (with the tokens it
continues), read a call, cancel one, arm or stop the first-token timer, emit an event (any
SessionEvent is itself the action "emit this"), or fail the chat with a tier's error.

Plain data: no gRPC, no asyncio. The driver (chat_session.py) carries the actions out, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from services.router.chat_events import SessionEvent, TierCallOpening
from services.router.session_calls import Continuation, TierError


@dataclass(frozen=True)
class OpenCall:
    """Start a Generate call on a replica of `opening.tier` not yet tried by this chat, then
    report it with SessionCore.opened(). Emit `opening` first: observers may add metadata."""

    call: int  # the core's id for the call
    opening: TierCallOpening
    timeout_s: float | None  # the call's deadline; None: none
    continuation: Continuation | None = None  # set: it continues a broken call's answer


@dataclass(frozen=True)
class ReadCall:
    """Read the call's stream from now on (chunks, its end or its failure), until it is over
    or cancelled; each goes back to the core as it arrives."""

    call: int


@dataclass(frozen=True)
class CancelCall:
    """Cancel the call upstream and stop reading it (the tier aborts its work)."""

    call: int


@dataclass(frozen=True)
class StartTimer:
    """Call SessionCore.timer() after `seconds`, unless StopTimer comes first."""

    seconds: float


@dataclass(frozen=True)
class StopTimer:
    """The armed timer is no longer wanted."""


@dataclass(frozen=True)
class Fail:
    """No answer is left: end the chat with `tier`'s failure (no Final)."""

    tier: str
    error: TierError


Action: TypeAlias = SessionEvent | OpenCall | ReadCall | CancelCall | StartTimer | StopTimer | Fail
