"""`tiermesh bench --target openai`: the bench's seeded open-loop scenario against any
OpenAI-compatible server (the tiermesh gateway, or vLLM elsewhere), reporting time to first
token, inter-token latency, time per output token and end-to-end latency (p50/p90/p99) and
throughput; with `--router`, the gateway's overhead over the direct gRPC router (closed loop at
1 and 64 streams: TTFT p50/p99 added, tokens/s ratio).

Knows OpenAI's SSE chunks (httpx) and the router's SDK; nothing of processes or prices.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from tiermesh.client import AsyncRouterClient, ChatError, DeltaEvent, FinalEvent

from services.bench.scenarios import RequestSequence, Scenario, arrival_times
from services.bench.sse_client import HttpStatusError, SseError, SsePool
from services.common.percentiles import percentile

OVERHEAD_STREAMS = (1, 64)
# the gRPC request that serves the same chat as each gateway model
GRPC_EQUIVALENT: dict[str, dict[str, str]] = {
    "tiermesh-routed": {"mode": "routed"},
    "tiermesh-progressive": {"mode": "progressive"},
    "tiermesh-small": {"mode": "pinned", "tier": "small"},
    "tiermesh-medium": {"mode": "pinned", "tier": "medium"},
    "tiermesh-large": {"mode": "pinned", "tier": "large"},
}


@dataclass
class StreamTiming:
    """One streamed chat as the client saw it; times in seconds since it was sent."""

    scheduled_at_s: float = 0.0
    finished_at_s: float = 0.0
    status: str = "OK"  # OK, HTTP_<code>, a gRPC status name, or CLIENT_ERROR
    error: str = ""
    chunk_times_s: list[float] = field(default_factory=list)  # each chunk with text
    end_s: float | None = None
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "OK" and self.end_s is not None


def _http_client(timeout_s: float, streams: int) -> httpx.AsyncClient:
    # TCP_NODELAY: the request's headers and body go out at once, not 40 ms apart
    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        limits=httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8),
    )
    return httpx.AsyncClient(transport=transport, timeout=timeout_s)


async def openai_stream(
    client: httpx.AsyncClient | SsePool, url: str, model: str, prompt: str, max_tokens: int
) -> StreamTiming:
    """One `stream: true` chat completion, through httpx or the lean SSE client; output tokens
    from the usage chunk when the server sends one, else the number of text chunks."""
    timing = StreamTiming()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    try:
        if isinstance(client, SsePool):
            await _time_events(client.post_events("/chat/completions", body), timing, sent)
        else:
            async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                if response.status_code != 200:
                    timing.status = f"HTTP_{response.status_code}"
                    timing.error = (await response.aread()).decode(errors="replace")[:300]
                    return timing
                await _time_events(_data_lines(response.aiter_lines()), timing, sent)
    except HttpStatusError as e:
        timing.status, timing.error = f"HTTP_{e.status}", e.body.decode(errors="replace")[:300]
    except (httpx.HTTPError, SseError, ValueError) as e:
        timing.status, timing.error = "CLIENT_ERROR", f"{type(e).__name__}: {e}"
    if timing.status == "OK" and not timing.output_tokens:
        timing.output_tokens = len(timing.chunk_times_s)
    return timing


async def _data_lines(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        if line.startswith("data: "):
            yield line[6:]


async def _time_events(events: AsyncIterator[str], timing: StreamTiming, sent: float) -> None:
    """Reads a stream's SSE payloads to its end (so a keep-alive connection is left clean)."""
    async for data in events:
        if data == "[DONE]":
            timing.end_s = time.perf_counter() - sent
        else:
            _read_chunk(json.loads(data), timing, time.perf_counter() - sent)


def _read_chunk(chunk: dict[str, Any], timing: StreamTiming, at_s: float) -> None:
    if "error" in chunk:
        timing.status, timing.error = "STREAM_ERROR", str(chunk["error"].get("message"))
        return
    for choice in chunk.get("choices") or ():
        if (choice.get("delta") or {}).get("content"):
            timing.chunk_times_s.append(at_s)
    usage = chunk.get("usage")
    if usage:
        timing.output_tokens = int(usage.get("completion_tokens", 0))


async def grpc_stream(
    client: AsyncRouterClient, options: dict[str, str], prompt: str, max_tokens: int
) -> StreamTiming:
    """The same chat through the router's SDK, timed the same way (the answer's revision)."""
    timing = StreamTiming()
    sent = time.perf_counter()
    try:
        stream = client.chat_stream(
            prompt, max_tokens=max_tokens, mode=options["mode"], tier=options.get("tier", "")
        )
        async for event in stream:
            if isinstance(event, DeltaEvent) and event.text:
                timing.chunk_times_s.append(time.perf_counter() - sent)
            elif isinstance(event, FinalEvent):
                timing.end_s = time.perf_counter() - sent
                answer = [u for u in event.usage if u.get("revision") == event.revision]
                timing.output_tokens = int(answer[0].get("completion_tokens", 0)) if answer else 0
    except ChatError as e:
        timing.status, timing.error = e.code, e.message
    return timing


async def open_loop(
    send: Callable[[str], Awaitable[StreamTiming]], scenario: Scenario, max_in_flight: int
) -> list[StreamTiming]:
    """The scenario's seeded arrivals and requests, each sent at its time; over max_in_flight
    an arrival is recorded as SHED."""
    arrivals = arrival_times(scenario)
    sequence = RequestSequence(scenario.mix, scenario.seed)
    start = time.perf_counter()
    timings: list[StreamTiming] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(index: int, prompt: str) -> None:
        result = await send(prompt)
        result.scheduled_at_s = timings[index].scheduled_at_s
        result.finished_at_s = time.perf_counter() - start
        timings[index] = result

    for index, at in enumerate(arrivals):
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
        timing = StreamTiming(scheduled_at_s=at)
        timings.append(timing)
        if len(tasks) >= max_in_flight:
            timing.status = "SHED"
            continue
        task = asyncio.create_task(one(index, sequence[index].prompt))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return timings


async def closed_loop(
    send: Callable[[str], Awaitable[StreamTiming]], streams: int, duration_s: float, seed: int
) -> list[StreamTiming]:
    """`streams` clients, each sending its next request as its previous one ends."""
    sequence = RequestSequence({"simple": 1.0}, seed)
    counter = iter(range(10**9))
    start = time.perf_counter()
    timings: list[StreamTiming] = []

    async def client() -> None:
        while time.perf_counter() - start < duration_s:
            at = time.perf_counter() - start
            timing = await send(sequence[next(counter)].prompt)
            timing.scheduled_at_s, timing.finished_at_s = at, time.perf_counter() - start
            timings.append(timing)

    await asyncio.gather(*(client() for _ in range(streams)))
    return timings


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    def q(p: float) -> float | None:
        v = percentile(values, p)
        return None if v is None else round(v * 1000, 2)

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def summarise(timings: Sequence[StreamTiming], warmup_s: float, end_s: float) -> dict[str, Any]:
    """TTFT, ITL (gaps between text chunks), TPOT ((end - first) / (tokens - 1)), E2E, counts
    and throughput of the requests that arrived in [warmup_s, end_s)."""
    measured = [t for t in timings if warmup_s <= t.scheduled_at_s < end_s]
    done = [t for t in measured if t.ok and t.chunk_times_s]
    window = [t for t in done if t.finished_at_s <= end_s] if end_s > warmup_s else done
    span_s = max(1e-9, (end_s - warmup_s) if end_s > warmup_s else 1.0)
    gaps = [b - a for t in done for a, b in zip(t.chunk_times_s, t.chunk_times_s[1:], strict=False)]
    tpot = [
        (t.end_s - t.chunk_times_s[0]) / (t.output_tokens - 1)
        for t in done
        if t.end_s is not None and t.output_tokens > 1
    ]
    errors: dict[str, int] = {}
    for t in measured:
        if not t.ok:
            errors[t.status] = errors.get(t.status, 0) + 1
    tokens = sum(t.output_tokens for t in window)
    return {
        "requests": {"scheduled": len(measured), "completed": len(done), "errors": errors},
        "ttft_ms": _ms([t.chunk_times_s[0] for t in done]),
        "itl_ms": _ms(gaps),
        "tpot_ms": _ms(tpot),
        "e2e_ms": _ms([t.end_s for t in done if t.end_s is not None]),
        "throughput_rps": round(len(window) / span_s, 3),
        "output_tokens_per_s": round(tokens / span_s, 2),
    }


async def run_openai(
    url: str,
    models: Sequence[str],
    scenario: Scenario,
    max_tokens: int,
    timeout_s: float,
    max_in_flight: int,
) -> dict[str, Any]:
    """Every model in turn under the scenario's open-loop schedule."""
    results: dict[str, Any] = {}
    async with _http_client(timeout_s, max_in_flight) as client:
        for model in models:

            async def send(prompt: str, model: str = model) -> StreamTiming:
                return await openai_stream(client, url, model, prompt, max_tokens)

            timings = await open_loop(send, scenario, max_in_flight)
            results[model] = summarise(timings, scenario.warmup_s, scenario.duration_s)
    return {
        "target": "openai",
        "url": url,
        "scenario": scenario.to_json(),
        "max_tokens": max_tokens,
        "models": results,
    }


async def gateway_overhead(
    url: str,
    router: str,
    model: str,
    max_tokens: int,
    timeout_s: float,
    duration_s: float,
    seed: int,
    streams: Sequence[int] = OVERHEAD_STREAMS,
    floor_url: str | None = None,
) -> dict[str, Any]:
    """The same closed-loop load through the gateway and directly through the router, at each
    stream count: TTFT p50/p99 added by the gateway and the tokens/s ratio (gateway / direct).

    At one stream the client alternates between the two request by request; at more, the two
    sides take turns in quarters of the duration (direct, gateway, gateway, direct), so a load
    that drifts on the machine falls on both. A plain http:// gateway is called with the lean
    SSE client (its own cost kept out of the number); https:// with httpx. With `floor_url` (a
    bare relay, services/bench/relay_floor.py) the one-stream round alternates over it too: its
    added TTFT is what any HTTP-to-gRPC relay costs on this host, and `gateway_over_floor_ms`
    what the gateway's own work adds to that."""
    options = GRPC_EQUIVALENT.get(model)
    if options is None:
        raise ValueError(f"--model: no gRPC equivalent of {model!r} to compare against")
    levels: list[dict[str, Any]] = []
    lean = url.startswith("http://")
    http: httpx.AsyncClient | SsePool = (
        SsePool(url) if lean else _http_client(timeout_s, max(streams))
    )
    floor = SsePool(floor_url) if floor_url is not None else None
    try:
        async with AsyncRouterClient(router) as grpc_client:

            async def via_gateway(prompt: str) -> StreamTiming:
                return await openai_stream(http, url, model, prompt, max_tokens)

            async def direct(prompt: str) -> StreamTiming:
                return await grpc_stream(grpc_client, options, prompt, max_tokens)

            async def via_floor(prompt: str) -> StreamTiming:
                assert floor is not None and floor_url is not None
                return await openai_stream(floor, floor_url, model, prompt, max_tokens)

            warmup = min(2.0, duration_s / 4)
            for n in streams:
                if n == 1:
                    sends, names = [direct, via_gateway], ["grpc", "gateway"]
                    if floor is not None:
                        sends.append(via_floor)
                        names.append("relay_floor")
                    timings = await alternating_loop(sends, len(sends) * duration_s, seed)
                    side = {
                        name: summarise(t, warmup, len(sends) * duration_s)
                        for name, t in zip(names, timings, strict=True)
                    }
                else:
                    side = await _in_turns(direct, via_gateway, n, duration_s, warmup, seed)
                level = {"streams": n, **side, **_overhead(side["grpc"], side["gateway"])}
                if "relay_floor" in side:
                    level["floor_ttft_added_ms"] = _added(side["grpc"], side["relay_floor"])
                    level["gateway_over_floor_ms"] = _added(side["relay_floor"], side["gateway"])
                levels.append(level)
    finally:
        if floor is not None:
            floor.close()
        if isinstance(http, SsePool):
            http.close()
        else:
            await http.aclose()
    client = "lean HTTP/1.1 (httptools)" if lean else "httpx"
    return {
        "model": model,
        "router": router,
        "duration_s": duration_s,
        "http_client": client,
        "levels": levels,
    }


async def alternating_loop(
    sends: Sequence[Callable[[str], Awaitable[StreamTiming]]], duration_s: float, seed: int
) -> list[list[StreamTiming]]:
    """One client sending the same prompt through each of `sends` in turn, then the next
    prompt; the timings of each."""
    sequence = RequestSequence({"simple": 1.0}, seed)
    start = time.perf_counter()
    timings: list[list[StreamTiming]] = [[] for _ in sends]
    index = 0
    while time.perf_counter() - start < duration_s:
        prompt = sequence[index].prompt
        index += 1
        for send, out in zip(sends, timings, strict=True):
            at = time.perf_counter() - start
            timing = await send(prompt)
            timing.scheduled_at_s, timing.finished_at_s = at, time.perf_counter() - start
            out.append(timing)
    return timings


async def _in_turns(
    direct: Callable[[str], Awaitable[StreamTiming]],
    gateway: Callable[[str], Awaitable[StreamTiming]],
    streams: int,
    duration_s: float,
    warmup_s: float,
    seed: int,
) -> dict[str, Any]:
    """Closed loops of `streams` clients in quarters: direct, gateway, gateway, direct; each
    side's two halves summarised together (throughput over its whole measured time)."""
    quarter = duration_s / 2
    runs: dict[str, list[list[StreamTiming]]] = {"grpc": [], "gateway": []}
    for name in ("grpc", "gateway", "gateway", "grpc"):
        send = direct if name == "grpc" else gateway
        runs[name].append(await closed_loop(send, streams, quarter, seed))
    # each half's measured time is [warmup, quarter); the second is laid after the first
    warmup, measured = warmup_s / 2, quarter - warmup_s / 2
    side: dict[str, Any] = {}
    for name, halves in runs.items():
        merged: list[StreamTiming] = []
        for offset, half in enumerate(halves):
            for timing in half:
                if timing.scheduled_at_s >= warmup:
                    timing.scheduled_at_s += offset * measured
                    timing.finished_at_s += offset * measured
                    merged.append(timing)
        side[name] = summarise(merged, warmup, warmup + 2 * measured)
    return side


def _added(base: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """TTFT p50 and p99 of `other` minus `base`'s (ms)."""

    def added(q: str) -> float | None:
        a, b = other["ttft_ms"][q], base["ttft_ms"][q]
        return None if a is None or b is None else round(a - b, 2)

    return {"p50": added("p50"), "p99": added("p99")}


def _overhead(direct: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    base = direct["output_tokens_per_s"]
    ratio = round(gateway["output_tokens_per_s"] / base, 3) if base else None
    return {"ttft_added_ms": _added(direct, gateway), "tokens_per_s_ratio": ratio}
