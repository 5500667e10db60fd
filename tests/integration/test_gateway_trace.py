"""The gateway's span of each router call, read back from a real trace file: it continues the
caller's `traceparent` (or starts a trace), the router's span is its child, a caller's unsampled
context records nothing, and a refused call still has its span, with the error. The gateway
sends the call's trace context before it builds the span (services/common/deferred_span.py), so
this is what shows that the context sent and the span built are the same one. FastAPI's own
request spans leave out health probes and scrapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0aa9aa"
CALLER_SPAN = "00f067aa0ba902b7"
UNSAMPLED_TRACE = "0af7651916cd43dd8448eb211c80319c"

SCRIPT = """
import asyncio
from pathlib import Path

import httpx

from services.common.config import GatewayConfig
from services.common.config_loading import build_config
from services.common.telemetry import setup_telemetry
from services.gateway.server import start_gateway
from tests.integration.mesh import start_mesh

telemetry = setup_telemetry("tiermesh-test")


async def main():
    mesh = await start_mesh(Path({model_dir!r}))
    config = build_config(GatewayConfig, {{"port": 0, "router": mesh.address}})
    gateway = await start_gateway(config)
    body = {{"model": "tiermesh-small", "max_tokens": 8, "stream": True,
             "messages": [{{"role": "user", "content": "What is your return policy?"}}]}}
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
            for traceparent in ({sampled!r}, None, {unsampled!r}):
                headers = {{"traceparent": traceparent}} if traceparent else {{}}
                async with http.stream("POST", "/v1/chat/completions", json=body,
                                       headers=headers) as response:
                    assert response.status_code == 200, await response.aread()
                    text = await response.aread()
                    assert text.endswith(b"data: [DONE]\\n\\n"), text
            refused = await http.post("/v1/chat/completions",
                                      json={{**body, "stream": False, "max_tokens": 10**9}})
            assert refused.status_code == 400, refused.text
            for path in ("/health", "/metrics", "/v1/models"):
                assert (await http.get(path)).status_code == 200, path
    finally:
        await gateway.stop()
        await mesh.stop()


asyncio.run(main())
telemetry.shutdown()
"""


def _spans(trace_file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in trace_file.read_text().splitlines()]


def test_the_gateway_span_is_the_one_its_call_carried(tiny_model_dir: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "traces.jsonl"
    script = SCRIPT.format(
        model_dir=str(tiny_model_dir),
        sampled=f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
        unsampled=f"00-{UNSAMPLED_TRACE}-{CALLER_SPAN}-00",
    )
    env = {
        **os.environ,
        "TIERMESH_TRACE_FILE": str(trace_file),
        "TIERMESH_TRUST_TRACE_CONTEXT": "1",  # the router continues the gateway's trace
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    spans = _spans(trace_file)
    gateway = [s for s in spans if s["name"] == "chat tiermesh-small"]
    routers = [s for s in spans if s["name"] == "router Chat"]
    by_id = {s["span_id"]: s for s in spans}

    # continued: the caller's trace, its span the parent; the router's span the gateway's child
    continued = [s for s in gateway if s["trace_id"] == CALLER_TRACE]
    assert len(continued) == 1, gateway
    assert continued[0]["parent_id"] == CALLER_SPAN
    assert continued[0]["attributes"]["gen_ai.request.model"] == "tiermesh-small"
    assert continued[0]["status"] == "OK"
    router = [s for s in routers if s["parent_id"] == continued[0]["span_id"]]
    assert len(router) == 1 and router[0]["trace_id"] == CALLER_TRACE, routers
    assert router[0]["start_ns"] >= continued[0]["start_ns"]  # the span starts before its call

    # no traceparent: the gateway's span starts a trace, and the router's is again its child
    roots = [s for s in gateway if s["parent_id"] is None and s["status"] == "OK"]
    assert len(roots) == 1, gateway
    children = [s for s in routers if s["parent_id"] == roots[0]["span_id"]]
    assert len(children) == 1 and children[0]["trace_id"] == roots[0]["trace_id"]

    # a caller that does not sample: nothing of its trace is recorded, here or in the router
    assert not [s for s in spans if s["trace_id"] == UNSAMPLED_TRACE]

    # refused by the router (max_tokens over its limit): the call's span ends with the error
    failed = [s for s in gateway if s["status"] == "ERROR"]
    assert len(failed) == 1, gateway
    assert failed[0]["attributes"]["error.type"] == "INVALID_ARGUMENT"
    # FastAPI's own request spans: the models list, not health probes or scrapes, and no spans
    # for its dependency and endpoint steps
    names = {s["name"] for s in spans if s["name"].startswith(("GET ", "fastapi."))}
    assert names == {"GET /v1/models"}, names

    assert all(
        s["parent_id"] is None or s["parent_id"] in by_id or s["parent_id"] == CALLER_SPAN
        for s in spans
        if s["trace_id"] in {g["trace_id"] for g in gateway}
    )
