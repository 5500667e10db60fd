"""Loads a typed config dataclass from TOML: every field's type checked against its annotation
(paths made relative to the file, lists to tuples, tables to dicts), unknown keys refused, then
the dataclass's own validate(); every error names the file and the field. Knows no service's
fields: those are config.py's.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Protocol, TypeVar

from services.common.errors import ConfigError


def require(ok: bool, name: str, message: str) -> None:
    """A config's validate() check: ConfigError naming the field unless `ok`."""
    if not ok:
        raise ConfigError(f"{name}: {message}")


class Validated(Protocol):
    """A config dataclass: its fields are the TOML keys; validate() raises ConfigError."""

    def validate(self) -> None: ...


Config = TypeVar("Config", bound=Validated)


def read_toml(path: Path, what: str = "config file") -> dict[str, Any]:
    """The TOML table in `path`; raises ConfigError naming the file if it is missing or bad."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def load_config(cls: type[Config], path: Path, **overrides: Any) -> Config:
    """Reads `path` (TOML) into `cls`, applies non-None overrides, validates, and returns it."""
    data = read_toml(path)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return build_config(cls, data, base_dir=path.parent)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def build_config(cls: type[Config], data: dict[str, Any], base_dir: Path | None = None) -> Config:
    """Builds and validates `cls` from a plain dict, checking every field's type."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for name, value in data.items():
        values[name] = _coerce(name, value, hints[name], base_dir)
    try:
        config = cls(**values)
    except TypeError as e:
        raise ConfigError(str(e)) from None
    config.validate()
    return config


def _coerce(name: str, value: Any, hint: Any, base_dir: Path | None) -> Any:
    origin = typing.get_origin(hint)
    if hint is Path:
        if not isinstance(value, str | Path):
            raise ConfigError(f"{name}: expected a path string, got {value!r}")
        path = Path(value)
        return path if path.is_absolute() or base_dir is None else base_dir / path
    if origin is tuple:  # tuple[str, ...]: a TOML list of strings
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name}: expected a list of strings, got {value!r}")
        return tuple(value)
    if origin is dict:
        value_type = typing.get_args(hint)[1]
        if value_type is float and isinstance(value, dict):
            value = {k: float(v) if isinstance(v, int) else v for k, v in value.items()}
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, value_type) for k, v in value.items()
        ):
            kind = "strings" if value_type is str else "numbers"
            raise ConfigError(f"{name}: expected a table of {kind}, got {value!r}")
        return dict(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    expected = hint if not isinstance(hint, types.UnionType) else typing.get_args(hint)
    if isinstance(value, bool) and hint is not bool:
        raise ConfigError(f"{name}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"{name}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
    return value
