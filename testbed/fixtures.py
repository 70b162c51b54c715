"""Fixtures that stand in for NVIDIA's unreachable downloads, built from NVIDIA's real PyPI wheels.

NVIDIA's download servers (CUDA runfiles, cuDNN and NCCL tarballs) cannot be reached from the build
and CI machines, but NVIDIA publishes the same CUDA 11 user-space binaries as wheels on PyPI. This
module downloads those wheels (pinned by the catalog's sha256), repackages their real binaries under
the official artifacts' file names, layouts and command-line contracts, and lays them out under
`.cache/mirror/<source>/<path>` exactly as `catalog/stacks.yml` names them, so that

    stack_sources: {nvidia_developer: "http://127.0.0.1:PORT/nvidia_developer"}

makes every catalog URL point at a loopback mirror of them (testbed/mirror.py serves it).
testbed/FIXTURES.md says, fixture by fixture, what inside is real and what is not.

Builds are reproducible (sorted members, fixed mtime, uid/gid 0, no time stamps in compressed
streams) and cached: each fixture is keyed on its catalog entry, its wheels and this file's source,
so a warm `build_mirror()` only reads the manifest and stats the files.

    python -m testbed.fixtures            # build (or check) every fixture, print the manifest summary
    python -m testbed.fixtures --force    # rebuild every fixture

The test bed's own runs build only the fixtures its hosts install (build_mirror; the contract tests in
tests/unit/test_fixtures.py and test_aptrepo.py build the others).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import importlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import yaml

from testbed import stacks
from testbed.files import CACHE, locked, sha256_file
from testbed.stacks import ScenarioError, load_catalog

MANIFEST = "manifest.json"
SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()

# 2020-10-12 00:00:00 UTC, around CUDA 11.1's release; any constant keeps tarballs reproducible.
FIXED_MTIME = 1602460800
# Fixtures favour build and unpack speed: their size is not part of any contract (and xz
# fixtures are stored, see StoredXzWriter).
GZIP_LEVEL = 1
COPY_BUFFER = 1 << 20

# Wheels (catalog `cuda_wheels` keys) whose files make up the CUDA toolkit fixture.
CUDA_TOOLKIT_WHEELS = (
    "nvidia-cuda-runtime-cu11",
    "nvidia-cublas-cu11",
    "nvidia-cuda-nvrtc-cu11",
    "nvidia-cuda-nvcc-cu11",
    # MindSpore's GPU build links cuFFT, cuRAND and cuSOLVER: a toolkit without them cannot import it.
    "nvidia-cufft-cu11",
    "nvidia-curand-cu11",
    "nvidia-cusolver-cu11",
)


class FixtureError(RuntimeError):
    """A clear, user-facing failure while building the fixtures."""


def log(message: str) -> None:
    print(f"[fixtures] {message}", file=sys.stderr, flush=True)


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


# --- wheels ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wheel:
    """One NVIDIA wheel on PyPI, pinned by the catalog."""

    package: str
    version: str
    file: str
    sha256: str


def catalog_wheels(catalog: dict[str, Any]) -> dict[str, Wheel]:
    """Every NVIDIA wheel the catalog pins: `cuda_wheels`, then `cudnn.<v>.wheel`, `nccl.<v>.wheel`."""
    wheels = {
        package: Wheel(package, str(entry["version"]), entry["file"], entry["sha256"])
        for package, entry in catalog.get("cuda_wheels", {}).items()
    }
    for component in ("cudnn", "nccl"):
        for entry in catalog.get(component, {}).values():
            spec = entry.get("wheel")
            if spec:
                wheels[f"{spec['package']}=={spec['version']}"] = Wheel(
                    spec["package"], str(spec["version"]), spec["file"], spec["sha256"]
                )
    for entry in catalog.get("tensorrt", {}).values():
        spec = entry.get("wheel")
        if spec:
            # One file per Python tag; the fixtures are built from the tested platform's.
            tagged = spec["files"][fixture_python_tag(catalog)]
            wheels[f"{spec['package']}=={spec['version']}"] = Wheel(
                spec["package"], str(spec["version"]), tagged["file"], tagged["sha256"]
            )
    return wheels


def fixture_python_tag(catalog: dict[str, Any]) -> str:
    """The Python tag of the tested platform (cp38 on Ubuntu 20.04): the TensorRT fixture's wheels."""
    tags = sorted({p["python_tag"] for p in catalog.get("platforms", {}).values() if p.get("tested")})
    if len(tags) != 1:
        raise FixtureError(f"catalog/stacks.yml platforms: expected one tested Python tag, found {tags or 'none'}")
    return tags[0]


def _verified(path: Path, wheel: Wheel) -> bool:
    return path.is_file() and sha256_file(path) == wheel.sha256


def fetch_wheels(wheels: list[Wheel], cache: Path = CACHE) -> dict[str, Path]:
    """Download the wheels with pip into `<cache>/wheels` and verify them; returns {file: path}.

    A wheel already there with the catalog's sha256 is reused; one with another checksum is
    deleted (before and after downloading) and never used.
    """
    dest = cache / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    missing = []
    for wheel in wheels:
        path = dest / wheel.file
        if _verified(path, wheel):
            log(f"wheel {wheel.file}: cached ({megabytes(path.stat().st_size)})")
        else:
            path.unlink(missing_ok=True)
            missing.append(wheel)
    # pip resolves one version per project in a call: two versions of one package (cuDNN 8.5.0's and 8.9.6's
    # wheels) go in separate calls.
    batches: list[list[Wheel]] = []
    for wheel in missing:
        batch = next((b for b in batches if all(w.package != wheel.package for w in b)), None)
        if batch is None:
            batches.append([wheel])
        else:
            batch.append(wheel)
    for batch in batches:
        _download(batch, dest)
    return {w.file: dest / w.file for w in wheels}


def _download(missing: list[Wheel], dest: Path) -> None:
    """One `pip download` of wheels of distinct packages into dest, each checked against its sha256."""
    if missing:
        started = time.monotonic()
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux1_x86_64",
            # nvidia-tensorrt has only manylinux_2_17 wheels (glibc 2.17; Ubuntu 20.04 has 2.31).
            "--platform",
            "manylinux_2_17_x86_64",
            "--python-version",
            "3.8",
            "--dest",
            str(dest),
            "--quiet",
            *[f"{w.package}=={w.version}" for w in missing],
        ]
        result = subprocess.run(cmd, text=True, capture_output=True)
        if result.returncode != 0:
            raise FixtureError(f"pip download failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr[-2000:]}")
        elapsed = time.monotonic() - started
        for wheel in missing:
            path = dest / wheel.file
            if not path.is_file():
                raise FixtureError(f"pip download {wheel.package}=={wheel.version} did not produce {wheel.file}")
            got = sha256_file(path)
            if got != wheel.sha256:
                path.unlink()
                raise FixtureError(
                    f"{wheel.file}: sha256 {got} does not match catalog/stacks.yml ({wheel.sha256}); "
                    "the file was deleted"
                )
            log(f"wheel {wheel.file}: downloaded {megabytes(path.stat().st_size)} ({elapsed:.0f} s for the batch)")


def drop_wheels(cache: Path = CACHE) -> int:
    """Delete the wheels fetch_wheels downloaded (`<cache>/wheels`), under the mirror builder's lock; returns
    the bytes this frees (a file another hard link also holds frees nothing). `./toolkit test` calls it once
    its prepare step has built the mirror: no stage before the last reads them (the fixture mirror is built
    from them; the hosts install what the mirror and PyPI serve), and at the suite's disk peak they were
    2.1 GB. The `fixtures` stage's contract tests fetch again what they build from (seconds from PyPI here)."""
    folder = cache / "wheels"
    freed = 0
    with locked(cache / "mirror.lock"):
        for path in folder.glob("*") if folder.is_dir() else ():
            stat = path.lstat()
            freed += stat.st_size if stat.st_nlink == 1 else 0
            path.unlink()
    return freed


# --- reproducible tarballs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One tar member: a file from a wheel, a file with given bytes, or a symlink."""

    name: str
    mode: int = 0o644
    wheel: Path | None = None
    wheel_member: str = ""
    data: bytes | None = None
    link: str = ""


def from_wheel(name: str, wheel: Path, member: str, mode: int = 0o644) -> Member:
    return Member(name=name, mode=mode, wheel=wheel, wheel_member=member)


def text_member(name: str, text: str, mode: int = 0o644) -> Member:
    return Member(name=name, mode=mode, data=text.encode())


def symlink(name: str, target: str) -> Member:
    return Member(name=name, mode=0o777, link=target)


def _tarinfo(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _directories(members: list[Member]) -> set[str]:
    found: set[str] = set()
    for member in members:
        parts = member.name.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            found.add("/".join(parts[:depth]))
    return found


class HashingWriter:
    """A binary writer that passes bytes on to a file and keeps their sha256 and count."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.out.write(data)
        self.digest.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def _vli(value: int) -> bytes:
    """xz's variable-length integer: 7 bits a byte, low bits first."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _with_crc32(data: bytes) -> bytes:
    return data + zlib.crc32(data).to_bytes(4, "little")


class StoredXzWriter:
    """Writes a valid .xz stream whose LZMA2 data are stored (uncompressed) chunks.

    LZMA compresses NVIDIA's libraries at about 8 MB/s here and decompresses them at about
    25 MB/s, which would make the xz fixtures (a 900 MB cuDNN tree) cost minutes to build and to
    unpack in every test. Their compression ratio is no part of any contract, while the container
    format is: this is the .xz format (xz-file-format 1.0.4: one block, LZMA2 filter, CRC32
    check) that `xz`, `tar -J` and Python's lzma read, written at disk speed.
    """

    CHUNK = 1 << 16  # the largest stored LZMA2 chunk
    FLAGS = b"\x00\x01"  # check type CRC32
    # Block header: size byte, flags (one filter, no sizes), LZMA2 filter (0x21) with one property
    # byte (a 64 KiB dictionary), padding to a multiple of four, CRC32.
    BLOCK_HEADER = _with_crc32(bytes([2, 0x00, 0x21, 0x01, 8, 0, 0, 0]))

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.crc = 0
        self.size = 0
        self.data_size = 0
        self.pending = bytearray()
        out.write(b"\xfd7zXZ\x00" + _with_crc32(self.FLAGS))
        out.write(self.BLOCK_HEADER)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        if self.pending:
            take = self.CHUNK - len(self.pending)
            self.pending += view[:take]
            view = view[take:]
            if len(self.pending) < self.CHUNK:
                return len(data)
            self._chunk(self.pending)
            self.pending = bytearray()
        while len(view) >= self.CHUNK:
            self._chunk(view[: self.CHUNK])
            view = view[self.CHUNK :]
        self.pending += view
        return len(data)

    def _chunk(self, piece: bytes | bytearray | memoryview) -> None:
        control = 0x01 if self.data_size == 0 else 0x02  # the first chunk resets the dictionary
        self.out.write(bytes([control]) + (len(piece) - 1).to_bytes(2, "big"))
        self.out.write(piece)
        self.data_size += 3 + len(piece)

    def tell(self) -> int:
        """Uncompressed bytes written (tarfile asks)."""
        return self.size

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        if self.pending:
            self._chunk(self.pending)
            self.pending = bytearray()
        self.out.write(b"\x00")  # end of the LZMA2 data
        self.data_size += 1
        self.out.write(b"\x00" * (-self.data_size % 4) + self.crc.to_bytes(4, "little"))
        unpadded = len(self.BLOCK_HEADER) + self.data_size + 4
        index = b"\x00" + _vli(1) + _vli(unpadded) + _vli(self.size)
        index = _with_crc32(index + b"\x00" * (-len(index) % 4))
        self.out.write(index)
        footer = (len(index) // 4 - 1).to_bytes(4, "little") + self.FLAGS
        self.out.write(zlib.crc32(footer).to_bytes(4, "little") + footer + b"YZ")


@contextmanager
def _compressed(out: BinaryIO, compression: str) -> Iterator[BinaryIO]:
    """A writer that compresses into `out` with no time stamp or file name in the stream."""
    if compression == "gz":
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=GZIP_LEVEL, mtime=0) as stream:
            yield stream  # type: ignore[misc]
    elif compression == "xz":
        writer = StoredXzWriter(out)
        yield writer  # type: ignore[misc]
        writer.close()
    else:
        raise FixtureError(f"unknown compression '{compression}'")


def write_tarball(path: Path, members: list[Member], compression: str) -> str:
    """Write a reproducible tarball (directories implied, members sorted, fixed owners and mtime).

    Returns the file's sha256.
    """
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise FixtureError(f"{path.name}: duplicate members {sorted({n for n in names if names.count(n) > 1})}")
    entries: list[tuple[str, Member | None]] = [(d, None) for d in _directories(members)]
    entries += [(m.name, m) for m in members]
    with ExitStack() as stack:
        hashing = HashingWriter(stack.enter_context(open(path, "wb")))
        stream = stack.enter_context(_compressed(hashing, compression))  # type: ignore[arg-type]
        tar = stack.enter_context(
            tarfile.open(fileobj=stream, mode="w", format=tarfile.GNU_FORMAT, copybufsize=COPY_BUFFER)
        )
        zips: dict[Path, zipfile.ZipFile] = {}
        for name, member in sorted(entries, key=lambda entry: entry[0]):
            if member is None:
                tar.addfile(_tarinfo(name, tarfile.DIRTYPE, 0o755))
            elif member.link:
                tar.addfile(_tarinfo(name, tarfile.SYMTYPE, 0o777, link=member.link))
            elif member.data is not None:
                tar.addfile(_tarinfo(name, tarfile.REGTYPE, member.mode, len(member.data)), io.BytesIO(member.data))
            else:
                assert member.wheel is not None
                if member.wheel not in zips:
                    zips[member.wheel] = stack.enter_context(zipfile.ZipFile(member.wheel))
                info = zips[member.wheel].getinfo(member.wheel_member)
                with zips[member.wheel].open(info) as data:
                    tar.addfile(_tarinfo(name, tarfile.REGTYPE, member.mode, info.file_size), data)
    return hashing.digest.hexdigest()


def wheel_files(wheel: Path, prefix: str) -> list[str]:
    """Regular files under `prefix` in a wheel, without the packages' empty __init__.py files."""
    with zipfile.ZipFile(wheel) as archive:
        return sorted(
            n
            for n in archive.namelist()
            if n.startswith(prefix) and not n.endswith("/") and not n.endswith("__init__.py")
        )


def wheel_text(wheel: Path, suffix: str) -> str:
    """A text file of the wheel's dist-info (e.g. 'License.txt')."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if ".dist-info/" in n and n.endswith(suffix)]
        if not names:
            raise FixtureError(f"{wheel.name}: no dist-info file ending in {suffix}")
        return archive.read(names[0]).decode("utf-8", errors="replace")


# --- the fixtures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fixture:
    """One artifact of the catalog that the mirror stands in for."""

    kind: str  # cuda_runfile | cudnn_tarball | nccl_tarball | tensorrt_tarball
    version: str  # the catalog's version key (11.1, 8.0.5, 2.8.4)
    full_version: str
    file: str
    source: str
    path: str
    wheels: tuple[Wheel, ...]
    entry: dict[str, Any] = field(hash=False, compare=False)

    def key(self) -> str:
        """Changes whenever anything the fixture is built from changes."""
        payload = {
            "kind": self.kind,
            "version": self.version,
            "entry": self.entry,
            "wheels": [asdict(w) for w in self.wheels],
            "builder": SOURCE_HASH,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.replace("-", ".").split(".") if part.isdigit())


def _wheel_for(catalog: dict[str, Any], component: str, version: str) -> Wheel:
    """The wheel a fixture of `component` `version` is built from: of the wheels the catalog pins for the same
    major version, the oldest at or above `version` (its own where it has one; cuDNN 8.0.5's tarball gets 8.5.0's
    binaries, not 8.9.6's), else the newest below it."""
    key = _version_key(version)
    candidates = sorted(
        (_version_key(v), entry["wheel"])
        for v, entry in catalog.get(component, {}).items()
        if entry.get("wheel") and str(v).split(".")[0] == version.split(".")[0]
    )
    if not candidates:
        raise FixtureError(
            f"catalog/stacks.yml has no {component} wheel with major version {version.split('.')[0]} to build from"
        )
    spec = next((w for k, w in candidates if k >= key), candidates[-1][1])
    return Wheel(spec["package"], str(spec["version"]), spec["file"], spec["sha256"])


def _tensorrt_wheel(catalog: dict[str, Any]) -> Wheel:
    """The newest nvidia-tensorrt wheel the catalog pins, for the tested platform's Python tag.

    NVIDIA publishes no TensorRT 7 wheel, so every TensorRT tarball fixture carries TensorRT 8 binaries.
    """
    wheels = catalog_wheels(catalog)
    candidates = [
        (_version_key(str(v)), wheels[f"{entry['wheel']['package']}=={entry['wheel']['version']}"])
        for v, entry in catalog.get("tensorrt", {}).items()
        if entry.get("wheel")
    ]
    if not candidates:
        raise FixtureError("catalog/stacks.yml has no tensorrt wheel to build the TensorRT tarball from")
    return max(candidates, key=lambda c: c[0])[1]


def plan(catalog: dict[str, Any]) -> list[Fixture]:
    """The fixtures the catalog calls for: every CUDA runfile and cuDNN, NCCL and TensorRT tarball."""
    cuda_wheels = catalog_wheels(catalog)
    missing = [p for p in CUDA_TOOLKIT_WHEELS if p not in cuda_wheels]
    if missing:
        raise FixtureError(f"catalog/stacks.yml cuda_wheels lacks {', '.join(missing)}")
    toolkit = tuple(cuda_wheels[p] for p in CUDA_TOOLKIT_WHEELS)
    fixtures = []
    for version, entry in catalog.get("cuda", {}).items():
        art = entry.get("runfile")
        if art:
            fixtures.append(
                Fixture(
                    "cuda_runfile",
                    str(version),
                    str(entry["full_version"]),
                    art["file"],
                    art["source"],
                    art["path"],
                    toolkit,
                    entry,
                )
            )
    for component in ("cudnn", "nccl"):
        for version, entry in catalog.get(component, {}).items():
            art = entry.get("tarball")
            if art:
                wheel = _wheel_for(catalog, component, str(version))
                fixtures.append(
                    Fixture(
                        f"{component}_tarball",
                        str(version),
                        str(entry["full_version"]),
                        art["file"],
                        art["source"],
                        art["path"],
                        (wheel,),
                        entry,
                    )
                )
    for version, entry in catalog.get("tensorrt", {}).items():
        art = entry.get("tarball")
        if art:
            fixtures.append(
                Fixture(
                    "tensorrt_tarball",
                    str(version),
                    str(version),
                    art["file"],
                    art["source"],
                    art["path"],
                    (_tensorrt_wheel(catalog),),
                    # The Python tag decides which binding goes into python/ (it is not in the entry).
                    {**entry, "fixture_python_tag": fixture_python_tag(catalog)},
                )
            )
    return fixtures


def release_of(version: str, parts: int = 3) -> str:
    """'8.5.0.96' -> '8.5.0': the x.y.z NVIDIA puts in versioned library file names."""
    return ".".join(version.split(".")[:parts])


def cudnn_reports(wheel: Wheel) -> int:
    """What cudnnGetVersion() returns for the wheel's libraries (CUDNN_VERSION for cuDNN 8)."""
    major, minor, patch = (int(p) for p in release_of(wheel.version).split("."))
    return major * 1000 + minor * 100 + patch


def nccl_reports(wheel: Wheel) -> int:
    """What ncclGetVersion() returns for the wheel's library (NCCL_VERSION_CODE for NCCL >= 2.9)."""
    major, minor, patch = (int(p) for p in release_of(wheel.version).split("."))
    return major * 10000 + minor * 100 + patch


def _split_suffix(file: str) -> tuple[str, str]:
    """Archive name -> (name without suffix, compression)."""
    for suffix, compression in ((".tar.xz", "xz"), (".txz", "xz"), (".tar.gz", "gz"), (".tgz", "gz")):
        if file.endswith(suffix):
            return file[: -len(suffix)], compression
    raise FixtureError(f"{file}: not a tarball name this module knows (.tgz, .tar.gz, .txz, .tar.xz)")


def versioned_library(wheel: Path, member: str, release: str, target_dir: str) -> list[Member]:
    """NVIDIA's tarball convention: lib.so -> lib.so.MAJOR -> lib.so.X.Y.Z, the real file.

    The wheels ship only lib.so.MAJOR (the soname); the real file gets the wheel's x.y.z.
    """
    so_name = Path(member).name
    base = so_name.split(".so")[0] + ".so"
    real = f"{base}.{release}"
    return [
        from_wheel(f"{target_dir}/{real}", wheel, member, 0o755),
        symlink(f"{target_dir}/{so_name}", real),
        symlink(f"{target_dir}/{base}", so_name),
    ]


FIXTURE_NOTE = (
    "TEST FIXTURE - NOT THE ARTIFACT NVIDIA PUBLISHES UNDER THIS NAME.\n"
    "Built by testbed/fixtures.py (see testbed/FIXTURES.md) because NVIDIA's download servers cannot be\n"
    "reached from this project's build machines. File name and layout follow {file};\n"
    "the binaries inside are NVIDIA's real redistributable ones from the PyPI wheel {wheel}\n"
    "(they report version {reports}). NVIDIA's licence for them follows.\n"
)


def cudnn_members(fixture: Fixture, wheel_path: Path) -> list[Member]:
    """cuDNN tarball: the old `cuda/{include,lib64}` layout (.tgz) or the newer `<name>/{include,lib}` one."""
    wheel = fixture.wheels[0]
    stem, _ = _split_suffix(fixture.file)
    if fixture.file.endswith("-archive.tar.xz"):
        top, lib_dir, licence = stem, "lib", "LICENSE"
    elif fixture.file.endswith(".tgz"):
        top, lib_dir, licence = "cuda", "lib64", "NVIDIA_SLA_cuDNN_Support.txt"
    else:
        raise FixtureError(f"{fixture.file}: unknown cuDNN tarball layout (expected *-archive.tar.xz or *.tgz)")
    release = release_of(wheel.version)
    members = [
        from_wheel(f"{top}/include/{Path(n).name}", wheel_path, n)
        for n in wheel_files(wheel_path, "nvidia/cudnn/include/")
        if n.endswith(".h")
    ]
    for name in wheel_files(wheel_path, "nvidia/cudnn/lib/"):
        members += versioned_library(wheel_path, name, release, f"{top}/{lib_dir}")
    note = FIXTURE_NOTE.format(file=fixture.file, wheel=wheel.file, reports=cudnn_reports(wheel))
    members.append(text_member(f"{top}/{licence}", note + "\n" + wheel_text(wheel_path, "License.txt")))
    return members


def nccl_members(fixture: Fixture, wheel_path: Path) -> list[Member]:
    """NCCL tarball: `<name>/{include/nccl.h,include/nccl_net.h,lib/libnccl.so*,LICENSE.txt}`."""
    wheel = fixture.wheels[0]
    top, _ = _split_suffix(fixture.file)
    members = [
        from_wheel(f"{top}/include/{Path(n).name}", wheel_path, n)
        for n in wheel_files(wheel_path, "nvidia/nccl/include/")
        if n.endswith(".h")
    ]
    for name in wheel_files(wheel_path, "nvidia/nccl/lib/"):
        members += versioned_library(wheel_path, name, release_of(wheel.version), f"{top}/lib")
    note = FIXTURE_NOTE.format(file=fixture.file, wheel=wheel.file, reports=nccl_reports(wheel))
    members.append(text_member(f"{top}/LICENSE.txt", note + "\n" + wheel_text(wheel_path, "License.txt")))
    return members


# --- the TensorRT tarball ----------------------------------------------------------------------

# The zip entries' time stamp in the fixture's Python wheels (zip cannot store FIXED_MTIME's zone).
WHEEL_DATE = (2020, 10, 12, 0, 0, 0)

FIXTURE_PACKAGE = """\"\"\"TEST FIXTURE - NOT NVIDIA's {name} {version}.

Built by testbed/fixtures.py (see testbed/FIXTURES.md) for the TensorRT tarball fixture: NVIDIA ships
{name} only inside the login-walled TensorRT tarball, not on PyPI. This package holds no code of
NVIDIA's; it lets the installer's steps (pip install, import, version) run against the fixture.
\"\"\"

__version__ = "{version}"
FIXTURE = True
"""


def tensorrt_reports(wheel: Wheel) -> int:
    """What getInferLibVersion() returns for the wheel's libnvinfer (NV_TENSORRT_VERSION: 8401 for 8.4.1)."""
    major, minor, patch = (int(p) for p in release_of(wheel.version).split("."))
    return major * 1000 + minor * 100 + patch


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_bytes(file: str, files: dict[str, tuple[bytes, int]], summary: str) -> bytes:
    """A reproducible wheel named `file` with `files` ({path: (data, mode)}) and its dist-info."""
    name, version, *tags = file[: -len(".whl")].split("-")
    dist = f"{name}-{version}.dist-info"
    pure = tags[-1] == "any"
    meta = {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n",
        f"{dist}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: msgpu testbed/fixtures.py\n"
            f"Root-Is-Purelib: {str(pure).lower()}\nTag: {'-'.join(tags)}\n"
        ),
        f"{dist}/top_level.txt": f"{name}\n",
    }
    entries = {**files, **{path: (text.encode(), 0o644) for path, text in meta.items()}}
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, (data, _) in sorted(entries.items())]
    entries[f"{dist}/RECORD"] = (("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode(), 0o644)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for path, (data, mode) in sorted(entries.items()):
            info = zipfile.ZipInfo(path, WHEEL_DATE)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data, compresslevel=GZIP_LEVEL)
    return out.getvalue()


def tensorrt_python_wheels(fixture: Fixture, wheel_path: Path, top: str) -> list[Member]:
    """The tarball's Python wheels (catalog `python_wheels`): TensorRT's binding and three stand-ins.

    tensorrt-*.whl holds the real binding (tensorrt/tensorrt.so, NVIDIA's tensorrt/__init__.py) of the
    nvidia-tensorrt wheel, without the libraries: like NVIDIA's, it finds them through LD_LIBRARY_PATH.
    uff, graphsurgeon and onnx_graphsurgeon are not on PyPI (onnx-graphsurgeon only from 0.5 on):
    their wheels are fixture packages that say so.
    """
    tag = fixture.entry["fixture_python_tag"]
    members = []
    for pattern in fixture.entry["tarball"].get("python_wheels", []):
        path = pattern.replace("{tag}", tag)
        file = Path(path).name
        name, version = file.split("-")[:2]
        if name == "tensorrt":
            with zipfile.ZipFile(wheel_path) as archive:
                files = {
                    n: (archive.read(n), 0o755 if n.endswith(".so") else 0o644)
                    for n in ("tensorrt/__init__.py", "tensorrt/tensorrt.so")
                }
            summary = f"TEST FIXTURE: TensorRT's Python binding from {fixture.wheels[0].file}"
        else:
            files = {f"{name}/__init__.py": (FIXTURE_PACKAGE.format(name=name, version=version).encode(), 0o644)}
            summary = f"TEST FIXTURE: stands in for NVIDIA's {name} {version} (no NVIDIA code)"
        members.append(Member(name=f"{top}/{path}", data=wheel_bytes(file, files, summary)))
    return members


def tensorrt_members(fixture: Fixture, wheel_path: Path) -> list[Member]:
    """TensorRT tarball: `TensorRT-<version>/{lib,python,uff,graphsurgeon,onnx_graphsurgeon,doc}`.

    lib/ has every library of the nvidia-tensorrt wheel as NVIDIA's tarballs name them: the real file
    lib*.so.X.Y.Z with .so.MAJOR and .so symlinks (the wheel has lib*.so.MAJOR; libmyelin three
    copies). No headers: the wheel has none.
    """
    wheel = fixture.wheels[0]
    top = f"TensorRT-{fixture.version}"
    by_base: dict[str, list[str]] = {}
    for name in wheel_files(wheel_path, "tensorrt/"):
        if ".so" in Path(name).name and not name.endswith("tensorrt.so"):
            by_base.setdefault(Path(name).name.split(".so")[0], []).append(name)
    members = []
    for names in by_base.values():
        real = max(names, key=len)
        suffix = Path(real).name.split(".so")[1]  # ".8", ".1.5.171", ".8.4.1" or ""
        if suffix.count(".") == 1:
            members += versioned_library(wheel_path, real, release_of(wheel.version), f"{top}/lib")
            continue
        members.append(from_wheel(f"{top}/lib/{Path(real).name}", wheel_path, real, 0o755))
        links = sorted((Path(n).name for n in names if n != real), key=len, reverse=True)
        for link, target in zip(links, [Path(real).name, *links]):
            members.append(symlink(f"{top}/lib/{link}", target))
    members += tensorrt_python_wheels(fixture, wheel_path, top)
    note = FIXTURE_NOTE.format(file=fixture.file, wheel=wheel.file, reports=tensorrt_reports(wheel))
    members.append(text_member(f"{top}/doc/TensorRT-SLA.txt", note + "\n" + wheel_text(wheel_path, "LICENSE.txt")))
    return members


# --- the CUDA runfile --------------------------------------------------------------------------

# (wheel package, folder in the wheel, folder in the toolkit) copied file by file.
TOOLKIT_TREES = (
    ("nvidia-cuda-runtime-cu11", "nvidia/cuda_runtime/include/", "include/"),
    ("nvidia-cublas-cu11", "nvidia/cublas/include/", "include/"),
    ("nvidia-cuda-nvrtc-cu11", "nvidia/cuda_nvrtc/include/", "include/"),
    ("nvidia-cuda-nvcc-cu11", "nvidia/cuda_nvcc/include/", "include/"),
    ("nvidia-cuda-nvcc-cu11", "nvidia/cuda_nvcc/nvvm/", "nvvm/"),
    ("nvidia-cufft-cu11", "nvidia/cufft/include/", "include/"),
    ("nvidia-curand-cu11", "nvidia/curand/include/", "include/"),
    ("nvidia-cusolver-cu11", "nvidia/cusolver/include/", "include/"),
)
# (wheel package, library in the wheel's lib/): installed in lib64/ with a lib*.so symlink.
TOOLKIT_LIBRARIES = (
    ("nvidia-cuda-runtime-cu11", "nvidia/cuda_runtime/lib/libcudart.so.11.0"),
    ("nvidia-cublas-cu11", "nvidia/cublas/lib/libcublas.so.11"),
    ("nvidia-cublas-cu11", "nvidia/cublas/lib/libcublasLt.so.11"),
    ("nvidia-cuda-nvrtc-cu11", "nvidia/cuda_nvrtc/lib/libnvrtc.so.11.2"),
    ("nvidia-cuda-nvrtc-cu11", "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.11.7"),
    ("nvidia-cufft-cu11", "nvidia/cufft/lib/libcufft.so.10"),
    ("nvidia-cufft-cu11", "nvidia/cufft/lib/libcufftw.so.10"),
    ("nvidia-curand-cu11", "nvidia/curand/lib/libcurand.so.10"),
    ("nvidia-cusolver-cu11", "nvidia/cusolver/lib/libcusolver.so.11"),
)
# version.json component names NVIDIA uses, for the real libraries inside.
TOOLKIT_COMPONENTS = {
    "nvidia-cuda-runtime-cu11": ("cuda_cudart", "CUDA Runtime (cudart)"),
    "nvidia-cublas-cu11": ("libcublas", "CUDA cuBLAS"),
    "nvidia-cuda-nvrtc-cu11": ("cuda_nvrtc", "CUDA NVRTC"),
    "nvidia-cuda-nvcc-cu11": ("cuda_nvcc", "CUDA NVCC (ptxas and libnvvm only)"),
    "nvidia-cufft-cu11": ("libcufft", "CUDA cuFFT"),
    "nvidia-curand-cu11": ("libcurand", "CUDA cuRAND"),
    "nvidia-cusolver-cu11": ("libcusolver", "CUDA cuSOLVER"),
}


def toolkit_members(wheels: dict[str, Path]) -> list[Member]:
    """The part of the CUDA toolkit every runfile fixture shares: real binaries and headers."""
    members: dict[str, Member] = {}
    crcs: dict[str, int] = {}
    for package, prefix, target in TOOLKIT_TREES:
        with zipfile.ZipFile(wheels[package]) as archive:
            for name in wheel_files(wheels[package], prefix):
                dest = target + name[len(prefix) :]
                crc = archive.getinfo(name).CRC
                if dest in members:
                    if crcs[dest] != crc:
                        raise FixtureError(f"{dest} differs between the wheels; cannot merge them into one toolkit")
                    continue
                members[dest] = from_wheel(dest, wheels[package], name)
                crcs[dest] = crc
    for package, name in TOOLKIT_LIBRARIES:
        library = Path(name).name
        members[f"lib64/{library}"] = from_wheel(f"lib64/{library}", wheels[package], name, 0o755)
        unversioned = library.split(".so")[0] + ".so"
        members[f"lib64/{unversioned}"] = symlink(f"lib64/{unversioned}", library)
    members["bin/ptxas"] = from_wheel("bin/ptxas", wheels["nvidia-cuda-nvcc-cu11"], "nvidia/cuda_nvcc/bin/ptxas", 0o755)
    members["EULA.txt"] = text_member("EULA.txt", wheel_text(wheels["nvidia-cuda-runtime-cu11"], "License.txt"))
    return list(members.values())


RUNFILE_HEADER = r"""#!/bin/sh
# TEST FIXTURE standing in for NVIDIA's CUDA @FULL@ runfile (@FILE@).
# Built by testbed/fixtures.py; testbed/FIXTURES.md says what inside is real. A self-extracting
# script (shell header + tar.gz payload from byte @START@ on) that installs the toolkit only:
# no driver, no samples, no interactive UI.
set -u
toolkitpath=/usr/local/cuda-@VERSION@
tmpdir=${TMPDIR:-/tmp}
silent=0
toolkit=0
driver=0
bad=""
if [ "$(id -u)" = 0 ]; then log=/var/log/cuda-installer.log; else log=/tmp/cuda-installer.log; fi
log=${CUDA_FIXTURE_LOG:-$log}

logline() { printf '[%s]: %s\n' "$1" "$2" >>"$log" 2>/dev/null || true; }
fail() { logline ERROR "$1"; printf '%s\n' "$1" >&2; exit 1; }
usage() {
    cat <<'USAGE'
CUDA @FULL@ runfile (test fixture: toolkit only, no interactive UI)
Usage: sh @FILE@ --silent --toolkit [options]
  --silent              required: the fixture has no interactive UI
  --toolkit             install the CUDA toolkit
  --toolkitpath=DIR     install into DIR (default /usr/local/cuda-@VERSION@)
  --tmpdir=DIR          extract into DIR instead of $TMPDIR or /tmp
  --no-man-page         accepted (the fixture has no man pages)
  --override            accepted (the fixture checks no compiler)
  --driver              refused: this fixture carries no driver
USAGE
}

for arg in "$@"; do
    case $arg in
        --silent) silent=1 ;;
        --toolkit) toolkit=1 ;;
        --toolkitpath=*) toolkitpath=${arg#--toolkitpath=} ;;
        --tmpdir=*) tmpdir=${arg#--tmpdir=} ;;
        --no-man-page | --override) ;;
        --driver) driver=1 ;;
        --help | -h) usage; exit 0 ;;
        *) bad="$bad $arg" ;;
    esac
done
[ "$driver" = 0 ] || fail "--driver: this fixture carries no driver (it stands in for the CUDA toolkit only)"
[ -z "$bad" ] || { usage >&2; fail "unknown option(s):$bad (the options this fixture supports are listed above)"; }
[ "$silent" = 1 ] || { usage >&2; fail "--silent is required: this fixture has no interactive installer"; }
[ "$toolkit" = 1 ] || fail "nothing to install: pass --toolkit (this fixture carries no driver)"
case $toolkitpath in
    /*) ;;
    *) fail "--toolkitpath=$toolkitpath: must be an absolute path" ;;
esac
case $toolkitpath in
    / | *"'"*) fail "--toolkitpath=$toolkitpath: refused (the root directory, or a quote in the path)" ;;
esac
[ -d "$tmpdir" ] || fail "--tmpdir=$tmpdir: no such directory"

logline INFO "CUDA @FULL@ runfile fixture: installing the toolkit into $toolkitpath"
work=$(mktemp -d "$tmpdir/cuda-fixture.XXXXXXXX") || fail "cannot create a temporary directory in $tmpdir"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
tail -c +@START@ "$0" | tar -xzf - -C "$work" || fail "extracting the toolkit from $0 into $work failed"

mkdir -p "$work/bin"
cat >"$work/bin/nvcc" <<'NVCC_STUB_END'
@NVCC@NVCC_STUB_END
cat >"$work/version.json" <<'VERSION_JSON_END'
@VERSION_JSON@VERSION_JSON_END
@NVRTC_LINK@{
    printf '#!/bin/sh\n# Written by the CUDA @FULL@ runfile fixture: removes the toolkit it installed.\n'
    printf "cuda_dir='%s'\n" "$toolkitpath"
    printf "log='%s'\n" "$log"
    cat <<'UNINSTALLER_END'
set -u
for arg in "$@"; do
    case $arg in
        --silent) ;;
        *) printf 'cuda-uninstaller (fixture): unknown option %s; allowed: --silent\n' "$arg" >&2; exit 1 ;;
    esac
done
rm -rf -- "$cuda_dir" || exit 1
printf '[INFO]: Uninstalled the CUDA toolkit in %s\n' "$cuda_dir" >>"$log" 2>/dev/null || true
UNINSTALLER_END
} >"$work/bin/cuda-uninstaller"
chmod 0755 "$work/bin/nvcc" "$work/bin/cuda-uninstaller"
chmod 0644 "$work/version.json"

mkdir -p "$toolkitpath" || fail "cannot create $toolkitpath"
cp -R -P -f "$work/." "$toolkitpath/" || fail "copying the toolkit into $toolkitpath failed"
chmod 0755 "$toolkitpath"
logline INFO "CUDA @FULL@ runfile fixture: installed the toolkit into $toolkitpath"
exit 0
"""

NVCC_STUB = r"""#!/bin/sh
# nvcc stand-in written by the CUDA @FULL@ runfile fixture (testbed/FIXTURES.md): NVIDIA publishes
# no nvcc binary for CUDA 11 on PyPI, so only --version is answered, in nvcc's banner format.
if [ $# -eq 1 ] && { [ "$1" = --version ] || [ "$1" = -V ]; }; then
    cat <<'BANNER'
nvcc: NVIDIA (R) Cuda compiler driver
Test fixture stub standing in for nvcc (testbed/FIXTURES.md); it compiles nothing
Cuda compilation tools, release @VERSION@, V@FULL@
Build cuda_@VERSION@.fixture
BANNER
    exit 0
fi
echo "fixture nvcc: only --version is supported" >&2
exit 1
"""


# NVRTC's soname in NVIDIA's toolkits: libnvrtc.so.<major>.<minor> up to CUDA 11.1, libnvrtc.so.11.2 from 11.2 on
# (the wheels' 11.7 build, which every fixture carries). A fixture named for an older release also carries the
# name its real toolkit has (a link to the 11.7 library), which MindSpore built for it dlopens.
NVRTC_LIBRARY = "libnvrtc.so.11.2"


def nvrtc_soname(version: str) -> str:
    """The file name of NVRTC in NVIDIA's CUDA `version` toolkit ('11.1' -> libnvrtc.so.11.1; 11.2+ -> .11.2)."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return NVRTC_LIBRARY if (major, minor) >= (11, 2) else f"libnvrtc.so.{major}.{minor}"


def nvrtc_link_script(version: str) -> str:
    """The runfile header's line that adds the release's own NVRTC name, where it differs ('' otherwise)."""
    name = nvrtc_soname(version)
    return "" if name == NVRTC_LIBRARY else f'ln -sf {NVRTC_LIBRARY} "$work/lib64/{name}"\n'


def _fill(template: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    return template


def version_json(fixture: Fixture) -> str:
    document: dict[str, Any] = {"cuda": {"name": "CUDA SDK", "version": fixture.full_version}}
    for wheel in fixture.wheels:
        key, name = TOOLKIT_COMPONENTS[wheel.package]
        document[key] = {"name": name, "version": wheel.version}
    document["fixture"] = {
        "note": "Test fixture built by testbed/fixtures.py; bin/nvcc is a stub, everything else is from the wheels.",
        "built_from": [{"package": w.package, "version": w.version, "file": w.file} for w in fixture.wheels],
    }
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


def runfile_header(fixture: Fixture) -> bytes:
    """The shell header, with the payload's byte offset (for `tail -c +N`) filled in."""
    values = {
        "FULL": fixture.full_version,
        "VERSION": fixture.version,
        "FILE": fixture.file,
        "NVCC": _fill(NVCC_STUB, {"FULL": fixture.full_version, "VERSION": fixture.version}),
        "VERSION_JSON": version_json(fixture),
        "NVRTC_LINK": nvrtc_link_script(fixture.version),
    }
    start = 0
    while True:
        header = _fill(RUNFILE_HEADER, {**values, "START": str(start)}).encode()
        if len(header) + 1 == start:
            return header
        start = len(header) + 1


def write_runfile(path: Path, fixture: Fixture, payload: Path) -> str:
    """Header + the shared payload; returns the file's sha256."""
    with open(path, "wb") as raw, open(payload, "rb") as data:
        out = HashingWriter(raw)
        out.write(runfile_header(fixture))
        shutil.copyfileobj(data, out, COPY_BUFFER)  # type: ignore[misc]
    path.chmod(0o755)
    return out.digest.hexdigest()


# --- building the mirror -----------------------------------------------------------------------


def _timed(what: str, build: Callable[[Path], str], dest: Path) -> str:
    """Build into `<dest>.partial`, then move it into place; returns the sha256 `build` reports."""
    started = time.monotonic()
    partial = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        digest = build(partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(dest)
    log(f"built {what} ({megabytes(dest.stat().st_size)}) in {time.monotonic() - started:.0f} s")
    return digest


def _toolkit_payload(work: Path, wheels: tuple[Wheel, ...], paths: dict[str, Path]) -> Path:
    """The tar.gz all runfile fixtures share, under `<cache>/mirror-work` (named by its inputs) while they are
    built; _build deletes it once they are."""
    key = hashlib.sha256(json.dumps([asdict(w) for w in wheels] + [SOURCE_HASH]).encode()).hexdigest()[:16]
    payload = work / f"cuda-toolkit-payload-{key}.tar.gz"
    if not payload.is_file():
        for old in work.glob("cuda-toolkit-payload-*"):
            old.unlink()
        by_package = {w.package: paths[w.file] for w in wheels}
        _timed("CUDA toolkit payload", lambda p: write_tarball(p, toolkit_members(by_package), "gz"), payload)
    return payload


def _build_tarball(fixture: Fixture, paths: dict[str, Path], dest: Path) -> str:
    wheel_path = paths[fixture.wheels[0].file]
    if fixture.kind == "cudnn_tarball":
        members = cudnn_members(fixture, wheel_path)
    elif fixture.kind == "tensorrt_tarball":
        members = tensorrt_members(fixture, wheel_path)
    else:
        members = nccl_members(fixture, wheel_path)
    _, compression = _split_suffix(fixture.file)
    return _timed(fixture.file, lambda p: write_tarball(p, members, compression), dest)


def reports_version(fixture: Fixture) -> str | int:
    """What the fixture's own version probe reports (see testbed/FIXTURES.md)."""
    if fixture.kind == "cuda_runfile":
        return fixture.full_version  # `nvcc --version` (the stub) says V<full_version>
    if fixture.kind == "cudnn_tarball":
        return cudnn_reports(fixture.wheels[0])  # cudnnGetVersion()
    if fixture.kind == "tensorrt_tarball":
        return tensorrt_reports(fixture.wheels[0])  # getInferLibVersion()
    return nccl_reports(fixture.wheels[0])  # ncclGetVersion()


def manifest_entry(fixture: Fixture, dest: Path, sha256: str) -> dict[str, Any]:
    return {
        "source": fixture.source,
        "path": fixture.path,
        "sha256": sha256,
        "size": dest.stat().st_size,
        "kind": fixture.kind,
        "catalog_version": fixture.full_version,
        "reports_version": reports_version(fixture),
        "real_version": fixture.wheels[0].version,
        "built_from": [w.file for w in fixture.wheels],
        "build_key": fixture.key(),
    }


def _up_to_date(fixture: Fixture, entry: dict[str, Any] | None, dest: Path) -> bool:
    return (
        entry is not None
        and entry.get("build_key") == fixture.key()
        and dest.is_file()
        and dest.stat().st_size == entry.get("size")
    )


def read_manifest(mirror_root: Path) -> dict[str, dict[str, Any]]:
    path = mirror_root / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


# Fixtures with builders of their own module, built after the ones above (they may reuse them). Each
# module has `build(cache: Path, root: Path, catalog: dict, force: bool) -> None` (caching on its own,
# under `root/<source>/...`) and `inventory_vars(root: Path, base_url: str) -> dict`, merged into
# inventory_vars() below (dicts merged one level deep). A module that does not exist is skipped.
EXTRA_BUILDERS = ("testbed.driver_fixture", "testbed.aptrepo")


def _extra_builders() -> list[Any]:
    return [importlib.import_module(name) for name in EXTRA_BUILDERS if importlib.util.find_spec(name)]


def build_mirror(
    cache: Path = CACHE, force: bool = False, catalog_path: Path = stacks.CATALOG_FILE, every: bool = False
) -> Path:
    """Build (or reuse) under `<cache>/mirror` the fixtures the test bed's hosts install
    (testbed/stacks.py: installed_artifacts), or with `every` each one the catalog names (the fixtures'
    contract tests, `python -m testbed.fixtures`); returns that root, with manifest.json. Fixtures built
    earlier stay while they are up to date."""
    if os.environ.get("MSGPU_NO_MIRROR_BUILD"):
        # The suite's `unit` stage runs while the prepare step builds the mirror (testbed/scenarios.py:
        # unit_stages); a test there that reads the mirror would wait for that build, or race it.
        raise FixtureError(
            "this unit test reads the fixture mirror, which `./toolkit test` builds while the `unit` stage runs: "
            "mark it @pytest.mark.prepared (it then runs in the `fixtures` stage, after the mirror is built)"
        )
    root = cache / "mirror"
    catalog = load_catalog(catalog_path)
    wanted = None if every else stacks.installed_artifacts(catalog, [f.file for f in plan(catalog)])
    with locked(cache / "mirror.lock"):
        _build_manifest_fixtures(cache, root, force, catalog, wanted)
        for module in _extra_builders():
            module.build(cache, root, catalog, force, wanted)
    return root


def _build_manifest_fixtures(
    cache: Path, root: Path, force: bool, catalog: dict[str, Any], wanted: set[str] | None
) -> None:
    """The fixtures listed in manifest.json (NVIDIA runfiles and tarballs rebuilt from PyPI wheels): those in
    `wanted` (every one when None), and the others while they are built and up to date."""
    fixtures = plan(catalog)
    old = {} if force else read_manifest(root)
    current = {f.file for f in fixtures if _up_to_date(f, old.get(f.file), root / f.source / f.path)}
    # The runfiles share one payload (built in about 25 s, 650 MB while they are written) and take a second each
    # once it is; a runfile no host installs (CUDA 11.6's: 679 MB) waits for `every` like the other fixtures.
    stale = [f for f in fixtures if f.file not in current and (wanted is None or f.file in wanted)]
    built = _build(stale, cache, root) if stale else {}
    manifest = {
        f.file: manifest_entry(f, root / f.source / f.path, built[f.file]) if f.file in built else old[f.file]
        for f in fixtures
        if f.file in built or f.file in current
    }
    _remove_dropped(root, old, manifest)
    if manifest != old:
        partial = root / (MANIFEST + ".partial")
        partial.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
        partial.replace(root / MANIFEST)


def _build(stale: list[Fixture], cache: Path, root: Path) -> dict[str, str]:
    """Build the fixtures; returns {file: sha256}."""
    started = time.monotonic()
    wheels = sorted({w for f in stale for w in f.wheels}, key=lambda w: w.file)
    paths = fetch_wheels(wheels, cache)
    work = cache / "mirror-work"
    work.mkdir(parents=True, exist_ok=True)
    runfiles = [f for f in stale if f.kind == "cuda_runfile"]
    tarballs = [f for f in stale if f.kind != "cuda_runfile"]
    # zlib inflates and deflates without the GIL, so threads use every core.
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        payload = pool.submit(_toolkit_payload, work, runfiles[0].wheels, paths) if runfiles else None
        jobs = {f.file: pool.submit(_build_tarball, f, paths, root / f.source / f.path) for f in tarballs}
        built = {name: job.result() for name, job in jobs.items()}
    shared = payload.result() if payload else None
    for fixture in runfiles:
        assert shared is not None
        dest = root / fixture.source / fixture.path
        built[fixture.file] = _timed(fixture.file, lambda p, f=fixture, s=shared: write_runfile(p, f, s), dest)
    if shared is not None:
        shared.unlink()  # 650 MB: every runfile is built from it at once (above), none needs it again
    log(f"built {len(stale)} fixture(s) in {time.monotonic() - started:.0f} s")
    return built


def _remove_dropped(root: Path, old: dict[str, dict[str, Any]], manifest: dict[str, dict[str, Any]]) -> None:
    """Files of fixtures the catalog no longer names leave the mirror too."""
    for name, entry in old.items():
        if name not in manifest:
            (root / entry["source"] / entry["path"]).unlink(missing_ok=True)


def inventory_vars(mirror_root: Path, base_url: str) -> dict[str, Any]:
    """Inventory variables that point the stack at the mirror and pin every fixture's sha256."""
    base = base_url.rstrip("/")
    merged: dict[str, Any] = {
        "stack_sources": {"nvidia_developer": f"{base}/nvidia_developer", "nvidia_driver": f"{base}/nvidia_driver"},
        "stack_artifact_checksums": {name: e["sha256"] for name, e in sorted(read_manifest(mirror_root).items())},
    }
    for module in _extra_builders():
        for key, value in module.inventory_vars(mirror_root, base).items():
            merged[key] = {**merged[key], **value} if isinstance(value, dict) and key in merged else value
    return merged


# The test bed's copy of the catalog, every sandbox host's stack_catalog_file (see testbed_catalog).
TESTBED_CATALOG = CACHE / "catalog" / "stacks.yml"
# What the CUDA toolkit fixture takes unpacked, at most, per byte of its runfile (measured: the payload
# of 648 MiB unpacks to 1,132 MiB, 1.75 times; 3 leaves a margin).
FIXTURE_UNPACKED_PER_BYTE = 3
_TESTBED_CATALOG_WRITTEN: list[Path] = []


def testbed_catalog(mirror_root: Path | None = None, path: Path | None = None) -> Path:
    """catalog/stacks.yml as the test bed's hosts use it: the same stacks, versions, artifacts and
    checksums, with each CUDA toolkit's `disk_mb` (the room the preflight demands under the install
    prefix) set to what the fixture toolkit takes instead of NVIDIA's 8-9 GB. The fixture carries only the
    libraries NVIDIA puts on PyPI (testbed/FIXTURES.md), so the real figure would refuse every fresh host
    on a CI machine with 10 GB free while the fixture stack fits in half of that. cuDNN, NCCL and TensorRT
    keep the catalog's figures: their fixtures carry NVIDIA's real libraries at their real sizes.
    The preflight's disk check is the same code either way; its own test (test_preflight.py) uses a
    64 MiB prefix that both figures overflow. Written to `path` (TESTBED_CATALOG) on every call (an atomic
    replace); returns the path. Without `mirror_root`, the mirror is built first where it is missing or stale
    (cached)."""
    path = path or TESTBED_CATALOG
    if mirror_root is None:
        if _TESTBED_CATALOG_WRITTEN:  # once per process: every inventory the test bed writes names it
            return path
        mirror_root = build_mirror()  # cached: builds only what is missing or stale
        _TESTBED_CATALOG_WRITTEN.append(mirror_root)
    runfiles = [e["size"] for e in read_manifest(mirror_root).values() if e["kind"] == "cuda_runfile"]
    if not runfiles:
        raise ScenarioError(f"test-bed catalog: {mirror_root} has no CUDA runfile fixture; build the mirror first")
    disk_mb = FIXTURE_UNPACKED_PER_BYTE * max(runfiles) // 2**20 + 1
    catalog = load_catalog()
    for entry in catalog["cuda"].values():
        if "disk_mb" in entry:
            entry["disk_mb"] = disk_mb
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "# Generated by testbed/fixtures.py (testbed_catalog) from catalog/stacks.yml; do not edit.\n"
    text += yaml.safe_dump(catalog, sort_keys=False)
    partial = path.with_name(f".stacks.yml.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=CACHE, help="cache folder (default: .cache)")
    parser.add_argument("--force", action="store_true", help="rebuild every fixture")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        root = build_mirror(args.cache, force=args.force, every=True)
    except FixtureError as exc:
        print(f"fixtures: {exc}", file=sys.stderr)
        return 1
    for name, entry in read_manifest(root).items():
        print(f"{name}: {megabytes(entry['size'])}, sha256 {entry['sha256']}, reports {entry['reports_version']}")
    print(f"mirror: {root} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
