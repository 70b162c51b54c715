"""A file's sha256, one way for every msgpu_verify module (Python 3.8, standard library only)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Union

CHUNK = 1 << 20


def sha256_of(path: Union[str, Path], opener: Callable[..., Any] = open) -> str:
    """The hex sha256 of the file at ``path``, read in blocks of CHUNK bytes; ``opener`` opens it for reading
    (``gzip.open``: the sha256 of its decompressed content)."""
    digest = hashlib.sha256()
    with opener(str(path), "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()
