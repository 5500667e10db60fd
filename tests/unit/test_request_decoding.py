"""Lenient request decoding (services/common/grpc_service.py): bytes that are not a valid
request become Undecodable with a message naming the string field that is not UTF-8."""

from __future__ import annotations

from tiermesh.v1 import common_pb2, router_pb2

from services.common.grpc_service import Undecodable, bad_utf8_field, lenient_deserializer


def spoiled(request: router_pb2.ChatRequest, marker: str) -> bytes:
    """The request's bytes with `marker` (a string value) replaced by bytes that are not UTF-8."""
    data = request.SerializeToString()
    assert marker.encode() in data
    return data.replace(marker.encode(), b"\xff\xfe" + b"x" * (len(marker) - 2))


def test_a_good_request_decodes_as_usual() -> None:
    request = router_pb2.ChatRequest(prompt="hi", request_id="r1")
    parse = lenient_deserializer(router_pb2.ChatRequest)
    assert parse(request.SerializeToString()) == request


def test_the_field_with_bad_utf8_is_named() -> None:
    messages = [
        common_pb2.ChatMessage(role="system", content="be brief"),
        common_pb2.ChatMessage(role="user", content="MARKER"),
    ]
    request = router_pb2.ChatRequest(request_id="r1", messages=messages, max_tokens=8)
    parse = lenient_deserializer(router_pb2.ChatRequest)
    assert parse(spoiled(request, "MARKER")) == Undecodable("messages[1].content: not valid UTF-8")
    prompt = router_pb2.ChatRequest(prompt="PROMPT", request_id="r1")
    assert bad_utf8_field(router_pb2.ChatRequest.DESCRIPTOR, spoiled(prompt, "PROMPT")) == "prompt"


def test_bytes_that_are_no_message_say_so() -> None:
    parsed = lenient_deserializer(router_pb2.ChatRequest)(b"\x0a\xff")
    assert isinstance(parsed, Undecodable)
    assert parsed.message.startswith("request: not a valid tiermesh.v1.ChatRequest")
