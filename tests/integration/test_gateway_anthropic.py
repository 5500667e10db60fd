"""POST /v1/messages through the real `anthropic` client (sync and async, streamed with
`client.messages.stream` and not) against a real gateway, router and torch tiers: the answer,
stop reasons, usage, the revisions opt-in, refusals naming the field, and API keys given as
`x-api-key` or a bearer token, with Anthropic's error types and statuses."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import pytest

from services.common.config import GatewayConfig, RouterConfig, TierConfig
from services.common.config_loading import build_config
from services.gateway.server import start_gateway
from services.router.server import start_router
from services.security.api_keys import create_key
from services.security.settings import ServiceSecurity
from services.tier.server import start_tier
from tests.integration.gateway_mesh import GatewayMesh, module_gateway
from tests.integration.mesh import Mesh

PROMPT = [{"role": "user", "content": "What is your return policy?"}]
MODELS = [
    "tiermesh-routed",
    "tiermesh-progressive",
    "tiermesh-small",
    "tiermesh-medium",
    "tiermesh-large",
]
LONG = {"max_tokens": 400}


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[GatewayMesh]:
    yield from module_gateway(tmp_path_factory.mktemp("tiny-model-large"), tiny_model_dir)


_OPEN: list[anthropic.Anthropic] = []  # clients made by a test, closed after it


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def client(url: str, **options: object) -> anthropic.Anthropic:
    options.setdefault("api_key", "x")
    made = anthropic.Anthropic(base_url=url, max_retries=0, **options)  # type: ignore[arg-type]
    _OPEN.append(made)
    return made


@pytest.mark.parametrize("model", MODELS)
def test_streamed_text_equals_the_non_streamed_message(gateway: GatewayMesh, model: str) -> None:
    message = client(gateway.url).messages.create(model=model, max_tokens=24, messages=PROMPT)
    assert (message.type, message.role, message.model) == ("message", "assistant", model)
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 1 <= message.usage.output_tokens <= 24
    with client(gateway.url).messages.stream(model=model, max_tokens=24, messages=PROMPT) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message.content[0].text
    assert final.content[0].text == text
    assert final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens
    assert final.usage.input_tokens == message.usage.input_tokens


async def test_the_async_client_streams_and_not(gateway: GatewayMesh) -> None:
    async_client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="x", max_retries=0)
    options = {"model": "tiermesh-progressive", "max_tokens": 16, "messages": PROMPT}
    message = await async_client.messages.create(**options)  # type: ignore[call-overload]
    async with async_client.messages.stream(**options) as stream:  # type: ignore[arg-type]
        pieces = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    await async_client.close()
    assert len(pieces) >= 1
    assert "".join(pieces) == message.content[0].text == final.content[0].text


def test_an_answer_cut_by_max_tokens_says_so(gateway: GatewayMesh) -> None:
    message = client(gateway.url).messages.create(
        model="tiermesh-small",
        max_tokens=3,
        system=[{"type": "text", "text": "You answer questions about the shop."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "assistant", "content": "Hi, how can I help?"},
            *PROMPT,
        ],
        stop_sequences=["\n\n\n"],
        # sampling fields the SDK no longer takes, which older clients and plain HTTP still send
        extra_body={"temperature": 0.0, "top_p": 1.0, "top_k": 10},
    )
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_ended_by_a_stop_sequence_names_it(gateway: GatewayMesh, stream: bool) -> None:
    whole = client(gateway.url).messages.create(
        model="tiermesh-small", max_tokens=16, messages=PROMPT
    )
    text = whole.content[0].text  # type: ignore[union-attr]
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # from the middle of the greedy answer
    options = {"model": "tiermesh-small", "max_tokens": 16, "messages": PROMPT}
    if stream:
        with client(gateway.url).messages.stream(stop_sequences=[stop], **options) as events:
            message = events.get_final_message()
    else:
        message = client(gateway.url).messages.create(stop_sequences=[stop], **options)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    assert message.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]


def test_raw_events_follow_anthropics_sequence(gateway: GatewayMesh) -> None:
    events = list(
        client(gateway.url).messages.create(
            model="tiermesh-small", max_tokens=8, messages=PROMPT, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert all(event.delta.type == "text_delta" for event in events[2:-3])  # type: ignore[union-attr]
    delta = events[-2]
    assert delta.delta.stop_reason == "max_tokens"  # type: ignore[union-attr]
    assert delta.usage.output_tokens == 8  # type: ignore[union-attr]


def test_every_revision_on_request(gateway: GatewayMesh) -> None:
    events = list(
        client(gateway.url).messages.create(
            model="tiermesh-progressive",
            max_tokens=16,
            messages=PROMPT,
            stream=True,
            extra_body={"tiermesh": {"revisions": True}},
        )
    )
    texts: dict[int, str] = {}
    for event in events:
        if event.type == "content_block_delta":
            info = event.model_extra["tiermesh"]  # type: ignore[index]
            texts[info["revision"]] = texts.get(info["revision"], "") + event.delta.text  # type: ignore[union-attr]
    final = events[-2].model_extra["tiermesh"]  # type: ignore[index]
    assert (final["final"], final["revision"], final["tier"]) == (True, 1, "large")
    assert final["route"]["tiers"] == ["small", "large"]
    assert set(texts) == {0, 1}
    message = client(gateway.url).messages.create(
        model="tiermesh-progressive",
        max_tokens=16,
        messages=PROMPT,
        extra_headers={"X-Tiermesh-Revisions": "1"},
    )
    assert message.model_extra["tiermesh"]["revision"] == 1  # type: ignore[index]
    assert message.content[0].text == texts[1]  # type: ignore[union-attr]


def test_a_client_leaving_the_stream_cancels_the_router_call(gateway: GatewayMesh) -> None:
    before = {tier: gateway.wait_idle(tier).completed for tier in ("small", "large")}
    body = {
        "model": "tiermesh-progressive",
        "max_tokens": 400,
        "messages": PROMPT,
        "stream": True,
        "tiermesh": {"revisions": True},
    }
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body) as response:
        for line in response.iter_lines():
            if '"text_delta","text":"' in line and '"text":""' not in line:
                break  # the first draft text: leave
    for tier in ("small", "large"):
        status = gateway.wait_idle(tier)
        assert status.running == 0
        assert status.completed == before[tier], f"{tier} finished instead of being cancelled"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"tools": [{"name": "lookup", "input_schema": {"type": "object"}}]}, "tools"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": ""},
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        ({"extra_body": {"temperature": 1.5}}, "temperature"),
        ({"max_tokens": 5000}, "max_tokens"),  # over the router's limit (400 here), relayed
    ],
)
def test_what_tiermesh_cannot_honour_is_a_400_naming_the_field(
    gateway: GatewayMesh, options: dict[str, object], named: str
) -> None:
    request = {"model": "tiermesh-small", "max_tokens": 8, "messages": PROMPT, **options}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client(gateway.url).messages.create(**request)  # type: ignore[call-overload]
    assert refused.value.status_code == 400
    body = refused.value.body
    assert body["type"] == "error"  # type: ignore[index]
    assert body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert body["error"]["message"].startswith(named)  # type: ignore[index]


def test_an_unknown_model_is_not_found_and_max_tokens_is_required(gateway: GatewayMesh) -> None:
    with pytest.raises(anthropic.NotFoundError) as refused:
        client(gateway.url).messages.create(model="claude-x", max_tokens=8, messages=PROMPT)
    assert refused.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    body = {"model": "tiermesh-small", "messages": PROMPT}
    response = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("max_tokens: required")


@dataclass
class KeyedGateway:
    mesh: GatewayMesh
    key: str
    feedback_only: str
    one_per_minute: str
    other: str  # a second app's key


@pytest.fixture(scope="module")
def keyed(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    """A gateway before a router that enforces API keys and admits one chat at a time."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    _, key = create_key(keys, "app", ("chat",))
    _, feedback_only = create_key(keys, "feedback-bot", ("feedback",))
    _, one_per_minute = create_key(keys, "slow", ("chat",), rpm=1)
    _, other = create_key(keys, "other-app", ("chat",))

    async def start() -> Mesh:
        tier_config = {"name": "small", "model_path": str(tiny_model_dir), **LONG}
        tier = await start_tier(build_config(TierConfig, tier_config))
        tiers = dict.fromkeys(("small", "medium", "large"), tier.address)  # one serves all
        router_config = {"port": 0, "tiers": tiers, "max_inflight": 1, **LONG}
        router = await start_router(
            build_config(RouterConfig, router_config), ServiceSecurity(keys_file=keys)
        )
        return Mesh({"small": tier}, router)

    mesh = GatewayMesh()
    try:
        mesh.mesh = mesh.run(start())
        config = build_config(GatewayConfig, {"port": 0, "router": mesh.mesh.address})
        mesh.gateway = mesh.run(start_gateway(config))
        yield KeyedGateway(mesh, key, feedback_only, one_per_minute, other)
    finally:
        mesh.stop()


def ask(url: str, **options: object) -> anthropic.types.Message:
    return client(url, **options).messages.create(
        model="tiermesh-small", max_tokens=4, messages=PROMPT
    )


def test_the_key_comes_as_x_api_key_or_as_a_bearer_token(keyed: KeyedGateway) -> None:
    url = keyed.mesh.url
    assert ask(url, api_key=keyed.key).content[0].text  # type: ignore[union-attr]
    assert ask(url, api_key=None, auth_token=keyed.key).content[0].text  # type: ignore[union-attr]
    with pytest.raises(anthropic.AuthenticationError) as refused:
        ask(url, api_key=keyed.key[:-2] + "xx")
    assert refused.value.status_code == 401
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        ask(url, api_key=keyed.feedback_only)
    assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]


def test_a_keys_rate_limit_is_429_and_a_full_router_is_529(keyed: KeyedGateway) -> None:
    url = keyed.mesh.url
    ask(url, api_key=keyed.one_per_minute)
    with pytest.raises(anthropic.RateLimitError) as limited:
        ask(url, api_key=keyed.one_per_minute)
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(limited.value.response.headers["retry-after"]) >= 1
    body = {"model": "tiermesh-small", "max_tokens": 400, "messages": PROMPT, "stream": True}
    headers = {"x-api-key": keyed.other}  # another key holds the one slot: not a fair-share limit
    with httpx.stream("POST", f"{url}/v1/messages", json=body, headers=headers) as held:
        assert held.status_code == 200  # the one chat the router admits, still streaming
        with pytest.raises(anthropic.InternalServerError) as overloaded:
            ask(url, api_key=keyed.key)
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert overloaded.value.response.headers["retry-after"] == "1"
    keyed.mesh.wait_idle("small")
