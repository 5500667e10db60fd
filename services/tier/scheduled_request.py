"""What the torch engine hands its batch scheduler (batch_scheduler.py): one request as the
scheduler holds it (ScheduledRequest: its pool slot, stop flag, chunk sink and decoding state, and
how the step planner sees it), the failure that ends one request alone, and the scheduler's two
typed seams, both off by default: a StepObserver sees each plan before it runs, a LogitsTransform
may rewrite a pass's logits before tokens are chosen. Knows torch's types; nothing of the loop,
asyncio or gRPC.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from services.common.errors import TiermeshError
from services.tier.chunking import ChunkAssembler, ChunkSink
from services.tier.prepared_request import PreparedRequest
from services.tier.queue_order import rank_of
from services.tier.step_planner import RowStatus, RunningRow, StepPlan, WaitingRequest


class RequestFailed(TiermeshError):
    """One request's own step failed (its prefill, sampling or detokenising raised): that
    request ends with this error, the others of its batch go on."""

    status = "INTERNAL"


def _no_release() -> None:
    pass


@dataclass
class ScheduledRequest:
    """One request inside the scheduler, holding the pool slot reserved for it at admission."""

    prepared: PreparedRequest
    stop: threading.Event
    sink: ChunkSink  # its chunks, then close() or fail()
    chunks: ChunkAssembler
    slot: int  # reserved in the pool before submit(); freed by the scheduler when it ends
    on_release: Callable[[], None] = _no_release  # called (on the scheduler's thread) once freed
    next_token: int = -1
    generated: int = 0
    generator: torch.Generator | None = field(default=None, repr=False)
    ended: bool = False  # its stream has ended (finished or failed); the next plan frees its slot
    prefilled: bool = False  # prefilled in the critical lane: it joins the running rows

    def waiting(self) -> WaitingRequest:
        """This request as the step planner sees it before its prefill."""
        return WaitingRequest(
            self.slot,
            len(self.prepared.prompt_ids),
            self.prepared.request_id,
            self.stop.is_set(),
            rank_of(self.prepared.priority),
            self.prepared.paused(),
        )

    def row(self) -> RunningRow:
        """This request as the step planner sees it once it runs."""
        status = RowStatus.DECODING
        if self.ended:
            status = RowStatus.ENDED
        elif self.stop.is_set():
            status = RowStatus.STOPPED
        elif self.prepared.paused():
            status = RowStatus.PAUSED
        return RunningRow(self.slot, status, self.prepared.request_id)


class StepObserver(Protocol):
    """Sees each plan of the scheduler's loop just before it is carried out (waits for an
    arrival included): metrics, traces, or a test that paces the loop. Called on the scheduler's
    thread; it cannot change the plan, and while it runs the loop (every running stream) waits
    for it; what it raises is logged and the plan runs all the same. The default,
    NO_STEP_OBSERVER, does nothing."""

    def before(self, plan: StepPlan) -> None: ...


class _NoStepObserver:
    def before(self, plan: StepPlan) -> None:
        pass


NO_STEP_OBSERVER: StepObserver = _NoStepObserver()


class LogitsTransform(Protocol):
    """Rewrites a forward pass's logits before each row's next token is chosen from them: given
    the rows' requests, in row order, and their logits (B, V), returns logits of the same shape
    (the same tensor, or a new one: never change it in place). Called on the scheduler's thread
    for every prefill and decode pass (and on the critical lane's thread for its prefills). A row
    it makes non-finite fails that request alone, as a row whose activations overflow would.
    None in service: tokens are chosen from the model's logits as they are."""

    def __call__(
        self, requests: Sequence[PreparedRequest], logits: torch.Tensor
    ) -> torch.Tensor: ...
