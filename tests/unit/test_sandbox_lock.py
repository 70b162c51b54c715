"""Two processes that build the same sandbox image take turns (testbed/sandbox.py: build_image holds a lock per
image flavour): the second waits until the first has released it, then finds the image the first one made,
instead of both writing the same `.partial` tarball."""

from __future__ import annotations

import subprocess
import sys
import time

from testbed import sandbox
from tests.conftest import ROOT

HOLDER = """
import sys, time
from pathlib import Path
from testbed import sandbox
with sandbox.locked(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(1.5)
"""


def test_a_second_process_waits_for_the_lock_the_first_holds(tmp_path):
    lock = tmp_path / "images" / "focal.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with sandbox.locked(lock):
            waited = time.monotonic() - started
    finally:
        holder.wait(timeout=30)
    # The holder sleeps 1.5 s with the lock after it said so: taking it sooner means it was not exclusive.
    assert waited >= 1.0, waited


def test_the_suite_deletes_the_builders_wheels_only_between_builds(tmp_path):
    """fixtures.drop_wheels (what `./toolkit test` runs after its prepare step) waits while a mirror build holds
    the builder's lock, deletes every downloaded wheel, and counts as freed only the bytes no other hard link
    (the controller's artifact cache, scenarios.link_cache_duplicates) still holds."""
    from testbed import fixtures

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "alone.whl").write_bytes(b"a" * 3000)
    (wheels / "shared.whl").write_bytes(b"s" * 5000)
    (tmp_path / "artifact-cache").mkdir()
    kept = tmp_path / "artifact-cache" / "shared.whl"
    kept.hardlink_to(wheels / "shared.whl")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "mirror.lock")], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        freed = fixtures.drop_wheels(tmp_path)
        waited = time.monotonic() - started
    finally:
        holder.wait(timeout=30)
    assert waited >= 1.0, waited
    assert freed == 3000
    assert not list(wheels.iterdir())
    assert kept.read_bytes() == b"s" * 5000
    assert fixtures.drop_wheels(tmp_path / "never-built") == 0
