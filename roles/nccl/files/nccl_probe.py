#!/usr/bin/env python3
"""Read-only probe of the NCCL files the `nccl` role installs; runs on the managed host.

    nccl_probe.py state PREFIX      JSON: the install marker, the recorded files, the missing ones
    nccl_probe.py version LIBRARY    NCCL_VERSION_CODE from ncclGetVersion(), e.g. 21403 for 2.14.3

Standard library only (the host's python3, 3.8 on Ubuntu 20.04). ncclGetVersion needs no GPU
and no other CUDA library (NCCL links the CUDA runtime statically).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

MARKER = ".msgpu-nccl"
MANIFEST = MARKER + ".files"
# The only folders of the prefix the role writes into; a manifest entry elsewhere is refused.
INSTALL_DIRS = ("include", "lib64")


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def recorded_files(prefix: str) -> list[str]:
    """Paths (relative to the prefix) the manifest lists; each must be a file in an install folder."""
    files = []
    for line in read_text(os.path.join(prefix, MANIFEST)).splitlines():
        entry = line.strip()
        if not entry:
            continue
        folder, _, name = entry.partition("/")
        if folder not in INSTALL_DIRS or name in ("", ".", "..") or "/" in name:
            raise SystemExit(f"{prefix}/{MANIFEST}: refusing the entry {entry!r} (not a file in {INSTALL_DIRS})")
        files.append(entry)
    return files


def state(prefix: str) -> dict[str, Any]:
    files = recorded_files(prefix)
    return {
        "marker": read_text(os.path.join(prefix, MARKER)).strip(),
        "files": files,
        "missing": [name for name in files if not os.path.lexists(os.path.join(prefix, name))],
    }


def version(library: str) -> int:
    nccl = ctypes.CDLL(library)
    nccl.ncclGetVersion.restype = ctypes.c_int  # ncclResult_t, ncclSuccess == 0
    nccl.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    code = ctypes.c_int(0)
    result = nccl.ncclGetVersion(ctypes.byref(code))
    if result != 0:
        raise SystemExit(f"{library}: ncclGetVersion returned error {result}")
    return code.value


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "state":
        print(json.dumps(state(argv[2])))
        return 0
    if len(argv) == 3 and argv[1] == "version":
        print(version(argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
