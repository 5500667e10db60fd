"""The environment variable registry (services/common/env.py) against the code: every variable
the code reads by name is registered, and every registered one is read somewhere, so the list
cannot rot either way.

A read is `os.environ[NAME]`, `os.environ.get(NAME)`, `.setdefault`, `.pop`, `NAME in
os.environ`, `os.getenv(NAME)`, the same through a local alias of os.environ (`env =
os.environ`), through a bare `environ`, or through the registry's accessors (which read by name
in env.py). NAME is a string literal, or a module constant (`API_KEY_ENV = "..."`, in the file or
imported by name), a key of a constant dict iterated over, or a value of a constant dict looked
up by key. A read whose name cannot be told this way fails the test: write it by name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.common.env import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("services", "mesh", "clients/python/src/tiermesh/client", "scripts")
MAPPING_READS = {"get", "setdefault", "pop"}


@dataclass(frozen=True)
class Read:
    where: str  # path:line
    names: tuple[str, ...]  # () when the name cannot be told


def source_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py"))


def _strings(node: ast.expr) -> tuple[str, ...] | None:
    """The strings a constant expression holds: a str, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = [_strings(element) for element in node.elts]
        if all(item is not None and len(item) == 1 for item in items):
            return tuple(item[0] for item in items if item is not None)
    return None


@dataclass
class Constants:
    """Module-level string constants (and dicts of them) of every scanned file, by name."""

    strings: dict[str, set[tuple[str, ...]]]
    dicts: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]  # name -> (keys, values)

    @classmethod
    def of(cls, trees: dict[Path, ast.Module]) -> Constants:
        strings: dict[str, set[tuple[str, ...]]] = {}
        dicts: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        for tree in trees.values():
            for node in tree.body:
                target, value = _assignment(node)
                if target is None or value is None:
                    continue
                if (held := _strings(value)) is not None:
                    strings.setdefault(target, set()).add(held)
                elif isinstance(value, ast.Dict):
                    keys = [_strings(k) if k is not None else None for k in value.keys]
                    values = [_strings(v) for v in value.values]
                    if all(k is not None for k in keys):
                        dicts[target] = (
                            tuple(k[0] for k in keys if k is not None),
                            tuple(s for v in values if v is not None for s in v),
                        )
        return cls(strings, dicts)

    def string(self, name: str) -> tuple[str, ...] | None:
        """The value of a str constant, or None (unknown, or two files disagree)."""
        held = self.strings.get(name, set())
        if len(held) != 1:
            return None
        (value,) = held
        return value if len(value) == 1 else None


def _assignment(node: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return (target.id if isinstance(target, ast.Name) else None), node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id, node.value
    return None, None


def _is_environ(node: ast.expr, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name)
    return isinstance(node, ast.Name) and (node.id == "environ" or node.id in aliases)


def _environ_aliases(tree: ast.Module) -> set[str]:
    """Names assigned an expression that holds os.environ (`env = os.environ if ... else ...`)."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            _is_environ(n, set()) for n in ast.walk(node.value) if isinstance(n, ast.expr)
        ):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return aliases


def _loop_keys(tree: ast.Module, name: str, constants: Constants) -> tuple[str, ...] | None:
    """The strings `name` takes as a loop or comprehension variable over a constant:
    `for name in CONST`, `for name in CONST.keys()`, `for name, _ in CONST.items()`."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.For | ast.comprehension):
            continue
        target, source = node.target, node.iter
        method = None
        if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute):
            method, source = source.func.attr, source.func.value
        if not isinstance(source, ast.Name):
            continue
        first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
        if not (isinstance(first, ast.Name) and first.id == name):
            continue
        if source.id in constants.dicts and method in (None, "keys", "items"):
            return constants.dicts[source.id][0]
        held = constants.strings.get(source.id, set())
        if method is None and len(held) == 1:
            return next(iter(held))
    return None


def _names(node: ast.expr, tree: ast.Module, constants: Constants) -> tuple[str, ...]:
    """The variable names an argument can be, or () when it cannot be told."""
    if (held := _strings(node)) is not None and len(held) == 1:
        return held
    if isinstance(node, ast.Name):
        value = constants.string(node.id)
        if value is not None:
            return value
        return _loop_keys(tree, node.id, constants) or ()
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id in constants.dicts
    ):
        return constants.dicts[node.value.id][1]
    return ()


def _read_name(node: ast.AST, aliases: set[str]) -> ast.expr | None:
    """The expression naming the variable, when `node` reads the environment; else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        function = node.func
        if function.attr in MAPPING_READS and _is_environ(function.value, aliases):
            return node.args[0]
        if function.attr == "getenv" and isinstance(function.value, ast.Name):
            return node.args[0]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return node.slice if _is_environ(node.value, aliases) else None
    membership = isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn)
    if membership and _is_environ(node.comparators[0], aliases):
        return node.left
    return None


def _reads(path: Path, tree: ast.Module, constants: Constants) -> Iterator[Read]:
    aliases = _environ_aliases(tree)
    where = str(path.relative_to(ROOT))
    for node in ast.walk(tree):
        if (argument := _read_name(node, aliases)) is not None:
            yield Read(f"{where}:{node.lineno}", _names(argument, tree, constants))


def code_reads() -> list[Read]:
    trees = {path: ast.parse(path.read_text(), str(path)) for path in source_files()}
    constants = Constants.of(trees)
    return [read for path, tree in trees.items() for read in _reads(path, tree, constants)]


@pytest.fixture(scope="module")
def reads() -> list[Read]:
    return code_reads()


def test_every_read_names_its_variable(reads: list[Read]) -> None:
    unknown = [read.where for read in reads if not read.names]
    assert not unknown, f"environment reads whose name cannot be told (write it by name): {unknown}"


def test_every_variable_read_is_registered(reads: list[Read]) -> None:
    missing = {n: r.where for r in reads for n in r.names if n not in VARIABLES}
    assert not missing, f"read but not in services/common/env.py VARIABLES: {missing}"


def test_every_registered_variable_is_read(reads: list[Read]) -> None:
    read = {name for r in reads for name in r.names}
    unread = sorted(set(VARIABLES) - read)
    assert not unread, f"in services/common/env.py VARIABLES but read nowhere: {unread}"


def test_the_scan_finds_reads_in_every_form() -> None:
    """The scanner itself, on a made-up module: each form of read, each way of naming."""
    source = (
        "import os\n"
        'A_ENV = "A"\n'
        'PAIRS = {"B": "1", "C": "2"}\n'
        'BY_SIGNAL = {"traces": "D", "metrics": "E"}\n'
        "def f(signal, environ=None):\n"
        "    env = os.environ if environ is None else environ\n"
        '    os.environ["F"]; os.environ.get(A_ENV); os.getenv("G"); "H" in os.environ\n'
        '    env.get("I"); env.get(BY_SIGNAL[signal]); os.environ.setdefault("J", "")\n'
        "    any(os.environ.get(k) != v for k, v in PAIRS.items())\n"
        '    os.environ.get(f"K_{signal}")\n'
        '    os.environ["L"] = "written, not read"\n'
    )
    tree = ast.parse(source)
    path = ROOT / "made_up.py"
    found = list(_reads(path, tree, Constants.of({path: tree})))
    names = sorted(name for read in found for name in read.names)
    assert names == ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J"]
    assert [read.where for read in found if not read.names] == ["made_up.py:10"]
