"""The events of one chat as plain, immutable Python values, converted from the wire's ChatEvent.

Order on a stream: RouteEvent; per revision RevisionStartEvent, DeltaEvent..., RevisionEndEvent;
then exactly one FinalEvent, unless the chat ends with an error (ChatError). `event_to_json` is the
`tiermesh chat --json` line format, a contract: fields are only ever added.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from tiermesh.client.errors import ChatError
from tiermesh.client.requests import MODE_NAMES, PRIORITY_NAMES
from tiermesh.v1 import common_pb2, router_pb2


@dataclass(frozen=True)
class RouteEvent:
    """Where the router sends the chat: `tiers` in revision order, and why."""

    request_id: str
    mode: str
    tiers: tuple[str, ...]
    complexity: float
    policy: str
    reason: str
    stepped_from: str = ""  # the tier overload moved the chat off ("" when it did not)
    priority: str = "interactive"  # the priority it runs at: interactive, batch or critical


@dataclass(frozen=True)
class RevisionStartEvent:
    """A revision begins; it replaces revision `replaces` (None for the first) and keeps its
    first `kept_prefix_chars` characters."""

    revision: int
    tier: str
    replaces: int | None
    kept_prefix_chars: int


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a step: its id, its text alone, its log-probability."""

    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token (with `top_logprobs` asked for): the text it adds (the texts of a
    revision's tokens make its text), its log-probability, the most likely tokens at its step."""

    text: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class DeltaEvent:
    """More text of a revision: a revision's text is the concatenation of its deltas.
    `token_logprobs`: the tokens whose text ends in this delta, when the request asked for
    `top_logprobs` (else empty)."""

    revision: int
    text: str
    token_ids: tuple[int, ...]
    token_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class RevisionEndEvent:
    revision: int
    finish_reason: str
    usage: dict[str, Any]
    error: str
    stop_sequence: str = ""  # the stop sequence that ended the revision, when one did


@dataclass(frozen=True)
class FinalEvent:
    """The answer: which revision it is, its text, and the usage of every tier called."""

    revision: int
    tier: str
    text: str
    reason: str
    revisions: int
    usage: list[dict[str, Any]]
    timings: dict[str, float]
    model: str = ""  # the answering model, "<tier>/<model>" ("" from a router that predates it)


Event = RouteEvent | RevisionStartEvent | DeltaEvent | RevisionEndEvent | FinalEvent

EVENT_TYPES: dict[type, str] = {
    RouteEvent: "route",
    RevisionStartEvent: "revision_start",
    DeltaEvent: "delta",
    RevisionEndEvent: "revision_end",
    FinalEvent: "final",
}


@dataclass
class ChatResult:
    """The answer of a chat: the final revision's text, and every event that led to it."""

    text: str
    tier: str
    revision: int
    final: FinalEvent
    events: list[Event] = field(default_factory=list)

    @classmethod
    def from_events(cls, events: list[Event]) -> ChatResult:
        if not events or not isinstance(events[-1], FinalEvent):
            raise ChatError("INTERNAL", "the chat stream ended without a final event")
        final = events[-1]
        return cls(final.text, final.tier, final.revision, final, events)


# field types whose Python value is already what MessageToDict writes for it (finite doubles
# aside: it writes "NaN" and "Infinity" as strings); fields with presence (optional, oneof)
# are left to it too, since it leaves them out when unset
_PLAIN_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_DOUBLE,
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_BOOL,
        FieldDescriptor.TYPE_STRING,
    }
)


@functools.cache
def _plain_names(descriptor: Any) -> tuple[str, ...] | None:
    """A message type's field names when every field is plain and singular, else None."""
    fields = descriptor.fields
    if all(f.type in _PLAIN_TYPES and not _repeated(f) and not f.has_presence for f in fields):
        return tuple(f.name for f in fields)
    return None


def _fields(message: Any) -> dict[str, Any]:
    """MessageToDict's dict of `message` (field names as in the proto, every field present).
    Messages of plain singular fields (Usage, Timings) are read directly, ten times faster;
    anything else, or a double that is not finite, goes through MessageToDict."""
    names = _plain_names(message.DESCRIPTOR)
    if names is not None:
        values = [(name, getattr(message, name)) for name in names]
        if all(math.isfinite(v) for _, v in values if isinstance(v, float)):
            # MessageToDict's order: the fields set (not at their default), then the rest
            return {n: v for n, v in values if v} | {n: v for n, v in values if not v}
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _repeated(field: FieldDescriptor) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6.30; `label` before (deprecated after)
        return bool(field.is_repeated)
    return bool(getattr(field, "label", 0) == 3)  # LABEL_REPEATED


def _usage(message: common_pb2.Usage) -> dict[str, Any]:
    return _fields(message)


def event_from_proto(event: router_pb2.ChatEvent) -> Event:
    """The plain event for one ChatEvent off the wire."""
    kind = event.WhichOneof("event")
    if kind == "route":
        r = event.route
        mode = MODE_NAMES.get(r.mode, "routed")
        priority = PRIORITY_NAMES.get(r.priority, "interactive")
        return RouteEvent(
            r.request_id,
            mode,
            tuple(r.tiers),
            r.complexity,
            r.policy,
            r.reason,
            r.stepped_from,
            priority,
        )
    if kind == "revision_start":
        s = event.revision_start
        replaces = s.replaces if s.HasField("replaces") else None
        return RevisionStartEvent(s.revision, s.tier, replaces, s.kept_prefix_chars)
    if kind == "delta":
        d = event.delta
        entries = tuple(
            TokenLogprob(
                e.text, e.logprob, tuple(TopLogprob(t.token_id, t.text, t.logprob) for t in e.top)
            )
            for e in d.token_logprobs
        )
        return DeltaEvent(d.revision, d.text, tuple(d.token_ids), entries)
    if kind == "revision_end":
        e = event.revision_end
        return RevisionEndEvent(
            e.revision, e.finish_reason, _usage(e.usage), e.error, e.stop_sequence
        )
    if kind == "final":
        f = event.final
        usage = [
            {
                "tier": u.tier,
                "revision": u.revision if u.HasField("revision") else None,
                "cancelled": u.cancelled,
                **_usage(u.usage),
            }
            for u in f.usage
        ]
        return FinalEvent(
            f.revision, f.tier, f.text, f.reason, f.revisions, usage, _fields(f.timings), f.model
        )
    raise ChatError("INTERNAL", f"unknown chat event {kind!r}")


def event_to_json(event: Event, t_ms: float) -> dict[str, Any]:
    """The `tiermesh chat --json` form of an event: {"type", "t_ms", ...its fields}."""
    fields = dict(event.__dict__)
    if isinstance(event, DeltaEvent):
        entries = fields.pop("token_logprobs")
        if entries:  # only when asked for: other lines keep their shape
            fields["token_logprobs"] = [token_logprob_to_json(e) for e in entries]
    if isinstance(event, DeltaEvent | RouteEvent):
        fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
    return {"type": EVENT_TYPES[type(event)], "t_ms": round(t_ms, 3), **fields}


def token_logprob_to_json(entry: TokenLogprob) -> dict[str, Any]:
    """{"text", "logprob", "top": [{"token_id", "text", "logprob"}, ...]}."""
    return {
        "text": entry.text,
        "logprob": entry.logprob,
        "top": [{"token_id": t.token_id, "text": t.text, "logprob": t.logprob} for t in entry.top],
    }
