"""The libraries rules: where each library MindSpore's wheel needs resolves (its extension's RPATH,
LD_LIBRARY_PATH, the linker cache), who provides a missing one, and an RPATH that shadows LD_LIBRARY_PATH."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .core import Finding, Host
from .linker import MULTIARCH_DIRS, elf_dynamic, library_search

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
