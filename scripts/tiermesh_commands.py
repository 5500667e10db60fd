"""Whether a `tiermesh ...` command line parses with today's CLI: the commands one shell line
holds, each parsed with the parser of the `tiermesh` command itself,
`services.cli.main.build_parser()`, made to report argparse's errors instead of exiting.

- `;`, `|`, `||`, `&&` and `&` split a line into commands, redirections (`> file`, `2>&1`) are
  dropped, and only commands whose program is `tiermesh` (or a path ending in `/tiermesh`, after
  any `NAME=value` assignments) are checked. A bare `tiermesh` is the program's name, not a
  command line, and is skipped.
- Placeholders: a value with an upper-case word in it (`PROMPT`, `DIR`, `small=PATH`,
  `127.0.0.1:PORT`, `$KEY`) or a `<...>` part passes any type and choices check; it still fills
  its argument, so a command without a required argument fails (write `tiermesh chat PROMPT`).
- Synopses: a line with `[`, `]`, `...` or `…`, or a sub-command written as alternatives
  (`train|eval`), is a synopsis, not a command: its sub-command words (each alternative) must
  exist and every `--option` it names must be an option of that sub-command; nothing else is
  checked. So is a line with a placeholder where a sub-command goes (`tiermesh COMMAND --help`).
- `--help` and `-h` parse (the help is printed nowhere).

Knows argparse and shell tokens; nothing of markdown or of which files are checked
(check_docs.py finds the lines). Nothing is run: command lines are only parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PLACEHOLDER = re.compile(r"<[^<>]*>|(?<![A-Za-z0-9_])[A-Z][A-Z0-9_]*(?![A-Za-z0-9_])")
_OPTION = re.compile(r"^--?[A-Za-z][\w-]*")
_SEPARATORS = frozenset({";", "|", "||", "&&", "&"})
_REDIRECT = re.compile(r"^\d*(>>?|<)(&\d+)?$")
_ATTACHED_REDIRECT = re.compile(r"^\d*>>?[^>\s]")


class _ParseFailure(Exception):
    """argparse reported an error (instead of exiting)."""


class _Exited(Exception):
    """argparse asked to exit without an error (after --help)."""


class _Placeholder(str):
    """A value written as a placeholder (`PATH`, `<dir>`): it passes types and choices."""


def is_placeholder(token: str) -> bool:
    """Whether a value is a placeholder rather than a literal value."""
    return _PLACEHOLDER.search(token) is not None


def _placeholder_type(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def accept(value: str) -> Any:
        return _Placeholder(value) if is_placeholder(value) else convert(value)

    accept.__name__ = getattr(convert, "__name__", "value")  # argparse names it in errors
    return accept


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _prepare(parser: argparse.ArgumentParser) -> None:
    """Make one parser (and its sub-parsers) report instead of exit, and accept placeholders."""

    def error(message: str) -> NoReturn:
        raise _ParseFailure(f"{parser.prog}: {message}")

    def leave(status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise _ParseFailure(f"{parser.prog}: {message or 'exit ' + str(status)}")
        raise _Exited

    check_value = parser._check_value

    def check(action: argparse.Action, value: Any) -> None:
        if not isinstance(value, _Placeholder):
            check_value(action, value)

    parser.error = error  # type: ignore[method-assign]
    parser.exit = leave  # type: ignore[method-assign]
    parser._check_value = check  # type: ignore[method-assign]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _prepare(child)
        elif action.nargs != 0:
            convert = parser._registry_get("type", action.type, action.type)
            if callable(convert):
                action.type = _placeholder_type(convert)


def build_cli_parser() -> argparse.ArgumentParser:
    """The `tiermesh` command's parser, made to report errors instead of exiting."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from services.cli.main import build_parser

    parser = build_parser()
    _prepare(parser)
    return parser


def tiermesh_commands(tokens: list[str]) -> Iterator[list[str]]:
    """The `tiermesh` commands of one shell line's tokens: their arguments, program dropped."""
    segments: list[list[str]] = [[]]
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token in _SEPARATORS:
            segments.append([])
            continue
        if _REDIRECT.match(token):
            skip_next = not token.endswith(("&1", "&2"))
            continue
        if _ATTACHED_REDIRECT.match(token):
            continue
        if token.endswith(";") and len(token) > 1:
            segments[-1].append(token[:-1])
            segments.append([])
            continue
        segments[-1].append(token)
    for segment in segments:
        words = list(segment)
        while words and _ASSIGNMENT.match(words[0]):
            words.pop(0)
        if len(words) > 1 and (words[0] == "tiermesh" or words[0].endswith("/tiermesh")):
            yield words[1:]


def _is_synopsis(args: Sequence[str]) -> bool:
    for token in args:
        if any(mark in token for mark in ("[", "]", "...", "…")):
            return True
        if not token.startswith("-") and re.fullmatch(r"[\w.-]+(\|[\w.-]+)+", token):
            return True
    return False


def _check_synopsis(parser: argparse.ArgumentParser, args: Sequence[str]) -> str | None:
    """A synopsis' sub-commands exist and it names only options they have."""
    current = [parser]
    tokens = list(args)
    while tokens:
        subs = _subparsers(current[0]) if len(current) == 1 else None
        word = tokens[0]
        if subs is None or word.startswith(("-", "[", "(")) or word in ("...", "…"):
            break
        alternatives = word.split("|")
        unknown = [alt for alt in alternatives if alt not in subs.choices]
        if unknown:
            known = len(unknown) < len(alternatives)  # alternatives of which some exist
            if is_placeholder(word) or not (subs.required or known):
                break
            choices = ", ".join(subs.choices)
            return f"{current[0].prog}: unknown sub-command {unknown[0]!r} (choose from {choices})"
        current = [subs.choices[alt] for alt in alternatives]
        tokens.pop(0)
    for token in tokens:
        option = _OPTION.match(token.lstrip("[("))
        if option is None:
            continue
        name = option.group(0)
        if not any(name in p._option_string_actions for p in current):
            progs = " / ".join(p.prog for p in current)
            return f"{progs}: unknown option {name}"
    return None


def _placeholder_command(parser: argparse.ArgumentParser, args: Sequence[str]) -> bool:
    """Whether a placeholder stands where a sub-command goes (`tiermesh COMMAND --help`)."""
    current = parser
    for word in args:
        subs = _subparsers(current)
        if subs is None or word.startswith("-"):
            return False
        if word not in subs.choices:
            return is_placeholder(word)
        current = subs.choices[word]
    return False


def check_command(parser: argparse.ArgumentParser, args: Sequence[str]) -> str | None:
    """None when `tiermesh ARGS` parses (or, for a synopsis, names what exists), else why not."""
    if _is_synopsis(args) or _placeholder_command(parser, args):
        return _check_synopsis(parser, args)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(list(args))
    except _ParseFailure as failure:
        return str(failure)
    except _Exited:
        return None
    return None
