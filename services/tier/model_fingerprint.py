"""A model folder's fingerprint: which checkpoint a tier serves, beyond its folder's name.

Two replicas answering as `small/model` may serve different weights (a folder of that name
elsewhere, retrained in place, hot-swapped): the tokens one generated must not be continued by
the other. The fingerprint is a short hash over every file of the folder that shapes the
answer (configs, tokenizer, weights): each file's name, size, and its first and last MiB. It
reads at most 2 MiB a file, so it costs milliseconds even for large checkpoints; two trainings
of one architecture differ within the first MiB of every weights file (the safetensors header
and the first tensors' values), so equal fingerprints mean the same checkpoint in practice,
though not by proof: a file changed only in its middle keeps its fingerprint.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SAMPLE_BYTES = 1 << 20  # read from each end of a file
DIGEST_BYTES = 8  # 16 hex characters
# what shapes the answer; the import record (tiermesh.json) and anything else is left out
SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja", ".py")
LEFT_OUT = frozenset({"tiermesh.json"})


def folder_fingerprint(path: Path) -> str:
    """The fingerprint of the model folder `path` (16 hex characters)."""
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    files = sorted(
        p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES and p.name not in LEFT_OUT
    )
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        with file.open("rb") as f:
            digest.update(f.read(SAMPLE_BYTES))
            if size > SAMPLE_BYTES:
                f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()
