"""`tiermesh chaos`'s command line as the options of its mesh: which tiers run on vLLM or on a
remote server, and what the launcher is given for them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.chaos.cli import options_from, register


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["chaos", *argv])


@pytest.mark.parametrize(
    ("argv", "echo", "vllm", "remotes", "models"),
    [
        ((), False, frozenset(), {}, {}),
        (("--engine", "echo"), True, frozenset(), {}, {}),
        (
            ("--engine", "large=vllm", "--model", "large=models/smollm2-135m"),
            False,
            frozenset({"large"}),
            {},
            {"large": Path("models/smollm2-135m")},
        ),
        (
            ("--engine", "large=openai", "--model", "large=http://10.0.0.5:8000/v1"),
            False,
            frozenset(),
            {"large": ("http://10.0.0.5:8000/v1",)},
            {},
        ),
    ],
)
def test_the_engines_of_the_mesh(
    argv: tuple[str, ...],
    echo: bool,
    vllm: frozenset[str],
    remotes: dict[str, tuple[str, ...]],
    models: dict[str, Path],
) -> None:
    options = options_from(parse(*argv))
    assert (options.echo is not None, options.vllm, options.remotes) == (echo, vllm, remotes)
    assert {tier: Path(path) for tier, path in options.models.items()} == models


@pytest.mark.parametrize("value", ["large=torch", "huge=vllm", "fast"])
def test_an_engine_it_does_not_know_is_refused(value: str) -> None:
    with pytest.raises(SystemExit):
        parse("--engine", value)


def test_a_remote_tier_needs_its_url() -> None:
    with pytest.raises(SystemExit, match="needs --model large="):
        options_from(parse("--engine", "large=openai"))
