"""The doctor: read a host's state and explain, in plain words, what keeps MindSpore off its GPUs.

Every rule reads real state (files under /, /proc and /sys, the env file's shell, the venv's
installed distributions, the ELF header of MindSpore's extension, `nvidia-smi -q` on a GPU host, unit
files merged as systemd merges them) and returns findings, each with an id, a severity (error,
warning, info), a title, the evidence (what was read, where) and the fix (plain words plus the exact
command or variable). Standard library only, Python 3.8.

The roots are parameters so that facts a container cannot have (a loaded nouveau or NVIDIA module,
Secure Boot's EFI variable, GPUs) can be given as a substituted file tree in tests; by default they
are the real /, /proc and /sys. nvidia-smi likewise: ``--nvidia-smi`` (or <root>/usr/bin/nvidia-smi
under a substituted root) can be a stand-in that prints a real GPU host's output. What the stack
expects (catalog values resolved by the `stack` role) comes from ``--expect FILE`` (JSON, written by
roles/verify tasks/doctor.yml).
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import mmap
import os
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

SEVERITIES = ("error", "warning", "info")
JSON_LINE = "@@MSGPU_DOCTOR_JSON@@"
SECURE_BOOT_VAR = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
MODULE_SIGNATURE_MAGIC = b"~Module signature appended~\n"
MULTIARCH_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
MINDSPORE_DISTRIBUTIONS = ("mindspore", "mindspore-gpu", "mindspore-cpu", "mindspore-ascend", "mindspore-dev")
# Where DKMS, the runfile and distribution kernels put the NVIDIA module below /lib/modules/<kernel>.
MODULE_SUBDIRS = ("updates/dkms", "updates", "extra", "kernel/drivers/video", "kernel/drivers/char/drm", "misc")
# /proc/driver/nvidia/version's first line names the release after "Kernel Module", for NVIDIA's
# proprietary module ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.00  Thu Oct 14 ...")
# and for the open kernel modules ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
# 535.104.05  Release Build  (dvs-builder@...)  ...").
NVRM_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)\b")
# Where systemd looks for a system unit and its drop-in folders (<unit>.d/*.conf), most important first.
SYSTEMD_UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/lib/systemd/system",
    "/usr/lib/systemd/system",
)
PERSISTENCED_UNIT = "nvidia-persistenced.service"
# The nvidia_driver role's drop-in for Ubuntu's unit (distro and cuda_repo methods).
PERSISTENCED_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/msgpu-persistence.conf"
# The GPU probe (gpu_probe.py: libcuda and NVML through ctypes, no MindSpore) runs through the judge's
# run_driver_probe, in a child with a hard timeout: a broken driver can hang in cuInit.
GPU_PROBE_TIMEOUT = 30.0
# What doctor.py needs beside it to run the probe and the GPU code rule (compute.py) when it runs as a lone file
# (the verify role copies these).
PROBE_FILES = ("__init__.py", "_proc.py", "judge.py", "gpu_probe.py", "compute.py")
# NCCL's soname: what MindSpore's collective libraries link (DT_NEEDED), and what the 1.10 and 2.x wheels bundle.
NCCL_SONAME = "libnccl.so.2"
# What a CUresult from cuInit, cuDeviceGetCount or the probe's kernel steps means on a GPU host, in plain words
# (cuda.h's CUresult values; gpu_probe.py names them through the driver's cuGetErrorName).
CUDA_MEANINGS = {
    2: "the GPU's memory is exhausted (other processes hold it: `nvidia-smi` lists them)",
    3: "the CUDA driver is not initialized: cuInit failed earlier in this process",
    35: "the CUDA driver library (libcuda) is newer than the loaded NVIDIA kernel module can serve",
    46: "the GPUs are busy or unavailable: compute mode Exclusive_Process/Prohibited (`nvidia-smi -q -d COMPUTE`)",
    100: "the driver sees no CUDA-capable GPU (no /dev/nvidia<N>, CUDA_VISIBLE_DEVICES hides them, or the GPUs "
    "fell off the bus: `sudo dmesg | grep -i xid`)",
    101: "a device ordinal that does not exist (CUDA_VISIBLE_DEVICES names a GPU the host does not have)",
    209: "no kernel image for this GPU",
    218: "the driver cannot JIT-compile PTX (a broken or mismatched libnvidia-ptxjitcompiler)",
    222: "the PTX is newer than this driver supports",
    304: "an operating-system call failed: usually /dev/nvidia* cannot be opened (permissions, or a container "
    "without the devices)",
    719: "the kernel crashed on the GPU (a hardware or driver fault: `sudo dmesg | grep -i xid`)",
    802: "the system is not ready: on NVSwitch hosts nvidia-fabricmanager is not running",
    803: "libcuda and the loaded NVIDIA kernel module are from different driver releases",
    804: "libcuda is a forward-compatibility copy (cuda-compat) this GPU does not support",
    999: "the driver failed without saying why: often nvidia_uvm is not loaded (or needs reloading after a "
    "suspend), or a GPU in a bad state",
}


@dataclass
class Finding:
    id: str
    severity: str
    title: str
    evidence: List[str]
    fix: str

    def as_dict(self) -> Dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
        }


@dataclass
class Host:
    """Where the doctor reads from, and what the stack expects (empty when no --expect was given)."""

    root: Path = Path("/")
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    expect: Dict[str, Any] = field(default_factory=dict)
    env_file: str = ""
    kernel: str = ""
    environ: Dict[str, str] = field(default_factory=dict)
    device_id: Optional[int] = None
    # nvidia-smi to ask (`-q`): None finds it (PATH, or <root>/usr/bin/nvidia-smi under a substituted
    # root, where a stand-in can print a real GPU host's output); '' asks none.
    nvidia_smi: Optional[str] = None
    # The GPU probe: None runs it on the real root only (a substituted tree's libraries are not this
    # machine's), True always, False never; libcuda/libnvml ('' = the probe's default) name the libraries.
    gpu_probe: Optional[bool] = None
    gpu_probe_timeout_s: float = GPU_PROBE_TIMEOUT
    libcuda: str = ""
    libnvml: str = ""
    cache: Dict[str, Any] = field(default_factory=dict)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def shown(self, path: Path) -> str:
        """A path as the evidence shows it: absolute on the host when the root is substituted."""
        try:
            return "/" + str(path.relative_to(self.root)) if self.root != Path("/") else str(path)
        except ValueError:
            return str(path)


# ---------------------------------------------------------------------------------------------- helpers


def read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def version_key(version: str) -> Tuple[int, ...]:
    """Numeric parts of a version, '470.82.01' -> (470, 82, 1); text after the digits is ignored."""
    parts: List[int] = []
    for part in re.split(r"[.+-]", str(version)):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        parts.append(int(digits.group(0)))
    return tuple(parts)


def _compare(left: Tuple[int, ...], right: Tuple[int, ...]) -> int:
    width = max(len(left), len(right))
    a = left + (0,) * (width - len(left))
    b = right + (0,) * (width - len(right))
    return (a > b) - (a < b)


def satisfies(version: str, specifier: str) -> bool:
    """``specifier`` like '<1.24' or '>=1.17,<1.24' (PEP 440 operators without pre-release subtleties)."""
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        match = re.match(r"(===|==|!=|<=|>=|~=|<|>)\s*(.+)", clause)
        if not match:
            continue
        op, wanted = match.groups()
        if op in ("==", "===", "!=") and wanted.endswith(".*"):
            same = version_key(version)[: len(version_key(wanted[:-2]))] == version_key(wanted[:-2])
            if same != (op != "!="):
                return False
            continue
        cmp = _compare(version_key(version), version_key(wanted))
        if op == "~=":
            prefix = version_key(wanted)[:-1]
            ok = cmp >= 0 and version_key(version)[: len(prefix)] == prefix
        else:
            ok = {"<": cmp < 0, "<=": cmp <= 0, ">": cmp > 0, ">=": cmp >= 0, "==": cmp == 0, "===": cmp == 0}.get(
                op, cmp != 0
            )
        if not ok:
            return False
    return True


def split_requirement(requirement: str) -> Tuple[str, str]:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", requirement)
    if not match:
        return requirement.strip(), ""
    return normalize(match.group(1)), match.group(2).split(";")[0].strip()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def shell_environment(env_file: str, timeout_s: float = 20.0) -> Tuple[Optional[Dict[str, str]], str]:
    """The environment a clean login-less bash has after sourcing ``env_file``, and what it printed."""
    clean = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    try:
        proc = subprocess.run(
            ["bash", "-c", '. "$1" 1>&2; env -0', "msgpu-doctor", env_file],
            env=clean,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    env: Dict[str, str] = {}
    for item in proc.stdout.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            env[key] = value
    return env, proc.stderr.decode("utf-8", "replace").strip()


# ------------------------------------------------------------------------------------------------ ELF


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


# ----------------------------------------------------------------------------------------------- facts


def loaded_modules(host: Host) -> Optional[Dict[str, str]]:
    text = read_text(host.proc / "modules")
    if text is None:
        return None
    return {line.split()[0]: line for line in text.splitlines() if line.strip()}


def running_kernel(host: Host) -> str:
    if host.kernel:
        return host.kernel
    text = read_text(host.proc / "sys/kernel/osrelease")
    return text.strip() if text else os.uname().release


def loaded_driver_version(host: Host) -> Tuple[Optional[str], str]:
    version = read_text(host.sys / "module/nvidia/version")
    if version and version.strip():
        return version.strip(), str(host.sys / "module/nvidia/version")
    version = nvrm_version(read_text(host.proc / "driver/nvidia/version") or "")
    if version:
        return version, str(host.proc / "driver/nvidia/version")
    return None, ""


def nvrm_version(text: str) -> Optional[str]:
    """The release in /proc/driver/nvidia/version, proprietary or open kernel module; None when absent."""
    match = NVRM_VERSION.search(text)
    return match.group(1) if match else None


def gpu_count(host: Host) -> Tuple[Optional[int], str]:
    gpus = host.proc / "driver/nvidia/gpus"
    if gpus.is_dir():
        return len([p for p in gpus.iterdir() if p.is_dir()]), str(gpus)
    devices = [p for p in host.path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]
    if devices:
        return len(devices), host.shown(host.path("/dev")) + "/nvidia<N>"
    return None, ""


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


def installed_distributions(site_dirs: Sequence[Path]) -> Dict[str, List[Tuple[str, str]]]:
    """normalized name -> [(version, metadata folder)] for every *.dist-info / *.egg-info found."""
    found: Dict[str, List[Tuple[str, str]]] = {}
    for site in site_dirs:
        for meta in sorted(list(site.glob("*.dist-info")) + list(site.glob("*.egg-info"))):
            text = read_text(meta / "METADATA") or read_text(meta / "PKG-INFO") or ""
            name = re.search(r"^Name:\s*(\S+)", text, re.MULTILINE)
            version = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
            if name and version:
                found.setdefault(normalize(name.group(1)), []).append((version.group(1), str(meta)))
    return found


def mpi_ranks(host: Host) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Processes that are MPI ranks (OpenMPI or PMIx environment), with the GPUs they could use, and the
    processes whose environment this user may not read (another user's, without root's ptrace right)."""
    ranks: List[Dict[str, Any]] = []
    unreadable: List[str] = []
    try:
        pids = [p for p in os.listdir(host.proc) if p.isdigit()]
    except OSError:
        return ranks, unreadable
    for pid in pids:
        try:
            raw: Optional[bytes] = (host.proc / pid / "environ").read_bytes()
        except PermissionError:
            unreadable.append(pid)
            continue
        except OSError:
            continue
        if not raw or (b"OMPI_COMM_WORLD_RANK=" not in raw and b"PMIX_RANK=" not in raw):
            continue
        env = dict(item.decode("utf-8", "replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)
        rank = env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK")
        job = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid") or env.get("OMPI_MCA_orte_ess_jobid", "?")
        opened: List[str] = []
        try:
            for fd in os.listdir(host.proc / pid / "fd"):
                target = os.readlink(str(host.proc / pid / "fd" / fd))
                if re.fullmatch(r"/dev/nvidia\d+", target):
                    opened.append(target)
        except OSError:
            pass
        cmdline = (_read_bytes(host.proc / pid / "cmdline") or b"").replace(b"\0", b" ").decode("utf-8", "replace")
        ranks.append(
            {
                "pid": int(pid),
                "job": job,
                "rank": rank,
                "local_rank": env.get("OMPI_COMM_WORLD_LOCAL_RANK"),
                "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                "device_id": env.get("DEVICE_ID"),
                "opened": sorted(set(opened)),
                "cmdline": cmdline.strip()[:200],
            }
        )
    return ranks, unreadable


def _read_bytes(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:
        return None


# ---------------------------------------------------------------------------------------- systemd units


@dataclass
class Unit:
    """A systemd unit as systemd merges it: its unit file, then its drop-ins in systemd's order."""

    name: str
    path: Optional[str]
    dropins: List[str]
    settings: Dict[str, Dict[str, List[str]]]

    @property
    def sources(self) -> List[str]:
        return ([self.path] if self.path else []) + self.dropins

    def values(self, section: str, key: str) -> List[str]:
        return list(self.settings.get(section, {}).get(key, []))

    def value(self, section: str, key: str) -> Optional[str]:
        values = self.values(section, key)
        return values[-1] if values else None


def unit_assignments(text: str) -> List[Tuple[str, str, str]]:
    """(section, key, value) of a unit file or drop-in, in order (systemd.syntax(7)): blank lines and
    comments (# or ;) skipped, a line ending in a backslash continued on the next one."""
    found: List[Tuple[str, str, str]] = []
    section = ""
    pending = ""  # a continued line so far, its backslashes replaced by spaces
    for raw in [*text.splitlines(), ""]:
        line = raw.strip()
        if pending and line[:1] in ("#", ";"):
            continue  # a comment inside a continued line
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, sep, value = line.partition("=")
        if sep:
            found.append((section, key.strip(), value.strip()))
    return found


def merge_unit(texts: Sequence[str]) -> Dict[str, Dict[str, List[str]]]:
    """section -> setting -> values after reading ``texts`` in order (the unit file, then each drop-in), as
    systemd does: an assignment adds to the setting's list, an empty one (``ExecStart=``) resets it; a
    single-valued setting (StopWhenUnneeded) is the list's last value."""
    settings: Dict[str, Dict[str, List[str]]] = {}
    for text in texts:
        for section, key, value in unit_assignments(text):
            values = settings.setdefault(section, {}).setdefault(key, [])
            if value:
                values.append(value)
            else:
                values.clear()
    return settings


def load_unit(
    name: str,
    list_dir: Callable[[str], Iterable[str]],
    read: Callable[[str], Optional[str]],
    dirs: Sequence[str] = SYSTEMD_UNIT_DIRS,
) -> Unit:
    """The unit ``name`` as systemd loads it, through ``list_dir`` (a folder's entry names, none when it is
    missing) and ``read`` (a file's text, None when it is missing), so that it works on any file tree:
    the unit file of the first folder of ``dirs`` that has one, then every ``<folder>/<name>.d/*.conf`` of
    all folders sorted by file name, a file name in a more important folder hiding it in the others."""
    path: Optional[str] = None
    text: Optional[str] = None
    for folder in dirs:
        text = read(f"{folder}/{name}")
        if text is not None:
            path = f"{folder}/{name}"
            break
    chosen: Dict[str, str] = {}
    for folder in dirs:
        for entry in list_dir(f"{folder}/{name}.d"):
            if entry.endswith(".conf"):
                chosen.setdefault(entry, f"{folder}/{name}.d/{entry}")
    dropins = [chosen[entry] for entry in sorted(chosen)]
    texts = ([text] if text is not None else []) + [read(dropin) or "" for dropin in dropins]
    return Unit(name, path, dropins, merge_unit(texts))


def host_unit(host: Host, name: str) -> Unit:
    """``name`` as systemd would load it from the host's files (no running systemd needed)."""

    def list_dir(folder: str) -> List[str]:
        try:
            return sorted(os.listdir(host.path(folder)))
        except OSError:
            return []

    def read(path: str) -> Optional[str]:
        target = host.path(path)
        if not os.path.lexists(str(target)):
            return None
        return read_text(target) or ""  # a unit masked by a link to /dev/null reads as empty

    return load_unit(name, list_dir, read)


def exec_argv(value: str) -> List[str]:
    """An Exec*= command line as a list (systemd's quoting), without its prefixes (-, @, :, +, !)."""
    try:
        argv = shlex.split(value)
    except ValueError:
        argv = value.split()
    while argv and argv[0][:1] in ("-", "@", ":", "+", "!"):
        argv[0] = argv[0][1:]
        if not argv[0]:
            argv = argv[1:]
    return argv


def unit_bool(value: Optional[str], default: bool = False) -> bool:
    """A systemd boolean (1, yes, true, on / 0, no, false, off)."""
    if value is None or not value.strip():
        return default
    return value.strip().lower() in ("1", "yes", "y", "true", "t", "on")


def persistence_mode_in(argv: Sequence[str]) -> bool:
    """Whether nvidia-persistenced started with ``argv`` turns persistence mode on: its default, unless a
    --no-persistence-mode comes after the last --persistence-mode."""
    mode = True
    for arg in argv:
        if arg == "--persistence-mode":
            mode = True
        elif arg == "--no-persistence-mode":
            mode = False
    return mode


def persistenced_processes(host: Host) -> List[Tuple[int, List[str]]]:
    """(pid, argv) of every running nvidia-persistenced."""
    found: List[Tuple[int, List[str]]] = []
    try:
        pids = sorted((p for p in os.listdir(host.proc) if p.isdigit()), key=int)
    except OSError:
        return found
    for pid in pids:
        raw = _read_bytes(host.proc / pid / "cmdline") or b""
        argv = [arg.decode("utf-8", "replace") for arg in raw.rstrip(b"\0").split(b"\0")] if raw else []
        if argv and os.path.basename(argv[0]) == "nvidia-persistenced":
            found.append((int(pid), argv))
    return found


# ----------------------------------------------------------------------------------------------- nvidia-smi


def nvidia_smi_program(host: Host) -> Optional[str]:
    if host.nvidia_smi is not None:
        return host.nvidia_smi or None
    if host.root != Path("/"):
        stand_in = str(host.path("/usr/bin/nvidia-smi"))
        return stand_in if os.access(stand_in, os.X_OK) else None
    found = shutil.which("nvidia-smi")
    return found or ("/usr/bin/nvidia-smi" if os.access("/usr/bin/nvidia-smi", os.X_OK) else None)


def nvidia_smi_query(host: Host, timeout_s: float = 30.0) -> Tuple[Optional[str], str]:
    """`nvidia-smi -q` (asked once per run), or None and why it did not answer."""
    if "nvidia_smi_q" in host.cache:
        return host.cache["nvidia_smi_q"]
    program = nvidia_smi_program(host)
    answer: Tuple[Optional[str], str]
    if not program:
        answer = None, "no nvidia-smi on this host"
    else:
        try:
            done = subprocess.run(
                [program, "-q"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            answer = None, f"`{program} -q` did not answer within {timeout_s:.0f} s"
        except OSError as exc:
            answer = None, f"`{program} -q` cannot run: {exc}"
        else:
            text = done.stdout.decode("utf-8", "replace")
            if done.returncode == 0:
                answer = text, f"`{program} -q`"
            else:
                answer = None, f"`{program} -q` exited with {done.returncode}: {text.strip()[-300:] or 'no output'}"
    host.cache["nvidia_smi_q"] = answer
    return answer


def gpu_persistence(text: str) -> List[Dict[str, str]]:
    """Each GPU of `nvidia-smi -q`: its bus id, product name and persistence mode (Enabled, Disabled)."""
    gpus: List[Dict[str, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        header = re.fullmatch(r"GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)", stripped)
        if header:
            gpus.append({"bus_id": header.group(1), "product": "", "persistence": ""})
            continue
        item = re.match(r"(Product Name|Persistence Mode)\s*:\s*(.*)$", stripped)
        if item and gpus:
            key = "product" if item.group(1) == "Product Name" else "persistence"
            gpus[-1][key] = gpus[-1][key] or item.group(2).strip()
    return gpus


# ----------------------------------------------------------------------------------------------- GPU probe


def sibling_module(name: str) -> Tuple[Optional[Any], str]:
    """A module of the package doctor.py sits in (``judge``, ``compute``), and why not when it is missing.

    In the package (``python -m msgpu_verify doctor``) it is imported as usual; doctor.py run as a file
    imports the package it sits in when the files it needs (PROBE_FILES) are beside it (the verify role copies
    them), and runs without them when it was copied alone."""
    try:
        if __package__:
            return importlib.import_module("." + name, __package__), ""
        folder = Path(__file__).resolve().parent
        missing = [item for item in PROBE_FILES if not (folder / item).is_file()]
        if missing:
            return None, f"{', '.join(missing)} not beside {Path(__file__).resolve()} (it runs alone)"
        if str(folder.parent) not in sys.path:
            sys.path.insert(0, str(folder.parent))
        return importlib.import_module(folder.name + "." + name), ""
    except ImportError as exc:
        return None, f"{name}.py cannot be imported: {exc}"


def driver_probe_runner() -> Tuple[Optional[Callable[..., Dict[str, Any]]], str]:
    """The judge's run_driver_probe (gpu_probe.py in a child with a hard timeout), and why not when it is missing."""
    judge, reason = sibling_module("judge")
    if judge is None:
        return None, reason if "not beside" in reason else f"the GPU probe cannot be imported: {reason}"
    return judge.run_driver_probe, ""


def gpu_probe_record(host: Host) -> Dict[str, Any]:
    """The GPU probe's record (judge.run_driver_probe's: state, verdict, reason, summary, document), run once."""
    if "gpu_probe" in host.cache:
        return host.cache["gpu_probe"]
    wanted = host.gpu_probe if host.gpu_probe is not None else host.root == Path("/")
    reason = ""
    runner: Optional[Callable[..., Dict[str, Any]]] = None
    if host.gpu_probe is False:
        reason = "--no-gpu-probe"
    elif not wanted:
        reason = "the root is substituted (--root): its libraries are not this machine's (--gpu-probe runs it)"
    else:
        runner, reason = driver_probe_runner()
    if runner is None:
        record: Dict[str, Any] = {
            "state": "skipped",
            "verdict": None,
            "reason": reason,
            "summary": "skipped: " + reason,
        }
    else:
        env = dict(os.environ)
        for variable, value in (("MSGPU_LIBCUDA", host.libcuda), ("MSGPU_LIBNVML", host.libnvml)):
            if value:
                env[variable] = value
        record = runner(host.gpu_probe_timeout_s, env=env)
    host.cache["gpu_probe"] = record
    return record


def probe_document(host: Host) -> Dict[str, Any]:
    """The probe's own JSON when it ran and answered ({} otherwise)."""
    record = gpu_probe_record(host)
    document = record.get("document") if record.get("state") == "ran" else None
    return document if isinstance(document, dict) else {}


def probe_nvml_devices(host: Host) -> List[Dict[str, Any]]:
    nvml = probe_document(host).get("nvml")
    if not isinstance(nvml, dict) or not nvml.get("available"):
        return []
    return [d for d in nvml.get("devices") or [] if isinstance(d, dict)]


def probe_line(host: Host) -> str:
    """The probe's answer as one evidence line."""
    record = gpu_probe_record(host)
    if record.get("state") == "ran":
        return f"GPU probe (gpu_probe.py, no MindSpore): {record.get('verdict')}: {record.get('reason')}"
    return f"GPU probe (gpu_probe.py, no MindSpore): {record.get('summary')}"


def cuda_code_text(code: Any, name: Any) -> str:
    """A CUresult and what it means, e.g. "CUDA_ERROR_UNKNOWN (999): the driver failed without saying why..."."""
    meaning = CUDA_MEANINGS.get(code) if isinstance(code, int) else None
    return f"{name} ({code})" + (f": {meaning}" if meaning else "")


def _error_code(text: str) -> Optional[int]:
    """The CUresult in gpu_probe's "CUDA_ERROR_LAUNCH_FAILED (719)"."""
    match = re.search(r"\((\d+)\)\s*$", text or "")
    return int(match.group(1)) if match else None


# ----------------------------------------------------------------------------------------------- rules

Rule = Callable[[Host], List[Finding]]


def rule_nouveau(host: Host) -> List[Finding]:
    findings: List[Finding] = []
    modules = loaded_modules(host)
    if modules is None:
        findings.append(
            Finding(
                "kernel-modules-unreadable",
                "info",
                "The loaded kernel modules cannot be read",
                [f"{host.proc / 'modules'} is missing (a container or a restricted /proc)"],
                "Run the doctor on the host itself (not in a container) to check nouveau and the NVIDIA module.",
            )
        )
    elif "nouveau" in modules:
        findings.append(
            Finding(
                "nouveau-loaded",
                "error",
                "nouveau, the open-source driver, holds the GPUs, so the NVIDIA driver cannot load",
                [f"{host.proc / 'modules'}: {modules['nouveau'].strip()}"],
                "Blacklist nouveau (nvidia_driver_blacklist_nouveau: true, then `./toolkit provision`, which writes "
                "/etc/modprobe.d/blacklist-nouveau.conf), then `sudo update-initramfs -u` and reboot.",
            )
        )
    blacklisted = []
    for folder in ("/etc/modprobe.d", "/lib/modprobe.d", "/usr/lib/modprobe.d"):
        for conf in sorted(host.path(folder).glob("*.conf")):
            if re.search(r"^\s*blacklist\s+nouveau\s*$", read_text(conf) or "", re.MULTILINE):
                blacklisted.append(host.shown(conf))
    if not blacklisted:
        findings.append(
            Finding(
                "nouveau-not-blacklisted",
                "warning",
                "nouveau is not blacklisted: after the next reboot it may claim the GPUs before the NVIDIA driver",
                ["no `blacklist nouveau` line in /etc/modprobe.d/*.conf, /lib/modprobe.d/*.conf"],
                "Set nvidia_driver_blacklist_nouveau: true (the default) and run `./toolkit provision`; it writes "
                "/etc/modprobe.d/blacklist-nouveau.conf and updates the initramfs.",
            )
        )
    return findings


def _module_files(host: Host, kernel: str, module: str) -> List[Path]:
    base = host.path(f"/lib/modules/{kernel}")
    files: List[Path] = []
    for sub in MODULE_SUBDIRS:
        files.extend(sorted((base / sub).glob(f"{module}.ko*")))
    # Canonical's signed precompiled modules (linux-modules-nvidia-<branch>-<kernel>).
    files.extend(sorted(base.glob(f"kernel/nvidia-[0-9]*/{module}.ko*")))
    return files


def rule_dkms(host: Host) -> List[Finding]:
    module = str((host.expect.get("driver") or {}).get("dkms_module") or "nvidia")
    findings: List[Finding] = []
    modules_root = host.path("/lib/modules")
    kernels = sorted(p.name for p in modules_root.iterdir() if p.is_dir()) if modules_root.is_dir() else []
    dkms_built = sorted(glob.glob(str(host.path(f"/var/lib/dkms/{module}/*/*/*/module/{module}.ko*"))))
    registered = sorted(p.name for p in host.path(f"/var/lib/dkms/{module}").glob("*") if re.match(r"\d", p.name))
    missing = []
    for kernel in kernels:
        has_headers = (modules_root / kernel / "build" / "Makefile").exists()
        if has_headers and not _module_files(host, kernel, module):
            built = [b for b in dkms_built if f"/{kernel}/" in b]
            missing.append((kernel, built))
    for kernel, built in missing:
        state = (
            f"DKMS built it ({host.shown(Path(built[0]))}) but it is not installed"
            if built
            else f"DKMS has not built it (registered: {', '.join(registered) or 'no version of ' + module})"
        )
        findings.append(
            Finding(
                "dkms-module-missing",
                "error",
                f"Kernel {kernel} has headers but no {module} module: booting it leaves the GPUs without a driver",
                [
                    f"{host.shown(modules_root / kernel / 'build/Makefile')} exists",
                    f"no {module}.ko in {host.shown(modules_root / kernel)}/{{{','.join(MODULE_SUBDIRS)}}}",
                    state,
                ],
                f"Build it: `sudo dkms autoinstall -k {kernel}` (or `./toolkit provision`, whose nvidia_driver role "
                f"builds the module for every kernel with headers). If the build fails, read "
                f"/var/lib/dkms/{module}/*/build/make.log: a kernel newer than the driver branch supports needs a "
                "newer "
                "stack_driver_branch.",
            )
        )
    running = running_kernel(host)
    if running in kernels:
        if not _module_files(host, running, module) and running not in [k for k, _ in missing]:
            findings.append(
                Finding(
                    "driver-module-missing-running-kernel",
                    "error",
                    f"The running kernel {running} has no {module} module",
                    [f"no {module}.ko in {host.shown(modules_root / running)} and no headers to build one"],
                    f"Install the headers and build it: `sudo apt-get install linux-headers-{running}` then "
                    f"`sudo dkms autoinstall -k {running}` (or `./toolkit provision`).",
                )
            )
    elif kernels or registered:
        findings.append(
            Finding(
                "running-kernel-not-installed",
                "info",
                f"The running kernel {running} has no /lib/modules folder here (a container shares its host's kernel)",
                [f"{host.shown(modules_root)} holds: {', '.join(kernels) or 'nothing'}"],
                "Nothing to do in a container; on a real host, reboot into an installed kernel.",
            )
        )
    return findings


def _secure_boot(host: Host) -> Tuple[Optional[bool], str]:
    path = host.sys / SECURE_BOOT_VAR
    data = _read_bytes(path)
    if data is None or len(data) < 5:
        return None, str(path)
    return data[4] == 1, str(path)


def module_signed(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(-len(MODULE_SIGNATURE_MAGIC), os.SEEK_END)
            return handle.read() == MODULE_SIGNATURE_MAGIC
    except OSError:
        return False


def rule_secure_boot(host: Host) -> List[Finding]:
    enabled, where = _secure_boot(host)
    if enabled is None:
        return [
            Finding(
                "secure-boot-unknown",
                "info",
                "Secure Boot state cannot be read (no EFI variables: legacy BIOS boot or a container)",
                [f"{where} is missing"],
                "Nothing to do unless the host boots with UEFI Secure Boot; then run the doctor on the host itself.",
            )
        ]
    if not enabled:
        return []
    module = str((host.expect.get("driver") or {}).get("dkms_module") or "nvidia")
    running = running_kernel(host)
    kernels = [running] if host.path(f"/lib/modules/{running}").is_dir() else []
    if not kernels:
        kernels = sorted(p.name for p in host.path("/lib/modules").glob("*") if p.is_dir())
    unsigned = [f for k in kernels for f in _module_files(host, k, module) if not module_signed(f)]
    if not unsigned:
        return []
    return [
        Finding(
            "secure-boot-unsigned-module",
            "error",
            f"Secure Boot is on and the {module} module is not signed: the kernel refuses to load it",
            [f"{where}: Secure Boot = 1"] + [f"{host.shown(f)} has no appended module signature" for f in unsigned[:4]],
            "Re-run `./toolkit provision` (site.yml): under Secure Boot it has Ubuntu's DKMS sign "
            f"{module} with the host's machine owner key (made by `update-secureboot-policy --new-key`), queues the "
            "key's enrolment (password in /var/lib/msgpu/mok-enrolment-password) and says what to do at the next "
            "boot's MOK manager; or use Canonical's signed modules (nvidia_driver_module: precompiled). By hand: "
            "`sudo update-secureboot-policy --new-key`, `sudo update-secureboot-policy --enroll-key`, "
            f"`sudo dkms autoinstall` so DKMS signs {module}, reboot and enroll the key in the MOK manager; or turn "
            "Secure Boot off in the firmware.",
        )
    ]


def _library_dirs_version(name: str, paths: Iterable[str]) -> Optional[Tuple[str, str]]:
    """(version, path) of the first real file behind ``name`` (libcuda.so.1 -> libcuda.so.470.82.01)."""
    for path in paths:
        real = os.path.realpath(path)
        match = re.match(re.escape(name.split(".so")[0]) + r"\.so\.(\d+\.\d+(?:\.\d+)?)$", os.path.basename(real))
        if match:
            return match.group(1), real
    return None


def user_space_driver(host: Host, library: str) -> Optional[Tuple[str, str]]:
    soname = {"libcuda": "libcuda.so.1", "libnvidia-ml": "libnvidia-ml.so.1"}[library]
    candidates = [str(host.path(d) / soname) for d in MULTIARCH_DIRS]
    cached = ld_cache(host).get(soname)
    if cached:
        candidates.insert(0, str(host.path(cached)) if host.root != Path("/") else cached)
    existing = [c for c in candidates if os.path.exists(c)]
    found = _library_dirs_version(library, existing)
    if found:
        return found
    for folder in MULTIARCH_DIRS:
        for path in sorted(host.path(folder).glob(library + ".so.[0-9]*")):
            found = _library_dirs_version(library, [str(path)])
            if found:
                return found
    return None


def rule_driver(host: Host) -> List[Finding]:
    findings: List[Finding] = []
    loaded, loaded_from = loaded_driver_version(host)
    libcuda = user_space_driver(host, "libcuda")
    nvml = user_space_driver(host, "libnvidia-ml")
    no_gpu = bool(host.expect.get("no_gpu"))
    driver = host.expect.get("driver") or {}
    minimum = str(host.expect.get("minimum_driver") or driver.get("minimum") or "")
    cuda = (host.expect.get("cuda") or {}).get("version", "")
    probe = gpu_probe_record(host)
    probe_lines = [probe_line(host)] if probe.get("state") != "skipped" else []
    probe_nvml = probe_document(host).get("nvml") or {}
    # nvmlInit_v2 answers NVML_ERROR_LIB_RM_VERSION_MISMATCH (18), "Driver/library version mismatch", when the
    # loaded module and the user-space driver differ: the same fault nvidia-smi reports.
    nvml_refused = (
        str(probe_nvml.get("reason") or "")
        if not probe_nvml.get("available") and re.search(r"mismatch|\(18\)", str(probe_nvml.get("reason") or ""))
        else ""
    )
    if loaded is None and not no_gpu:
        findings.append(
            Finding(
                "driver-not-loaded",
                "error",
                "The NVIDIA kernel module is not loaded, so no program can reach the GPUs",
                [
                    f"{host.sys / 'module/nvidia/version'} and {host.proc / 'driver/nvidia/version'} are missing",
                    f"user-space driver library: {libcuda[1] if libcuda else 'libcuda.so.1 not found'}",
                    *probe_lines,
                ],
                "Load it: `sudo modprobe nvidia` (its error names the cause: nouveau, Secure Boot, no module for this "
                "kernel); after a driver install or upgrade, reboot (nvidia_driver_reboot: true lets "
                "`./toolkit provision` do it). On a host without GPUs on purpose set stack_no_gpu: true.",
            )
        )
    if libcuda is None:
        findings.append(
            Finding(
                "driver-user-space-missing",
                "error",
                "The NVIDIA driver's user-space library libcuda.so.1 is not installed",
                [f"not in the linker cache nor in {', '.join(MULTIARCH_DIRS[:2])}"],
                "Install the driver: `./toolkit provision` (role nvidia_driver; stack_driver_method "
                f"{driver.get('method') or 'distro'}, packages "
                f"{', '.join(driver.get('packages') or []) or 'libnvidia-compute-<branch>'}).",
            )
        )
    version, source = (loaded, loaded_from) if loaded else (libcuda if libcuda else (None, ""))
    if version and minimum and version_key(version) < version_key(minimum):
        findings.append(
            Finding(
                "driver-too-old",
                "error",
                f"Driver {version} is older than {minimum}, the minimum CUDA {cuda or '(stack)'} needs",
                [f"{source}: {version}", f"catalog: cuda {cuda} minimum_driver {minimum}"],
                f"Install a newer branch: set stack_driver_branch to one whose version is >= {minimum} "
                "(catalog/stacks.yml "
                f"`driver`; the stack's is {driver.get('branch') or '?'}) and run `./toolkit provision`, then reboot.",
            )
        )
    files_differ = bool(loaded and nvml and nvml[0] != loaded)
    if files_differ or (nvml_refused and not no_gpu):
        evidence = [f"{loaded_from}: {loaded}"] if loaded else []
        evidence += [f"{nvml[1]}: {nvml[0]}"] if nvml else []
        evidence += [f"NVML (gpu_probe.py): {nvml_refused}"] if nvml_refused else []
        findings.append(
            Finding(
                "nvml-mismatch",
                "error",
                f"NVML driver/library version mismatch: the loaded module is {loaded}, the user-space library "
                + (nvml[0] if nvml else "?")
                if files_differ
                else f"NVML driver/library version mismatch: {nvml_refused}",
                evidence,
                "The driver packages were upgraded but the old module is still loaded (nvidia-smi says 'Failed to "
                "initialize NVML: Driver/library version mismatch'): reboot, or stop every GPU process and "
                "`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`. nvidia_driver_hold: "
                "true keeps unattended upgrades from doing this again.",
            )
        )
    return findings


def rule_persistence(host: Host) -> List[Finding]:
    """Persistence mode off on a GPU host, from `nvidia-smi -q` and NVML (the GPU probe's nvmlDeviceGetPersistenceMode:
    either answers when the other cannot; both are shown when both answer; or, when neither can, from how the
    running nvidia-persistenced was started), with how systemd would start the daemon as the cause."""
    if host.expect.get("no_gpu"):
        return []
    text, asked = nvidia_smi_query(host)
    gpus = gpu_persistence(text or "")
    off = [g for g in gpus if g["persistence"].lower() == "disabled"]
    nvml = [d for d in probe_nvml_devices(host) if d.get("persistence_mode") in ("on", "off")]
    nvml_off = [d for d in nvml if d["persistence_mode"] == "off"]
    daemons = persistenced_processes(host)
    daemons_off = [(pid, argv) for pid, argv in daemons if not persistence_mode_in(argv[1:])]
    if gpus or nvml:
        if not off and not nvml_off:
            return []
    elif not daemons_off:
        return []
    evidence: List[str] = []
    if gpus or nvml:
        evidence += [
            f"{asked}: GPU {gpu['bus_id']} ({gpu['product'] or '?'}): Persistence Mode : {gpu['persistence']}"
            for gpu in off[:8]
        ]
        if len(off) > 8:
            evidence.append(f"... and {len(off) - 8} more GPU(s) with Persistence Mode : Disabled")
        evidence += [
            "NVML (gpu_probe.py) nvmlDeviceGetPersistenceMode: GPU {} {}({}): off".format(
                d.get("index"), f"{d['pci_bus_id']} " if d.get("pci_bus_id") else "", d.get("name") or "?"
            )
            for d in nvml_off[:8]
        ]
        if len(nvml_off) > 8:
            evidence.append(f"... and {len(nvml_off) - 8} more GPU(s) NVML reports with persistence mode off")
        if not gpus:
            evidence.append(f"nvidia-smi gave no GPUs: {asked}")
        count, total = (len(off), len(gpus)) if gpus else (len(nvml_off), len(nvml))
        title = (
            f"Persistence mode is off on {count} of {total} GPU(s): every CUDA program waits for the driver "
            "to initialize them, and they are torn down again when the last one exits"
        )
    else:
        evidence.append(f"GPUs not asked: {asked}")
        title = "nvidia-persistenced runs with --no-persistence-mode: persistence mode is off"
    evidence += [f"{host.proc}/{pid}/cmdline: {' '.join(argv)}" for pid, argv in daemons]
    if not daemons:
        evidence.append(f"no nvidia-persistenced process runs ({host.proc}/<pid>/cmdline)")
    unit = host_unit(host, PERSISTENCED_UNIT)
    exec_start = unit.values("Service", "ExecStart")
    stop_when_unneeded = unit.value("Unit", "StopWhenUnneeded")
    if unit.path is None:
        evidence.append(f"no {unit.name} in {', '.join(SYSTEMD_UNIT_DIRS)}")
        cause = (
            f"There is no {unit.name}: the driver packages (nvidia-compute-utils-<branch>) install it, and for "
            "the runfile method the nvidia_driver role does."
        )
    else:
        evidence.append(
            f"{unit.name} as systemd merges {' + '.join(unit.sources)}: "
            f"ExecStart={exec_start[-1] if exec_start else '(none)'}; "
            f"StopWhenUnneeded={stop_when_unneeded if stop_when_unneeded is not None else 'false (default)'}"
        )
        unit_on = bool(exec_start) and persistence_mode_in(exec_argv(exec_start[-1])[1:])
        if not unit_on or unit_bool(stop_when_unneeded):
            cause = (
                "The unit starts the daemon with persistence mode off (and StopWhenUnneeded=true stops it again): "
                f"that is Ubuntu's packaged unit without the nvidia_driver role's drop-in {PERSISTENCED_DROPIN}."
            )
        else:
            cause = (
                "The unit would turn persistence mode on, but the daemon runs an older command line or does not "
                "run: `sudo systemctl daemon-reload && sudo systemctl enable nvidia-persistenced && "
                "sudo systemctl restart nvidia-persistenced`."
            )
    return [
        Finding(
            "persistence-mode-off",
            "warning",
            title,
            evidence,
            cause + " Keep nvidia_driver_persistence_mode: true (the default) and run `./toolkit provision`: the "
            f"nvidia_driver role writes {PERSISTENCED_DROPIN} ([Service] ExecStart= then ExecStart=/usr/bin/"
            "nvidia-persistenced --user nvidia-persistenced --persistence-mode --verbose; [Unit] "
            "StopWhenUnneeded=false; the runfile method's own unit runs the same command line), then enables "
            "and restarts nvidia-persistenced. Right now, until the next reboot: `sudo nvidia-smi -pm 1`.",
        )
    ]


PROBE_FIX_RERUN = (
    "`python3 -m msgpu_verify gpu-probe --pretty` (or `python3 gpu_probe.py --pretty`) shows the probe's answer."
)


def rule_gpu_probe(host: Host) -> List[Finding]:
    """What the GPU probe (libcuda and NVML without any framework) says is wrong with the driver or the GPUs. On a
    host without GPUs on purpose (stack_no_gpu) its answer is recorded in the document, never a finding."""
    record = gpu_probe_record(host)
    if host.expect.get("no_gpu"):
        return []
    state = record.get("state")
    if state in ("timeout", "crashed"):
        return [
            Finding(
                "gpu-probe-no-answer",
                "error" if state == "timeout" else "warning",
                "The GPU probe (libcuda through ctypes, no MindSpore) gave no answer: "
                + ("the driver hangs" if state == "timeout" else "it crashed"),
                [probe_line(host)]
                + ([f"it printed: {record['output_tail'][-300:]}"] if record.get("output_tail") else []),
                "A driver that hangs in cuInit or crashes the process is stuck or broken: look for Xid errors "
                "(`sudo dmesg | grep -i -e xid -e nvrm`), check `nvidia-smi`, stop GPU processes and reload the "
                "module (`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`) or reboot. "
                + PROBE_FIX_RERUN,
            )
        ]
    document = probe_document(host)
    if not document:
        return []
    verdict = document.get("verdict")
    findings: List[Finding] = []
    nvml = document.get("nvml") if isinstance(document.get("nvml"), dict) else {}
    nvml_line = (
        f"NVML: driver {nvml.get('driver_version')}"
        if nvml.get("available")
        else f"NVML: {nvml.get('reason') or 'not asked'}"
    )
    if verdict == "NO_DRIVER" and user_space_driver(host, "libcuda") is not None:
        findings.append(
            Finding(
                "cuda-driver-unloadable",
                "error",
                "libcuda.so.1 is installed, but it cannot be loaded",
                [probe_line(host)],
                "The driver's user-space libraries are broken or from another architecture: reinstall the driver "
                "(`./toolkit provision`, role nvidia_driver), and check `ldd $(ldconfig -p | awk '/libcuda.so.1 /"
                "{print $NF; exit}')` for what it lacks. " + PROBE_FIX_RERUN,
            )
        )
    elif verdict == "NO_DEVICE" and loaded_driver_version(host)[0] is not None:
        findings.append(
            Finding(
                "cuda-no-device",
                "error",
                "The NVIDIA module is loaded, but the CUDA driver sees no GPU",
                [probe_line(host), *_init_lines(document), nvml_line, _visible_line(host)],
                "Check that /dev/nvidia0.. exist and are readable (`ls -l /dev/nvidia*`; "
                "`sudo nvidia-modprobe -u -c=0` creates them), that CUDA_VISIBLE_DEVICES does not hide the GPUs, "
                "and the kernel log for GPUs that fell off the bus (`sudo dmesg | grep -i xid`, Xid 79: reseat or "
                "power-cycle). " + PROBE_FIX_RERUN,
            )
        )
    elif verdict == "DRIVER_ERROR":
        findings.append(_driver_error(host, document, nvml_line))
    elif verdict == "KERNEL_FAILED":
        devices = [d for d in document.get("devices") or [] if isinstance(d, dict)]
        failed = [d for d in devices if not (d.get("kernel") or {}).get("ok")]
        # The probe's kernel is PTX for compute_50 (compute.PROBE_PTX): on an older GPU it cannot run at all, which
        # says nothing about the driver or the GPU.
        below = [d for d in failed if _below_probe(d)]
        failed = [d for d in failed if d not in below]
        if below:
            findings.append(_below_probe_finding(below, len(devices), nvml_line))
        lines = []
        for device in failed:
            kernel = device.get("kernel") or {}
            error = str(kernel.get("error") or "")
            code = _error_code(error)
            meaning = CUDA_MEANINGS.get(code) if code is not None else None
            lines.append(
                "GPU {} ({}, compute capability {}): {} failed: {}{}".format(
                    device.get("index"),
                    device.get("name") or "?",
                    device.get("compute_capability") or "?",
                    kernel.get("step"),
                    error,
                    f" - {meaning}" if meaning else "",
                )
            )
        if failed:
            findings.append(
                Finding(
                    "gpu-kernel-failed",
                    "error",
                    f"A tiny CUDA kernel fails on {len(failed)} of {len(devices)} GPU(s) without any framework: the "
                    "driver or the GPU is at fault, not MindSpore",
                    [*lines, nvml_line],
                    "Look for Xid errors (`sudo dmesg | grep -i -e xid -e nvrm`) and ECC errors (`nvidia-smi -q -d "
                    "ECC`), check the GPU's power and cooling, reset it (`sudo nvidia-smi -r -i <index>`, no process "
                    "may use it) or reboot; a GPU that keeps failing needs service. " + PROBE_FIX_RERUN,
                )
            )
    findings += _driver_version_findings(host, nvml)
    findings += _ecc_findings(nvml)
    return findings


def _probe_cc(device: Dict[str, Any]) -> Tuple[Optional[Tuple[int, int]], str]:
    """A probe device's compute capability as a tuple (compute.cc_tuple) and as text; (None, "?") unknown."""
    compute, _ = sibling_module("compute")
    cc = compute.cc_tuple(device.get("compute_capability")) if compute is not None else None
    return cc, (f"{cc[0]}.{cc[1]}" if cc else str(device.get("compute_capability") or "?"))


def _below_probe(device: Dict[str, Any]) -> bool:
    """A GPU whose compute capability is below the probe's PTX target (compute.PROBE_PTX, 5.0)."""
    compute, _ = sibling_module("compute")
    cc = _probe_cc(device)[0]
    return bool(compute is not None and cc and cc < compute.cc_tuple(compute.PROBE_PTX))


def _below_probe_finding(below: List[Dict[str, Any]], total: int, nvml_line: str) -> Finding:
    compute, _ = sibling_module("compute")
    ptx = compute.PROBE_PTX if compute is not None else "5.0"
    lines = [
        "GPU {} ({}): {} failed: {}: compute capability {} is below what the probe (PTX {}) can run".format(
            d.get("index"),
            d.get("name") or "?",
            (d.get("kernel") or {}).get("step"),
            (d.get("kernel") or {}).get("error"),
            _probe_cc(d)[1],
            ptx,
        )
        for d in below
    ]
    ccs = sorted({_probe_cc(d)[1] for d in below})
    return Finding(
        "gpu-below-probe",
        "warning",
        f"The GPU probe cannot check {len(below)} of {total} GPU(s): compute capability {', '.join(ccs)} is below what "
        f"the probe (PTX {ptx}) can run",
        [*lines, nvml_line],
        "This blames neither the driver nor the GPU: the probe's test kernel is PTX for compute_"
        f"{ptx.replace('.', '')}, which the driver cannot build for an older GPU, so the probe says nothing about it "
        "(`nvidia-smi` shows whether the driver serves it). Whether the stack's libraries run on it is the "
        "gpu-unsupported finding's answer (the GPU's compute capability against the stack's code); CUDA 12 has no "
        "code for compute capability below 5.0 at all.",
    )


def _init_lines(document: Dict[str, Any]) -> List[str]:
    lines = []
    for step in ("cuInit", "cuDeviceGetCount"):
        result = document.get(f"{step}_result")
        if isinstance(result, dict) and result.get("code"):
            lines.append(f"{step} returned {cuda_code_text(result.get('code'), result.get('name'))}")
    return lines


def _visible_line(host: Host) -> str:
    value = host.environ.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return f"the doctor's CUDA_VISIBLE_DEVICES={value!r}" if value is not None else "CUDA_VISIBLE_DEVICES unset"


def _driver_error(host: Host, document: Dict[str, Any], nvml_line: str) -> Finding:
    lines = _init_lines(document)
    codes = [
        (document.get(f"{step}_result") or {}).get("code")
        for step in ("cuInit", "cuDeviceGetCount")
        if isinstance(document.get(f"{step}_result"), dict)
    ]
    code = next((c for c in codes if c), None)
    evidence = [probe_line(host), *lines, nvml_line]
    loaded, loaded_from = loaded_driver_version(host)
    libcuda = user_space_driver(host, "libcuda")
    if loaded:
        evidence.append(f"{loaded_from}: {loaded}")
    if libcuda:
        evidence.append(f"{libcuda[1]}: {libcuda[0]}")
    modules = loaded_modules(host)
    fix = {
        3: "Reload the driver or reboot; then run the doctor again.",
        35: "The kernel module is older than libcuda: reboot into the installed driver (an upgrade without reboot "
        "leaves the old module loaded), or reinstall the branch's packages with `./toolkit provision`.",
        802: "Start the fabric manager at exactly the driver's version: `sudo systemctl enable --now "
        "nvidia-fabricmanager` (`./toolkit provision` installs it on NVSwitch hosts), then run the doctor again.",
        803: "Reboot so the kernel module matches the installed libcuda (or stop every GPU process and `sudo rmmod "
        "nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`); nvidia_driver_hold: true keeps "
        "unattended upgrades from doing this again.",
        804: "Remove the forward-compatibility libcuda (package cuda-compat-*, or /usr/local/cuda*/compat on "
        "LD_LIBRARY_PATH): this GPU needs the driver's own libcuda.",
        304: "Check /dev/nvidia* (`ls -l /dev/nvidia*`: readable and writable by the user) and, in a container, "
        "that the devices are passed in.",
        999: "Reload nvidia_uvm (`sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm`) or reboot; look for Xid "
        "errors (`sudo dmesg | grep -i xid`).",
    }.get(
        code if isinstance(code, int) else -1,
        "Look for Xid errors (`sudo dmesg | grep -i -e xid -e nvrm`) and "
        "reinstall or reload the driver (`./toolkit provision`, then reboot).",
    )
    if code == 999 and modules is not None and "nvidia_uvm" not in modules:
        evidence.append(f"{host.proc / 'modules'}: nvidia_uvm is not loaded")
        fix = "Load it: `sudo modprobe nvidia_uvm` (CUDA needs it; /dev/nvidia-uvm appears with it). " + fix
    if code:
        step = "cuInit" if (document.get("cuInit_result") or {}).get("code") else "cuDeviceGetCount"
        name = (document.get(f"{step}_result") or {}).get("name")
        title = f"The CUDA driver fails before any framework: {step} returned {name} ({code})"
        meaning = CUDA_MEANINGS.get(code)
        if meaning:
            title += f": {meaning}"
    else:
        title = "The CUDA driver library is not usable: " + str(document.get("reason"))
    return Finding("cuda-init-failed", "error", title, evidence, fix + " " + PROBE_FIX_RERUN)


def _driver_version_findings(host: Host, nvml: Dict[str, Any]) -> List[Finding]:
    """The driver NVML reports (the running one) against the catalog's: the branch, or for the runfile method the
    exact release."""
    running = str(nvml.get("driver_version") or "") if nvml.get("available") else ""
    driver = host.expect.get("driver") or {}
    branch = str(driver.get("branch") or "")
    method = str(driver.get("method") or "")
    version = str(driver.get("version") or "")
    if not running:
        return []
    if method == "runfile" and version and running != version:
        wanted = f"the runfile's {version}"
    elif re.fullmatch(r"\d+", branch) and running.split(".")[0] != branch:
        wanted = f"branch {branch} ({method or 'the stack'}'s {', '.join(driver.get('packages') or []) or 'driver'})"
    else:
        return []
    return [
        Finding(
            "driver-version-unexpected",
            "warning",
            f"The running driver is {running}, the stack installs {wanted}",
            [f"NVML (gpu_probe.py) nvmlSystemGetDriverVersion: {running}", f"catalog: driver {json.dumps(driver)}"],
            "Another driver was installed by hand or by another tool, or the host was not rebooted after "
            "`./toolkit provision` changed the branch: run `./toolkit provision` (it installs stack_driver_branch "
            f"{branch or '?'} and removes other branches' packages) and reboot; or set stack_driver_branch to the "
            "branch you want.",
        )
    ]


def _ecc_findings(nvml: Dict[str, Any]) -> List[Finding]:
    """ECC off on GPUs that have it (NVML; GeForce cards answer "not supported" and are left alone)."""
    devices = [d for d in nvml.get("devices") or [] if isinstance(d, dict)] if nvml.get("available") else []
    off = [d for d in devices if d.get("ecc") == "off"]
    if not off:
        return []
    return [
        Finding(
            "ecc-off",
            "info",
            f"ECC is off on {len(off)} of {len(devices)} GPU(s) that support it: memory errors go unnoticed",
            [
                "NVML (gpu_probe.py) nvmlDeviceGetEccMode: GPU {} {}({}): off".format(
                    d.get("index"), f"{d['pci_bus_id']} " if d.get("pci_bus_id") else "", d.get("name") or "?"
                )
                for d in off
            ],
            "If the GPUs should correct memory errors (data-centre GPUs ship with ECC on): `sudo nvidia-smi -e 1` "
            "and reboot. ECC off gives a little more memory and bandwidth; leave it if that was chosen.",
        )
    ]


def rule_compute(host: Host) -> List[Finding]:
    """The stack's GPU code (expect ``gpu_code``: stack_resolved.gpu_code, each component's measured SASS/PTX and
    documented compute-capability range) against the compute capability the GPU probe read for each GPU, by
    compute.py's rule (judge.check_gpu_code): a GPU the stack cannot run on is an error, a GPU it runs on only through
    the driver's PTX JIT or outside a library's support matrix a warning. Nothing without gpu_code, on a host without
    GPUs on purpose, or without the probe's compute capabilities."""
    components = host.expect.get("gpu_code")
    if not components or host.expect.get("no_gpu") or not probe_document(host):
        return []
    judge, _ = sibling_module("judge")
    compute, _ = sibling_module("compute")
    if judge is None or compute is None:
        return []
    stack = str(host.expect.get("stack") or "")
    name = str(host.expect.get("host") or socket.gethostname())
    result = judge.check_gpu_code(components, gpu_probe_record(host), name, stack)
    if result.get("state") != "checked":
        return []
    supports = f"the stack's libraries support: {result['supports']}"
    read = "compute capability from the GPU probe (gpu_probe.py: cuDeviceGetAttribute): " + "; ".join(
        "{} at {}: {}".format(g["id"], ", ".join(s for s in g["slots"] if s) or "?", compute.cc_text(g["cc"]))
        for g in result["gpus"]
    )
    findings: List[Finding] = []
    if result["errors"]:
        bad = [g for g in result["gpus"] if any(outcome == compute.NONE for outcome, _ in g["problems"])]
        findings.append(
            Finding(
                "gpu-unsupported",
                "error",
                f"Stack {stack or '?'} cannot run on {sum(len(g['slots']) for g in bad)} GPU(s) of this host: "
                + ", ".join(f"{g['id']} (compute capability {compute.cc_text(g['cc'])})" for g in bad),
                [*result["errors"], read, supports],
                "stack_name: auto picks a catalog stack that runs here (the preflight, playbooks/preflight.yml, "
                "changes nothing and says which and why), or set stack_name to a stack whose MindSpore, CUDA, cuDNN "
                "and TensorRT support this GPU (catalog/stacks.yml, `gpu:` of each version); then "
                "`./toolkit provision`.",
            )
        )
    # compute.check writes one warning per JIT / outside-the-matrix problem, GPU by GPU in its problems' order.
    warnings = iter(result["warnings"])
    kinds: Dict[str, List[str]] = {compute.JIT: [], compute.OUTSIDE: [], compute.SINGLE: [], compute.UNKNOWN: []}
    for entry in result["gpus"]:
        for outcome, why in entry["problems"]:
            if outcome in kinds:
                kinds[outcome].append(next(warnings, why))
    if kinds[compute.JIT]:
        findings.append(
            Finding(
                "gpu-jit-only",
                "warning",
                f"Stack {stack or '?'} runs on some of this host's GPUs only through the driver's PTX JIT: each "
                "user's first start compiles for minutes",
                [*kinds[compute.JIT], read, supports],
                "Nothing is broken: the driver compiles the PTX once per user and keeps it in the kernel cache "
                "(~/.nv/ComputeCache; CUDA_CACHE_MAXSIZE of at least 2 GiB, the env file sets it), and the verify "
                "role's warm-up pays it before anything is timed. stack_name: auto picks a catalog stack with native "
                "code for this GPU where there is one.",
            )
        )
    if kinds[compute.OUTSIDE]:
        findings.append(
            Finding(
                "gpu-outside-matrix",
                "warning",
                f"Stack {stack or '?'} runs on some of this host's GPUs outside its libraries' support matrix "
                "(same-architecture code, untuned, not verified by NVIDIA)",
                [*kinds[compute.OUTSIDE], read, supports],
                "It runs, possibly slower than a stack built for this GPU. stack_name: auto picks a catalog stack "
                "whose libraries list this GPU where there is one.",
            )
        )
    if kinds[compute.SINGLE]:
        findings.append(
            Finding(
                "gpu-single-only",
                "warning",
                f"Stack {stack or '?'} runs on this host's one GPU, but its NCCL has no code for it: multi-GPU and "
                "multi-host (mpirun) training cannot run here",
                [*kinds[compute.SINGLE], read, supports],
                "Single-GPU training runs. For distributed training this GPU needs an NCCL built for its "
                "architecture, which no stack of the catalog has (docs/gpu-evidence.md); a host with several such "
                "GPUs is refused by the preflight.",
            )
        )
    if kinds[compute.UNKNOWN]:
        findings.append(
            Finding(
                "gpu-code-unknown",
                "warning",
                f"Stack {stack or '?'} has components whose GPU code the catalog does not record: not checked "
                "against this host's GPUs",
                [*kinds[compute.UNKNOWN], read, supports],
                "Nothing to do on the host; the judge (`./toolkit verify`) shows whether MindSpore computes on the "
                "GPU. The catalog's `gpu:` of that component's version (catalog/stacks.yml) or its measured code "
                "(catalog/gpu_code.yml) would let this check judge it.",
            )
        )
    return findings


PROVIDERS: Sequence[Tuple[str, str, str]] = (
    # (soname prefix, what provides it, the variable that picks how)
    ("libcuda.so", "the NVIDIA driver (role nvidia_driver, package libnvidia-compute-<branch>)", "stack_driver_method"),
    ("libnvidia-", "the NVIDIA driver (role nvidia_driver)", "stack_driver_method"),
    ("libcudnn", "cuDNN (role cuda_library)", "stack_cudnn_method"),
    ("libnccl", "NCCL (role cuda_library)", "stack_nccl_method"),
    ("libnvinfer", "TensorRT (role cuda_library)", "stack_tensorrt_method"),
    ("libmpi", "OpenMPI (role openmpi, Ubuntu package libopenmpi3)", "stack_openmpi_version"),
    ("lib", "the CUDA toolkit (role cuda) in its lib64", "stack_cuda_method"),
)


def provider(host: Host, library: str) -> Tuple[str, str]:
    for prefix, who, variable in PROVIDERS:
        if library.startswith(prefix):
            component = variable.replace("stack_", "").replace("_method", "").replace("_version", "")
            method = (host.expect.get(component) or {}).get("method") if component != "openmpi" else None
            return who, f"{variable}={method}" if method else variable
    return "the stack", "stack_name"


def mindspore_extension(host: Host, env: Dict[str, str]) -> Optional[Path]:
    venv = env.get("VIRTUAL_ENV") or (host.expect.get("mindspore") or {}).get("venv") or ""
    if not venv:
        return None
    matches = sorted(glob.glob(str(host.path(venv)) + "/lib/python*/site-packages/mindspore/_c_expression*.so"))
    return Path(matches[0]) if matches else None


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


def _rpath_dirs(host: Host, extension: Optional[Path]) -> Tuple[List[str], List[str]]:
    if extension is None:
        return [], []
    dynamic = elf_dynamic(extension)
    origin = host.shown(extension.parent)
    expand: Callable[[str], List[str]] = lambda value: [  # noqa: E731
        d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in value.split(":") if d
    ]
    # DT_RUNPATH (when present) makes the loader ignore DT_RPATH and come after LD_LIBRARY_PATH.
    if dynamic.get("runpath"):
        return [], [d for v in dynamic["runpath"] for d in expand(v)]
    return [d for v in dynamic.get("rpath", []) for d in expand(v)], []


def rule_libraries(host: Host, env: Dict[str, str]) -> List[Finding]:
    ms = host.expect.get("mindspore") or {}
    required = list(ms.get("libraries_required") or [])
    optional = list(ms.get("libraries_optional") or [])
    if not required and not optional:
        return []
    extension = mindspore_extension(host, env)
    rpath, runpath = _rpath_dirs(host, extension)
    ld_path = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d] + runpath
    findings: List[Finding] = []
    found_table: List[str] = []
    # Besides the catalog's list, every library the extension itself links (DT_NEEDED): the import
    # fails on any of them (libcurand.so.10, libcufft.so.10, ...). Only missing ones are reported.
    linked = [n for n in (elf_dynamic(extension).get("needed", []) if extension else []) if n not in required]
    checks = [(lib, "error", True) for lib in required] + [(lib, "warning", True) for lib in optional]
    checks += [(lib, "error", False) for lib in linked if lib not in optional]
    for library, severity, listed in checks:
        hits = library_search(host, library, rpath, ld_path)
        who, variable = provider(host, library)
        if hits:
            if listed:
                how, path = hits[0]
                found_table.append(f"{library} -> {os.path.realpath(str(host.path(path)))} ({how})")
            continue
        need = "MindSpore cannot import without it" if severity == "error" else "some features need it"
        if not listed:
            need += "; MindSpore's extension links it (DT_NEEDED)"
        findings.append(
            Finding(
                f"library-missing:{library}",
                severity,
                f"{library} is not found by the dynamic linker ({need})",
                [
                    "searched RPATH of "
                    f"{host.shown(extension) if extension else 'the MindSpore extension (not found)'}: "
                    f"{':'.join(rpath) or '-'}",
                    f"LD_LIBRARY_PATH of {host.env_file or 'the environment'}: {':'.join(ld_path) or '-'}",
                    "ld.so.cache and " + ", ".join(MULTIARCH_DIRS[:2]),
                ],
                f"It comes from {who}; {variable} chooses how it is installed. Run `./toolkit provision` "
                f"(or the role's playbook) to reinstall it, and source {host.env_file or 'the stack env file'}; "
                f"`ldconfig -p | grep {library.split('.so')[0]}` shows copies elsewhere.",
            )
        )
    if found_table:
        where = host.shown(extension) if extension else "the MindSpore extension (not found)"
        found_table.insert(0, f"search order: DT_RPATH of {where}: {':'.join(rpath) or '-'}; then LD_LIBRARY_PATH")
        findings.append(
            Finding(
                "libraries-found",
                "info",
                f"{len(found_table) - 1} of the wheel's {len(required) + len(optional)} catalog libraries resolve "
                f"(and {len([lib for lib in linked if lib not in optional])} more the extension links were checked)",
                found_table,
                "Nothing to do.",
            )
        )
    findings.extend(rule_rpath_shadow(host, extension, rpath, ld_path, required + optional))
    return findings


def rule_rpath_shadow(
    host: Host, extension: Optional[Path], rpath: List[str], ld_path: List[str], libraries: List[str]
) -> List[Finding]:
    shadowed: List[str] = []
    for library in libraries:
        from_rpath = [p for how, p in library_search(host, library, rpath, []) if how == "RPATH"]
        from_env = [p for how, p in library_search(host, library, [], ld_path) if how == "LD_LIBRARY_PATH"]
        if from_rpath and from_env:
            wins = os.path.realpath(str(host.path(from_rpath[0])))
            wanted = os.path.realpath(str(host.path(from_env[0])))
            if wins != wanted:
                shadowed.append(f"{library}: RPATH gives {wins}, LD_LIBRARY_PATH wanted {wanted}")
    if not shadowed:
        return []
    return [
        Finding(
            "rpath-shadows-ld-library-path",
            "error",
            "MindSpore's RPATH loads other CUDA libraries than LD_LIBRARY_PATH names",
            [
                f"{host.shown(extension) if extension else '?'} DT_RPATH: {':'.join(rpath)} "
                "(searched before LD_LIBRARY_PATH)",
                *shadowed,
            ],
            "The wheel's RPATH prefers /usr/local/cuda*/lib64, so what that folder holds wins over the env file. "
            "Point it at the stack's toolkit (`sudo ln -sfn <stack_install_prefix>/cuda-"
            f"{(host.expect.get('cuda') or {}).get('version', '<ver>')} /usr/local/cuda`, which the cuda role "
            "manages) or remove the other copies from that folder; then run the doctor again.",
        )
    ]


def nccl_version(path: Path) -> Optional[str]:
    """NCCL's release of a libnccl file: from its real file name (libnccl.so.2.14.3, as NVIDIA's tarballs, debs and
    the cuda_library role's wheel method name it), else from the "NCCL version 2.7.6+cuda11.1" string NCCL prints at
    init, which every build carries (the copies bundled in MindSpore's wheels are named libnccl.so.2 only)."""
    match = re.match(r"libnccl\.so\.(\d+\.\d+\.\d+)$", os.path.basename(os.path.realpath(str(path))))
    if match:
        return match.group(1)
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(b"NCCL version ")
            found = re.match(rb"NCCL version (\d+\.\d+\.\d+)", data[at : at + 40]) if at >= 0 else None
    except (OSError, ValueError):
        return None
    return found.group(1).decode() if found else None


def nccl_users(package: Path) -> List[Path]:
    """The libraries of the MindSpore package that link NCCL (DT_NEEDED libnccl.so.2): lib/libgpu_collective.so
    (1.5, 1.10), lib/libnvidia_collective.so (1.10), lib/plugin/gpu<CUDA>/libnvidia_collective.so (2.x)."""
    users: List[Path] = []
    for folder, dirs, files in os.walk(str(package)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.startswith("libnccl") or not re.search(r"\.so(\.|$)", name):
                continue
            path = Path(folder) / name
            if not path.is_symlink() and NCCL_SONAME in elf_dynamic(path).get("needed", []):
                users.append(path)
    return users


def _plugin_cuda(path: Path) -> Optional[Tuple[int, ...]]:
    match = re.fullmatch(r"gpu(\d+(?:\.\d+)*)", path.parent.name)
    return version_key(match.group(1)) if match else None


def _nccl_user_for_stack(users: List[Path], cuda: str) -> List[Path]:
    """Of the NCCL users, those MindSpore would load with the stack's CUDA: the 2.x wheel has one plugin folder per
    CUDA it was built for (lib/plugin/gpu10.1, gpu11.1, gpu11.6) and loads the one for the installed CUDA, else the
    newest older one; the users outside such folders always count."""
    plain = [u for u in users if _plugin_cuda(u) is None]
    plugins = [u for u in users if _plugin_cuda(u) is not None]
    want = version_key(cuda)[:2] if cuda else ()
    if plugins and want:
        older = [u for u in plugins if (_plugin_cuda(u) or ())[:2] <= want]
        if older:
            best = max((_plugin_cuda(u) or ())[:2] for u in older)
            plugins = [u for u in older if (_plugin_cuda(u) or ())[:2] == best]
    return plain + plugins


def nccl_search(host: Host, user: Path, extension: Optional[Path], ld_library_path: List[str]) -> List[Tuple[str, str]]:
    """Where the dynamic linker looks for libnccl.so.2 when ``user`` (a library that DT_NEEDs it) is loaded, in its
    order: [(how, path)] of the files that exist. ld.so(8): the user's DT_RPATH (unless it has a DT_RUNPATH), then
    the DT_RPATH of the objects up the chain that loads it (glibc walks each loader's DT_RPATH; MindSpore's extension
    heads that chain for the wheel's libraries, directly or through the libraries it links), then
    LD_LIBRARY_PATH, the user's DT_RUNPATH, ld.so.cache and the default folders. A libnccl.so.2 already loaded into
    the process (LD_PRELOAD) would be used before all of them."""
    dynamic = elf_dynamic(user)
    origin = host.shown(user.parent)

    def expand(values: List[str], where: str) -> List[str]:
        return [d.replace("$ORIGIN", where).replace("${ORIGIN}", where) for v in values for d in v.split(":") if d]

    runpath = expand(dynamic.get("runpath", []), origin)
    steps: List[Tuple[str, List[str]]] = []
    if not runpath:
        steps.append((f"DT_RPATH of {host.shown(user)}", expand(dynamic.get("rpath", []), origin)))
        if extension is not None and extension != user:
            loader = elf_dynamic(extension)
            if not loader.get("runpath"):
                steps.append(
                    (
                        f"DT_RPATH of {host.shown(extension)} (in the chain that loads {user.name})",
                        expand(loader.get("rpath", []), host.shown(extension.parent)),
                    )
                )
    steps.append(("LD_LIBRARY_PATH", ld_library_path))
    steps.append((f"DT_RUNPATH of {host.shown(user)}", runpath))
    hits: List[Tuple[str, str]] = []
    for how, dirs in steps:
        for folder in dirs:
            if folder and (host.path(folder) / NCCL_SONAME).exists():
                hits.append((how, os.path.normpath(folder) + "/" + NCCL_SONAME))
    cached = ld_cache(host).get(NCCL_SONAME)
    if cached:
        hits.append(("ld.so.cache", cached))
    for folder in MULTIARCH_DIRS:
        if (host.path(folder) / NCCL_SONAME).exists():
            hits.append(("default path", folder + "/" + NCCL_SONAME))
    return hits


def nccl_release(code: str) -> str:
    """NCCL_VERSION_CODE as a release: 21403 -> 2.14.3 (major*10000 + minor*100 + patch since 2.9), 2804 -> 2.8.4
    (major*1000 + minor*100 + patch before); '' for anything else."""
    if not code.isdigit():
        return ""
    value = int(code)
    if value >= 10000:
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100}"
    return f"{value // 1000}.{value % 1000 // 100}.{value % 100}" if value >= 1000 else ""


def rule_nccl(host: Host, env: Dict[str, str]) -> List[Finding]:
    """Which libnccl.so.2 MindSpore's NCCL user would load, and whether a copy the wheel bundles (1.10:
    mindspore/lib/libnccl.so.2, 2.x: mindspore/lib/plugin/gpu<CUDA>/libnccl.so.2, found first through the
    collective library's RPATH $ORIGIN) shadows the NCCL the stack installed (the cuda_library role: <prefix>/lib64 on
    the env file's LD_LIBRARY_PATH, or NVIDIA's debs in the linker cache). Info when they agree, a warning when the
    versions differ."""
    extension = mindspore_extension(host, env)
    if extension is None:
        return []
    package = extension.parent
    users = nccl_users(package)
    if not users:
        return []
    cuda = str((host.expect.get("cuda") or {}).get("version") or "")
    chosen = _nccl_user_for_stack(users, cuda)
    ld_path = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    user = chosen[0]
    hits = nccl_search(host, user, extension, ld_path)
    # The stack's NCCL: what the linker finds without any of the wheel's RPATHs; else the venv's nvidia-nccl wheel.
    stack_hits = [(how, path) for how, path in library_search(host, NCCL_SONAME, [], ld_path) if how != "RPATH"]
    venv = env.get("VIRTUAL_ENV") or (host.expect.get("mindspore") or {}).get("venv") or ""
    for wheel in sorted(glob.glob(str(host.path(venv)) + "/lib/python*/site-packages/nvidia/nccl/lib/" + NCCL_SONAME)):
        stack_hits.append(("the venv's nvidia-nccl wheel (on no search path)", host.shown(Path(wheel))))
    expected = str((host.expect.get("nccl") or {}).get("version") or "")
    catalog_release = expected
    # The release a site says its NCCL reports (nccl_expected_version, NCCL_VERSION_CODE, as the cuda_library role
    # checks it): where it is set, it is the version to compare with (the test bed's NCCL fixture is 2.14.3).
    site_code = str((host.expect.get("nccl") or {}).get("expected_version") or "")
    if nccl_release(site_code):
        expected = nccl_release(site_code)

    def real(path: str) -> str:
        return os.path.realpath(str(host.path(path)))

    def described(how: str, path: str) -> str:
        version = nccl_version(host.path(path))
        shown_real = host.shown(Path(real(path)))
        target = f" -> {shown_real}" if shown_real != path else ""
        return f"{path}{target} (NCCL {version or 'version unknown'}; {how})"

    evidence = [f"{host.shown(user)} links {NCCL_SONAME} (DT_NEEDED)"]
    evidence += [f"{host.shown(u)} links it too, beside it (the same search)" for u in chosen[1:]]
    others = [u for u in users if u not in chosen]
    if others:
        evidence.append(
            f"not loaded with the stack's CUDA {cuda}: "
            + ", ".join(host.shown(u) for u in others)
            + " (the wheel loads the GPU plugin folder for the installed CUDA)"
        )
    if not hits:
        return []  # nothing to load: rule_libraries' library-missing:libnccl.so.2 says it
    how, path = hits[0]
    loaded_version = nccl_version(host.path(path))
    bundled = real(path).startswith(os.path.realpath(str(package)) + os.sep)
    evidence.append("loads first: " + described(how, path))
    later: List[Tuple[str, str]] = []
    for h, p in hits[1:]:
        if real(p) != real(path) and all(real(p) != real(q) for _, q in later):
            later.append((h, p))
    evidence += ["then: " + described(h, p) for h, p in later[:3]]
    via = "its DT_RPATH" if how == f"DT_RPATH of {host.shown(user)}" else how
    stack_path = next((p for _, p in stack_hits), None)
    stack_version = nccl_version(host.path(stack_path)) if stack_path else None
    if stack_path and real(stack_path) != real(path):
        evidence.append("the stack's NCCL: " + described(stack_hits[0][0], stack_path))
    elif not stack_path:
        evidence.append(
            f"the stack's NCCL{' ' + expected if expected else ''}: no {NCCL_SONAME} on LD_LIBRARY_PATH, in "
            "ld.so.cache or the default folders"
        )
    if catalog_release:
        method = (host.expect.get("nccl") or {}).get("method") or "?"
        site = f"; nccl_expected_version {site_code}: release {expected}" if expected != catalog_release else ""
        evidence.append(f"catalog: nccl {catalog_release} ({method}){site}")
    shadows = stack_path is not None and real(stack_path) != real(path)
    versions = {v for v in (loaded_version, stack_version or (expected if not stack_path else None)) if v}
    differ = len(versions) > 1 or bool(loaded_version and expected and loaded_version != expected)
    severity = "warning" if differ else "info"
    which = "the NCCL its wheel bundles" if bundled else "another NCCL"
    if shadows:
        return [
            Finding(
                "nccl-shadowed",
                severity,
                f"MindSpore loads {which} ({loaded_version or 'version unknown'}), not the stack's "
                f"({stack_version or 'version unknown'}): {user.name} finds it first through {via}",
                evidence,
                (
                    "The wheel's collective library looks beside itself ($ORIGIN) before LD_LIBRARY_PATH"
                    if bundled
                    else f"{how} comes before the stack's LD_LIBRARY_PATH"
                )
                + ", so the stack's NCCL is not what distributed training uses. To use the stack's: preload it, "
                f"`export LD_PRELOAD={stack_path}` (or `mpirun -x LD_PRELOAD=...`): a library already loaded as "
                f"{NCCL_SONAME} is used before any search. Or leave it: every host runs the same wheel, so every rank "
                "loads the same NCCL, and the stack's serves other programs only. Ranks that mix NCCL releases "
                "(one host preloading, another not) can hang or fail in their first collective.",
            )
        ]
    if bundled:
        note = "the wheel's own copy; the stack's NCCL is not where the linker looks"
    else:
        note = "the stack's NCCL" + (f", release {loaded_version}, not the expected {expected}" if differ else "")
    return [
        Finding(
            "nccl-loaded",
            severity,
            f"MindSpore's {user.name} loads {path} (NCCL {loaded_version or 'version unknown'}): {note}",
            evidence,
            "Nothing to do."
            if not differ
            else "Run `./toolkit provision` (role cuda_library installs stack_nccl_version where the env file's "
            "LD_LIBRARY_PATH looks) and source the env file; `ldconfig -p | grep libnccl` lists other copies.",
        )
    ]


def rule_env(host: Host, env: Optional[Dict[str, str]], stderr: str) -> List[Finding]:
    if not host.env_file:
        return []
    if env is None or not host.path(host.env_file).is_file():
        return [
            Finding(
                "env-file-missing",
                "error",
                f"The stack's env file {host.env_file} is missing or cannot be sourced",
                [f"{host.env_file}: {'missing' if not host.path(host.env_file).is_file() else stderr}"],
                "Run `./toolkit provision` (role mindspore writes it, role cuda the CUDA one it sources).",
            )
        ]
    findings: List[Finding] = []
    cuda = host.expect.get("cuda") or {}
    home_expected = cuda.get("home", "")
    home = env.get("CUDA_HOME", "")
    shown_stderr = [f"it printed: {stderr[:300]}"] if stderr else []
    if not home:
        findings.append(
            Finding(
                "cuda-home-unset",
                "error",
                f"CUDA_HOME is not set in the shell of {host.env_file}",
                [f"`. {host.env_file}; echo $CUDA_HOME` is empty", *shown_stderr],
                f"The env file sources {cuda.get('env_file') or '/etc/msgpu/env/cuda-<ver>.sh'}, which exports "
                f"CUDA_HOME={home_expected or '<prefix>/cuda-<ver>'}; run `./toolkit provision` "
                "(role cuda rewrites it).",
            )
        )
    elif home_expected and os.path.normpath(home) != os.path.normpath(home_expected):
        findings.append(
            Finding(
                "cuda-home-wrong",
                "error",
                f"CUDA_HOME is {home}, not the stack's toolkit {home_expected}",
                [f"`. {host.env_file}; echo $CUDA_HOME` = {home}"],
                f"Source only {host.env_file} (it switches toolkits), or fix mindspore_cuda_prefix; "
                "`./toolkit provision` rewrites the env files.",
            )
        )
    path_dirs = [d for d in env.get("PATH", "").split(":") if d]
    nvcc = next((d for d in path_dirs if (host.path(d) / "nvcc").exists()), None)
    if nvcc is None:
        findings.append(
            Finding(
                "cuda-not-on-path",
                "error",
                f"CUDA (nvcc) is not on PATH in the shell of {host.env_file}",
                [
                    f"PATH={env.get('PATH', '')}",
                    f"no nvcc in any of those folders{' (' + home + '/bin)' if home else ''}",
                    *shown_stderr,
                ],
                f"The CUDA env file puts {home_expected or '$CUDA_HOME'}/bin on PATH; run `./toolkit provision` "
                "(role cuda) and source the env file.",
            )
        )
    lib64 = (home_expected or home).rstrip("/") + "/lib64"
    if (home_expected or home) and lib64 not in env.get("LD_LIBRARY_PATH", "").split(":"):
        findings.append(
            Finding(
                "ld-library-path-missing-cuda",
                "warning",
                f"LD_LIBRARY_PATH does not hold {lib64}",
                [f"LD_LIBRARY_PATH={env.get('LD_LIBRARY_PATH', '')}"],
                f"Source {host.env_file}; `./toolkit provision` rewrites it.",
            )
        )
    return findings


def rule_python_packages(host: Host, env: Dict[str, str]) -> List[Finding]:
    ms = host.expect.get("mindspore") or {}
    venv = env.get("VIRTUAL_ENV") or ms.get("venv") or ""
    if not venv:
        return []
    sites = [Path(p) for p in sorted(glob.glob(str(host.path(venv)) + "/lib/python*/site-packages"))]
    if not sites:
        return [
            Finding(
                "venv-missing",
                "error",
                f"The MindSpore virtualenv {venv} has no site-packages",
                [f"{venv}/lib/python*/site-packages: not found"],
                "Run `./toolkit provision` (role mindspore builds the virtualenv).",
            )
        ]
    dists = installed_distributions(sites)
    findings: List[Finding] = []
    for pin in ms.get("pins") or []:
        name, spec = split_requirement(pin)
        for version, where in dists.get(name, []):
            if not satisfies(version, spec):
                findings.append(
                    Finding(
                        f"pin-violated:{name}",
                        "error",
                        f"{name} {version} is installed, but {ms.get('package', 'MindSpore')} "
                        f"{ms.get('version', '')} needs {pin}",
                        [f"{host.shown(Path(where))}: {name} {version}", f"catalog pin: {pin}"],
                        f"Reinstall within the pin: `{venv}/bin/pip install -c {venv}/msgpu-constraints.txt "
                        f"'{pin}'` (the env file exports PIP_CONSTRAINT so later installs keep it), or rerun "
                        "`./toolkit provision`.",
                    )
                )
    products = [(n, v, w) for n in MINDSPORE_DISTRIBUTIONS for v, w in dists.get(n, [])]
    if len(products) > 1:
        findings.append(
            Finding(
                "mindspore-packages-conflict",
                "error",
                "More than one MindSpore package is installed; they overwrite each other's `mindspore` folder",
                [f"{host.shown(Path(w))}: {n} {v}" for n, v, w in products],
                f"Keep only {ms.get('package', 'the stack package')}: `{venv}/bin/pip uninstall -y "
                + " ".join(n for n, _, _ in products)
                + "`, then `./toolkit provision` to reinstall the stack's wheel.",
            )
        )
    elif not products and ms.get("package"):
        findings.append(
            Finding(
                "mindspore-not-installed",
                "error",
                f"{ms['package']} is not installed in {venv}",
                [f"no mindspore*.dist-info in {', '.join(host.shown(s) for s in sites)}"],
                "Run `./toolkit provision` (role mindspore).",
            )
        )
    return findings


def _visible(value: Optional[str]) -> Optional[List[str]]:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def rule_devices(host: Host, env: Dict[str, str]) -> List[Finding]:
    findings: List[Finding] = []
    value = host.environ.get("CUDA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))
    device_id = host.device_id
    if device_id is None and (host.environ.get("DEVICE_ID") or "").strip().isdigit():
        device_id = int(host.environ["DEVICE_ID"])
    count, count_from = gpu_count(host)
    visible = _visible(value)
    evidence = [f"CUDA_VISIBLE_DEVICES={value!r}" if value is not None else "CUDA_VISIBLE_DEVICES unset"]
    if device_id is not None:
        evidence.append(f"device_id {device_id} (DEVICE_ID / --device-id)")
    if count is not None:
        evidence.append(f"{count} GPU(s) in {count_from}")
    if visible is not None and (not visible or visible[0] in ("-1", "NoDevFiles")):
        if not host.expect.get("no_gpu"):
            findings.append(
                Finding(
                    "cuda-visible-devices-empty",
                    "error",
                    "CUDA_VISIBLE_DEVICES hides every GPU",
                    evidence,
                    "Unset CUDA_VISIBLE_DEVICES or list the GPUs to use (e.g. `export CUDA_VISIBLE_DEVICES=0,1`).",
                )
            )
        return findings
    if visible and count:
        wrong = [v for v in visible if v.isdigit() and int(v) >= count]
        if wrong:
            findings.append(
                Finding(
                    "cuda-visible-devices-out-of-range",
                    "error",
                    f"CUDA_VISIBLE_DEVICES names GPU {', '.join(wrong)}, but the host has {count}",
                    evidence,
                    f"Use indices 0..{count - 1} (`nvidia-smi -L` lists them).",
                )
            )
    available = len(visible) if visible is not None else count
    if device_id is not None and available is not None and device_id >= available:
        findings.append(
            Finding(
                "device-id-not-visible",
                "error",
                f"device_id {device_id} is not among the {available} GPU(s) this process can see",
                evidence,
                "MindSpore's device_id counts inside CUDA_VISIBLE_DEVICES: with CUDA_VISIBLE_DEVICES="
                f"{value or '<list>'} use device_id 0..{max(available - 1, 0)} "
                "(`context.set_context(device_id=...)` or DEVICE_ID), or widen CUDA_VISIBLE_DEVICES.",
            )
        )
    return findings


def _effective_gpu(rank: Dict[str, Any]) -> Optional[str]:
    if rank["opened"]:
        return ",".join(rank["opened"])
    visible = _visible(rank["cuda_visible_devices"])
    device = rank["device_id"]
    if visible is None or not visible:
        return None  # the program may pick its GPU itself (set_context(device_id=local rank)): cannot tell
    index = int(device) if device is not None and str(device).isdigit() else 0
    if len(visible) == 1 or device is not None:
        return visible[index] if index < len(visible) else None
    return None


def rule_mpi(host: Host) -> List[Finding]:
    ranks, unreadable = mpi_ranks(host)
    by_job: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for rank in ranks:
        by_job.setdefault(rank["job"], {}).setdefault(str(rank["rank"]), rank)
    findings: List[Finding] = []
    for job, members in sorted(by_job.items()):
        if len(members) < 2:
            continue
        gpus = {r: _effective_gpu(m) for r, m in members.items()}
        known = [g for g in gpus.values() if g is not None]
        if len(known) == len(members) and len(set(known)) == 1:
            findings.append(
                Finding(
                    "mpi-ranks-one-gpu",
                    "error",
                    f"All {len(members)} MPI ranks of job {job} use the same GPU ({known[0]})",
                    [
                        "pid {pid} rank {rank}: CUDA_VISIBLE_DEVICES={cuda_visible_devices} DEVICE_ID={device_id} "
                        "opened {opened} ({cmdline})".format(**m)
                        for _, m in sorted(members.items())
                    ],
                    "Give each rank its own GPU: in the script "
                    "`context.set_context(device_id=int(os.environ['OMPI_COMM_WORLD_LOCAL_RANK']))` and do not "
                    "pass one "
                    "fixed CUDA_VISIBLE_DEVICES/DEVICE_ID to every rank (`mpirun -x CUDA_VISIBLE_DEVICES=0` does).",
                )
            )
    if unreadable:
        findings.append(
            Finding(
                "processes-unreadable",
                "info",
                f"The environment of {len(unreadable)} process(es) of other users cannot be read",
                [f"{host.proc}/<pid>/environ: permission denied for pid {', '.join(sorted(unreadable, key=int)[:10])}"],
                "Run the doctor as root (`./toolkit doctor` does) to check every MPI rank's GPU binding.",
            )
        )
    return findings


# ------------------------------------------------------------------------------------------------- run

RULES = (
    "nouveau",
    "dkms",
    "secure-boot",
    "driver",
    "persistence",
    "gpu-probe",
    "compute",
    "env",
    "libraries",
    "nccl",
    "python-packages",
    "devices",
    "mpi",
)


def diagnose(host: Host) -> Dict[str, Any]:
    """Run every rule; the JSON document (findings sorted by severity)."""
    started = time.monotonic()
    env: Optional[Dict[str, str]] = None
    stderr = ""
    if host.env_file:
        env, stderr = shell_environment(str(host.path(host.env_file)))
    shell = env or dict(host.environ)
    findings: List[Finding] = []
    findings += rule_nouveau(host)
    findings += rule_dkms(host)
    findings += rule_secure_boot(host)
    findings += rule_driver(host)
    findings += rule_persistence(host)
    findings += rule_gpu_probe(host)
    findings += rule_compute(host)
    findings += rule_env(host, env, stderr)
    findings += rule_libraries(host, shell)
    findings += rule_nccl(host, shell)
    findings += rule_python_packages(host, shell)
    findings += rule_devices(host, shell)
    findings += rule_mpi(host)
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    return {
        "host": host.expect.get("host") or socket.gethostname(),
        "stack": host.expect.get("stack"),
        "env_file": host.env_file,
        "kernel": running_kernel(host),
        "roots": {"root": str(host.root), "proc": str(host.proc), "sys": str(host.sys)},
        "rules": list(RULES),
        "counts": counts,
        "ok": counts["error"] == 0,
        "findings": [f.as_dict() for f in findings],
        "elapsed_s": round(time.monotonic() - started, 3),
        "expect": host.expect,
        "gpu_probe": gpu_probe_record(host),
    }


def render(document: Dict[str, Any]) -> str:
    """Human output: one summary line, then each finding with its evidence and fix."""
    counts = document["counts"]
    lines = [
        "doctor: {} (stack {}): {} error(s), {} warning(s), {} note(s) in {} s".format(
            document["host"],
            document.get("stack") or "?",
            counts["error"],
            counts["warning"],
            counts["info"],
            document["elapsed_s"],
        )
    ]
    probe = document.get("gpu_probe") or {}
    if probe:
        lines.append(
            "GPU probe (no MindSpore): "
            + str(probe.get("summary") or probe.get("verdict"))
            + (f": {probe.get('reason')}" if probe.get("state") == "ran" and probe.get("verdict") != "OK" else "")
        )
    for finding in document["findings"]:
        lines.append("")
        lines.append("{:<7} {}  [{}]".format(finding["severity"].upper(), finding["title"], finding["id"]))
        for item in finding["evidence"]:
            lines.append("        seen: " + item)
        lines.append("        fix:  " + finding["fix"])
    if not counts["error"] and not counts["warning"]:
        lines.append("")
        lines.append("No problems found by: " + ", ".join(document["rules"]) + ".")
    return "\n".join(lines)


def host_from_args(args: argparse.Namespace) -> Host:
    expect: Dict[str, Any] = {}
    if args.expect:
        expect = json.loads(Path(args.expect).read_text())
    if args.expect_json:
        expect = json.loads(args.expect_json)
    return Host(
        root=Path(args.root),
        proc=Path(args.proc),
        sys=Path(args.sys),
        expect=expect,
        env_file=args.env_file if args.env_file is not None else str(expect.get("env_file") or ""),
        kernel=args.kernel,
        environ=dict(os.environ),
        device_id=args.device_id,
        nvidia_smi=args.nvidia_smi,
        gpu_probe=args.gpu_probe,
        gpu_probe_timeout_s=args.gpu_probe_timeout,
        libcuda=args.libcuda,
        libnvml=args.libnvml,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--expect", help="JSON of what the stack expects (roles/verify tasks/doctor.yml writes it)")
    parser.add_argument("--env-file", help="the stack's env file (default: the one --expect names)")
    parser.add_argument("--root", default="/", help="file system root to read (a substituted tree in tests)")
    parser.add_argument("--proc", default="/proc")
    parser.add_argument("--sys", default="/sys")
    parser.add_argument("--kernel", default="", help="running kernel release (default: from --proc)")
    parser.add_argument("--device-id", type=int, help="MindSpore device_id to check (default: $DEVICE_ID)")
    parser.add_argument("--expect-json", help="the same JSON as text (the role passes it inline)")
    parser.add_argument(
        "--nvidia-smi",
        help="nvidia-smi to ask for `-q` (default: on PATH, or <root>/usr/bin/nvidia-smi under --root; '': none)",
    )
    probe = parser.add_mutually_exclusive_group()
    probe.add_argument(
        "--gpu-probe",
        dest="gpu_probe",
        action="store_true",
        default=None,
        help="run the GPU probe (gpu_probe.py, libcuda and NVML without MindSpore) even under --root "
        "(default: on the real root only)",
    )
    probe.add_argument("--no-gpu-probe", dest="gpu_probe", action="store_false", help="do not run the GPU probe")
    parser.add_argument(
        "--gpu-probe-timeout", type=float, default=GPU_PROBE_TIMEOUT, help="seconds the GPU probe may take (child)"
    )
    parser.add_argument("--libcuda", default="", help="libcuda the GPU probe loads (default: libcuda.so.1)")
    parser.add_argument("--libnvml", default="", help="libnvidia-ml the GPU probe loads (default: libnvidia-ml.so.1)")
    parser.add_argument("--json", help="write the JSON document here ('-': print it instead of the text)")
    parser.add_argument(
        "--json-line", action="store_true", help=f"after the text, print the JSON on one line after {JSON_LINE!r}"
    )


def run(args: argparse.Namespace) -> int:
    host = host_from_args(args)
    document = diagnose(host)
    if args.json == "-":
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        if args.json:
            target = Path(args.json)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        print(render(document))
        if args.json_line:
            print(JSON_LINE + " " + json.dumps(document, sort_keys=True))
    return 0 if document["ok"] else 1


def main(argv: Optional[List[str]] = None) -> int:
    """``python3 doctor.py ...``: the file runs alone too (the role copies only this one)."""
    parser = argparse.ArgumentParser(prog="msgpu doctor", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
