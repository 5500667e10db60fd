"""Continuous (in-flight) batching for the torch engine: one thread decodes every running
request together, one token per request per step, over a KV-cache pool allocated at start.

A new request arrives with its pool slot already reserved (the engine reserves it when the
request is admitted, so the loop never meets a full pool) and joins between steps: the requests
waiting then are prefilled together, in one forward pass over their prompts packed end to end,
and those that arrived during that pass in another, before the next step, within a token budget
per step; a finished or stopped one leaves at once and frees its slot. One
request's own failure (non-finite logits, sampling, detokenising) fails that request alone: the
rest of the batch goes on. Knows torch and an architecture's pooled passes (pooled_models.py:
GPT-2, the Llama family); nothing of asyncio or gRPC: results leave through each request's
ChunkSink.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from services.common.errors import TiermeshError
from services.tier.chunking import ChunkAssembler, ChunkSink
from services.tier.decode import Alternatives, NonFiniteLogits, choose_token_with_top
from services.tier.kv_pool import KvCachePool
from services.tier.model_loading import LoadedModel
from services.tier.pooled_models import PooledPasses
from services.tier.prepared_request import PreparedRequest

log = logging.getLogger(__name__)


class BusyWindow:
    """The share of the last `window_s` seconds a loop spent working. Spans are added by the
    loop's thread; share() may be read from any thread (a deque copy is atomic)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._spans: deque[tuple[float, float]] = deque(maxlen=8192)  # (start, end), monotonic

    def add(self, start: float, end: float) -> None:
        self._spans.append((start, end))

    def share(self, now: float | None = None) -> float:
        """Busy seconds within (now - window_s, now] over window_s, in [0, 1]."""
        now = time.monotonic() if now is None else now
        since = now - self.window_s
        busy = sum(
            min(end, now) - max(start, since) for start, end in list(self._spans) if end > since
        )
        return max(0.0, min(1.0, busy / self.window_s))


class RequestFailed(TiermeshError):
    """One request's own step failed (its prefill, sampling or detokenising raised): that
    request ends with this error, the others of its batch go on."""

    status = "INTERNAL"


def _no_release() -> None:
    pass


@dataclass
class Sequence:
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


# Test hook: when set, rows whose request it answers True for get NaN logits before their next
# token is chosen, the way a row whose activations overflow would. None in service.
PoisonHook = Callable[[PreparedRequest], bool]


class BatchScheduler:
    """Thread-safe entry points: submit() and shutdown(). Everything else runs on its thread.

    Every submitted sequence holds a slot the caller reserved (pool.acquire()); the inbox is
    therefore bounded by the pool, and the scheduler frees the slot when the sequence ends.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        passes: PooledPasses,
        pool: KvCachePool,
        prefill_tokens_per_step: int = 512,
    ) -> None:
        self._loaded = loaded
        self._passes = passes
        self._pool = pool
        # Between two decode steps, waiting requests are prefilled while their prompt tokens fit
        # this budget (at least one): those waiting together in one forward, then those that
        # arrived during it in the next. A burst starts together, yet running streams are never
        # stalled for long by a queue of long prompts.
        self._prefill_budget = prefill_tokens_per_step
        self._inbox: queue.Queue[Sequence] = queue.Queue(maxsize=pool.slots)
        self._active: dict[int, Sequence] = {}  # slot -> sequence
        self._closing = threading.Event()
        self._done: Future[None] | None = None
        self.steps = 0
        self.batched_tokens = 0
        self.prefills = 0  # prefill forward passes
        self.prefilled_requests = 0  # requests they prefilled
        self.busy = BusyWindow()  # prefill and decode time: the loop's utilisation
        self.poison_hook: PoisonHook | None = None

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
        (two threads issuing ops each get an OpenMP team, and the teams fight for the cores)."""
        self._done = torch_thread.submit(self._run)

    def submit(self, sequence: Sequence) -> None:
        self._inbox.put_nowait(sequence)

    def shutdown(self) -> None:
        self._closing.set()
        if self._done is not None:
            self._done.result(timeout=30)

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self._drop_stopped()
                waiting: list[Sequence] = []
                if not self._active:
                    try:
                        waiting.append(self._inbox.get(timeout=0.05))
                    except queue.Empty:
                        continue
                started = time.monotonic()
                self._admit_waiting(waiting)
                if self._active:
                    self._step()
                self.busy.add(started, time.monotonic())
            except Exception as e:  # a failed forward fails the running requests, not the tier
                log.exception("batch step failed")
                for sequence in list(self._active.values()):
                    self._fail(sequence, RequestFailed(f"batch step failed: {e!r}"))
        for sequence in list(self._active.values()):
            sequence.sink.close()
            self._finish(sequence)
        while True:  # submitted but never started: end them and free their slots
            try:
                sequence = self._inbox.get_nowait()
            except queue.Empty:
                break
            sequence.sink.close()
            self._release(sequence)

    def _admit_waiting(self, waiting: list[Sequence]) -> None:
        """Prefills the waiting requests, then those that arrived while that prefill ran, and so
        on while the step's prefill budget lasts, before the next decode step: a burst whose
        requests reach the inbox over a prefill starts one decode step sooner, and running
        streams still wait for at most one budget of prompt tokens (and one prompt past it)."""
        budget = self._prefill_budget
        while budget > 0:
            batch, budget = self._take_waiting(waiting, budget)
            if not batch:
                return
            self._admit(batch)
            waiting = []

    def _take_waiting(self, waiting: list[Sequence], budget: int) -> tuple[list[Sequence], int]:
        """`waiting` and then the inbox's requests while their prompt tokens fit `budget`
        (at least one request, when there is one), and the budget they leave."""
        budget -= sum(len(s.prepared.prompt_ids) for s in waiting)
        while budget > 0:
            try:
                sequence = self._inbox.get_nowait()
            except queue.Empty:
                break
            budget -= len(sequence.prepared.prompt_ids)
            waiting.append(sequence)
        return waiting, budget

    def _drop_stopped(self) -> None:
        for sequence in list(self._active.values()):
            if sequence.stop.is_set():
                sequence.sink.close()
                self._finish(sequence)

    def _finish(self, sequence: Sequence) -> None:
        if self._active.get(sequence.slot) is sequence:
            del self._active[sequence.slot]
            self._release(sequence)

    def _release(self, sequence: Sequence) -> None:
        self._pool.release(sequence.slot)
        sequence.on_release()

    def _fail(self, sequence: Sequence, error: BaseException) -> None:
        sequence.sink.fail(error)
        self._finish(sequence)

    def _admit(self, waiting: list[Sequence]) -> None:
        """Prefills the waiting requests together and chooses their first tokens. When the
        batched forward fails, each is prefilled alone, so a failure stays with its request."""
        sequences = []
        for sequence in waiting:
            if sequence.stop.is_set():
                sequence.sink.close()
                self._release(sequence)
                continue
            sampling = sequence.prepared.sampling
            if not sampling.greedy and sampling.seed is not None:
                device = self._loaded.device
                sequence.generator = torch.Generator(device=device).manual_seed(sampling.seed)
            self._active[sequence.slot] = sequence
            sequences.append(sequence)
        if not sequences:
            return
        if len(sequences) > 1:
            try:
                self._choose(sequences, self._prefill(sequences))
                return
            except Exception:
                log.exception("batched prefill of %d requests failed: one by one", len(sequences))
        for sequence in sequences:
            try:
                self._choose([sequence], self._prefill([sequence]))
            except Exception as e:
                log.exception("prefill of %s failed", sequence.prepared.request_id)
                self._fail(sequence, RequestFailed(f"prefill failed: {e!r}"))

    def _prefill(self, sequences: list[Sequence]) -> torch.Tensor:
        batch = self._pool.prefill_batch(
            [s.slot for s in sequences], [list(s.prepared.prompt_ids) for s in sequences]
        )
        logits = self._passes.prefill(self._loaded.model, self._pool, batch)  # (B, V)
        self._pool.note_use()
        self.prefills += 1
        self.prefilled_requests += len(sequences)
        return logits

    def _step(self) -> None:
        slots = list(self._active)
        tokens = [self._active[s].next_token for s in slots]
        logits = self._passes.decode_step(self._loaded.model, self._pool, slots, tokens)  # (B, V)
        self._pool.note_use()
        self.steps += 1
        self.batched_tokens += len(slots)
        self._choose([self._active[s] for s in slots], logits)

    @torch.inference_mode()
    def _choose(self, sequences: list[Sequence], logits: torch.Tensor) -> None:
        """Chooses each row's next token from logits (B, V) and records it. A row whose logits
        are not finite, or whose sampling or detokenising raises, fails its own request."""
        if self.poison_hook is not None:
            poisoned = [row for row, s in enumerate(sequences) if self.poison_hook(s.prepared)]
            if poisoned:
                logits = logits.clone()
                logits[poisoned] = float("nan")
        finite = torch.isfinite(logits).all(dim=-1).tolist()  # (B,)
        best: list[int] = []
        chosen: list[float] = []
        logprobs: torch.Tensor | None = None
        if any(s.prepared.sampling.greedy for s in sequences):  # one pass for the greedy rows
            logprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
            top = logprobs.argmax(dim=-1)  # (B,)
            best = top.tolist()
            chosen = logprobs.gather(1, top[:, None])[:, 0].tolist()  # (B,)
        likeliest = self._likeliest(sequences, logprobs)
        for row, sequence in enumerate(sequences):
            if not finite[row]:
                error = NonFiniteLogits(
                    f"non-finite logits at generated token {sequence.generated + 1} "
                    "(this request overflows the model)"
                )
                log.warning("request %s failed: %s", sequence.prepared.request_id, error)
                self._fail(sequence, error)
                continue
            try:
                sampling = sequence.prepared.sampling
                alternatives: Alternatives = ()
                if sampling.greedy:
                    token, logprob = best[row], chosen[row]
                    alternatives = likeliest.get(row, ())
                else:
                    token, logprob, alternatives = choose_token_with_top(
                        logits[row],
                        sampling,
                        sequence.generator,
                        sampling.top_logprobs or 0,
                        known_finite=True,  # checked for the whole batch above
                    )
                self._record(sequence, token, logprob, alternatives)
            except Exception as e:
                log.exception("request %s failed", sequence.prepared.request_id)
                self._fail(sequence, RequestFailed(f"choosing or decoding its token: {e!r}"))

    @staticmethod
    def _likeliest(
        sequences: list[Sequence], logprobs: torch.Tensor | None
    ) -> dict[int, Alternatives]:
        """The most likely tokens of the greedy rows that asked for them (top_logprobs), by
        row: one topk over those rows, read back once."""
        rows = [
            row
            for row, s in enumerate(sequences)
            if s.prepared.sampling.greedy and s.prepared.sampling.top_logprobs
        ]
        if not rows or logprobs is None:
            return {}
        k = max(sequences[row].prepared.sampling.top_logprobs or 0 for row in rows)
        values, ids = torch.topk(logprobs[rows], min(k, logprobs.shape[-1]), dim=-1)  # (R, k)
        likeliest = {}
        for row, row_ids, row_values in zip(rows, ids.tolist(), values.tolist(), strict=True):
            wanted = sequences[row].prepared.sampling.top_logprobs or 0
            likeliest[row] = tuple(zip(row_ids[:wanted], row_values[:wanted], strict=True))
        return likeliest

    def _record(
        self,
        sequence: Sequence,
        token: int,
        logprob: float,
        top: Alternatives = (),
    ) -> None:
        sequence.generated += 1
        finish = sequence.prepared.finish_after(token, sequence.generated)
        chunk = sequence.chunks.add(token, logprob, finish, top)
        if chunk is not None:
            sequence.sink.put(chunk)
        if finish is not None:
            sequence.sink.close()
            self._finish(sequence)
        else:
            sequence.next_token = token
