"""The gateway as its own process stops cleanly on Ctrl-C and on SIGTERM: exit status 0 and no
traceback (a terminal's Ctrl-C reaches every process of `tiermesh run`, the gateway too)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.processes import free_port, spawn


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_gateway_stops_cleanly_on_a_signal(sig: signal.Signals, tmp_path: Path) -> None:
    port = free_port()
    args = ["--port", str(port), "--router", f"127.0.0.1:{free_port()}"]
    gateway = spawn("gateway", "services.gateway", args, f"127.0.0.1:{port}", tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:  # serving: /health answers (503 while the router is away is an answer)
            assert gateway.process.poll() is None, gateway.log_tail()
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, gateway.log_tail()
                time.sleep(0.1)
        gateway.signal(sig)
        assert gateway.process.wait(30) == 0, gateway.log_tail()
        assert "Traceback" not in gateway.log_path.read_text(), gateway.log_tail()
    finally:
        gateway.stop()
