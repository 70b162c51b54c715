"""The NCCL rule: which libnccl.so.2 MindSpore's collective library loads first, and whether a copy its wheel
bundles shadows the stack's NCCL."""

from __future__ import annotations

import glob
import mmap
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .core import Finding, Host
from .libraries import mindspore_extension
from .linker import MULTIARCH_DIRS, elf_dynamic, ld_cache, library_search
from .versions import version_key

# NCCL's soname: what MindSpore's collective libraries link (DT_NEEDED), and what the 1.10 and 2.x wheels bundle.
NCCL_SONAME = "libnccl.so.2"


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
