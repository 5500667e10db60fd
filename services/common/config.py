"""Typed service configuration: each service's fields, their defaults and their checks, loaded
from TOML and validated at start-up by config_loading.py (every error names the file and the
field). Knows nothing of what the services do with the values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from services.common.config_loading import require
from services.common.tiers import TIER_NAMES

ENGINES = ("torch", "tensorrt_llm", "echo", "openai", "vllm")
POLICIES = ("interim_heuristic", "keyword", "threshold", "cost_target", "adaptive")
GATES = ("always", "race", "cascade", "escalate")
OVERLOAD_MODES = ("step_down", "shed")


@dataclass(frozen=True)
class TierConfig:
    """One model tier: which model, on which engine, with which limits."""

    name: str  # "small", "medium" or "large"
    model_path: Path  # local Hugging Face folder; relative paths are relative to the config file
    # "torch", "tensorrt_llm", "echo" (no model: load tests) or "openai" (a remote server)
    engine: str = "torch"
    device: str = "cpu"  # "cpu", "cuda", "cuda:N"
    dtype: str = "float32"  # weights in "float32", "bfloat16" or "float16"
    # "lazy": weights memory-mapped from the safetensors files (no copy; pages read when used);
    # "eager": transformers' from_pretrained, every tensor copied (README, Serving your own models)
    weights_loading: str = "lazy"
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port (tests)
    max_running: int = 4  # requests decoding at once (critical ones: up to running_slots)
    max_queued: int = 16  # admitted requests waiting for a slot; past it RESOURCE_EXHAUSTED
    # the longest expected wait for a slot a request is queued for (a shorter deadline of its
    # own bounds it too); one expected to wait longer is refused at once with the wait as its
    # retry delay
    max_wait_s: float = 5.0
    # running slots beyond max_running that only critical requests may take, as a share of
    # max_running (rounded down), so one starts at once while interactive and batch fill
    # max_running; 0 = none (the built-in tiers keep 1.0: as many again)
    critical_reserve: float = 0.0
    max_tokens: int = 256  # most tokens one request may generate
    max_prompt_tokens: int = 512  # longest rendered prompt accepted, in tokens
    tokens_per_chunk: int = 4  # tokens per streamed chunk after the first
    torch_threads: int = 1  # torch intra-op threads for this process
    # nice levels the model's compute threads (load, batch loop, decode) run below the tier's
    # own gRPC and event-loop threads, so admission, refusals and streaming never wait on a
    # decode step for a CPU; 0 = the same priority
    compute_nice: int = 5
    batching: bool = True  # continuous batching over a KV-cache pool (GPT-2 models), else
    # one decode thread per request with its own growing cache
    kv_max_len: int = 0  # positions per KV-cache pool slot; 0 = the model's context length
    # batching: a critical request is prefilled the moment it arrives, on a thread of its own at
    # the serving threads' priority, beside the batch's pass under way (its first token waits
    # for no other pass); false = it waits for the loop's next plan like the others
    critical_lane: bool = True
    # batching: when every running slot is taken, a critical request pauses the newest batch
    # request running (it keeps its KV-cache slot and goes on where it was once a slot frees)
    # instead of waiting; up to critical_slots at once, so the KV pool holds that many more
    critical_pauses_batch: bool = True
    prefill_tokens_per_step: int = 512  # batching: prompt tokens prefilled between decode steps
    # tensorrt_llm only: share of free GPU memory for the KV cache when kv_max_len is 0, and
    # the most tokens one scheduler iteration may process (0 = the library's default)
    kv_free_gpu_memory_fraction: float = 0.85
    max_num_tokens: int = 0
    drain_grace_s: float = 10.0  # on SIGTERM, how long in-flight streams may finish
    metrics_port: int = 0  # Prometheus scrape endpoint (on $TIERMESH_METRICS_HOST); 0 = off
    # echo only (model_path is ignored): time to the first token after a running slot is
    # free, and tokens per second after it per stream (0 = as fast as the loop goes)
    echo_ttft_ms: float = 10.0
    echo_tokens_per_s: float = 100.0
    # openai only (model_path is ignored): the remote OpenAI-compatible server's API base,
    # http(s)://HOST:PORT/v1 (one server: a tier's replicas are one process per URL)
    remote_url: str = ""
    remote_model: str = ""  # the served model's name; "" = the first that /v1/models lists
    # the environment variable holding the server's API key (sent as Bearer); "" = no key
    remote_api_key_env: str = ""
    remote_ca_file: Path = Path("")  # CA bundle (PEM) that signs an https server; "" = system's
    # ask for the answer's token ids (vLLM's `return_token_ids`); off for a server that refuses
    # fields it does not know (the tier then streams text with counts from the usage)
    remote_token_ids: bool = True
    # vllm only: the interpreter of the environment holding vLLM (`make setup-vllm`); "" =
    # $TIERMESH_VLLM_PYTHON, else .venv-vllm/bin/python in the checkout. The rest go to vLLM's
    # engine arguments as they are (0 or "" = vLLM's default; max_num_seqs 0 = max_running)
    vllm_python: str = ""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str = ""  # "mp" or "ray"; "" = vLLM's choice
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 0  # 0 = the model's context length
    max_num_seqs: int = 0
    enable_prefix_caching: bool = True
    quantization: str = ""
    # on CPU: GiB of memory for vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)
    cpu_kvcache_space_gib: float = 2.0

    @property
    def critical_slots(self) -> int:
        """Running slots beyond max_running kept for critical requests."""
        return int(self.max_running * self.critical_reserve)

    @property
    def running_slots(self) -> int:
        """The most requests decoding at once: max_running, plus the critical slots (= the
        KV-cache pool's slots when batching)."""
        return self.max_running + self.critical_slots

    def validate(self) -> None:
        require(self.name in TIER_NAMES, "name", f"must be one of {', '.join(TIER_NAMES)}")
        require(self.engine in ENGINES, "engine", f"must be one of {', '.join(ENGINES)}")
        require(self.dtype in ("float32", "bfloat16", "float16"), "dtype", "unknown dtype")
        require(
            self.weights_loading in ("lazy", "eager"), "weights_loading", "must be lazy or eager"
        )
        require(0 <= self.port <= 65535, "port", "must be in [0, 65535]")
        for name in ("max_running", "max_tokens", "max_prompt_tokens", "torch_threads"):
            require(getattr(self, name) >= 1, name, "must be >= 1")
        require(self.max_queued >= 0, "max_queued", "must be >= 0")
        require(0 <= self.compute_nice <= 19, "compute_nice", "must be in [0, 19]")
        require(1 <= self.tokens_per_chunk <= 64, "tokens_per_chunk", "must be in [1, 64]")
        require(self.drain_grace_s >= 0, "drain_grace_s", "must be >= 0")
        require(self.kv_max_len >= 0, "kv_max_len", "must be >= 0")
        require(self.prefill_tokens_per_step >= 1, "prefill_tokens_per_step", "must be >= 1")
        require(
            0.0 < self.kv_free_gpu_memory_fraction <= 1.0,
            "kv_free_gpu_memory_fraction",
            "must be in (0, 1]",
        )
        require(self.max_num_tokens >= 0, "max_num_tokens", "must be >= 0")
        require(self.echo_ttft_ms >= 0, "echo_ttft_ms", "must be >= 0")
        require(self.echo_tokens_per_s >= 0, "echo_tokens_per_s", "must be >= 0")
        if self.engine == "openai":
            require(
                _is_remote_url(self.remote_url),
                "remote_url",
                f"must be one http(s)://HOST[:PORT]/v1 URL for engine openai, got "
                f"{self.remote_url!r}",
            )
        require(0.0 <= self.critical_reserve <= 1.0, "critical_reserve", "must be in [0, 1]")
        require(self.max_wait_s > 0, "max_wait_s", "must be > 0")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            require(getattr(self, name) >= 1, name, "must be >= 1")
        require(
            self.distributed_executor_backend in ("", "mp", "ray"),
            "distributed_executor_backend",
            'must be "mp" or "ray" (or "" for vLLM\'s choice)',
        )
        require(
            0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization", "must be in (0, 1]"
        )
        for name in ("max_model_len", "max_num_seqs"):
            require(getattr(self, name) >= 0, name, "must be >= 0")
        require(self.cpu_kvcache_space_gib > 0, "cpu_kvcache_space_gib", "must be > 0")
        require(
            not self.remote_api_key_env or self.remote_api_key_env.isidentifier(),
            "remote_api_key_env",
            f"must be an environment variable's name, got {self.remote_api_key_env!r}",
        )


@dataclass(frozen=True)
class RouterConfig:
    """The router: where the tiers are, its limits and its progressive defaults."""

    tiers: dict[str, str] = field(
        default_factory=lambda: {
            "small": "127.0.0.1:50061",
            "medium": "127.0.0.1:50062",
            "large": "127.0.0.1:50063",
        }
    )  # tier name -> gRPC target: "host:port", several "host:port" separated by commas (the
    # tier's replicas; the router balances over them by load), or "xds:///tier-small"
    host: str = "127.0.0.1"
    port: int = 50051
    policy: str = "interim_heuristic"  # routing policy for MODE_ROUTED (see POLICIES)
    complexity_model: Path = Path("")  # predictor artifact; empty = the committed one
    max_inflight: int = 256  # chats at once; past it RESOURCE_EXHAUSTED
    default_max_tokens: int = 128  # when a request leaves max_tokens unset
    max_tokens: int = 256  # most a request may ask for
    max_prompt_chars: int = 8000  # longest prompt (all messages) accepted
    draft_tier: str = "small"  # progressive: the fast tier streamed first
    refine_tier: str = "large"  # progressive: the strong tier whose answer replaces the draft
    refine_budget_ms: int = 30000  # progressive: refinement must finish within this or is dropped
    drain_grace_s: float = 10.0
    metrics_port: int = 0  # Prometheus scrape endpoint (on $TIERMESH_METRICS_HOST); 0 = off
    # Load-aware fallback: where a request goes when its tier is over its TTFT SLO or full.
    fallback: dict[str, str] = field(
        default_factory=lambda: {"small": "medium", "medium": "large", "large": "medium"}
    )
    ttft_slo_ms: dict[str, float] = field(default_factory=dict)  # per tier; absent = no SLO
    first_token_timeout_ms: int = 0  # start the fallback tier if no token by then; 0 = off
    load_watch_interval_ms: int = 250  # how often tiers push their load to the router
    # Health-aware routing: a tier whose last load report is older than this, whose WatchLoad
    # or health stream broke, or whose health says NOT_SERVING (draining) takes no new calls.
    load_stale_ms: int = 1000
    # Passive ejection (outlier detection): after this many consecutive failed calls a tier is
    # ejected for ejection_base_ms x 2^(times ejected before), at most ejection_max_ms; then
    # one probe call is let through, and its outcome ends or renews the ejection.
    eject_after_failures: int = 3
    ejection_base_ms: int = 1000
    ejection_max_ms: int = 30000
    # Deadlines: a tier call carries the client's remaining deadline, or this when the client
    # set none; a call with no chunk for stall_timeout_ms (first chunk included) has failed.
    tier_call_timeout_s: float = 300.0
    # a chat that finds every tier able to take it still loading its model waits (within its
    # deadline) this long for one to be SERVING, instead of failing at once
    loading_wait_s: float = 60.0
    stall_timeout_ms: int = 10000
    large_queue_limit: int = 8  # threshold policies: large only while its queue is shorter
    # ...and past it, the fallback tier only for a request the predictor gives at least this
    # chance of being answered there (0 = always fall back); others stay queued on large
    queue_fallback_min_success: float = 0.5
    # Relative cost per output token of each tier (large = 1), for cost-aware policies.
    tier_costs: dict[str, float] = field(
        default_factory=lambda: {"small": 0.05, "medium": 0.25, "large": 1.0}
    )
    adaptive_cost_weight: float = 0.3  # adaptive: reward = quality - weight x cost
    adaptive_exploration: float = 1.0  # adaptive: LinUCB exploration bonus (x its std. error)
    # Progressive gate: "always" refines; "race" starts both and cancels the refinement when
    # the draft is confident; "cascade" starts the refinement only when the draft is unsure;
    # "escalate" picks the first tier by the complexity score (small below
    # escalate_small_below, medium below escalate_medium_below, else large) and sends an answer
    # less sure than its tier's escalate_*_confidence on to the next tier up (escalation.py)
    progressive_gate: str = "escalate"
    min_draft_confidence: float = 0.9  # geometric-mean token probability of a confident draft
    escalate_small_below: float = 0.2
    escalate_medium_below: float = 1.01  # over 1: never large first
    escalate_small_confidence: float = 0.945
    escalate_medium_confidence: float = 0.99
    # A routed chat whose tier cannot start it in time: "step_down" serves it from the next
    # smaller tier able to (else a larger one), by priority; "shed" leaves it to the fallback
    # chain and refuses it when every tier is full.
    overload: str = "step_down"
    # an interactive chat steps down when its tier expects to start it later than this
    interactive_wait_budget_ms: float = 1000.0
    # under load (its tier could not start it in time), a routed interactive or batch chat that
    # left max_tokens unset runs with at most this many (answers hold their slots for less, so
    # queues drain faster); 0 = never lowered
    overload_max_tokens: int = 0

    def validate(self) -> None:
        for tier, target in self.tiers.items():
            require(tier in TIER_NAMES, "tiers", f"unknown tier {tier!r}")
            parts = [part.strip() for part in target.split(",")]
            require(all(parts), "tiers", f"{tier}: empty address in {target!r}")
            require(
                len(parts) == 1 or not target.startswith("xds:"),
                "tiers",
                f"{tier}: an xds:/// target stands alone (xDS balances its endpoints)",
            )
        for name in ("draft_tier", "refine_tier"):
            require(getattr(self, name) in self.tiers, name, "must be a configured tier")
        require(0 <= self.port <= 65535, "port", "must be in [0, 65535]")
        for name in ("max_inflight", "default_max_tokens", "max_tokens", "max_prompt_chars"):
            require(getattr(self, name) >= 1, name, "must be >= 1")
        require(
            self.default_max_tokens <= self.max_tokens,
            "default_max_tokens",
            "must be <= max_tokens",
        )
        require(self.refine_budget_ms >= 1, "refine_budget_ms", "must be >= 1")
        require(self.policy in POLICIES, "policy", f"must be one of {', '.join(POLICIES)}")
        require(self.progressive_gate in GATES, "progressive_gate", f"one of {', '.join(GATES)}")
        require(0.0 <= self.min_draft_confidence <= 1.0, "min_draft_confidence", "in [0, 1]")
        for name in ("escalate_small_confidence", "escalate_medium_confidence"):
            require(0.0 <= getattr(self, name) <= 1.0, name, "must be in [0, 1]")
        require(
            0.0 <= self.escalate_small_below <= self.escalate_medium_below,
            "escalate_small_below",
            "must be in [0, escalate_medium_below]",
        )
        require(self.overload in OVERLOAD_MODES, "overload", f"one of {', '.join(OVERLOAD_MODES)}")
        require(self.interactive_wait_budget_ms > 0, "interactive_wait_budget_ms", "must be > 0")
        require(
            0 <= self.overload_max_tokens <= self.max_tokens,
            "overload_max_tokens",
            "must be in [0, max_tokens]",
        )
        for name in ("fallback", "ttft_slo_ms", "tier_costs"):
            for tier in getattr(self, name):
                require(tier in TIER_NAMES, name, f"unknown tier {tier!r}")
        for tier in self.fallback.values():
            require(tier in TIER_NAMES, "fallback", f"unknown tier {tier!r}")
        require(self.first_token_timeout_ms >= 0, "first_token_timeout_ms", "must be >= 0")
        require(
            50 <= self.load_watch_interval_ms <= 60000, "load_watch_interval_ms", "in [50, 60000]"
        )
        require(
            self.load_stale_ms > self.load_watch_interval_ms,
            "load_stale_ms",
            "must be > load_watch_interval_ms",
        )
        require(self.eject_after_failures >= 1, "eject_after_failures", "must be >= 1")
        require(self.ejection_base_ms >= 1, "ejection_base_ms", "must be >= 1")
        require(
            self.ejection_max_ms >= self.ejection_base_ms,
            "ejection_max_ms",
            "must be >= ejection_base_ms",
        )
        require(self.tier_call_timeout_s > 0, "tier_call_timeout_s", "must be > 0")
        require(self.loading_wait_s >= 0, "loading_wait_s", "must be >= 0")
        require(self.stall_timeout_ms >= 1, "stall_timeout_ms", "must be >= 1")
        require(self.large_queue_limit >= 0, "large_queue_limit", "must be >= 0")
        require(
            0.0 <= self.queue_fallback_min_success <= 1.0,
            "queue_fallback_min_success",
            "must be in [0, 1]",
        )


@dataclass(frozen=True)
class GatewayConfig:
    """The HTTP gateway: where it listens and which router it calls over gRPC."""

    host: str = "127.0.0.1"
    port: int = 8080  # 0 = any free port (tests)
    router: str = "127.0.0.1:50051"  # the router's gRPC target
    timeout_s: float = 120.0  # deadline of one chat's router call
    retry_after_s: int = 1  # Retry-After on a 429 when the router gives no hint
    drain_grace_s: float = 10.0  # on SIGTERM, how long in-flight responses may finish
    # browser origins (scheme://host[:port], or "*") the API answers cross-origin (CORS);
    # empty: same origin only (the chat page), and no CORS work per request
    cors_origins: tuple[str, ...] = ()
    # the most choices (`n`) one chat completion may ask for; each is one router chat
    max_choices: int = 8
    # Connections (services/gateway/connections.py). A request's headers must be in within
    # header_timeout_s of the connection opening (of the first byte, for a later request on a
    # kept-alive connection), its body within body_timeout_s of its headers; else it is
    # closed (408 for a body). A kept-alive connection idle for keepalive_timeout_s is closed.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 5.0
    # open connections at once (lowered at start to stay under the open files limit), and from
    # one client address; past either a new connection is refused: 503 with Retry-After if its
    # request comes within a second, else closed. At max_connections the connection idle longest
    # (no request in progress, for 0.5 s at least) is closed first to make room.
    max_connections: int = 4096
    max_connections_per_client: int = 512

    def validate(self) -> None:
        require(0 <= self.port <= 65535, "port", "must be in [0, 65535]")
        require(1 <= self.max_choices <= 128, "max_choices", "must be in [1, 128]")
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            require(getattr(self, name) > 0, name, "must be > 0")
        for name in ("max_connections", "max_connections_per_client"):
            require(getattr(self, name) >= 1, name, "must be >= 1")
        require(bool(self.router), "router", "must be a gRPC target")
        for i, origin in enumerate(self.cors_origins):
            problem = _origin_problem(origin)
            require(problem is None, f"cors_origins[{i}]", f"{problem}, got {origin!r}")
        require(self.timeout_s > 0, "timeout_s", "must be > 0")
        require(self.retry_after_s >= 0, "retry_after_s", "must be >= 0")
        require(self.drain_grace_s >= 0, "drain_grace_s", "must be >= 0")


def _origin_problem(origin: str) -> str | None:
    """None for `*` or an origin as browsers send it (http(s)://host[:port], lower case), else
    what is wrong with it."""
    if origin == "*":
        return None
    wanted = "must be http(s)://host[:port] as a browser sends it, or *"
    try:
        parts = urlsplit(origin)
        port = parts.port  # raises past 65535
    except ValueError:
        return wanted
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return wanted
    if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return f"{wanted} (no path, query or user)"
    if port == 0 or origin != origin.lower():
        return f"{wanted} (lower case, port 1-65535): browsers compare origins exactly"
    return None


def _is_remote_url(url: str) -> bool:
    """Whether `url` is one http(s) URL with a host (and a port in 1-65535, if any)."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises past 65535
    except ValueError:
        return False
    one = "," not in url and port != 0
    return one and parts.scheme in ("http", "https") and bool(parts.hostname)
