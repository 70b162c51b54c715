"""Which GPU architectures a shared library carries code for: its CUDA fat binaries, read without CUDA.

Standard library only, Python 3.8 to 3.12, no relative imports: the file can be copied alone to any machine
and run as ``python fatbin.py LIBRARY_OR_WHEEL`` (or ``python -m msgpu_verify.fatbin ...``); it prints JSON.

A CUDA library carries its GPU code as fat binaries: containers of entries, each entry either SASS (a cubin,
an ELF file for one real architecture, sm_XY) or PTX (text for one virtual architecture, compute_XY, which the
driver JIT-compiles for newer GPUs). nvcc's host objects keep them in the ``.nv_fatbin`` section (the executable
fatbin: what ``__cudaRegisterFatBinary`` hands to the driver) and, for relocatable device code, in
``__nv_relfatbin`` (nvlink's input, never loaded at run time). Like cuobjdump, this reader takes a library's
executable fatbin, or its relocatable one when it has none (``everything=True``, ``--all``: both, as
``cuobjdump -all``). It also takes every plausible container outside those sections: fatbins a library keeps
as data and loads itself (TensorRT's libnvinfer, libmyelin and libnvinfer_builder_resource, which has no fatbin
section at all), or a file that is not ELF (a raw .fatbin). The file is memory-mapped and payloads are never
decompressed or copied: a 500 MB library takes well under a second.

Layout (little-endian), as read here; NVIDIA documents none of it. Checked against four public readers: ZLUDA
(vosen/ZLUDA, zluda_dark_api/src/lib.rs: FatbinHeader, FatbinFileHeader, FatbinFileHeaderFlags), Niklas Eiling's
cuda-fatbin-decompression (fatbin-decompress.h: fat_elf_header, fat_text_header; FATBIN_FLAG_COMPRESS), jiegec's
fatbinary crate (src/lib.rs, after the former) and nvopen-tools' fatbin/FORMAT_SPECIFICATION.md (reverse-
engineered from cuobjdump); then on all 48,633 entries (executable, relocatable and data fatbins) of the
catalog's pinned wheels (catalog/gpu_code.yml): each entry's arch is its cubin's own EF_CUDA_SM (ELF e_flags,
EM_CUDA) or its PTX's ``.target sm_XY``, and major.minor its PTX's ``.version`` (compressed payloads LZ4-decoded
for the check); and against cuobjdump 13.5's ``-lelf -lptx``: the same entries per architecture it still reads
(sm_75 and up) in every library, and the same entries in each data fatbin cut out to a file.

  container header, 16 bytes:
    0  u32 magic 0xBA55ED50
    4  u16 version (1)
    6  u16 header_size (16: the first entry starts there)
    8  u64 fat_size: the bytes of all entries after this header
  entry header, header_size bytes (64, or more when it carries an object name or ptxas options after them):
    0  u16 kind: 1 PTX, 2 ELF (SASS)
    2  u16 version (0x0101)
    4  u32 header_size: the payload starts there
    8  u64 payload_size, padded (the next entry starts at entry + header_size + payload_size)
    16 u32 compressed payload size (0 when not compressed)
    20 u32 64 when ptxas options follow the first 64 header bytes (PTX), else 0
    24 u16 minor, 26 u16 major: the PTX ISA version of a PTX entry ("code version" [1,7] of a cubin)
    28 u32 arch: 86 for sm_86 / compute_86
    32 u32 object name offset, 36 u32 its length (in the header; 0 when none)
    40 u64 flags: 0x1 64-bit, 0x2 debug, 0x10 Linux, 0x1000 compressed (old), 0x2000 compressed (LZ4)
    48 u64 (zero), 56 u64 uncompressed payload size (when compressed)

Entries of other kinds are counted but not sorted into SASS or PTX. Architecture-specific suffixes (sm_90a) are
not read: such an entry is listed as "9.0".
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import struct
import sys
import tempfile
import zipfile
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

FATBIN_MAGIC = 0xBA55ED50
MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
CONTAINER = struct.Struct("<IHHQ")  # magic, version, header_size, fat_size
ENTRY = struct.Struct("<HHIQIIHHIIIQ")  # kind .. flags (48 bytes)
ENTRY_MIN_HEADER = 64
ENTRY_MAX_HEADER = 4096
KIND_PTX = 1
KIND_ELF = 2
FLAG_COMPRESSED = 0x1000 | 0x2000
SECTIONS = (b".nv_fatbin", b"__nv_relfatbin")
SHT_NOBITS = 8
ELF_MAGIC = b"\x7fELF"
# Wheel members extracted to a temporary file to be memory-mapped; smaller ones are read into memory.
IN_MEMORY_BYTES = 32 * 2**20
COPY_BUFFER = 4 * 2**20


class FatbinError(ValueError):
    """A file that cannot be read at all (missing, unreadable)."""


class Entry:
    """One embedded entry: where it is, what it is."""

    __slots__ = ("arch", "compressed", "flags", "kind", "offset", "section", "version")

    def __init__(self, offset: int, kind: int, arch: int, version: Tuple[int, int], flags: int, section: str):
        self.offset = offset
        self.kind = kind
        self.arch = arch
        self.version = version
        self.flags = flags
        self.compressed = bool(flags & FLAG_COMPRESSED)
        self.section = section

    @property
    def kind_name(self) -> str:
        return {KIND_PTX: "ptx", KIND_ELF: "sass"}.get(self.kind, f"kind-{self.kind}")

    @property
    def cc(self) -> str:
        """The architecture as a compute capability string: 86 -> "8.6", 100 -> "10.0"."""
        return f"{self.arch // 10}.{self.arch % 10}"

    def as_dict(self) -> Dict[str, Any]:
        return {
            "offset": self.offset,
            "section": self.section,
            "kind": self.kind_name,
            "arch": self.cc,
            "version": f"{self.version[0]}.{self.version[1]}",
            "compressed": self.compressed,
            "flags": hex(self.flags),
        }


class Scan:
    """What one file holds: its entries, its containers' count and what could not be read."""

    def __init__(self) -> None:
        self.entries: List[Entry] = []
        self.containers = 0
        self.errors: List[str] = []


def cc_key(cc: str) -> Tuple[int, ...]:
    """Sort key of a compute capability string: "10.0" after "9.0"."""
    return tuple(int(part) for part in cc.split("."))


def _sections(data: Union[mmap.mmap, bytes], errors: List[str]) -> Optional[List[Tuple[str, int, int]]]:
    """The fatbin sections (name, offset, size) of an ELF64 little-endian file; None when the file is not one
    (or its section table cannot be read: then `errors` says why)."""
    size = len(data)
    if size < 64 or data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0:
        return None
    if shentsize < 64 or shoff + shentsize > size:
        errors.append(
            f"ELF section table at {shoff:#x} ({shentsize}-byte entries) lies outside the file ({size} bytes)"
        )
        return None
    if shnum == 0:  # extended numbering: the count is section 0's sh_size
        shnum = struct.unpack_from("<Q", data, shoff + 32)[0]
    if shstrndx == 0xFFFF:  # SHN_XINDEX: the index is section 0's sh_link
        shstrndx = struct.unpack_from("<I", data, shoff + 40)[0]
    if shoff + shnum * shentsize > size or shstrndx >= shnum:
        errors.append(f"ELF section table at {shoff:#x}: {shnum} sections run past the file's end ({size} bytes)")
        return None

    def header(index: int) -> Tuple[int, int, int, int]:
        name, kind, _flags, _addr, offset, length = struct.unpack_from("<IIQQQQ", data, shoff + index * shentsize)
        return name, kind, offset, length

    _, _, names_at, names_size = header(shstrndx)
    if names_at + names_size > size:
        errors.append(f"ELF section names at {names_at:#x} run past the file's end")
        return None
    found = []
    for index in range(shnum):
        name_at, kind, offset, length = header(index)
        if name_at >= names_size:
            continue
        start = names_at + name_at
        end = data.find(b"\0", start, names_at + names_size)
        name = data[start : end if end >= 0 else names_at + names_size]
        if name not in SECTIONS or kind == SHT_NOBITS or length == 0:
            continue
        label = name.decode()
        if offset + length > size:
            errors.append(f"section {label} ({length} bytes at {offset:#x}) runs past the file's end; read up to it")
            length = max(0, size - offset)
        found.append((label, offset, length))
    return found


def _container(data: Union[mmap.mmap, bytes], at: int, end: int, section: str, scan: Scan) -> int:
    """Read the container at `at` (its magic checked) into `scan`; returns where reading goes on."""
    _, version, header_size, fat_size = CONTAINER.unpack_from(data, at)
    if version != 1 or not CONTAINER.size <= header_size <= ENTRY_MAX_HEADER:
        scan.errors.append(
            f"{section}: container at {at:#x} has version {version} and a header size of {header_size} bytes "
            "(expected 1 and 16); skipped"
        )
        return at + len(MAGIC_BYTES)
    stop = at + header_size + fat_size
    if stop > end:
        scan.errors.append(
            f"{section}: container at {at:#x} declares {fat_size} bytes but only {max(0, end - at - header_size)} "
            "follow; its entries are read up to that point"
        )
        stop = end
    scan.containers += 1
    entry = at + header_size
    index = 0
    while entry < stop:
        if entry + ENTRY.size > stop:
            scan.errors.append(f"{section}: container at {at:#x}: entry {index} at {entry:#x} is cut off")
            break
        kind, _ver, entry_header, payload, _csize, _unk, minor, major, arch, _noff, _nlen, flags = ENTRY.unpack_from(
            data, entry
        )
        if not ENTRY_MIN_HEADER <= entry_header <= ENTRY_MAX_HEADER:
            scan.errors.append(
                f"{section}: container at {at:#x}: entry {index} at {entry:#x} has a header size of {entry_header} "
                "bytes; the rest of the container is skipped"
            )
            break
        found = Entry(entry, kind, arch, (major, minor), flags, section)
        following = entry + entry_header + payload
        if following > stop:
            scan.errors.append(
                f"{section}: container at {at:#x}: entry {index} at {entry:#x} ({found.kind_name} {found.cc}, "
                f"{payload} bytes) runs past the container's end; not counted"
            )
            break
        scan.entries.append(found)
        entry = following
        index += 1
    return max(stop, at + CONTAINER.size)


def _plausible(data: Union[mmap.mmap, bytes], at: int, end: int) -> bool:
    """Whether the magic found at `at` (outside a fatbin section) starts a real container: its version, header
    size, declared size and first entry make sense."""
    if at + CONTAINER.size + ENTRY.size > end:
        return False
    _, version, header_size, fat_size = CONTAINER.unpack_from(data, at)
    if version != 1 or header_size != CONTAINER.size or fat_size < ENTRY_MIN_HEADER:
        return False
    if at + header_size + fat_size > end:
        return False
    kind, _ver, entry_header = ENTRY.unpack_from(data, at + header_size)[:3]
    return kind in (KIND_PTX, KIND_ELF) and ENTRY_MIN_HEADER <= entry_header <= ENTRY_MAX_HEADER


def _walk(data: Union[mmap.mmap, bytes], start: int, end: int, section: str, scan: Scan, strict: bool) -> None:
    """Every container between `start` and `end`. In a fatbin section (strict) containers follow each other,
    with zero padding between; a magic that does not start a container there is reported. Outside (not
    strict) only containers that look real are taken."""
    at = data.find(MAGIC_BYTES, start, end)
    while at >= 0:
        if strict and at + CONTAINER.size > end:
            scan.errors.append(f"{section}: container header at {at:#x} is cut off")
            break
        if strict or _plausible(data, at, end):
            gap = data[start:at] if strict and at > start else b""
            if gap.strip(b"\0"):
                scan.errors.append(f"{section}: {len(gap)} bytes between {start:#x} and {at:#x} are not a container")
            start = _container(data, at, end, section, scan)
        else:
            start = at + 1
        at = data.find(MAGIC_BYTES, start, end)
    if strict and start < end and data[start:end].strip(b"\0"):
        scan.errors.append(f"{section}: {end - start} bytes from {start:#x} on are not a container")


def scan_bytes(data: Union[mmap.mmap, bytes], everything: bool = False) -> Scan:
    """The fatbin entries of a file's bytes: the executable fatbin (``.nv_fatbin``: what the CUDA runtime hands
    to the driver) when the file has one, else the relocatable one (``__nv_relfatbin``: what nvlink reads), as
    cuobjdump chooses by default; and every plausible container outside those sections (fatbins a library
    embeds as data and loads itself, as TensorRT's do, or all of a file that is not an ELF file).
    `everything`: the relocatable fatbin too when there is an executable one (cuobjdump's ``-all``)."""
    scan = Scan()
    sections = _sections(data, scan.errors) or []
    chosen = sections
    if not everything:
        for name in SECTIONS:
            chosen = [section for section in sections if section[0] == name.decode()]
            if chosen:
                break
    for name, offset, size in chosen:
        _walk(data, offset, offset + size, name, scan, strict=True)
    start = 0
    for offset, size in sorted((offset, size) for _, offset, size in sections):
        _walk(data, start, offset, "file", scan, strict=False)
        start = max(start, offset + size)
    _walk(data, start, len(data), "file", scan, strict=False)
    return scan


def scan_file(path: Union[str, os.PathLike], everything: bool = False) -> Scan:
    """scan_bytes of a file, memory-mapped."""
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:
                return Scan()
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return scan_bytes(data, everything)
    except OSError as exc:
        raise FatbinError(f"{path}: {exc.strerror or exc}") from exc


def summarize(scan: Scan) -> Dict[str, Any]:
    """The public summary of a scan: SASS and PTX architectures (sorted, unique), entry counts, problems."""
    sass = {entry.cc for entry in scan.entries if entry.kind == KIND_ELF}
    ptx = {entry.cc for entry in scan.entries if entry.kind == KIND_PTX}
    return {
        "sass": sorted(sass, key=cc_key),
        "ptx": sorted(ptx, key=cc_key),
        "entries": len(scan.entries),
        "compressed": sum(1 for entry in scan.entries if entry.compressed),
        "errors": list(scan.errors),
    }


def read_library(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """{"sass": ["5.3", ...], "ptx": [...], "entries": n, "compressed": n, "errors": [...]} of one library.

    `errors` lists what could not be read (a truncated or garbled container): the rest is still reported.
    A file that is not there or cannot be read raises FatbinError."""
    return summarize(scan_file(path))


def is_library(name: str) -> bool:
    """A shared library's file name: libx.so, libx.so.8, libx.so.8.4.1, _x.cpython-38-x86_64-linux-gnu.so."""
    base = name.rsplit("/", 1)[-1]
    if base.endswith(".so"):
        return True
    head, dot_so, tail = base.partition(".so.")
    return bool(head and dot_so and tail and all(part.isdigit() for part in tail.split(".")))


def wheel_libraries(
    path: Union[str, os.PathLike], prefix_filter: Union[str, Sequence[str], None] = None
) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(member name, read_library result) for every shared library in a wheel, in the wheel's order, GPU code
    or not. `prefix_filter`: only members whose names start with it (a string or several)."""
    prefixes = (prefix_filter,) if isinstance(prefix_filter, str) else tuple(prefix_filter or ())
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise FatbinError(f"{path}: not a readable wheel ({exc})") from exc
    with archive:
        for info in archive.infolist():
            if info.is_dir() or not is_library(info.filename):
                continue
            if prefixes and not info.filename.startswith(prefixes):
                continue
            yield info.filename, _read_member(archive, info)


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Dict[str, Any]:
    if info.file_size <= IN_MEMORY_BYTES:
        return summarize(scan_bytes(archive.read(info)))
    with tempfile.TemporaryDirectory(prefix="msgpu-fatbin-") as folder:
        target = os.path.join(folder, "member.so")
        with archive.open(info) as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, COPY_BUFFER)
        return read_library(target)


def has_gpu_code(result: Dict[str, Any]) -> bool:
    return bool(result["entries"])


def read_wheel(
    path: Union[str, os.PathLike], prefix_filter: Union[str, Sequence[str], None] = None
) -> Dict[str, Dict[str, Any]]:
    """{member name: read_library result} for every shared library of a wheel (a zip) that has GPU code."""
    return {name: result for name, result in wheel_libraries(path, prefix_filter) if has_gpu_code(result)}


def _is_elf(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == ELF_MAGIC


def _describe(paths: Iterable[str], entries: bool, everything: bool) -> Dict[str, Any]:
    document: Dict[str, Any] = {}
    for path in paths:
        if not os.path.isfile(path):
            raise FatbinError(f"{path}: no such file")
        if zipfile.is_zipfile(path) and not _is_elf(path):
            document[path] = read_wheel(path)
            continue
        scan = scan_file(path, everything)
        result = summarize(scan)
        if entries:
            result["entry_list"] = [entry.as_dict() for entry in scan.entries]
        document[path] = result
    return document


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fatbin",
        description="List the GPU architectures (SASS and PTX) of the CUDA fat binaries in libraries or wheels.",
    )
    parser.add_argument("paths", nargs="+", metavar="LIB_OR_WHEEL", help="a shared library, or a wheel (zip)")
    parser.add_argument("--entries", action="store_true", help="also list every entry of a library")
    parser.add_argument(
        "--all",
        dest="everything",
        action="store_true",
        help="a library's relocatable fatbin (__nv_relfatbin, read by nvlink only) too when it has an executable "
        "one (as cuobjdump -all)",
    )
    args = parser.parse_args(argv)
    try:
        document = _describe(args.paths, args.entries, args.everything)
    except FatbinError as exc:
        print(f"fatbin: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(document, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
