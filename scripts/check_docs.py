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
- How a line splits into commands, and what passes as a placeholder or a synopsis:
  tiermesh_commands.py.

This module reads the markdown and the tree; tiermesh_commands.py knows the CLI.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiermesh_commands.py, beside it
from tiermesh_commands import build_cli_parser, check_command, tiermesh_commands

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HTML_ID = re.compile(r"""<[a-zA-Z][^>]*\s(?:id|name)=["']([^"']+)["']""")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
_SHELL_LANGUAGES = frozenset({"", "sh", "bash", "shell", "console", "zsh", "shell-session"})


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
        for args in tiermesh_commands(tokens):
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
