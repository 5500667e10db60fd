"""Several choices (`n`) of one chat completion: each choice's router request, and the
gathering of their answers (the first failure cancels the others)."""

from __future__ import annotations

import asyncio

import pytest

from services.gateway.chat_request import MAX_SEED, parse_chat_request
from services.gateway.completions import all_of
from services.gateway.errors import GatewayError

BODY = {"model": "tiermesh-small", "messages": [{"role": "user", "content": "hi"}]}


def test_each_choice_after_the_first_gets_the_seed_plus_its_index() -> None:
    parsed = parse_chat_request({**BODY, "n": 3, "seed": 41}, max_choices=8)
    assert parsed.n == 3
    assert [parsed.choice_request(i).sampling.seed for i in range(3)] == [41, 42, 43]
    assert parsed.choice_request(0) is parsed.request
    assert parsed.request.sampling.seed == 41  # the others are copies


def test_a_seed_at_the_top_wraps_to_one_and_no_seed_stays_none() -> None:
    top = parse_chat_request({**BODY, "n": 3, "seed": MAX_SEED}, max_choices=8)
    assert [top.choice_request(i).sampling.seed for i in range(3)] == [MAX_SEED, 1, 2]
    unseeded = parse_chat_request({**BODY, "n": 2}, max_choices=8)
    assert unseeded.choice_request(1).sampling.seed == 0  # 0: not seeded


@pytest.mark.parametrize("n", [0, 5, -1, True, "2"])
def test_n_outside_the_bound_is_a_400_naming_it(n: object) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_chat_request({**BODY, "n": n}, max_choices=4)
    assert (caught.value.status, caught.value.param) == (400, "n")
    assert "[1, 4]" in str(caught.value)


def test_all_of_keeps_the_order_of_the_results() -> None:
    async def later(value: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return value

    assert asyncio.run(all_of([later(1, 0.03), later(2, 0.0), later(3, 0.01)])) == [1, 2, 3]


def test_all_of_cancels_the_rest_when_one_fails() -> None:
    cancelled: list[int] = []

    async def slow(index: int) -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(index)
            raise
        return index

    async def fails() -> int:
        await asyncio.sleep(0.01)
        raise GatewayError(429, "busy")

    async def run() -> None:
        with pytest.raises(GatewayError, match="busy"):
            await all_of([slow(0), fails(), slow(2)])

    asyncio.run(asyncio.wait_for(run(), 5))
    assert sorted(cancelled) == [0, 2]
