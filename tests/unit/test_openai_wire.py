"""The gateway's OpenAI chunk builders: a content chunk's pre-encoded event is byte for byte the
event of the chunk dict it stands for, whatever the text."""

from __future__ import annotations

import json

import pytest

from services.gateway.openai_wire import ChunkWriter, sse

TEXTS = ["", "Hello", ' a "quoted" word', "back\\slash\nnew line\ttab", "café ☕ 日本", "\x00\x1f"]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("with_usage_field", [False, True])
def test_content_event_is_the_encoded_chunk(text: str, with_usage_field: bool) -> None:
    writer = ChunkWriter('model "x"')
    expected = sse(writer.chunk({"content": text}, with_usage_field=with_usage_field))
    event = writer.content_event(text, with_usage_field=with_usage_field)
    assert event == expected
    chunk = json.loads(event.removeprefix(b"data: "))
    assert chunk["choices"][0]["delta"] == {"content": text}
    assert ("usage" in chunk) is with_usage_field
