"""Continuous (in-flight) batching for the torch engine: one thread decodes every running
request together, one token per request per step, over a KV-cache pool allocated at start.

A new request arrives with its pool slot already reserved (the engine reserves it when the
request is admitted, so the loop never meets a full pool) and joins between steps. What each
step does is decided by the step planner (step_planner.py: which requests prefill together and
in how many passes within the step's prompt-token budget, which rows decode, which leave); this
loop builds the planner's state, asks, and carries the plan out: the forward passes, token
choice, streaming and freeing slots. A critical request may skip the wait for the pass under
way: with a critical lane (a second thread, at the tier's serving priority rather than the
model's lowered one), it is prefilled there the moment it arrives, beside whatever pass the loop
runs (other slots of the pool: the two never touch the same one), its first token streamed at
once, and it joins the decode batch at the loop's next plan as a running row. One request's own
failure (non-finite logits, sampling, detokenising) fails that request alone: the rest of the
batch goes on. Two typed seams, both off by default: a StepObserver sees each plan before it
runs, a LogitsTransform may rewrite a pass's logits before tokens are chosen. Knows torch and
an architecture's pooled passes (pooled_models.py: GPT-2, the Llama family); nothing of asyncio
or gRPC: results leave through each request's ChunkSink.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from services.tier.decode import Alternatives, NonFiniteLogits, choose_token_with_top
from services.tier.kv_pool import KvCachePool
from services.tier.model_loading import LoadedModel
from services.tier.pooled_models import PooledPasses
from services.tier.queue_order import CRITICAL
from services.tier.scheduled_request import (
    NO_STEP_OBSERVER,
    LogitsTransform,
    RequestFailed,
    ScheduledRequest,
    StepObserver,
)
from services.tier.step_planner import (
    SchedulerState,
    StepPlan,
    StepProgress,
    plan_step,
)
from services.tier.utilisation import BusyWindow

log = logging.getLogger(__name__)


class BatchScheduler:
    """Thread-safe entry points: submit() and shutdown(). Everything else runs on its thread.

    Every submitted request holds a slot the caller reserved (pool.acquire()); the inbox is
    therefore bounded by the pool, and the scheduler frees the slot when the request ends.
    Each step is planned by step_planner.plan_step(); this loop carries the plans out.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        passes: PooledPasses,
        pool: KvCachePool,
        prefill_tokens_per_step: int = 512,
        *,
        observer: StepObserver = NO_STEP_OBSERVER,
        logits_transform: LogitsTransform | None = None,
        critical_lane: ThreadPoolExecutor | None = None,
    ) -> None:
        """`critical_lane`: the one thread critical requests are prefilled on as they arrive
        (see the module's docstring), shut down with the scheduler; None: they wait for the
        loop's next plan, as the others do (the planner prefills them first, alone)."""
        self._loaded = loaded
        self._passes = passes
        self._pool = pool
        # prompt tokens prefilled between two decode steps (step_planner.py): a burst starts
        # together, yet running streams are never stalled for long by a queue of long prompts
        self._prefill_budget = prefill_tokens_per_step
        self._observer = observer
        self._logits_transform = logits_transform
        self._inbox: queue.Queue[ScheduledRequest] = queue.Queue(maxsize=pool.slots)
        self._waiting: dict[int, ScheduledRequest] = {}  # slot -> request, in arrival order
        self._active: dict[int, ScheduledRequest] = {}  # slot -> request, in decode-row order
        self._closing = threading.Event()
        self._done: Future[None] | None = None
        self.steps = 0
        self.batched_tokens = 0
        self.prefills = 0  # prefill forward passes
        self.prefilled_requests = 0  # requests they prefilled
        self.lane_prefills = 0  # critical requests prefilled in the critical lane
        self._lane = critical_lane
        self._lane_lock = threading.Lock()  # submit() against shutdown(): never a lost request
        self.busy = BusyWindow()  # prefill and decode time: the loop's utilisation

    def warm_up(self) -> None:
        """One prefill and one decode step of a one-token prompt in a free slot, then freed: the
        first forward pays for kernel selection and the pool's first page faults (seconds on a
        CPU), so the first request does not. Call on the torch thread before start()."""
        slot = self._pool.acquire()
        try:
            self._passes.prefill(
                self._loaded.model, self._pool, self._pool.prefill_batch([slot], [[0]])
            )
            self._passes.decode_step(self._loaded.model, self._pool, [slot], [0])
        finally:
            self._pool.release(slot)

    def start(self, torch_thread: ThreadPoolExecutor) -> None:
        """Runs the loop on `torch_thread`: the one thread that issues this model's torch ops
        but for the critical lane's prefills (two threads issuing ops each get an OpenMP team,
        and the teams fight for the cores: the lane's only while a critical prefill runs)."""
        self._done = torch_thread.submit(self._run)

    def warm_up_lane(self) -> None:
        """warm_up's prefill on the critical lane's thread, whose first forward pays the same
        costs; nothing without a lane. Call before start()."""
        if self._lane is not None:
            self._lane.submit(self._warm_prefill).result()

    def _warm_prefill(self) -> None:
        slot = self._pool.acquire()
        try:
            self._passes.prefill(
                self._loaded.model, self._pool, self._pool.prefill_batch([slot], [[0]])
            )
        finally:
            self._pool.release(slot)

    def submit(self, request: ScheduledRequest) -> None:
        if request.prepared.priority == CRITICAL:
            with self._lane_lock:
                if self._lane is not None:
                    self._lane.submit(self._prefill_in_lane, request)
                    return
        self._inbox.put_nowait(request)

    def shutdown(self) -> None:
        with self._lane_lock:  # requests submitted from now on go to the loop, which ends them
            lane, self._lane = self._lane, None
        if lane is not None:  # its requests reach the inbox before the loop's last look at it
            lane.shutdown(wait=True)
        self._closing.set()
        if self._done is not None:
            self._done.result(timeout=30)

    def _prefill_in_lane(self, request: ScheduledRequest) -> None:
        """On the critical lane: prefills one critical request and streams its first token,
        then hands it to the loop as a running row. A request stopped before, or a scheduler
        closing, hands it over unprefilled: the loop drops it (or ends it as it closes)."""
        if not (request.stop.is_set() or self._closing.is_set()):
            try:
                self._seed(request)
                self._choose([request], self._prefill([request]))
                self.lane_prefills += 1
            except Exception as e:
                log.exception("prefill of %s failed", request.prepared.request_id)
                self._fail(request, RequestFailed(f"prefill failed: {e!r}"))
            request.prefilled = True
        self._inbox.put_nowait(request)

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self._run_step()
            except Exception as e:  # a failed forward fails the running requests, not the tier
                log.exception("batch step failed")
                for request in list(self._active.values()):
                    if not request.ended:
                        self._fail(request, RequestFailed(f"batch step failed: {e!r}"))
        self._take_arrivals()
        for request in (*self._active.values(), *self._waiting.values()):
            if not request.ended:  # running, or submitted but never started: end it
                request.sink.close()
            self._release(request)
        self._active.clear()
        self._waiting.clear()

    def _run_step(self) -> None:
        """One step: asks the planner, carries its plan out, and asks again after each prefill
        pass, until a plan (a decode pass, or a wait for an arrival) ends the step."""
        started = time.monotonic()
        worked = False  # a forward pass ran: the step counts as busy time
        plan = StepPlan(resume=StepProgress())  # a step begins
        while plan.resume is not None:
            self._take_arrivals()
            plan = plan_step(self._state(plan.resume))
            self._observe(plan)
            self._carry_out(plan)
            worked = worked or bool(plan.prefill or plan.decode)
        if worked:
            self.busy.add(started, time.monotonic())
        if plan.wait:
            self._wait_for_arrival()

    def _observe(self, plan: StepPlan) -> None:
        """Shows `plan` to the observer; an observer that raises is logged, never obeyed."""
        try:
            self._observer.before(plan)
        except Exception:
            log.exception("step observer failed")

    def _state(self, progress: StepProgress) -> SchedulerState:
        return SchedulerState(
            budget=self._prefill_budget,
            waiting=tuple(request.waiting() for request in self._waiting.values()),
            running=tuple(request.row() for request in self._active.values()),
            progress=progress,
        )

    def _carry_out(self, plan: StepPlan) -> None:
        for row in plan.free:
            self._release(self._active.pop(row.slot))
        for row in plan.evict:
            request = self._active.pop(row.slot)
            request.sink.close()
            self._release(request)
        for waiting in plan.drop:
            request = self._waiting.pop(waiting.slot)
            request.sink.close()
            self._release(request)
        if plan.prefill:
            self._admit([self._waiting.pop(waiting.slot) for waiting in plan.prefill])
        if plan.decode:
            self._step([self._active[row.slot] for row in plan.decode])

    def _take_arrivals(self) -> None:
        """Moves what the inbox holds to the waiting requests, in arrival order (to the running
        rows, those the critical lane prefilled)."""
        while True:
            try:
                self._arrive(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _arrive(self, request: ScheduledRequest) -> None:
        if request.prefilled:
            self._active[request.slot] = request
        else:
            self._waiting[request.slot] = request

    def _wait_for_arrival(self) -> None:
        """Nothing runs or waits: waits a little for the next request (then the loop looks at
        `_closing` again)."""
        try:
            request = self._inbox.get(timeout=0.05)
        except queue.Empty:
            return
        self._arrive(request)

    def _release(self, request: ScheduledRequest) -> None:
        self._pool.release(request.slot)
        request.on_release()

    def _fail(self, request: ScheduledRequest, error: BaseException) -> None:
        request.sink.fail(error)
        request.ended = True

    def _admit(self, requests: list[ScheduledRequest]) -> None:
        """Prefills the requests together and chooses their first tokens. When the batched
        forward fails, each is prefilled alone, so a failure stays with its request."""
        self._active.update((request.slot, request) for request in requests)
        for request in requests:
            self._seed(request)
        if len(requests) > 1:
            try:
                self._choose(requests, self._prefill(requests))
                return
            except Exception:
                log.exception("batched prefill of %d requests failed: one by one", len(requests))
        for request in requests:
            try:
                self._choose([request], self._prefill([request]))
            except Exception as e:
                log.exception("prefill of %s failed", request.prepared.request_id)
                self._fail(request, RequestFailed(f"prefill failed: {e!r}"))

    def _seed(self, request: ScheduledRequest) -> None:
        """A sampled request with a seed gets its own generator, before its first token."""
        sampling = request.prepared.sampling
        if not sampling.greedy and sampling.seed is not None:
            device = self._loaded.device
            request.generator = torch.Generator(device=device).manual_seed(sampling.seed)

    def _prefill(self, requests: list[ScheduledRequest]) -> torch.Tensor:
        batch = self._pool.prefill_batch(
            [r.slot for r in requests], [list(r.prepared.prompt_ids) for r in requests]
        )
        logits = self._passes.prefill(self._loaded.model, self._pool, batch)  # (B, V)
        self._pool.note_use()
        self.prefills += 1
        self.prefilled_requests += len(requests)
        return logits

    def _step(self, requests: list[ScheduledRequest]) -> None:
        slots = [r.slot for r in requests]
        tokens = [r.next_token for r in requests]
        logits = self._passes.decode_step(self._loaded.model, self._pool, slots, tokens)  # (B, V)
        self._pool.note_use()
        self.steps += 1
        self.batched_tokens += len(slots)
        self._choose(requests, logits)

    @torch.inference_mode()
    def _choose(self, requests: list[ScheduledRequest], logits: torch.Tensor) -> None:
        """Chooses each row's next token from logits (B, V) and records it. A row whose logits
        are not finite, or whose sampling or detokenising raises, fails its own request."""
        if self._logits_transform is not None:
            logits = self._logits_transform([r.prepared for r in requests], logits)
        finite = torch.isfinite(logits).all(dim=-1).tolist()  # (B,)
        best: list[int] = []
        chosen: list[float] = []
        logprobs: torch.Tensor | None = None
        if any(r.prepared.sampling.greedy for r in requests):  # one pass for the greedy rows
            logprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
            top = logprobs.argmax(dim=-1)  # (B,)
            best = top.tolist()
            chosen = logprobs.gather(1, top[:, None])[:, 0].tolist()  # (B,)
        likeliest = self._likeliest(requests, logprobs)
        for row, request in enumerate(requests):
            if not finite[row]:
                error = NonFiniteLogits(
                    f"non-finite logits at generated token {request.generated + 1} "
                    "(this request overflows the model)"
                )
                log.warning("request %s failed: %s", request.prepared.request_id, error)
                self._fail(request, error)
                continue
            try:
                sampling = request.prepared.sampling
                alternatives: Alternatives = ()
                if sampling.greedy:
                    token, logprob = best[row], chosen[row]
                    alternatives = likeliest.get(row, ())
                else:
                    token, logprob, alternatives = choose_token_with_top(
                        logits[row],
                        sampling,
                        request.generator,
                        sampling.top_logprobs or 0,
                        known_finite=True,  # checked for the whole batch above
                    )
                self._record(request, token, logprob, alternatives)
            except Exception as e:
                log.exception("request %s failed", request.prepared.request_id)
                self._fail(request, RequestFailed(f"choosing or decoding its token: {e!r}"))

    @staticmethod
    def _likeliest(
        requests: list[ScheduledRequest], logprobs: torch.Tensor | None
    ) -> dict[int, Alternatives]:
        """The most likely tokens of the greedy rows that asked for them (top_logprobs), by
        row: one topk over those rows, read back once."""
        rows = [
            row
            for row, r in enumerate(requests)
            if r.prepared.sampling.greedy and r.prepared.sampling.top_logprobs
        ]
        if not rows or logprobs is None:
            return {}
        k = max(requests[row].prepared.sampling.top_logprobs or 0 for row in rows)
        values, ids = torch.topk(logprobs[rows], min(k, logprobs.shape[-1]), dim=-1)  # (R, k)
        likeliest = {}
        for row, row_ids, row_values in zip(rows, ids.tolist(), values.tolist(), strict=True):
            wanted = requests[row].prepared.sampling.top_logprobs or 0
            likeliest[row] = tuple(zip(row_ids[:wanted], row_values[:wanted], strict=True))
        return likeliest

    def _record(
        self,
        request: ScheduledRequest,
        token: int,
        logprob: float,
        top: Alternatives = (),
    ) -> None:
        request.generated += 1
        finish = request.prepared.finish_after(token, request.generated)
        chunk = request.chunks.add(token, logprob, finish, top)
        if chunk is not None:
            request.sink.put(chunk)
        if finish is not None:
            request.sink.close()
            request.ended = True
        else:
            request.next_token = token
