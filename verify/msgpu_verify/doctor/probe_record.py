"""The GPU probe as the doctor's GPU rules read it: gpu_probe.py (libcuda and NVML through ctypes, no
MindSpore) run once per host through the judge's run_driver_probe, in a child with a hard timeout, and the modules
of the package the doctor sits in (judge.py, compute.py) that it needs for that."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .core import Host

# What the doctor needs beside its folder (in the msgpu_verify folder it sits in) to run the probe and the GPU code
# rule (compute.py) when it runs as files (the verify role copies these with the doctor's folder).
PROBE_FILES = ("__init__.py", "_proc.py", "judge.py", "gpu_probe.py", "compute.py")


def sibling_module(name: str) -> Tuple[Optional[Any], str]:
    """A module of the package the doctor's folder sits in (``judge``, ``compute``), and why not when it is missing.

    In the package (``python -m msgpu_verify doctor``), and run as files from a msgpu_verify folder that holds the
    files it needs (PROBE_FILES: the verify role copies them beside the doctor's folder), it is imported from that
    package; the doctor's folder copied alone (or without them) runs without it."""
    folder = Path(__file__).resolve().parent
    package = (__package__ or "").rpartition(".")[0]  # msgpu_verify; '' when the folder was copied alone
    missing = [item for item in PROBE_FILES if not (folder.parent / item).is_file()]
    if missing or not package:
        return None, f"{', '.join(missing or PROBE_FILES)} not beside {folder} (it runs alone)"
    try:
        return importlib.import_module("." + name, package), ""
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
