"""First-run warm-up: let the CUDA driver JIT-compile MindSpore's kernels once, under its own long limit.

mindspore-gpu 1.5.1's CUDA kernels carry sm_53 SASS and compute_53 PTX only (about 12 MiB of PTX). On any other GPU
(an RTX 3090 is sm_86) the driver compiles all of that PTX when MindSpore creates its first CUDA context (CUDA 11.1
has no lazy loading): minutes, against the judge's 60 s / 180 s and the quick benchmark's 75 s. The driver keeps what
it compiled in its kernel cache (CUDA_CACHE_PATH, default ~/.nv/ComputeCache; at most CUDA_CACHE_MAXSIZE bytes,
256 MiB by default on CUDA 11, 4 GiB at most), so only the first process of a user on a host pays.

``warmup`` runs the judge's probe (probe.py: import, set_context(device_target="GPU"), run_check, the independent Mul)
in a child with the warm-up's own limit, so that first context and its compilation happen here, timed, before the
judge and the benchmark are timed. On success it writes a marker into the cache folder (``msgpu-warmup-<host>.json``:
the MindSpore package, the driver version, the GPU names); a later run with the same ones answers CACHED at once,
and a new driver, GPU or MindSpore warms again. Deleting the cache deletes the marker with it. Hosts without a GPU
are SKIPPED with the reason. Standard library only; Python 3.8.

Verdicts: OK (warmed now), CACHED, SKIPPED (exit 0); HANG, FAILED (exit 1).
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import gpu_probe
from . import judge as judge_mod
from ._proc import RESULT_MARKER, ChildResult, find_result, run_child

VERDICTS = ("OK", "CACHED", "SKIPPED", "HANG", "FAILED")
PASSING = ("OK", "CACHED", "SKIPPED")
DEFAULT_TIMEOUT = 1800.0
MARKER_PREFIX = "msgpu-warmup-"
# What the mindspore role's env file exports (the driver's maximum), and the least that holds 1.5.1's kernels
# compiled for one GPU with room to spare.
WANTED_CACHE_BYTES = 4294967296
MIN_CACHE_BYTES = 2 * 1024**3
DEFAULT_CACHE_BYTES = 256 * 1024**2
GPU_STAGES = ("context", "run_check", "mul")
IDENTITY_KEYS = ("mindspore", "mindspore_package", "mindspore_mtime", "driver_version", "gpus")

HINTS = {
    "OK": "Nothing to do.",
    "CACHED": "Nothing to do.",
    "SKIPPED": "Nothing to do on a host without a GPU; on a GPU host see the judge's verdict.",
    "HANG": "Run the warm-up once by hand with a longer limit, as the virtualenv's owner with the stack's env file "
    "sourced: `python -m msgpu_verify warmup --timeout 3600` (or raise verify_warmup_timeout); the compiled kernels "
    "stay in the cache folder, so later runs are quick. Check that CUDA_CACHE_MAXSIZE is at least 2 GiB (the env file "
    "sets 4294967296), that CUDA_CACHE_DISABLE is not set and that the cache folder is writable for this user; "
    "while it runs, `nvidia-smi` shows the python process and a CPU core busy.",
    "FAILED": "See the judge's verdict below (it runs next and explains this failure); the warm-up only prepares it.",
}

# Runs INSIDE the judged Python: where the mindspore package is and its release, from mindspore/version.py (every
# wheel has it), WITHOUT importing MindSpore (an import can take seconds or hang: the probe judges that).
VERSION_CHILD = r"""
import importlib.util, json, os, re, sys
doc = {}
try:
    spec = importlib.util.find_spec("mindspore")
except Exception as exc:
    spec = None
    doc["error"] = "%s: %s" % (type(exc).__name__, exc)
if spec is not None and spec.origin:
    folder = os.path.dirname(os.path.realpath(spec.origin))
    doc["package"] = folder
    try:
        doc["mtime"] = int(os.stat(spec.origin).st_mtime)
    except OSError:
        pass
    try:
        with open(os.path.join(folder, "version.py")) as handle:
            match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", handle.read())
        doc["version"] = match.group(1) if match else None
    except OSError:
        doc["version"] = None
sys.stdout.write("%s %s\n" % (sys.argv[1], json.dumps(doc)))
sys.stdout.flush()
os._exit(0)
"""


def hostname() -> str:
    return socket.gethostname()


def username() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (a container's random uid)
        return str(os.getuid())


def cache_settings(env: Dict[str, str]) -> Dict[str, Any]:
    """The driver's kernel cache as ``env`` sets it, and what is wrong with it (``warnings``)."""
    home = env.get("HOME") or os.path.expanduser("~")
    path = env.get("CUDA_CACHE_PATH") or os.path.join(home, ".nv", "ComputeCache")
    text = env.get("CUDA_CACHE_MAXSIZE")
    try:
        maxsize: Optional[int] = int(text) if text else None
    except ValueError:
        maxsize = None
    disabled = env.get("CUDA_CACHE_DISABLE", "").strip() == "1"
    warnings: List[str] = []
    if disabled:
        warnings.append("CUDA_CACHE_DISABLE=1: the driver keeps no compiled kernels, every process compiles again")
    effective = maxsize if maxsize is not None else DEFAULT_CACHE_BYTES
    if effective < MIN_CACHE_BYTES:
        said = f"CUDA_CACHE_MAXSIZE={text}" if text else "CUDA_CACHE_MAXSIZE is not set (256 MiB on CUDA 11)"
        warnings.append(
            f"{said}: too small for MindSpore's compiled kernels, the driver evicts them and compiles again; "
            f"the stack's env file sets {WANTED_CACHE_BYTES} (source it)"
        )
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    writable = os.access(str(existing), os.W_OK | os.X_OK)
    if not writable:
        warnings.append(f"{existing} is not writable for {username()}: the driver cannot keep what it compiles")
    return {
        "path": path,
        "maxsize": maxsize,
        "maxsize_set": text,
        "disabled": disabled,
        "writable": writable,
        "warnings": warnings,
    }


def gpus_present(root: str = "/") -> List[str]:
    """The GPUs the NVIDIA kernel module drives (/proc/driver/nvidia/gpus/<PCI address>) and /dev/nvidia0."""
    base = Path(root)
    found: List[str] = []
    with contextlib.suppress(OSError):
        found = sorted(p.name for p in (base / "proc/driver/nvidia/gpus").iterdir())
    if not found and (base / "dev/nvidia0").exists():
        found = ["/dev/nvidia0"]
    return found


def mindspore_package(python: str, env: Dict[str, str], timeout_s: float) -> Dict[str, Any]:
    """Where the judged Python's mindspore is and its release (mindspore/version.py), without importing it."""
    try:
        child = run_child([python, "-c", VERSION_CHILD, RESULT_MARKER], timeout_s=timeout_s, env=env, cwd="/")
    except OSError as exc:
        return {"error": f"cannot start {python}: {exc}"}
    raw = find_result(child.output)
    if raw is None:
        return {"error": "the package lookup " + ("timed out" if child.timed_out else f"exited {child.returncode}")}
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": "the package lookup printed no JSON"}


def identity(python: str, env: Dict[str, str], timeout_s: float, libnvml: Optional[str] = None) -> Dict[str, Any]:
    """What the compiled kernels depend on: the MindSpore package, the driver, the GPUs (NVML: no CUDA context)."""
    package = mindspore_package(python, env, timeout_s)
    nvml = gpu_probe.probe_nvml(libnvml or env.get("MSGPU_LIBNVML") or gpu_probe.DEFAULT_LIBNVML)
    return {
        "mindspore": package.get("version"),
        "mindspore_package": package.get("package"),
        "mindspore_mtime": package.get("mtime"),
        "driver_version": nvml.get("driver_version"),
        "gpus": [str(d.get("name")) for d in nvml.get("devices") or []],
    }


def marker_path(cache: Dict[str, Any], host: str) -> Path:
    return Path(cache["path"]) / (MARKER_PREFIX + host + ".json")


def read_marker(path: Path) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
    return [f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in IDENTITY_KEYS if old.get(key) != new.get(key)]


def _finish(doc: Dict[str, Any], verdict: str, explanation: str, started: float) -> Dict[str, Any]:
    doc.update(verdict=verdict, explanation=explanation, hint=HINTS[verdict])
    doc["elapsed_s"] = round(time.monotonic() - started, 3)
    return doc


def _probe_result(child: ChildResult) -> Dict[str, Any]:
    raw = find_result(child.output)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def hang_explanation(last: Optional[str], timeout_s: float) -> str:
    if last in (None, "begin import", "end import"):
        where = "in `import mindspore`" if last == "begin import" else "before MindSpore touched the GPU"
        stage = last or "start-up"
        return (
            f"The warm-up did not finish within {timeout_s:g} s and was stuck {where} (last stage: {stage}): "
            "no CUDA context yet, so this is not kernel compilation; see the judge's HANG hint."
        )
    return (
        f"First-run kernel compilation (the CUDA driver JIT-compiling MindSpore's PTX for this GPU) did not finish "
        f"within {timeout_s:g} s (last stage: {last}). Run `python -m msgpu_verify warmup --timeout 3600` once as "
        "this user with the env file sourced, or raise verify_warmup_timeout."
    )


def warmup(
    python: str,
    timeout_s: float = DEFAULT_TIMEOUT,
    env: Optional[Dict[str, str]] = None,
    root: str = "/",
    no_gpu_reason: Optional[str] = None,
    force: bool = False,
    libnvml: Optional[str] = None,
) -> Dict[str, Any]:
    """Warm the kernel cache once (or say CACHED / SKIPPED); the warm-up JSON document."""
    started = time.monotonic()
    env = dict(os.environ if env is None else env)
    host = hostname()
    cache = cache_settings(env)
    doc: Dict[str, Any] = {
        "host": host,
        "user": username(),
        "python": python,
        "timeout_s": timeout_s,
        "cache": cache,
        "seconds": None,
        "gpu_seconds": None,
        "marker": None,
    }
    if no_gpu_reason:
        return _finish(doc, "SKIPPED", f"no GPU on this host ({no_gpu_reason}): nothing to compile", started)
    present = gpus_present(root)
    if not present:
        return _finish(
            doc,
            "SKIPPED",
            "no GPU: the NVIDIA kernel module lists no GPU (/proc/driver/nvidia/gpus) and /dev/nvidia0 does not "
            "exist, so there is nothing to compile",
            started,
        )
    doc["gpus_present"] = present
    current = identity(python, env, min(120.0, timeout_s / 4), libnvml)
    doc["identity"] = current
    marker = marker_path(cache, host)
    doc["marker"] = str(marker)
    old = None if (force or cache["disabled"]) else read_marker(marker)
    if old is not None:
        changed = differences(old.get("identity") or {}, current)
        if not changed:
            doc["cached_from"] = {key: old.get(key) for key in ("seconds", "gpu_seconds", "warmed_at")}
            return _finish(
                doc,
                "CACHED",
                "already warmed for MindSpore {}, driver {} and {} on {} ({} s then); nothing compiled now".format(
                    current["mindspore"] or old.get("mindspore_version") or "?",
                    current["driver_version"] or "?",
                    ", ".join(current["gpus"]) or "this GPU",
                    old.get("warmed_at") or "?",
                    old.get("seconds"),
                ),
                started,
            )
        doc["rewarm_because"] = changed
    remaining = max(1.0, timeout_s - (time.monotonic() - started))
    probe = Path(__file__).resolve().with_name("probe.py")
    try:
        child = run_child([python, str(probe), "--device", "GPU"], timeout_s=remaining, env=env, cwd="/")
    except OSError as exc:
        return _finish(doc, "FAILED", f"cannot start {python}: {exc}", started)
    result = _probe_result(child)
    stages = result.get("stage_seconds") or {}
    doc["seconds"] = child.elapsed_s
    doc["stage_seconds"] = stages
    ran = [float(stages[s]) for s in GPU_STAGES if isinstance(stages.get(s), (int, float))]
    doc["gpu_seconds"] = round(sum(ran), 3) if ran else None
    doc["mindspore_version"] = result.get("mindspore_version")
    doc["last_stage"] = judge_mod.last_stage(child.output)
    if child.timed_out:
        doc["output_tail"] = judge_mod.clean_output(child.output)[-4000:]
        return _finish(doc, "HANG", hang_explanation(doc["last_stage"], timeout_s), started)
    verdict = judge_mod.classify(child.output, child.returncode, child.timed_out, {}, "GPU")
    doc["probe_verdict"] = verdict["verdict"]
    if verdict["verdict"] == "NO_GPU":
        return _finish(doc, "SKIPPED", "MindSpore sees no GPU: " + verdict["explanation"], started)
    if verdict["verdict"] != "OK":
        doc["output_tail"] = judge_mod.clean_output(child.output)[-4000:]
        return _finish(
            doc,
            "FAILED",
            "the warm-up could not compute on the GPU ({}: {})".format(verdict["verdict"], verdict["explanation"]),
            started,
        )
    explanation = "MindSpore {} created its first CUDA context and ran on the GPU in {} s ({} s on the GPU)".format(
        doc["mindspore_version"], doc["seconds"], doc["gpu_seconds"]
    )
    if cache["disabled"]:
        explanation += "; CUDA_CACHE_DISABLE=1, so nothing was kept and no marker written"
    else:
        record = {
            "identity": current,
            "mindspore_version": doc["mindspore_version"],
            "seconds": doc["seconds"],
            "gpu_seconds": doc["gpu_seconds"],
            "warmed_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "user": doc["user"],
            "host": host,
        }
        try:
            marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            marker.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            cache["warnings"].append(f"cannot write the marker {marker}: {exc}")
            doc["marker"] = None
    if cache["warnings"]:
        explanation += ". Warning: " + "; ".join(cache["warnings"])
    return _finish(doc, "OK", explanation, started)


def exit_code(document: Dict[str, Any]) -> int:
    return 0 if document["verdict"] in PASSING else 1


def summary_line(document: Dict[str, Any]) -> str:
    return "warmup: {} ({} s) {}".format(document["verdict"], document["elapsed_s"], document["explanation"])
