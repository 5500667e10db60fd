"""scripts/check_docs.py: broken links and command lines today's CLI refuses are found, by line."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts" / "check_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


check_docs = _load_checker()


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    built: argparse.ArgumentParser = check_docs.build_cli_parser()
    return built


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _failures(report: Any) -> list[tuple[int, str]]:
    return [(f.line, f.message) for f in report.failures]


def test_a_good_link_passes_and_a_broken_one_is_reported_with_its_line(tmp_path: Path) -> None:
    _write(tmp_path, "docs/guide.md", "# Guide\n\n## Setting up\n\ntext\n")
    page = _write(
        tmp_path,
        "README.md",
        "# Title\n"
        "\n"
        "See [the guide](docs/guide.md), [its setup](docs/guide.md#setting-up) and\n"
        "[the title](#title), or [the web](https://example.com).\n"
        "\n"
        "A [missing page](docs/nothing.md) and [a missing part](docs/guide.md#teardown).\n"
        "\n"
        "```sh\n"
        "echo '[not a link](nowhere.md)'\n"
        "```\n"
        "\n"
        "[ref]: docs/gone.md\n",
    )
    report = check_docs.check_links(page, tmp_path)
    assert report.links == 6  # the web link is not counted, the code block is not read
    assert _failures(report) == [
        (6, "broken link docs/nothing.md: no such file"),
        (6, "broken link docs/guide.md#teardown: no heading #teardown there"),
        (12, "broken link docs/gone.md: no such file"),
    ]


def test_commands_are_parsed_and_refusals_name_the_line(
    tmp_path: Path, parser: argparse.ArgumentParser
) -> None:
    page = _write(
        tmp_path,
        "docs/commands.md",
        "# Commands\n"
        "\n"
        "```sh\n"
        "tiermesh chat --mode pinned --tier small --json PROMPT   # a good one\n"
        "tiermesh chat --colour PROMPT\n"
        "tiermesh bnech --duration 5\n"
        "OMP_NUM_THREADS=1 .venv/bin/tiermesh bench engine --concurrency 1,16 \\\n"
        "    --max-tokens 16 --json\n"
        "tiermesh mesh k8s --secure | kubectl apply -f -\n"
        "```\n"
        "\n"
        "Run `tiermesh run --base-port B` or `tiermesh top --once`; not `tiermesh tier swap`.\n"
        "`tiermesh` alone is the program, `tiermesh.v1` a package.\n",
    )
    report = check_docs.check_commands(page, parser, tmp_path)
    assert report.commands == 8
    failures = _failures(report)
    assert [line for line, _ in failures] == [5, 6, 12]
    assert failures[0][1].startswith("tiermesh: unrecognized arguments: --colour (in: ")
    assert "invalid choice: 'bnech'" in failures[1][1]
    assert "the following arguments are required: TIER, DIR" in failures[2][1]


def test_synopses_check_sub_commands_and_option_names(
    tmp_path: Path, parser: argparse.ArgumentParser
) -> None:
    page = _write(
        tmp_path,
        "docs/synopsis.md",
        "| command | what |\n"
        "| --- | --- |\n"
        "| `tiermesh models train\\|eval\\|workload` | models |\n"
        "| `tiermesh models train\\|evaluate` | a typo |\n"
        "| `tiermesh top [--once --json] [--interval S]` | live |\n"
        "| `tiermesh top [--once --yaml]` | no such option |\n"
        "| `tiermesh COMMAND --help` | help |\n",
    )
    report = check_docs.check_commands(page, parser, tmp_path)
    assert report.commands == 5
    failures = _failures(report)
    assert [line for line, _ in failures] == [4, 6]
    assert "unknown sub-command 'evaluate'" in failures[0][1]
    assert "unknown option --yaml" in failures[1][1]


def test_placeholders_pass_types_and_choices(parser: argparse.ArgumentParser) -> None:
    assert check_docs.check_command(parser, ["run", "--base-port", "B", "--tier-nice", "N"]) is None
    assert check_docs.check_command(parser, ["chat", "--mode", "MODE", "PROMPT"]) is None
    refused = check_docs.check_command(parser, ["run", "--base-port", "high"])
    assert refused is not None and "invalid int value: 'high'" in refused
    assert check_docs.check_command(parser, ["chat", "--help"]) is None


def test_the_readme_and_docs_pass() -> None:
    files = check_docs.default_files()
    assert ROOT / "README.md" in files and len(files) > 1
    report = check_docs.check_files(files)
    assert [str(f) for f in report.failures] == []
    assert report.links > 0 and report.commands > 0
