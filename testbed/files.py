"""The test bed's folders and the file helpers its modules share: the bottom of testbed/'s imports (it imports
none of the others), so that the fixtures (testbed/fixtures.py), the sandbox hosts (testbed/sandbox.py) and the
scenarios (testbed/scenarios.py) all build on it without importing each other in a circle
(tests/unit/test_testbed_imports.py)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The test bed's caches: images, fixture mirror, wheels, scenario settings (MSGPU_CACHE moves them).
CACHE = Path(os.environ.get("MSGPU_CACHE", ROOT / ".cache"))
# How much of a file is read at a time.
READ_BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    """The sha256 of the file's content (hex), read a block at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for block in iter(lambda: data.read(READ_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed): two processes that build the same thing (two test
    runs started at once on a fresh machine: an image, the fixture mirror) take turns, and the second finds
    what the first one built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
