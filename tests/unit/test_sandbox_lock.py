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
