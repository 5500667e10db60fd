"""Reads the google.rpc details of an error status (the `grpc-status-details-bin` trailer):
RetryInfo, BadRequest and ErrorInfo, into plain values on ChatError.

The client depends on protobuf only, not on the googleapis protos: the three detail messages
and google.rpc.Status are declared here field by field (their numbers are the wire contract)
in a private descriptor pool, so they never clash with another package's copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, duration_pb2, message_factory

DETAILS_TRAILER = "grpc-status-details-bin"
_F = descriptor_pb2.FieldDescriptorProto


@dataclass(frozen=True)
class StatusDetails:
    """What the server said beyond code and message; empty when it said nothing more."""

    retry_after_s: float | None = None  # RetryInfo: wait this long before retrying
    reason: str = ""  # ErrorInfo: a stable machine-readable cause, e.g. "RATE_LIMITED"
    domain: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    field_violations: tuple[tuple[str, str], ...] = ()  # BadRequest: (field, description)


def _message(name: str, fields: Sequence[tuple[str, int, int, int, str]]) -> Any:
    """A DescriptorProto: fields as (name, number, type, label, type_name)."""
    proto = descriptor_pb2.DescriptorProto(name=name)
    for fname, number, ftype, label, type_name in fields:
        added = proto.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            added.type_name = type_name
    return proto


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    for module in (any_pb2, duration_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    opt, rep = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    entry = _message(
        "MetadataEntry",
        [("key", 1, _F.TYPE_STRING, opt, ""), ("value", 2, _F.TYPE_STRING, opt, "")],
    )
    entry.options.map_entry = True
    error_info = _message(
        "ErrorInfo",
        [
            ("reason", 1, _F.TYPE_STRING, opt, ""),
            ("domain", 2, _F.TYPE_STRING, opt, ""),
            ("metadata", 3, _F.TYPE_MESSAGE, rep, ".google.rpc.ErrorInfo.MetadataEntry"),
        ],
    )
    error_info.nested_type.append(entry)
    violation = _message(
        "FieldViolation",
        [("field", 1, _F.TYPE_STRING, opt, ""), ("description", 2, _F.TYPE_STRING, opt, "")],
    )
    bad_request = _message(
        "BadRequest",
        [("field_violations", 1, _F.TYPE_MESSAGE, rep, ".google.rpc.BadRequest.FieldViolation")],
    )
    bad_request.nested_type.append(violation)
    file = descriptor_pb2.FileDescriptorProto(
        name="tiermesh_client/google_rpc_details.proto",
        package="google.rpc",
        syntax="proto3",
        dependency=["google/protobuf/any.proto", "google/protobuf/duration.proto"],
        message_type=[
            _message(
                "Status",
                [
                    ("code", 1, _F.TYPE_INT32, opt, ""),
                    ("message", 2, _F.TYPE_STRING, opt, ""),
                    ("details", 3, _F.TYPE_MESSAGE, rep, ".google.protobuf.Any"),
                ],
            ),
            _message(
                "RetryInfo",
                [("retry_delay", 1, _F.TYPE_MESSAGE, opt, ".google.protobuf.Duration")],
            ),
            error_info,
            bad_request,
        ],
    )
    pool.Add(file)
    names = ("Status", "RetryInfo", "ErrorInfo", "BadRequest")
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"google.rpc.{n}"))
        for n in names
    }


_TYPES: dict[str, Any] | None = None


def parse_status_details(trailing_metadata: Sequence[tuple[str, Any]] | None) -> StatusDetails:
    """The details in a call's trailing metadata (empty StatusDetails when there are none or
    they do not parse)."""
    global _TYPES
    raw = next((v for k, v in (trailing_metadata or ()) if k == DETAILS_TRAILER), None)
    if not isinstance(raw, bytes):
        return StatusDetails()
    if _TYPES is None:
        _TYPES = _build()
    try:
        status = _TYPES["Status"].FromString(raw)
    except Exception:  # a malformed trailer must not hide the error itself
        return StatusDetails()
    retry: float | None = None
    reason = domain = ""
    metadata: dict[str, str] = {}
    violations: list[tuple[str, str]] = []
    for item in status.details:
        kind = item.type_url.rsplit("/", 1)[-1]
        if kind in ("google.rpc.RetryInfo", "google.rpc.ErrorInfo", "google.rpc.BadRequest"):
            detail = _TYPES[kind.removeprefix("google.rpc.")].FromString(item.value)
        else:
            continue
        if kind == "google.rpc.RetryInfo":
            retry = detail.retry_delay.seconds + detail.retry_delay.nanos / 1e9
        elif kind == "google.rpc.ErrorInfo":
            reason, domain, metadata = detail.reason, detail.domain, dict(detail.metadata)
        else:
            violations += [(v.field, v.description) for v in detail.field_violations]
    return StatusDetails(retry, reason, domain, metadata, tuple(violations))
