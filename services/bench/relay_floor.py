"""The floor an HTTP front door's overhead is measured against: the least an OpenAI-style
SSE-over-HTTP to gRPC relay can do on this host, served the way the gateway is (uvicorn with
httptools, its own process). Per request it parses the JSON body, makes one router Chat call and
writes each Delta as a `chat.completion.chunk` event, then a usage chunk and `[DONE]`: no
validation, errors, revisions, metrics, tracing or cancellation. `tiermesh bench --target openai
--router ADDR --relay-floor` runs it beside the gateway, so "what the gateway adds" and "what
any relay in this stack adds" come from one run.

Never a service: it trusts its input and speaks plaintext only. Knows the router's stubs and
ASGI; nothing of the gateway's code (it must not share the gateway's costs).
"""

from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from tiermesh.v1 import common_pb2, router_pb2, router_pb2_grpc

from services.common.child_process import stop_process
from services.common.http_listener import tcp_listener

MODES = {"routed": router_pb2.MODE_ROUTED, "progressive": router_pb2.MODE_PROGRESSIVE}
SSE = [(b"content-type", b"text/event-stream")]


def _chat_request(body: dict[str, Any]) -> router_pb2.ChatRequest:
    """The router request for an OpenAI body naming a tiermesh model (tiermesh-small, ...)."""
    name = str(body.get("model", "")).removeprefix("tiermesh-")
    request = router_pb2.ChatRequest(
        messages=[
            common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in body["messages"]
        ],
        mode=MODES.get(name, router_pb2.MODE_PINNED),
        tier="" if name in MODES else name,
    )
    if body.get("max_tokens"):
        request.max_tokens = int(body["max_tokens"])
    return request


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class RelayApp:
    """The ASGI app: one router channel, opened at start-up."""

    def __init__(self, router: str) -> None:
        self._router = router
        self._stub: router_pb2_grpc.RouterServiceStub | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                channel = grpc.aio.insecure_channel(self._router)
                self._stub = router_pb2_grpc.RouterServiceStub(channel)
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        assert self._stub is not None
        pieces = []
        while True:
            message = await receive()
            pieces.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = json.loads(b"".join(pieces) or b"{}")
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        async for event in self._stub.Chat(_chat_request(body)):
            if event.HasField("delta"):
                chunk = {"choices": [{"index": 0, "delta": {"content": event.delta.text}}]}
                await send({"type": "http.response.body", "body": _event(chunk), "more_body": True})
            elif event.HasField("final"):
                answer = [u for u in event.final.usage if u.revision == event.final.revision]
                tokens = answer[0].usage.completion_tokens if answer else 0
                last = _event({"choices": [], "usage": {"completion_tokens": tokens}})
                await send({"type": "http.response.body", "body": last + b"data: [DONE]\n\n"})
                return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description="A bare HTTP-to-gRPC relay (a bench's floor).")
    parser.add_argument("--router", required=True, help="router address, plaintext")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    sock = tcp_listener("127.0.0.1", args.port)  # as the gateway's
    print(f"relay floor on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(
        RelayApp(args.router), http="httptools", log_level="warning", access_log=False
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


class RelayFloorError(Exception):
    """The relay process did not start (or did not say where it listens) in time."""


@contextmanager
def relay_floor(router: str, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Runs the relay in its own process against `router`; yields its base URL (…/v1). The
    process is stopped on leaving (killed if SIGTERM does not end it within 10 s)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "services.bench.relay_floor", "--router", router],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], start_timeout_s)
        line = process.stdout.readline().strip() if ready else ""
        if not line.startswith("relay floor on "):
            raise RelayFloorError(
                f"the relay floor did not start within {start_timeout_s:g} s "
                f"(exit status {process.poll()})"
            )
        yield line.removeprefix("relay floor on ")
    finally:
        stop_process(process, grace_s=10.0)


if __name__ == "__main__":
    sys.exit(main())
