"""POST /v1/completions (legacy text completions) through the real `openai` client
(`client.completions.create`, streamed and not) against a real gateway, router and torch
tiers: the text, finish reasons, usage, stop sequences, the revisions opt-in and refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.gateway_mesh import GatewayMesh, module_gateway

PROMPT = "What is your return policy?"
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
def test_streamed_text_equals_the_non_streamed_completion(
    client: openai.OpenAI, model: str
) -> None:
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=24)
    assert (completion.object, completion.model) == ("text_completion", model)
    choice = completion.choices[0]
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 24
    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == choice.text
    assert chunks[-2].choices[0].finish_reason == choice.finish_reason
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens


def test_sampling_fields_and_a_stop_sequence(client: openai.OpenAI) -> None:
    free = client.completions.create(
        model="tiermesh-small", prompt=PROMPT, max_tokens=12, temperature=0.0
    )
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip(f"no stop sequence to cut {text!r} at")
    cut = client.completions.create(
        model="tiermesh-small",
        prompt=[PROMPT],
        max_tokens=12,
        temperature=0.0,
        top_p=1.0,
        seed=3,
        stop=[stop],
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_every_revision_on_request(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="tiermesh-progressive",
            prompt=PROMPT,
            max_tokens=16,
            stream=True,
            extra_body={"tiermesh": {"revisions": True}},
        )
    )
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        info = chunk.model_extra["tiermesh"]  # type: ignore[index]
        texts[info["revision"]] = texts.get(info["revision"], "") + chunk.choices[0].text
    final = chunks[-1].model_extra["tiermesh"]  # type: ignore[index]
    assert (final["final"], final["revision"], final["tier"]) == (True, 1, "large")
    assert set(texts) == {0, 1}
    answer = client.completions.create(
        model="tiermesh-progressive",
        prompt=PROMPT,
        max_tokens=16,
        extra_headers={"X-Tiermesh-Revisions": "1"},
    )
    assert answer.model_extra["tiermesh"]["revision"] == 1  # type: ignore[index]
    assert answer.choices[0].text == texts[1]


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"n": 2}, "n"),
        ({"echo": True}, "echo"),
        ({"logprobs": 1}, "logprobs"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"max_tokens": 5000}, "max_tokens"),  # over the router's limit, relayed
    ],
)
def test_what_tiermesh_cannot_honour_is_a_400_naming_the_field(
    client: openai.OpenAI, options: dict[str, object], param: str
) -> None:
    request: dict[str, object] = {"model": "tiermesh-small", "prompt": PROMPT, **options}
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**request)  # type: ignore[call-overload]
    assert refused.value.body["param"] == param  # type: ignore[index]
