"""The gateway through the real `openai` client: streaming and not, usage, models, error
mapping and the revisions opt-in, against a real router and torch tiers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.gateway_mesh import GatewayMesh, module_gateway

PROMPT = [{"role": "user", "content": "What is your return policy?"}]
MODELS = ["tiermesh-routed", "tiermesh-progressive", "tiermesh-small", "tiermesh-medium"]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[GatewayMesh]:
    yield from module_gateway(tmp_path_factory.mktemp("tiny-model-large"), tiny_model_dir)


def client(gateway: GatewayMesh) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)


def streamed_text(gateway: GatewayMesh, model: str, **options: object) -> tuple[str, list]:
    stream = client(gateway).chat.completions.create(
        model=model, messages=PROMPT, stream=True, **options
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_models_lists_modes_and_tiers(gateway: GatewayMesh) -> None:
    ids = [m.id for m in client(gateway).models.list()]
    assert ids == [*MODELS, "tiermesh-large"]


@pytest.mark.parametrize("model", [*MODELS, "tiermesh-large"])
def test_streamed_text_equals_the_non_streamed_answer(gateway: GatewayMesh, model: str) -> None:
    answer = client(gateway).chat.completions.create(model=model, messages=PROMPT, max_tokens=24)
    text, chunks = streamed_text(gateway, model, max_tokens=24)
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content
    assert text == answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    assert {c.id for c in chunks} == {chunks[0].id}
    assert chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason


def test_progressive_plain_stream_is_the_refined_answer(gateway: GatewayMesh) -> None:
    answer = client(gateway).chat.completions.create(
        model="tiermesh-progressive",
        messages=PROMPT,
        max_tokens=16,
        extra_body={"tiermesh": {"revisions": True}},
    )
    extra = answer.model_extra["tiermesh"]
    assert (extra["revision"], extra["tier"], extra["revisions"]) == (1, "large", 2)
    assert extra["route"]["tiers"] == ["small", "large"]
    text, _ = streamed_text(gateway, "tiermesh-progressive", max_tokens=16)
    assert text == answer.choices[0].message.content


def test_include_usage_adds_a_final_usage_chunk(gateway: GatewayMesh) -> None:
    _, chunks = streamed_text(
        gateway, "tiermesh-small", max_tokens=12, stream_options={"include_usage": True}
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 12
    assert last.usage.total_tokens == last.usage.prompt_tokens + 12
    assert all(c.usage is None for c in chunks[:-1])


def test_revisions_opt_in_through_extra_body(gateway: GatewayMesh) -> None:
    _, chunks = streamed_text(
        gateway,
        "tiermesh-progressive",
        max_tokens=16,
        extra_body={"tiermesh": {"revisions": True}},
    )
    infos = [c.model_extra["tiermesh"] for c in chunks if c.model_extra.get("tiermesh")]
    revisions = [i for i in infos if not i.get("final")]
    assert {(i["revision"], i["tier"], i["replaces"]) for i in revisions} == {
        (0, "small", None),
        (1, "large", 0),
    }
    texts: dict[int, str] = {}
    for c in chunks:
        info = c.model_extra.get("tiermesh")
        if info and not info.get("final") and c.choices:
            texts[info["revision"]] = texts.get(info["revision"], "") + (
                c.choices[0].delta.content or ""
            )
    final = infos[-1]
    assert final["final"] is True
    assert final["revision"] == 1 and final["tier"] == "large"
    assert final["reason"]
    assert final["route"]["policy"]
    assert final["timings"]["time_to_first_draft_ms"] <= final["timings"]["time_to_final_ms"]
    kept = next(i["kept_prefix_chars"] for i in revisions if i["revision"] == 1)
    assert texts[0][:kept] == texts[1][:kept]
    assert texts[0] != texts[1]


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -3}, "max_completion_tokens"),
        ({"max_tokens": 100000}, "max_tokens"),  # the router's limit, relayed
        ({"temperature": 3.0}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": 3}, "stop"),
        ({"n": 0}, "n"),
        ({"n": 9}, "n"),  # over the gateway's max_choices (8)
        ({"n": 1.5}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
        ({"logprobs": "yes"}, "logprobs"),
    ],
)
def test_bad_request_is_a_400_naming_the_field(
    gateway: GatewayMesh, options: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).chat.completions.create(model="tiermesh-small", messages=PROMPT, **options)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_conversation_no_tier_holds_is_a_400_streamed_or_not(
    gateway: GatewayMesh, stream: bool
) -> None:
    # the router takes it and routes it; every tier then refuses it for its context, before any
    # text: a streamed request's status is still that error, not 200 and an error event
    long = [{"role": "user", "content": "Where is my order? " * 200}]
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).chat.completions.create(
            model="tiermesh-routed", messages=long, stream=stream, max_tokens=8
        )
    error = caught.value.body
    assert caught.value.status_code == 400 and isinstance(error, dict)
    assert error["code"] == "context_length_exceeded"  # OpenAI's code for it
    assert "exceeds the largest context of the tiers" in error["message"]


@pytest.mark.parametrize(
    ("service_tier", "echoed", "priority"),
    [
        (None, "default", "interactive"),
        ("flex", "flex", "batch"),
        ("priority", "priority", "critical"),
    ],
)
def test_service_tier_sets_the_priority_and_is_echoed(
    gateway: GatewayMesh, service_tier: str | None, echoed: str, priority: str
) -> None:
    options: dict[str, object] = {"extra_body": {"tiermesh": {"revisions": True}}}
    if service_tier is not None:
        options["service_tier"] = service_tier
    answer = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=4, **options
    )
    _, chunks = streamed_text(gateway, "tiermesh-small", max_tokens=4, **options)
    assert answer.service_tier == echoed
    assert {c.service_tier for c in chunks} == {echoed}
    assert (answer.model_extra or {})["tiermesh"]["route"]["priority"] == priority


def test_an_unknown_service_tier_is_a_400_naming_it(gateway: GatewayMesh) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(gateway).chat.completions.create(
            model="tiermesh-small", messages=PROMPT, extra_body={"service_tier": "gold"}
        )
    assert refused.value.body["param"] == "service_tier"  # type: ignore[index]


def test_unknown_model_is_404(gateway: GatewayMesh) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(gateway).chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert caught.value.body["code"] == "model_not_found"


def test_a_route_not_served_is_an_openai_not_found(gateway: GatewayMesh) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(gateway).embeddings.create(model="tiermesh-small", input="Hello")
    assert caught.value.body["code"] == "not_found"
    assert "/v1/chat/completions" in caught.value.message


def test_sampling_options_are_honoured(gateway: GatewayMesh) -> None:
    options = {"temperature": 0.9, "top_p": 0.9, "seed": 1234, "max_tokens": 12, "user": "u-1"}
    first, second = (
        client(gateway).chat.completions.create(model="tiermesh-small", messages=PROMPT, **options)
        for _ in range(2)
    )
    greedy = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=12
    )
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].message.content != greedy.choices[0].message.content


@pytest.mark.parametrize("model", ["tiermesh-small", "tiermesh-progressive"])
def test_stop_sequences_end_the_answer_before_them(gateway: GatewayMesh, model: str) -> None:
    whole = client(gateway).chat.completions.create(model=model, messages=PROMPT, max_tokens=24)
    full = whole.choices[0].message.content or ""
    assert len(full) >= 8, full
    stop = full[len(full) // 2 : len(full) // 2 + 3]  # some text from the middle of the answer
    expected = full[: full.find(stop)]
    answer = client(gateway).chat.completions.create(
        model=model, messages=PROMPT, max_tokens=24, stop=[stop, "\x00never"]
    )
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "stop"
    text, chunks = streamed_text(gateway, model, max_tokens=24, stop=stop)
    assert text == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("model", ["tiermesh-small", "tiermesh-progressive"])
def test_logprobs_give_each_token_of_the_answer(gateway: GatewayMesh, model: str) -> None:
    answer = client(gateway).chat.completions.create(
        model=model, messages=PROMPT, max_tokens=16, logprobs=True, top_logprobs=3
    )
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    tokens = choice.logprobs.content
    assert "".join(t.token for t in tokens) == choice.message.content
    for token in tokens:
        assert token.logprob <= 0.0
        assert token.bytes == list(token.token.encode())
        assert len(token.top_logprobs) == 3
        chances = [t.logprob for t in token.top_logprobs]
        assert chances == sorted(chances, reverse=True)
        assert token.logprob <= chances[0] + 1e-5  # greedy: the chosen token is the likeliest
        assert token.logprob == pytest.approx(chances[0], abs=1e-5)
    # streamed: each chunk lists the tokens of its text; together the same answer, token for
    # token
    text, chunks = streamed_text(gateway, model, max_tokens=16, logprobs=True, top_logprobs=3)
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert text == choice.message.content
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in tokens]
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            listed = chunk.choices[0].logprobs
            assert listed is not None
            assert "".join(t.token for t in listed.content) == chunk.choices[0].delta.content


def test_no_logprobs_unless_asked_and_none_on_top_when_zero(gateway: GatewayMesh) -> None:
    plain = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=8
    )
    assert plain.choices[0].logprobs is None
    bare = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=8, logprobs=True
    )
    tokens = bare.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == bare.choices[0].message.content
    assert all(t.top_logprobs == [] for t in tokens)
    neutral = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=8, top_logprobs=0
    )  # 0 alternatives without logprobs asks for nothing: accepted
    assert neutral.choices[0].logprobs is None


def test_logprobs_follow_a_stop_sequence(gateway: GatewayMesh) -> None:
    whole = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=24
    )
    full = whole.choices[0].message.content or ""
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    answer = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=24, stop=stop, logprobs=True
    )
    content = answer.choices[0].message.content
    assert content == full[: full.find(stop)]
    assert "".join(t.token for t in answer.choices[0].logprobs.content) == content


def test_n_gives_that_many_choices_each_an_answer(gateway: GatewayMesh) -> None:
    one = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=12
    )
    three = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, max_tokens=12, n=3
    )
    assert [c.index for c in three.choices] == [0, 1, 2]
    # greedy: every choice is the one answer
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert one.usage is not None and three.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counted once
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens


def test_sampled_choices_use_the_seed_plus_their_index(gateway: GatewayMesh) -> None:
    options = {"temperature": 1.0, "max_tokens": 16}
    choices = client(gateway).chat.completions.create(
        model="tiermesh-small", messages=PROMPT, n=3, seed=77, **options
    )
    alone = [
        client(gateway)
        .chat.completions.create(model="tiermesh-small", messages=PROMPT, seed=seed, **options)
        .choices[0]
        .message.content
        for seed in (77, 78, 79)
    ]
    assert [c.message.content for c in choices.choices] == alone
    assert len(set(alone)) > 1, "three seeds sampled the same answer"


def test_streamed_choices_interleave_and_end_with_one_usage_chunk(gateway: GatewayMesh) -> None:
    answer = client(gateway).chat.completions.create(
        model="tiermesh-progressive", messages=PROMPT, max_tokens=16, n=2
    )
    _, chunks = streamed_text(
        gateway,
        "tiermesh-progressive",
        max_tokens=16,
        n=2,
        stream_options={"include_usage": True},
    )
    texts = {0: "", 1: ""}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices  # one choice per chunk, as OpenAI streams n > 1
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason is not None:
            finishes[choice.index].append(choice.finish_reason)
    assert texts == {c.index: c.message.content for c in answer.choices}
    assert finishes == {c.index: [c.finish_reason] for c in answer.choices}
    assert {c.id for c in chunks} == {chunks[0].id}
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert answer.usage is not None
    assert last.usage.completion_tokens == answer.usage.completion_tokens


def test_each_choice_carries_its_revisions_object(gateway: GatewayMesh) -> None:
    answer = client(gateway).chat.completions.create(
        model="tiermesh-progressive",
        messages=PROMPT,
        max_tokens=12,
        n=2,
        extra_body={"tiermesh": {"revisions": True}},
    )
    extras = [c.model_extra["tiermesh"] for c in answer.choices]
    assert [(e["final"], e["tier"], e["revisions"]) for e in extras] == [(True, "large", 2)] * 2
    assert extras[0]["route"]["request_id"] != extras[1]["route"]["request_id"]
    assert answer.model_extra["tiermesh"] == extras[0]


def test_streamed_choices_each_end_with_their_final_object(gateway: GatewayMesh) -> None:
    _, chunks = streamed_text(
        gateway,
        "tiermesh-progressive",
        max_tokens=12,
        n=2,
        extra_body={"tiermesh": {"revisions": True}},
    )
    finals = {}
    for chunk in chunks:
        info = chunk.model_extra.get("tiermesh")
        if info and info.get("final"):
            (choice,) = chunk.choices
            assert choice.index not in finals, "a choice ended twice"
            finals[choice.index] = info
    assert sorted(finals) == [0, 1]
    assert finals[0]["route"]["request_id"] != finals[1]["route"]["request_id"]
