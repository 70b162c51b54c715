#!/usr/bin/env python3
"""Read-only probe of the cuDNN files the `cudnn` role installs; runs on the managed host.

    cudnn_probe.py state PREFIX      JSON: the install marker, the recorded files, the missing ones
    cudnn_probe.py version LIBRARY   cudnnGetVersion() of LIBRARY, e.g. 8500 for cuDNN 8.5.0

Standard library only (the host's python3, 3.8 on Ubuntu 20.04). Calling cudnnGetVersion needs
no GPU, but cuDNN 8 loads its sub-libraries (libcudnn_ops_infer.so.8, ...) on the first call, and
they need cuBLAS from the CUDA toolkit and libcuda.so.1 from the driver: when one is missing,
cuDNN prints the loader's error on stderr and aborts the process. The caller reports that text.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

MARKER = ".msgpu-cudnn"
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
    cudnn = ctypes.CDLL(library)
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    cudnn.cudnnGetVersion.argtypes = []
    return int(cudnn.cudnnGetVersion())


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
