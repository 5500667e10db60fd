"""Writes the launcher's small JSON state files in the run directory (pids.json, mesh.json)
atomically: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, body: Any) -> None:
    """`body` as indented JSON at `path`, through a temporary file beside it."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(body, indent=1) + "\n")
    temporary.replace(path)
