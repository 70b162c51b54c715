"""Run a child process with a hard timeout; on timeout the whole process group is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

RESULT_MARKER = "@@MSGPU_VERIFY_RESULT@@"


@dataclass
class ChildResult:
    returncode: Optional[int]
    output: str
    timed_out: bool
    elapsed_s: float
    pgid: int


def _live_members(pgid: int) -> Optional[int]:
    """Processes in group ``pgid`` that are not zombies, from /proc; None where /proc cannot tell."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    count = 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open("/proc/" + entry + "/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            count += 1
    return count


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    members = _live_members(pgid)
    return True if members is None else members > 0


def kill_group(pgid: int, grace_s: float = 2.0, proc: Optional[subprocess.Popen] = None) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()  # reap the leader so it does not count as alive
            if not _group_alive(pgid):
                return
            time.sleep(0.05)


def run_child(
    argv: Sequence[str],
    timeout_s: float,
    env: Optional[Dict[str, str]] = None,
    cwd: Optional[str] = None,
) -> ChildResult:
    """Run ``argv`` in a new session; stdout and stderr are merged (C++ logs keep their order)."""
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=child_env,
        cwd=cwd,
        start_new_session=True,
    )
    pgid = proc.pid
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(pgid, proc=proc)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a process outside the group still holds the pipe
            proc.kill()
            out = b""
    else:
        # Leftovers of the child (daemons it started) must not outlive the check.
        if _group_alive(pgid):
            kill_group(pgid, grace_s=0.5, proc=proc)
    return ChildResult(
        returncode=proc.returncode,
        output=out.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        elapsed_s=round(time.monotonic() - start, 3),
        pgid=pgid,
    )


def find_result(output: str) -> Optional[str]:
    """The JSON text on the last line that starts with the result marker, if any."""
    found: Optional[str] = None
    for line in output.splitlines():
        index = line.find(RESULT_MARKER)
        if index >= 0:
            found = line[index + len(RESULT_MARKER) :].strip()
    return found


def strip_markers(output: str) -> List[str]:
    return [line for line in output.splitlines() if RESULT_MARKER not in line]
