"""POST /v1/responses through the real `openai` client (`client.responses.create`, streamed
and not) against a real gateway, router and torch tiers: `output_text`, the event sequence,
max_output_tokens, the revisions opt-in and refusals naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.gateway_mesh import GatewayMesh, module_gateway

INPUT = "What is your return policy?"
MODELS = ["tiermesh-routed", "tiermesh-progressive", "tiermesh-small", "tiermesh-large"]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[GatewayMesh]:
    yield from module_gateway(tmp_path_factory.mktemp("tiny-model-large"), tiny_model_dir)


@pytest.fixture
def client(gateway: GatewayMesh) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0) as made:
        yield made


@pytest.mark.parametrize("model", MODELS)
def test_streamed_text_equals_the_non_streamed_response(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(
        model=model, instructions="Answer briefly.", input=INPUT, max_output_tokens=24
    )
    assert (response.object, response.model) == ("response", model)
    assert response.status in ("completed", "incomplete")
    assert response.output_text
    assert response.usage is not None and 1 <= response.usage.output_tokens <= 24
    assert response.instructions == "Answer briefly."
    events = list(
        client.responses.create(
            model=model,
            instructions="Answer briefly.",
            input=INPUT,
            max_output_tokens=24,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] == f"response.{response.status}"
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == response.output_text
    assert events[-1].response.output_text == text  # type: ignore[union-attr]
    assert events[-4].text == text  # type: ignore[union-attr]


def test_the_sdks_stream_helper_reads_the_events(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="tiermesh-progressive", input=INPUT, max_output_tokens=16
    ) as stream:
        events = list(stream)
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    last = events[-1]
    # the answer is 16 tokens long: as OpenAI does, the stream ends with response.incomplete
    # (which the helper's get_final_response(), waiting for response.completed, refuses)
    assert last.type == "response.incomplete"
    assert last.response.output_text == "".join(deltas)
    assert last.response.usage is not None and last.response.usage.output_tokens == 16


def test_max_output_tokens_leaves_the_response_incomplete(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="tiermesh-small",
        input=[
            {"role": "developer", "content": "You answer questions about the shop."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
            {"role": "assistant", "content": "Hi, how can I help?"},
            {"role": "user", "content": INPUT},
        ],
        max_output_tokens=3,
        temperature=0.0,
        top_p=1.0,
        metadata={"ticket": "t-1"},
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.metadata == {"ticket": "t-1"}


def test_every_revision_on_request(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="tiermesh-progressive",
            input=INPUT,
            max_output_tokens=16,
            stream=True,
            extra_body={"tiermesh": {"revisions": True}},
        )
    )
    texts: dict[int, str] = {}
    for event in events:
        if event.type == "response.output_text.delta":
            info = event.model_extra["tiermesh"]  # type: ignore[index]
            texts[info["revision"]] = texts.get(info["revision"], "") + event.delta
    assert set(texts) == {0, 1}
    completed = events[-1].response  # type: ignore[union-attr]
    final = completed.model_extra["tiermesh"]  # type: ignore[index]
    assert (final["final"], final["revision"], final["tier"]) == (True, 1, "large")
    assert completed.output_text == texts[1]
    answer = client.responses.create(
        model="tiermesh-progressive",
        input=INPUT,
        max_output_tokens=16,
        extra_headers={"X-Tiermesh-Revisions": "1"},
    )
    assert answer.model_extra["tiermesh"]["tier"] == "large"  # type: ignore[index]
    assert answer.output_text == texts[1]


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "http://x/a.png"}],
                    }
                ]
            },
            "input[0].content[0].type",
        ),
        ({"max_output_tokens": 5000}, "max_output_tokens"),  # over the router's limit, relayed
        ({"temperature": 3.0}, "temperature"),
    ],
)
def test_what_tiermesh_cannot_honour_is_a_400_naming_the_field(
    client: openai.OpenAI, options: dict[str, object], param: str
) -> None:
    request: dict[str, object] = {"model": "tiermesh-small", "input": INPUT, **options}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**request)  # type: ignore[call-overload]
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param  # type: ignore[index]
    assert refused.value.body["message"].startswith(param)  # type: ignore[index]


def test_an_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model="gpt-x", input=INPUT)
    assert refused.value.body["code"] == "model_not_found"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_an_input_no_tier_holds_is_a_400_streamed_or_not(
    client: openai.OpenAI, stream: bool
) -> None:
    # every tier refuses it for its context after the route, before any text: still a status
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="tiermesh-routed", input="Where is my order? " * 200, stream=stream
        )
    assert caught.value.status_code == 400
    assert "exceeds the largest context of the tiers" in str(caught.value)
