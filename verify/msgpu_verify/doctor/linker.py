"""What the dynamic linker sees: an ELF file's DT_NEEDED, DT_RPATH and DT_RUNPATH, the linker cache, and where
a library would be found in the linker's order (the library and NCCL rules, the driver's user-space library)."""

from __future__ import annotations

import glob
import os
import re
import struct
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .core import Host, read_text

MULTIARCH_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


def elf_dynamic(path: Path) -> Dict[str, List[str]]:
    """DT_NEEDED, DT_RPATH and DT_RUNPATH of a 64-bit little-endian ELF file ({} when unreadable or not one).

    Reads only the header, the program headers, the dynamic section and its string table (a few KiB), never the
    whole file: MindSpore's libraries are up to hundreds of MiB, and the NCCL rule reads every one of the wheel's."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return {}
            (phoff,) = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            if phentsize < 56 or phnum > 4096:
                return {}
            handle.seek(phoff)
            table = handle.read(phentsize * phnum)
            loads: List[Tuple[int, int, int]] = []
            dynamic: Optional[Tuple[int, int]] = None
            for index in range(phnum):
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                    "<IIQQQQ", table, index * phentsize
                )
                if p_type == 1:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == 2:
                    dynamic = (p_offset, p_filesz)
            if dynamic is None or dynamic[1] > 1 << 20:
                return {}
            handle.seek(dynamic[0])
            section = handle.read(dynamic[1])
            entries: List[Tuple[int, int]] = []
            for offset in range(0, len(section) - 15, 16):
                tag, value = struct.unpack_from("<qQ", section, offset)
                if tag == 0:
                    break
                entries.append((tag, value))
            strtab_vaddr = next((v for t, v in entries if t == 5), None)
            strsz = next((v for t, v in entries if t == 10), None) or 1 << 20  # DT_STRSZ, else up to 1 MiB
            if strtab_vaddr is None:
                return {}
            strtab = next((o + strtab_vaddr - va for va, o, size in loads if va <= strtab_vaddr < va + size), None)
            if strtab is None:
                return {}
            handle.seek(strtab)
            strings = handle.read(min(strsz, 1 << 24))
    except (OSError, struct.error):
        return {}

    def string(offset: int) -> str:
        end = strings.find(b"\0", offset)
        return strings[offset : end if end >= 0 else len(strings)].decode("utf-8", "replace")

    names = {1: "needed", 15: "rpath", 29: "runpath"}
    found: Dict[str, List[str]] = {"needed": [], "rpath": [], "runpath": []}
    for tag, value in entries:
        if tag in names:
            found[names[tag]].append(string(value))
    return found


def ld_cache(host: Host) -> Dict[str, str]:
    """soname -> path from `ldconfig -p` (the real cache) or, under a substituted root, ld.so.conf's dirs."""
    if "ld_cache" in host.cache:
        return host.cache["ld_cache"]
    found: Dict[str, str] = {}
    if host.root == Path("/"):
        for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
            if os.access(ldconfig, os.X_OK):
                try:
                    out = subprocess.run(
                        [ldconfig, "-p"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20, check=False
                    ).stdout.decode("utf-8", "replace")
                except (OSError, subprocess.TimeoutExpired):
                    continue
                for line in out.splitlines():
                    match = re.match(r"\s*(\S+) \((libc6,x86-64[^)]*)\) => (\S+)", line)
                    if match and match.group(1) not in found:
                        found[match.group(1)] = match.group(3)
                break
    else:
        for folder in ld_conf_dirs(host):
            for entry in sorted(host.path(folder).glob("*.so*")):
                found.setdefault(entry.name, folder.rstrip("/") + "/" + entry.name)
    host.cache["ld_cache"] = found
    return found


def ld_conf_dirs(host: Host) -> List[str]:
    dirs: List[str] = []

    def parse(path: Path, depth: int = 0) -> None:
        for line in (read_text(path) or "").splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("include "):
                pattern = line.split(None, 1)[1]
                for inc in sorted(glob.glob(str(host.path(pattern)))):
                    if depth < 4:
                        parse(Path(inc), depth + 1)
            elif line:
                dirs.append(line)

    parse(host.path("/etc/ld.so.conf"))
    return dirs


def library_search(host: Host, library: str, rpath: List[str], ld_library_path: List[str]) -> List[Tuple[str, str]]:
    """Where the dynamic linker would look for ``library``, in its order: [(how, path)] of existing files."""
    hits: List[Tuple[str, str]] = []
    for how, dirs in (("RPATH", rpath), ("LD_LIBRARY_PATH", ld_library_path)):
        for folder in dirs:
            if folder and (host.path(folder) / library).exists():
                hits.append((how, folder.rstrip("/") + "/" + library))
    cached = ld_cache(host).get(library)
    if cached:
        hits.append(("ld.so.cache", cached))
    for folder in MULTIARCH_DIRS:
        if (host.path(folder) / library).exists():
            hits.append(("default path", folder + "/" + library))
    return hits
