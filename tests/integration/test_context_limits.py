"""Conversations longer than a tier's context, through a real router and real torch tiers: an
unset max_tokens is what each tier's context leaves after the prompt, a prompt a tier cannot
hold goes on to one that can, and a prompt no tier holds is refused naming the largest context.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient, ChatError

from tests.integration.mesh import start_mesh
from tests.tiny_model import build_tiny_model

SHORT_CONTEXT = 96  # positions of the short model; the tiny model's own is 512


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-short"), context=SHORT_CONTEXT)


def conversation(turns: int) -> list[tuple[str, str]]:
    """A conversation of `turns` questions and answers, then one more question."""
    messages = []
    for turn in range(turns):
        messages.append(("user", f"What is the price of item {turn}?"))
        messages.append(("assistant", f"Item {turn} costs {turn + 3} dollars."))
    messages.append(("user", "And the shipping?"))
    return messages


async def test_an_unset_max_tokens_is_what_the_context_leaves(short_model_dir: Path) -> None:
    mesh = await start_mesh(
        short_model_dir,
        tier_options={"max_tokens": 40},
        router_options={"default_max_tokens": 40, "max_tokens": 40},
    )
    try:
        messages = conversation(1)
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(messages=messages, mode="pinned", tier="small")
            usage = {u["tier"]: u for u in result.final.usage}["small"]
            prompt = usage["prompt_tokens"]
            # the default (40) did not fit after this prompt: the tier answered within its context
            assert prompt + 40 > SHORT_CONTEXT
            assert usage["completion_tokens"] <= SHORT_CONTEXT - prompt
            # a max_tokens the client set is refused as before when it does not fit
            with pytest.raises(ChatError) as refused:
                await client.chat(messages=messages, mode="pinned", tier="small", max_tokens=40)
        assert refused.value.code == "INVALID_ARGUMENT"
        assert f"exceeds the model's context of {SHORT_CONTEXT} tokens" in refused.value.message
    finally:
        await mesh.stop()


async def test_a_prompt_the_draft_tier_cannot_hold_is_answered_by_the_refine_tier(
    tiny_model_dir: Path, short_model_dir: Path
) -> None:
    mesh = await start_mesh(tiny_model_dir, models={"small": short_model_dir})
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(
                messages=conversation(6), mode="progressive", progressive_gate="always"
            )
        assert (result.revision, result.tier) == (0, "large")
        reason = result.final.reason
        assert reason.startswith("draft tier small failed (INVALID_ARGUMENT: prompt: ")
        assert f"exceeds this tier's limit of {SHORT_CONTEXT - 1} tokens" in reason
    finally:
        await mesh.stop()


async def test_a_prompt_no_tier_holds_is_refused_naming_the_largest_context(
    tiny_model_dir: Path, short_model_dir: Path
) -> None:
    mesh = await start_mesh(
        tiny_model_dir, models={"small": short_model_dir}, tier_options={"max_prompt_tokens": 64}
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            with pytest.raises(ChatError) as refused:
                await client.chat(
                    messages=conversation(12), mode="progressive", progressive_gate="always"
                )
        assert refused.value.code == "INVALID_ARGUMENT"
        assert "exceeds the largest context of the tiers that could take it (64 tokens)" in (
            refused.value.message
        )
        assert refused.value.details.reason == "PROMPT_TOO_LONG"
    finally:
        await mesh.stop()
