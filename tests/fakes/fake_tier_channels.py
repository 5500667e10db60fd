"""A FAKE of the router's TierClient (services/router/tier_calls.py) for unit tests of the chat
session: each tier answers with a scripted stream of GenerateChunks, with delays, or fails with a
gRPC status; every call records its metadata, and whether it was cancelled, ran past its
deadline or completed. Time is the event loop's; no processes, no sockets, no model. A call
that continues an answer (continue_token_ids) skips the script's first chunks, one per token
given, as a tier continuing after those tokens would.

Like a real call, a fake call runs from the moment it is made: a script's delays count from the
call's start, so a stream read late yields what is already due at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass

import grpc
from tiermesh.v1 import common_pb2, tier_pb2


@dataclass(frozen=True)
class Step:
    """One scripted event of a call, `after_s` after the previous one (or the call's start)."""

    after_s: float
    chunk: tier_pb2.GenerateChunk | None = None
    error: grpc.StatusCode | None = None  # set: the call fails here with this status
    details: str = ""


def answer(
    pieces: Sequence[str],
    *,
    every_s: float = 0.0,
    first_after_s: float = 0.0,
    logprob: float = -0.1,
    finish_reason: str = "stop",
) -> list[Step]:
    """A call that streams `pieces` (one chunk each, a token per piece) and finishes; every
    token has log-probability `logprob` (-0.1 is a confident draft, -2.0 an unsure one)."""
    steps = []
    for i, text in enumerate(pieces):
        chunk = tier_pb2.GenerateChunk(text=text, token_ids=[100 + i], logprobs=[logprob])
        if i == len(pieces) - 1:
            chunk.finish_reason = finish_reason
            chunk.usage.CopyFrom(common_pb2.Usage(prompt_tokens=5, completion_tokens=len(pieces)))
        steps.append(Step(first_after_s if i == 0 else every_s, chunk=chunk))
    return steps


def failure(code: grpc.StatusCode, details: str, after_s: float = 0.0) -> list[Step]:
    """A call that fails with `code` after `after_s`, before any output."""
    return [Step(after_s, error=code, details=details)]


def broken(
    pieces: Sequence[str], code: grpc.StatusCode, details: str, *, then_after_s: float = 0.0
) -> list[Step]:
    """A call that streams `pieces` (no finish) and then, `then_after_s` later, fails with
    `code`: a tier dying mid-answer."""
    streamed = answer(pieces)
    last = streamed[-1].chunk
    assert last is not None
    last.ClearField("finish_reason")
    last.ClearField("usage")
    return [*streamed, Step(then_after_s, error=code, details=details)]


def silent_after(pieces: Sequence[str], silent_s: float) -> list[Step]:
    """A call that streams `pieces` (no finish) and then sends nothing for `silent_s`: a hung
    tier."""
    return broken(pieces, grpc.StatusCode.UNAVAILABLE, "never seen", then_after_s=silent_s)


def _continued(steps: list[Step], tokens: int) -> list[Step]:
    """The script after its first `tokens` chunks (a token each), with usage counted as a tier
    continuing after them counts it (the given tokens are prompt)."""
    if not tokens:
        return steps
    skipped = [i for i, step in enumerate(steps) if step.chunk is not None][:tokens]
    rest = steps[skipped[-1] + 1 :] if skipped else steps
    out = []
    for step in rest:
        if step.chunk is not None and step.chunk.HasField("usage"):
            chunk = tier_pb2.GenerateChunk()
            chunk.CopyFrom(step.chunk)
            chunk.usage.prompt_tokens += tokens
            chunk.usage.completion_tokens -= tokens
            step = Step(step.after_s, chunk=chunk)
        out.append(step)
    return out


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class FakeGenerateStream:
    """One scripted call; satisfies tier_calls.GenerateStream."""

    def __init__(
        self,
        tier: str,
        request: tier_pb2.GenerateRequest,
        steps: Sequence[Step],
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> None:
        self.tier = tier
        self.endpoint = tier  # the replica it went to
        self.request = request
        self.metadata = list(metadata)
        self.timeout_s = timeout_s
        self._steps = _continued(list(steps), len(request.continue_token_ids))
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._deadline = None if timeout_s is None else self._start + timeout_s
        self._ends_at = self._start + sum(step.after_s for step in self._steps)
        self._woken = asyncio.Event()
        self.cancelled = False  # the router cancelled it while it ran upstream
        self.read_to_end = False  # the router read every scripted step

    @property
    def deadline_exceeded(self) -> bool:
        return (
            not self.cancelled
            and self._deadline is not None
            and self._deadline < self._ends_at
            and self._loop.time() >= self._deadline
        )

    @property
    def stopped_upstream(self) -> bool:
        """The tier's work was cut short: cancelled, or ended by its deadline."""
        return self.cancelled or self.deadline_exceeded

    def done(self) -> bool:
        return self.cancelled or self.deadline_exceeded or self._loop.time() >= self._ends_at

    def cancel(self) -> bool:
        if self.done():
            return False
        self.cancelled = True
        self._woken.set()
        return True

    def __aiter__(self) -> AsyncIterator[tier_pb2.GenerateChunk]:
        return self._run()

    async def _run(self) -> AsyncIterator[tier_pb2.GenerateChunk]:
        due = self._start
        for step in self._steps:
            due += step.after_s
            await self._wait_until(due)
            if step.error is not None:
                raise rpc_error(step.error, step.details)
            assert step.chunk is not None
            yield step.chunk
        self.read_to_end = True

    async def _wait_until(self, due: float) -> None:
        """Sleeps until `due`; raises as the real call would once cancelled or past deadline."""
        until = due if self._deadline is None else min(due, self._deadline)
        delay = until - self._loop.time()
        if delay > 0 and not self.cancelled:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), delay)
        if self.cancelled:
            raise rpc_error(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
        if self._deadline is not None and due > self._deadline:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


class FakeTierChannels:
    """Satisfies tier_calls.TierClient: each tier answers with its script (several calls to a
    tier each get the whole script). A tier has one replica named as the tier, or those given in
    `replicas`; a script keyed by a replica's name is that replica's alone. A new call goes to
    the first replica not yet tried. `calls` holds every call made, by tier."""

    def __init__(
        self,
        scripts: Mapping[str, Sequence[Step]],
        replicas: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.scripts = dict(scripts)
        self.replicas = {tier: tuple(names) for tier, names in (replicas or {}).items()}
        self.calls: dict[str, list[FakeGenerateStream]] = {}

    def endpoints(self, tier: str) -> tuple[str, ...]:
        return self.replicas.get(tier, (tier,))

    def pick(self, tier: str, avoid: Collection[str]) -> str | None:
        return next((e for e in self.endpoints(tier) if e not in avoid), None)

    def generate(
        self,
        tier: str,
        endpoint: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> FakeGenerateStream:
        script = self.scripts.get(endpoint, self.scripts.get(tier))
        assert script is not None, f"no script for {endpoint} of {tier}"
        stream = FakeGenerateStream(tier, request, script, timeout_s, metadata)
        stream.endpoint = endpoint
        self.calls.setdefault(tier, []).append(stream)
        return stream

    def call(self, tier: str) -> FakeGenerateStream:
        """The one call made to `tier`."""
        calls = self.calls.get(tier, [])
        assert len(calls) == 1, f"{len(calls)} calls to {tier}"
        return calls[0]
