#!/usr/bin/env python3
"""Read-only probe of the files the `cuda_library` role installs (cuDNN, NCCL); runs on the managed host.

    library_probe.py state NAME PREFIX [LIBRARY ARTIFACT]
                                            JSON: the install marker, the recorded files, the missing ones;
                                            with LIBRARY and ARTIFACT also whether ARTIFACT (the archive the
                                            host's artifact cache may still hold) exists, and, where a marker
                                            is, what `version NAME LIBRARY` answers, run as a child process
                                            ({"rc", "stdout", "stderr"}): a re-run reads it all in one call
    library_probe.py version NAME LIBRARY   the version LIBRARY reports: cudnnGetVersion() (CUDNN_VERSION,
                                            e.g. 8500 for cuDNN 8.5.0) or ncclGetVersion() (NCCL_VERSION_CODE,
                                            e.g. 21403 for NCCL 2.14.3)

NAME is cudnn or nccl. Standard library only (the host's python3, 3.8 on Ubuntu 20.04). Neither
version function needs a GPU. NCCL links the CUDA runtime statically and needs no other CUDA
library. cuDNN 8 loads its sub-libraries (libcudnn_ops_infer.so.8, ...) on the first call, and
they need cuBLAS from the CUDA toolkit and libcuda.so.1 from the driver: when one is missing,
cuDNN prints the loader's error on stderr and aborts the process. The caller reports that text.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from typing import Any, Callable

# The only folders of the prefix the role writes into; a manifest entry elsewhere is refused.
INSTALL_DIRS = ("include", "lib64")


def marker_name(name: str) -> str:
    return f".msgpu-{name}"


def manifest_name(name: str) -> str:
    return marker_name(name) + ".files"


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def recorded_files(name: str, prefix: str) -> list[str]:
    """Paths (relative to the prefix) the manifest lists; each must be a file in an install folder."""
    manifest = os.path.join(prefix, manifest_name(name))
    files = []
    for line in read_text(manifest).splitlines():
        entry = line.strip()
        if not entry:
            continue
        folder, _, base = entry.partition("/")
        if folder not in INSTALL_DIRS or base in ("", ".", "..") or "/" in base:
            raise SystemExit(f"{manifest}: refusing the entry {entry!r} (not a file in {INSTALL_DIRS})")
        files.append(entry)
    return files


def state(name: str, prefix: str, library: str = "", artifact: str = "") -> dict[str, Any]:
    files = recorded_files(name, prefix)
    found: dict[str, Any] = {
        "marker": read_text(os.path.join(prefix, marker_name(name))).strip(),
        "files": files,
        "missing": [entry for entry in files if not os.path.lexists(os.path.join(prefix, entry))],
    }
    if library:
        found["artifact"] = bool(artifact) and os.path.lexists(artifact)
        found["version"] = loaded_version(name, library) if found["marker"] else None
    return found


def own_command() -> list[str]:
    """How to run this program again: its file, or its source where it runs as `python3 -c SOURCE ...`
    (as the role runs it: one call on the host, where the script module makes three)."""
    if "__file__" in globals():
        return [sys.executable, os.path.abspath(__file__)]
    with open("/proc/self/cmdline", "rb") as cmdline:
        interpreter_arguments = cmdline.read().split(b"\0")
    if len(interpreter_arguments) < 3 or interpreter_arguments[1] != b"-c":
        raise SystemExit("library_probe.py: run it as a file or as `python3 -c SOURCE`")
    return [sys.executable, "-c", interpreter_arguments[2].decode()]


def loaded_version(name: str, library: str) -> dict[str, Any]:
    """`version NAME LIBRARY` in a child process (cuDNN aborts the process that loads it when a sub-library
    is missing): its exit status, output and error output."""
    child = subprocess.run(
        [*own_command(), "version", name, library],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return {"rc": child.returncode, "stdout": child.stdout, "stderr": child.stderr}


def cudnn_version(library: str) -> int:
    """size_t cudnnGetVersion(void)."""
    cudnn = ctypes.CDLL(library)
    cudnn.cudnnGetVersion.restype = ctypes.c_size_t
    cudnn.cudnnGetVersion.argtypes = []
    return int(cudnn.cudnnGetVersion())


def nccl_version(library: str) -> int:
    """ncclResult_t ncclGetVersion(int *version); ncclSuccess == 0."""
    nccl = ctypes.CDLL(library)
    nccl.ncclGetVersion.restype = ctypes.c_int
    nccl.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    code = ctypes.c_int(0)
    result = nccl.ncclGetVersion(ctypes.byref(code))
    if result != 0:
        raise SystemExit(f"{library}: ncclGetVersion returned error {result}")
    return code.value


VERSION_FUNCTIONS: dict[str, Callable[[str], int]] = {"cudnn": cudnn_version, "nccl": nccl_version}


def main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[1] == "state" and argv[2] in VERSION_FUNCTIONS:
        print(json.dumps(state(*argv[2:])))
        return 0
    if len(argv) == 4 and argv[2] in VERSION_FUNCTIONS:
        command, name, path = argv[1:]
        if command == "state":
            print(json.dumps(state(name, path)))
            return 0
        if command == "version":
            print(VERSION_FUNCTIONS[name](path))
            return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
