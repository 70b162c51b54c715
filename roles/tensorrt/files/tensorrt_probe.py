#!/usr/bin/env python3
"""Load TensorRT the way a MindSpore Serving process does and report what it finds (runs on the host).

    tensorrt_probe.py LIBDIR

LIBDIR holds libnvinfer (the tarball's lib/, or the nvidia-tensorrt wheel's tensorrt/ package).
Loads libnvinfer.so.<major> (its soname, found in LIBDIR) and asks getInferLibVersion(), which
needs no GPU; loads libnvinfer_plugin.so.<major>, which needs cuBLAS and cuDNN from the CUDA
toolkit (found through LD_LIBRARY_PATH, as the env file sets it); then imports the Python binding
`tensorrt`. Prints one JSON object; on a failure it prints the loader's or importer's error on
stderr and exits 1. Standard library only (the host's python3, 3.8 on Ubuntu 20.04).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from typing import Any


def soname(libdir: str, base: str) -> str:
    """LIBDIR/<base>.so.<major>: the file the dynamic linker looks for."""
    found = sorted(n for n in os.listdir(libdir) if re.fullmatch(re.escape(base) + r"\.so\.[0-9]+", n))
    if not found:
        raise OSError(f"{libdir}: no {base}.so.<major> (found {sorted(os.listdir(libdir))})")
    return os.path.join(libdir, found[-1])


def probe(libdir: str) -> dict[str, Any]:
    library = soname(libdir, "libnvinfer")
    nvinfer = ctypes.CDLL(library)
    nvinfer.getInferLibVersion.restype = ctypes.c_int32
    nvinfer.getInferLibVersion.argtypes = []
    version = int(nvinfer.getInferLibVersion())
    plugin = soname(libdir, "libnvinfer_plugin")
    ctypes.CDLL(plugin)
    # Imported only here: after the libraries above proved loadable, so a failure names the library.
    import tensorrt

    return {
        "library": os.path.realpath(library),
        "version": version,
        "plugin": os.path.realpath(plugin),
        "python": str(tensorrt.__version__),
        "python_file": str(tensorrt.__file__),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        result = probe(argv[1])
    except (OSError, ImportError, AttributeError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
