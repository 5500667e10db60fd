"""The server's optional parts, which `pip install 'tiermesh[EXTRA]'` extra brings each, and the
error that says so when one is missing (instead of a bare ModuleNotFoundError deep in a command).

| module | extra | what needs it |
| --- | --- | --- |
| matplotlib | bench | the benchmark's and route-eval's plots |
| sklearn | train | training the complexity predictor |
| envoy (xds-protos) | mesh | the xDS control plane and its admin client |
| httpx | remote | a tier whose engine is a remote OpenAI-compatible server (`openai`) |
"""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, str]] = {
    "matplotlib": ("bench", "matplotlib"),
    "sklearn": ("train", "scikit-learn"),
    "envoy": ("mesh", "xds-protos"),
    "httpx": ("remote", "httpx"),
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, module: str, purpose: str) -> None:
        extra, package = EXTRAS[module]
        super().__init__(
            f"{purpose} needs {package}, which is not installed: pip install 'tiermesh[{extra}]'"
        )


def require_extra(module: str, purpose: str) -> None:
    """Raises MissingExtra unless `module` (a key of EXTRAS) can be imported."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(module, purpose)
