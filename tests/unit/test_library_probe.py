"""roles/cuda_library/files/library_probe.py, the cuda_library role's read-only probe, on stand-in libraries
compiled here: `state` reads the install record and, where a marker is, the installed library's version from a
child process (a library that aborts its process, as cuDNN does when a sub-library is missing, is reported, not
fatal to the probe), and whether the host's artifact cache still holds the archive."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "roles" / "cuda_library" / "files" / "library_probe.py"

NCCL = """int ncclGetVersion(int *version) { *version = 21403; return 0; }"""
CUDNN_ABORTS = """#include <stdio.h>
#include <stdlib.h>
unsigned long cudnnGetVersion(void) {
    fprintf(stderr, "Could not load library libcudnn_ops_infer.so.8. Error: libcublas.so.11: cannot open\\n");
    abort();
}"""


def _library(tmp_path: Path, name: str, source: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc on this machine to build the stand-in library")
    (tmp_path / f"{name}.c").write_text(source)
    built = tmp_path / "lib64" / name
    built.parent.mkdir(exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(built), str(tmp_path / f"{name}.c")], check=True)
    return built


def _state(*args: str, as_source: bool = False) -> dict:
    """The probe as a file, or (as_source) as the role runs it: `python3 -c SOURCE state ...`."""
    program = ["-c", PROBE.read_text()] if as_source else [str(PROBE)]
    done = subprocess.run([sys.executable, *program, "state", *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("as_source", [False, True], ids=["file", "source"])
def test_state_reads_the_installed_version_and_the_cached_archive(tmp_path, as_source):
    library = _library(tmp_path, "libnccl.so.2", NCCL)
    (tmp_path / ".msgpu-nccl").write_text("ab" * 32 + "\n")
    (tmp_path / ".msgpu-nccl.files").write_text("lib64/libnccl.so.2\ninclude/nccl.h\n")
    archive = tmp_path / "nccl.txz"
    found = _state("nccl", str(tmp_path), str(library), str(archive), as_source=as_source)
    assert found["marker"] == "ab" * 32 and found["missing"] == ["include/nccl.h"]
    assert found["artifact"] is False
    assert found["version"]["rc"] == 0 and found["version"]["stdout"].strip() == "21403", found
    archive.write_bytes(b"x")
    assert _state("nccl", str(tmp_path), str(library), str(archive))["artifact"] is True
    # The two-argument form (as before) reads the record only.
    assert set(_state("nccl", str(tmp_path))) == {"marker", "files", "missing"}


@pytest.mark.parametrize("as_source", [False, True], ids=["file", "source"])
def test_a_library_that_aborts_is_reported_by_the_probe_that_survives_it(tmp_path, as_source):
    library = _library(tmp_path, "libcudnn.so.8", CUDNN_ABORTS)
    (tmp_path / ".msgpu-cudnn").write_text("cd" * 32)
    found = _state("cudnn", str(tmp_path), str(library), str(tmp_path / "cudnn.tgz"), as_source=as_source)
    assert found["version"]["rc"] != 0 and "libcublas.so.11" in found["version"]["stderr"], found


def test_without_a_marker_nothing_is_loaded(tmp_path):
    found = _state("cudnn", str(tmp_path), str(tmp_path / "lib64" / "libcudnn.so.8"), str(tmp_path / "a.tgz"))
    assert found == {"marker": "", "files": [], "missing": [], "artifact": False, "version": None}
