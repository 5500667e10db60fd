"""Histogram bucket boundaries for every tiermesh histogram, as OpenTelemetry Views.

Without them the SDK's defaults (0, 5, 10, 25 ... 10000) put every latency in seconds into the
first bucket and Prometheus quantiles say nothing. The boundaries are those the OpenTelemetry
GenAI semantic conventions advise: time to first token from 1 ms, time per output token from
10 ms, request durations doubling from 10 ms to ~82 s, token counts in powers of 4. Knows only
metric names; nothing of who records them.
"""

from __future__ import annotations

from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

# gen_ai.server.time_to_first_token (s)
TIME_TO_FIRST_TOKEN = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
# gen_ai.server.time_per_output_token (s)
TIME_PER_OUTPUT_TOKEN = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
# gen_ai.server.request.duration, gen_ai.client.operation.duration and the like (s)
REQUEST_DURATION = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
# gen_ai.client.token.usage ({token})
TOKEN_USAGE = tuple(float(4**n) for n in range(14))  # 1, 4, 16, ... 67,108,864
# tiermesh.chat.revisions ({revision})
REVISIONS = (1.0, 2.0, 3.0, 4.0, 5.0)

BOUNDARIES: dict[str, tuple[float, ...]] = {
    "gen_ai.server.time_to_first_token": TIME_TO_FIRST_TOKEN,
    "gen_ai.server.time_per_output_token": TIME_PER_OUTPUT_TOKEN,
    "gen_ai.server.request.duration": REQUEST_DURATION,
    "gen_ai.client.operation.duration": REQUEST_DURATION,
    "gen_ai.client.token.usage": TOKEN_USAGE,
    "tiermesh.chat.time_to_first_draft": TIME_TO_FIRST_TOKEN,
    "tiermesh.chat.time_to_final": REQUEST_DURATION,
    "tiermesh.chat.revisions": REVISIONS,
}


def histogram_views() -> list[View]:
    """One View per histogram in BOUNDARIES, giving it its explicit buckets."""
    return [
        View(
            instrument_name=name,
            aggregation=ExplicitBucketHistogramAggregation(boundaries=list(boundaries)),
        )
        for name, boundaries in BOUNDARIES.items()
    ]
