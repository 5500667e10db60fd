"""The last good topology of a control plane, kept on disk so that a restarted control plane
serves it even when its topology file has since become invalid.

Every topology the control plane publishes is written (as given, host names unresolved) to a
state file beside the topology file, `<stem>.last-good.yaml`, atomically: a temporary file in
the same folder, flushed and synced, then renamed over the old one. `load_or_last_good` reads
the topology file and, if it is invalid, falls back to that state file and says so. Knows
topology files only; nothing of xDS or of serving.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mesh.topology import Topology, dump_yaml
from mesh.topology_file import load_topology
from services.common.errors import ConfigError

log = logging.getLogger(__name__)
SUFFIX = ".last-good.yaml"


def last_good_path(topology_path: Path) -> Path:
    """Where the last good version of `topology_path` is kept: beside it."""
    return topology_path.with_name(topology_path.stem + SUFFIX)


def save_last_good(topology: Topology, topology_path: Path) -> Path:
    """Writes `topology` as the last good version of `topology_path`, atomically; returns the
    state file. A failure to write is logged, not raised: serving goes on without it."""
    target = last_good_path(topology_path)
    header = (
        f"# the last good topology of {topology_path.name}, saved by the control plane at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; served after a restart if "
        f"{topology_path.name} is invalid\n"
    )
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(dump_yaml(topology, header))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
    except OSError as e:
        log.warning("could not save the last good topology to %s: %s", target, e)
    return target


@dataclass(frozen=True)
class LoadedTopology:
    """What to serve at start: the topology, and why it is not the file's own (or "")."""

    topology: Topology
    fallback_reason: str = ""


def load_or_last_good(topology_path: Path) -> LoadedTopology:
    """The topology of `topology_path`; if that file is invalid (or gone) and a last good
    version was saved, that version with the reason. Raises the file's ConfigError when there
    is no usable last good version."""
    try:
        return LoadedTopology(load_topology(topology_path))
    except ConfigError as error:
        saved = last_good_path(topology_path)
        if not saved.is_file():
            raise
        try:
            topology = load_topology(saved)
        except ConfigError as saved_error:
            raise ConfigError(
                f"{error} (and the last good copy is unusable: {saved_error})"
            ) from None
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(saved.stat().st_mtime))
        reason = f"{error}; serving the last good topology saved at {when} ({saved})"
        return LoadedTopology(topology, reason)
