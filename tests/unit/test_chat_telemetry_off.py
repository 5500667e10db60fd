"""A chat's telemetry in a process with no OpenTelemetry provider: no work at all, except that a
trusted caller's trace context still travels on to the tiers. Each case runs in a fresh Python
process, since providers, once installed by another test, stay for the whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0aa9aa-00f067aa0ba902b7-01"
PROBE = f"""
import json
from services.common.telemetry import metrics_on, tracing_on
from services.router.chat_events import TierCallOpening
from services.router.chat_telemetry import NO_TELEMETRY, chat_telemetry
plain = chat_telemetry([("user-agent", "x")])
caller = chat_telemetry([("traceparent", "{TRACEPARENT}")])
opening = TierCallOpening("small", "r/small/1")
caller.observe(opening)
print(json.dumps({{
    "on": [tracing_on(), metrics_on()],
    "plain_is_none": plain is NO_TELEMETRY,
    "caller_is_none": caller is NO_TELEMETRY,
    "metadata": dict(opening.metadata),
}}))
"""


def _probe(trust: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TIERMESH_"))}
    if trust:
        env["TIERMESH_TRUST_TRACE_CONTEXT"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_no_provider_means_no_telemetry_work() -> None:
    result = _probe(trust=False)
    assert result["on"] == [False, False]
    assert result["plain_is_none"] is True
    assert result["caller_is_none"] is True  # an untrusted caller's context is not passed on
    assert result["metadata"] == {}


def test_a_trusted_callers_trace_context_still_reaches_the_tiers() -> None:
    result = _probe(trust=True)
    assert result["plain_is_none"] is True
    assert result["caller_is_none"] is False
    metadata = result["metadata"]
    assert isinstance(metadata, dict)
    assert metadata["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
