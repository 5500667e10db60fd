"""The SDK's event conversion reads Usage and Timings directly (services' hot path) and gives
exactly what MessageToDict gives, which the `tiermesh chat --json` contract was written with;
messages it cannot read that way, and doubles that are not finite, still go through
MessageToDict."""

from __future__ import annotations

import math

from google.protobuf.json_format import MessageToDict
from tiermesh.client.events import _fields, event_from_proto
from tiermesh.v1 import common_pb2, router_pb2


def _reference(message: object) -> dict[str, object]:
    return MessageToDict(  # type: ignore[arg-type]
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def test_usage_and_timings_read_directly_equal_message_to_dict() -> None:
    usage = common_pb2.Usage(
        prompt_tokens=12, completion_tokens=30, queue_ms=0.25, ttft_ms=3.5, total_ms=40.0
    )
    timings = router_pb2.Timings(route_ms=0.3, ttft_ms=8.0, time_to_final_ms=200.125)
    partly = common_pb2.Usage(completion_tokens=3, total_ms=9.5)  # set fields come first
    for message in (usage, timings, partly, common_pb2.Usage(), router_pb2.Timings()):
        got, expected = _fields(message), _reference(message)
        assert got == expected
        assert list(got.items()) == list(expected.items())  # the same order (JSON output)
        assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]


def test_a_message_with_presence_or_a_non_finite_double_goes_through_message_to_dict() -> None:
    tier_usage = router_pb2.TierUsage(tier="small", cancelled=True)  # revision, usage unset
    assert _fields(tier_usage) == _reference(tier_usage)
    assert "revision" not in _fields(tier_usage)  # optional and unset: left out, as before
    usage = common_pb2.Usage(ttft_ms=math.inf, total_ms=math.nan)
    assert _fields(usage) == _reference(usage)
    assert _fields(usage)["ttft_ms"] == "Infinity"


def test_a_final_event_carries_the_same_usage_and_timings_as_before() -> None:
    event = router_pb2.ChatEvent()
    final = event.final
    final.revision, final.tier, final.text, final.revisions = 1, "large", "ok", 2
    final.timings.route_ms = 0.4
    for tier, revision in (("small", 0), ("large", 1)):
        entry = final.usage.add(tier=tier, revision=revision)
        entry.usage.completion_tokens = 7 + revision
    converted = event_from_proto(event)
    assert converted.timings == _reference(final.timings)  # type: ignore[union-attr]
    assert converted.usage == [  # type: ignore[union-attr]
        {"tier": u.tier, "revision": u.revision, "cancelled": False, **_reference(u.usage)}
        for u in final.usage
    ]
