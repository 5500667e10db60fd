"""Checks README.md and docs/*.md against the tree and today's CLI: relative links and commands.

    .venv/bin/python scripts/check_docs.py [FILE.md ...]   # default: README.md and docs/*.md

Prints every failure as `file:line: message`, then one summary line; exits 1 on any failure, else
0. `make lint` runs it. Nothing is run and nothing is fetched: links are looked up on disk and
command lines are only parsed.

Links. Every markdown link or image outside code, `[text](target)` or a reference definition
`[label]: target`, whose target has no URL scheme (`https:`, `mailto:`) must name an existing file
or folder, relative to the markdown file. A `#anchor` (alone, or after a path to a markdown file)
must be a heading of that file, slugged as GitHub does (lower case, punctuation dropped, spaces
to `-`, `-1`, `-2` for repeats), or an HTML `id`/`name` in it.

Commands. Every `tiermesh ...` command line is parsed with the parser of the `tiermesh` command
itself, `services.cli.main.build_parser()`; argparse's errors become failures with its message.
- Where: lines of fenced code blocks with no language or a shell's (`sh`, `bash`, `console`,
  ...; a `text` or `python` block is not read), and inline code spans outside code blocks (a
  span may wrap lines; `\\|` inside a table is `|`). In code, a line ending in `\\` is joined
  with the next one, and a leading `$ ` prompt and `# comments` are dropped.
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
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HTML_ID = re.compile(r"""<[a-zA-Z][^>]*\s(?:id|name)=["']([^"']+)["']""")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PLACEHOLDER = re.compile(r"<[^<>]*>|(?<![A-Za-z0-9_])[A-Z][A-Z0-9_]*(?![A-Za-z0-9_])")
_OPTION = re.compile(r"^--?[A-Za-z][\w-]*")
_SEPARATORS = frozenset({";", "|", "||", "&&", "&"})
_SHELL_LANGUAGES = frozenset({"", "sh", "bash", "shell", "console", "zsh", "shell-session"})
_REDIRECT = re.compile(r"^\d*(>>?|<)(&\d+)?$")
_ATTACHED_REDIRECT = re.compile(r"^\d*>>?[^>\s]")


@dataclass(frozen=True)
class Failure:
    """One thing wrong in a markdown file, at a line."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass
class Report:
    """What was checked, and what failed."""

    links: int = 0
    commands: int = 0
    failures: list[Failure] = field(default_factory=list)

    def add(self, other: Report) -> None:
        self.links += other.links
        self.commands += other.commands
        self.failures.extend(other.failures)


@dataclass(frozen=True)
class _Markdown:
    """A markdown file split into its code lines and its prose blocks, with line numbers."""

    code: list[tuple[int, str]]  # (line, text) of every line of a shell (or unnamed) code block
    prose: list[tuple[int, str]]  # (first line, text) of each run of non-blank lines outside code
    headings: list[str]


def _split_markdown(text: str) -> _Markdown:
    code: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    headings: list[str] = []
    fence: str | None = None
    shell = False  # whether the open fence is a shell block (no language, or a shell's)
    block: list[str] = []
    block_start = 0

    def flush() -> None:
        if block:
            prose.append((block_start, "\n".join(block)))
            block.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            elif shell:
                code.append((number, line))
            continue
        if opened:
            flush()
            fence = opened.group(1)
            language = line.strip()[len(fence) :].strip().split(" ")[0].lower()
            shell = language in _SHELL_LANGUAGES
            continue
        if not line.strip():
            flush()
            continue
        heading = _HEADING.match(line)
        if heading:
            flush()
            headings.append(heading.group(2))
            prose.append((number, line))
            continue
        if not block:
            block_start = number
        block.append(line)
    flush()
    return _Markdown(code=code, prose=prose, headings=headings)


def _line_at(start: int, text: str, offset: int) -> int:
    return start + text.count("\n", 0, offset)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a markdown text defines: its headings' slugs and its HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _split_markdown(text).headings:
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    found.update(_HTML_ID.findall(text))
    return found


def _blank_inline_code(text: str) -> str:
    """The text with each inline code span replaced by spaces (newlines kept)."""
    return _INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _link_targets(doc: _Markdown) -> Iterator[tuple[int, str]]:
    for start, block in doc.prose:
        plain = _blank_inline_code(block)
        for match in _LINK.finditer(plain):
            yield _line_at(start, plain, match.start()), match.group(1)
        for offset, line in enumerate(plain.split("\n")):
            reference = _REFERENCE.match(line)
            if reference:
                yield start + offset, reference.group(1)


def check_links(path: Path, root: Path = ROOT) -> Report:
    """Every relative link of one markdown file names an existing file (and heading)."""
    report = Report()
    name = _display(path, root)
    text = path.read_text(encoding="utf-8")
    doc = _split_markdown(text)
    for line, target in _link_targets(doc):
        if _SCHEME.match(target):
            continue
        report.links += 1
        location, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(location)).resolve() if location else path.resolve()
        if not resolved.exists():
            report.failures.append(Failure(name, line, f"broken link {target}: no such file"))
            continue
        if anchor and resolved.suffix == ".md" and resolved.is_file():
            own = text if resolved == path.resolve() else resolved.read_text(encoding="utf-8")
            if unquote(anchor) not in anchors(own):
                report.failures.append(
                    Failure(name, line, f"broken link {target}: no heading #{anchor} there")
                )
    return report


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


def _commands(tokens: list[str]) -> Iterator[list[str]]:
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


def _command_lines(doc: _Markdown) -> Iterator[tuple[int, str]]:
    """(line, shell text) of every candidate command: code lines and inline code spans."""
    pending: list[str] = []
    first = 0
    for number, line in doc.code:
        if not pending:
            first = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        yield first, " ".join(pending)
        pending = []
    if pending:
        yield first, " ".join(pending)
    for start, block in doc.prose:
        for match in _INLINE_CODE.finditer(block):
            span = match.group(2).replace("\\|", "|").replace("\n", " ").strip()
            yield _line_at(start, block, match.start()), span


def check_commands(path: Path, parser: argparse.ArgumentParser, root: Path = ROOT) -> Report:
    """Every `tiermesh ...` command line of one markdown file parses with today's CLI."""
    report = Report()
    name = _display(path, root)
    doc = _split_markdown(path.read_text(encoding="utf-8"))
    for line, text in _command_lines(doc):
        shell = text.strip()
        if shell.startswith("$ "):
            shell = shell[2:]
        if not re.search(r"(^|[\s;|&/])tiermesh(\s|$)", shell):
            continue
        try:
            tokens = shlex.split(shell, comments=True)
        except ValueError as e:
            report.commands += 1
            report.failures.append(Failure(name, line, f"cannot split {shell!r}: {e}"))
            continue
        for args in _commands(tokens):
            report.commands += 1
            problem = check_command(parser, args)
            if problem is not None:
                command = shlex.join(["tiermesh", *args])
                report.failures.append(Failure(name, line, f"{problem} (in: {command})"))
    return report


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def default_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def check_files(paths: Sequence[Path], root: Path = ROOT) -> Report:
    """Links and commands of every file given."""
    report = Report()
    try:
        parser: argparse.ArgumentParser | None = build_cli_parser()
    except Exception as e:  # the CLI itself does not import: say so, and check the links anyway
        report.failures.append(Failure("services/cli/main.py", 1, f"no tiermesh parser: {e!r}"))
        parser = None
    for path in paths:
        report.add(check_links(path, root))
        if parser is not None:
            report.add(check_commands(path, parser, root))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    cli.add_argument("files", nargs="*", type=Path, help="default: README.md and docs/*.md")
    args = cli.parse_args(argv)
    paths: list[Path] = args.files or default_files()
    report = check_files(paths)
    for failure in report.failures:
        print(failure)
    verdict = f"{len(report.failures)} failure(s)" if report.failures else "all good"
    print(
        f"check_docs: {len(paths)} files, {report.links} relative links, "
        f"{report.commands} tiermesh command lines checked: {verdict}"
    )
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
