"""Measures what mTLS costs on the router hop: time to the first token and tokens/s of the same
requests over plaintext and over TLS (client -> router) + mTLS (router -> tier), side by side
in one run, and with an API key checked at the router on top.

Starts, as separate processes: a plaintext small tier and router, and a secure small tier
(accepting only the router's certificate) with two secure routers (one also enforcing API
keys), all on a fresh development CA. Every request kind runs interleaved so machine noise hits
them alike. The small tier is an echo tier (10 ms to the first token, then as fast as it goes,
no model) unless `--model` gives a model folder. Prints p50/p99 time to first token and
tokens/s per path; `--json` adds one JSON object as the last line. Processes are started,
waited for and stopped as scripts/hop_latency.py does (services.common.child_process, .serving).

    .venv/bin/python scripts/mtls_cost.py [--requests 100] [--max-tokens 64] [--model PATH]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table
from tiermesh.v1 import router_pb2, router_pb2_grpc, tier_pb2, tier_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hop_latency import (
    PROMPT,
    ROOT,
    _has_token,
    router_command,
    wait_all_serving,
)

from services.common.child_process import spawn, stop_processes
from services.common.percentiles import percentile
from services.common.ports import free_port
from services.common.serving import NotServingError
from services.launcher.echo_tiers import EchoSettings, write_echo_config
from services.security.api_keys import create_key
from services.security.certs import init_ca, issue
from services.security.tls import TlsFiles, channel_credentials

ROUTER_ID = "spiffe://tiermesh/router"


@dataclass
class Service:
    """A started process, its port and the credentials a client reaches it with."""

    port: int
    credentials: grpc.ChannelCredentials | None

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def channel(self) -> grpc.Channel:
        if self.credentials is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, self.credentials)


def _tls_env(pki: Path, stem: str) -> dict[str, str]:
    return {
        "TIERMESH_TLS_CA": str(pki / "ca.pem"),
        "TIERMESH_TLS_CERT": str(pki / f"{stem}.pem"),
        "TIERMESH_TLS_KEY": str(pki / f"{stem}-key.pem"),
    }


def _files(pki: Path, stem: str | None = None) -> TlsFiles:
    if stem is None:
        return TlsFiles(pki / "ca.pem")
    return TlsFiles(pki / "ca.pem", pki / f"{stem}.pem", pki / f"{stem}-key.pem")


def start_all(
    tmp: Path, model: Path | None, env: dict[str, str], procs: list[Any]
) -> tuple[dict[str, Service], str]:
    """Every service, by name; and an API key for the keyed router."""
    pki = tmp / "certs"
    init_ca(pki)
    for name in ("router", "tier/small"):
        issue(pki, name)
    keys = tmp / "keys.json"
    _, key = create_key(keys, "bench", ("chat",))
    tier_args = ["--model", str(model)] if model else []
    if model is None:
        source = ROOT / "services" / "tier_small" / "config.toml"
        echo = write_echo_config(source, tmp, EchoSettings(ttft_ms=10.0, tokens_per_s=0.0))
        tier_args = ["--config", str(echo)]
    tier = [sys.executable, "-m", "services.tier_small", "--metrics-port", "0", *tier_args]
    secure_tier_env = {**env, **_tls_env(pki, "tier-small"), "TIERMESH_ALLOWED_CALLERS": ROUTER_ID}
    secure_router_env = {**env, **_tls_env(pki, "router"), "TIERMESH_TLS_CLIENT_AUTH": "optional"}
    plans = {
        "plain tier": ([*tier], env, None),
        "secure tier": ([*tier], secure_tier_env, channel_credentials(_files(pki, "router"))),
    }
    services: dict[str, Service] = {}
    for name, (command, service_env, credentials) in plans.items():
        port = free_port()
        procs.append(spawn([*command, "--port", str(port)], env=service_env))
        services[name] = Service(port, credentials)
    client_tls = channel_credentials(_files(pki))
    routers = {
        "plain router": ("plain tier", env, None),
        "secure router": ("secure tier", secure_router_env, client_tls),
        "secure router, keys": (
            "secure tier",
            {**secure_router_env, "TIERMESH_KEYS_FILE": str(keys)},
            client_tls,
        ),
    }
    for name, (tier_name, router_env, credentials) in routers.items():
        port, tier_port = free_port(), services[tier_name].port
        command = router_command(port, {"small": tier_port, "large": tier_port})
        procs.append(spawn(command, env=router_env))
        services[name] = Service(port, credentials)
    return services, key


@dataclass
class Sample:
    first_ms: float
    tokens: int
    total_s: float


def _tokens(message: Any) -> int:
    if isinstance(message, tier_pb2.GenerateChunk):
        return len(message.token_ids)
    if isinstance(message, router_pb2.ChatEvent) and message.WhichOneof("event") == "delta":
        return len(message.delta.token_ids)
    return 0


def request_kinds(
    services: dict[str, Service], key: str, max_tokens: int
) -> dict[str, Callable[[int], Iterator[Any]]]:
    plain_tier = tier_pb2_grpc.TierServiceStub(services["plain tier"].channel())
    secure_tier = tier_pb2_grpc.TierServiceStub(services["secure tier"].channel())
    plain, secure, keyed = (
        router_pb2_grpc.RouterServiceStub(services[name].channel())
        for name in ("plain router", "secure router", "secure router, keys")
    )
    messages = [{"role": "user", "content": PROMPT}]
    chat = router_pb2.ChatRequest(
        prompt=PROMPT, mode=router_pb2.MODE_PINNED, tier="small", max_tokens=max_tokens
    )
    bearer = (("authorization", f"Bearer {key}"),)

    def generate(i: int) -> tier_pb2.GenerateRequest:
        return tier_pb2.GenerateRequest(
            request_id=f"m{i}", messages=messages, max_tokens=max_tokens
        )

    return {
        "direct tier, plaintext": lambda i: plain_tier.Generate(generate(i)),
        "direct tier, mTLS": lambda i: secure_tier.Generate(generate(i)),
        "router, plaintext": lambda i: plain.Chat(chat),
        "router, TLS + mTLS to tier": lambda i: secure.Chat(chat),
        "router, TLS + mTLS + API key": lambda i: keyed.Chat(chat, metadata=bearer),
    }


def measure(
    kinds: dict[str, Callable[[int], Iterator[Any]]], n: int, console: Console
) -> dict[str, list[Sample]]:
    results: dict[str, list[Sample]] = {name: [] for name in kinds}
    with console.status("measuring…") as status:
        for i in range(-10, n):  # the first 10 rounds warm up and are not counted
            for name, call in kinds.items():
                t0 = time.perf_counter()
                first, tokens = None, 0
                try:
                    for message in call(i):
                        if first is None and _has_token(message):
                            first = (time.perf_counter() - t0) * 1000
                        tokens += _tokens(message)
                except grpc.RpcError:
                    if i >= 0:
                        raise
                    time.sleep(0.5)  # a router may not have connected to its new tier yet
                    continue
                if i >= 0 and first is not None:
                    results[name].append(Sample(first, tokens, time.perf_counter() - t0))
            status.update(f"measuring… {max(i, 0)}/{n}")
    return results


def report(results: dict[str, list[Sample]], console: Console, as_json: bool) -> None:
    table = Table(title="first token (ms) and tokens/s per stream, plaintext against mTLS")
    for column in ("path", "n", "TTFT p50", "TTFT p99", "tokens/s"):
        table.add_column(column)
    summary: dict[str, dict[str, float]] = {}
    for name, samples in results.items():
        firsts = [s.first_ms for s in samples]
        rate = sum(s.tokens for s in samples) / max(sum(s.total_s for s in samples), 1e-9)
        p50, p99 = statistics.median(firsts), percentile(firsts, 0.99) or 0.0
        summary[name] = {
            "n": len(samples),
            "ttft_p50_ms": round(p50, 3),
            "ttft_p99_ms": round(p99, 3),
            "tokens_per_s": round(rate, 1),
        }
        table.add_row(name, str(len(samples)), f"{p50:.2f}", f"{p99:.2f}", f"{rate:.0f}")
    console.print(table)
    pairs = {
        "direct tier": ("direct tier, plaintext", "direct tier, mTLS"),
        "router hop": ("router, plaintext", "router, TLS + mTLS to tier"),
    }
    costs = {}
    for what, (plain, secure) in pairs.items():
        costs[what] = {
            "ttft_p50_ms": round(summary[secure]["ttft_p50_ms"] - summary[plain]["ttft_p50_ms"], 3),
            "tokens_per_s_ratio": round(
                summary[secure]["tokens_per_s"] / max(summary[plain]["tokens_per_s"], 1e-9), 3
            ),
        }
        console.print(
            f"mTLS cost, {what}: TTFT p50 {costs[what]['ttft_p50_ms']:+.2f} ms, tokens/s "
            f"x{costs[what]['tokens_per_s_ratio']:.2f}"
        )
    if as_json:
        print(json.dumps({"paths": summary, "mtls_cost": costs}))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="requests of each kind")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--model", type=Path, help="small-tier model (default: an echo tier)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TIERMESH_"))}
    procs: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            services, key = start_all(Path(tmp), args.model, env, procs)
            try:
                wait_all_serving({s.address: s.credentials for s in services.values()}, procs)
            except NotServingError as e:
                console.print(f"[red]services did not start[/red]: {e}")
                return 1
            kinds = request_kinds(services, key, args.max_tokens)
            results = measure(kinds, args.requests, console)
        finally:
            stop_processes(procs, grace_s=30)
    report(results, console, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
