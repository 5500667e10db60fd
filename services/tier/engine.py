"""The engine interface a tier serves from, and the plain types that cross it.

An engine turns a prompt into a stream of token chunks. It knows nothing of gRPC: the tier
servicer translates. Implementations: `torch_engine.TorchEngine` (CPU or CUDA) and
`tensorrt_llm_engine.TensorRtLlmEngine` (NVIDIA GPUs), chosen by `factory.create_engine`; both
build on `engine_lifecycle.EngineLifecycle`, which owns what they share around decoding.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. The defaults mean greedy decoding."""

    temperature: float = 0.0  # 0 = argmax; else softmax(logits / temperature), in [0.05, 2]
    top_p: float = 1.0  # nucleus mass kept, range (0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    seed: int | None = None  # seeds the sampler for reproducible output; None = unseeded
    stop: tuple[str, ...] = ()  # stop sequences: the text ends before the first (stop_sequences)
    # per-token detail (TokenLogprob on each chunk) with this many alternatives; None = none
    top_logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to produce. Already validated against the tier's limits by the caller."""

    request_id: str
    max_tokens: int  # >= 1
    prompt: str = ""  # raw prompt, used when messages is empty
    messages: tuple[tuple[str, str], ...] = ()  # (role, content), rendered by the chat template
    sampling: Sampling = field(default_factory=Sampling)
    tokens_per_chunk: int = 0  # 0 = the engine's default
    deadline_s: float | None = None  # seconds the caller has left when it arrives; None = none
    continue_ids: tuple[int, ...] = ()  # answer tokens already streamed (another replica's)
    continue_chars: int | None = None  # characters of their text the caller has; None = all
    # their log-probabilities (with sampling.top_logprobs), for the entries of those whose
    # text the caller does not have yet; () = not known
    continue_logprobs: tuple[float, ...] = ()
    # max_tokens is an upper bound the prompt may lower to what the model's context has left
    fit_to_context: bool = False
    # its place in the wait queue: "critical", "interactive" or "batch" (queue_order.py)
    priority: str = "interactive"


@dataclass(frozen=True)
class EnginePhases:
    """What an engine with a scheduler of its own (vLLM) measured of one request inside it, after
    the tier gave it a running slot: its wait for the engine's scheduler, prefill and decode
    (ms, the engine's clock), how often it was preempted (its KV cache taken back and recomputed
    later) and how many prompt tokens its prefix cache already held."""

    scheduler_wait_ms: float
    prefill_ms: float
    decode_ms: float
    preemptions: int
    cached_prompt_tokens: int


@dataclass(frozen=True)
class GenerationUsage:
    prompt_tokens: int
    completion_tokens: int
    queue_ms: float  # waiting for a running slot
    ttft_ms: float  # from generate() being called to the first token
    total_ms: float  # from generate() being called to the last token
    engine_phases: EnginePhases | None = None  # None = the engine measures none of its own


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a step: its id, its text alone, its log-probability.
    (The SDK's tiermesh.client.TopLogprob has the same fields; engines stay free of gRPC.)"""

    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token for a caller that asked for per-token detail: the text it adds to
    the stream (empty inside a split character), its log-probability, and the most likely
    tokens at its step, most likely first."""

    text: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class GenerationChunk:
    """Tokens produced since the previous chunk. The last chunk has finish_reason and usage."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]  # natural-log probability of each token, same order
    finish_reason: str | None = None  # "stop" or "length", on the last chunk only
    usage: GenerationUsage | None = None
    # the model that answered (the load snapshot's model), on the first chunk that carries a
    # token and on the last chunk: a stream that began before a model swap names the old model
    model: str = ""
    model_fingerprint: str = ""  # with model: its checkpoint's fingerprint ("" if none)
    # with sampling.top_logprobs: the tokens whose text ends in this chunk, in order
    token_logprobs: tuple[TokenLogprob, ...] = ()
    stop_sequence: str = ""  # on the last chunk, the stop sequence that ended the answer
    # on the last chunk, from an engine that measures them (the tier's usage carries them on)
    engine_phases: EnginePhases | None = None


@dataclass(frozen=True)
class EngineLoad:
    """A snapshot of the engine's load and capacity (the signal routers read)."""

    model: str
    device: str
    serving: bool
    running: int
    max_running: int
    queued: int
    max_queued: int
    ttft_ms_p50: float
    ttft_ms_p99: float
    kv_pool_capacity_tokens: int
    kv_pool_used_tokens: int
    kv_pool_peak_tokens: int
    weights_bytes: int
    kv_pool_bytes: int
    completed: int
    rejected: int
    params: int
    max_prompt_tokens: int
    max_tokens: int
    # share of the last 5 s the batched decode loop spent in forward passes, in [0, 1]; 0 when
    # the engine has no such loop
    decode_busy_share: float = 0.0
    model_fingerprint: str = ""  # the checkpoint's (model_fingerprint.py); "" for no folder
    # admission's expected wait for a running slot of a request arriving now, and the longest
    # it queues one for (a longer expected wait is refused at once); 0 when unknown
    expected_wait_ms: float = 0.0
    max_wait_ms: float = 0.0
    # the engine's own scheduler at its last step (vllm; 0 for engines without one): requests
    # it runs and those it holds unscheduled; and the share of prompt tokens its prefix cache
    # held over its recent requests
    engine_running: int = 0
    engine_waiting: int = 0
    prefix_cache_hit_rate: float = 0.0
    queued_batch: int = 0  # of `queued`, batch requests (those of a higher priority go first)
    paused: int = 0  # batch requests paused for critical ones (not in `running`)


class Engine(Protocol):
    """What the tier servicer needs from an engine.

    All methods are called from the tier's event loop. generate() may be consumed by many tasks
    at once; closing its iterator early (the client left) must abort the request's work.
    """

    name: str  # the engine: "torch", "openai", "tensorrt_llm" or "echo"

    async def start(self) -> None:
        """Loads the model. Raises on failure; the tier stays NOT_SERVING."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Streams the completion of one request.

        Raises InvalidArgument (prompt too long), Overloaded (admission queue full, or the
        request could not start within its deadline or the queue's longest wait; with a retry
        delay) or Unavailable (not started, or shutting down) before the first chunk.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stops a request's generation; its stream ends. Unknown ids are ignored."""

    def load(self) -> EngineLoad:
        """The current load snapshot. Cheap; safe to call often."""
        ...

    def check_health(self) -> None:
        """Raises Unavailable if the engine cannot serve."""

    async def shutdown(self) -> None:
        """Aborts what is running and frees the model."""
