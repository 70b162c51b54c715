"""Which GPUs a stack's code can run on: the one rule for the preflight, the verify role and the doctor.

Standard library only, Python 3.8 to 3.12, no relative imports: the stack role's filter plugin loads this
file by path on the controller (roles/stack/filter_plugins/gpu_support.py), and the doctor's run copies it to a
host beside the doctor's folder. The data it judges comes from the catalog: for each component of a stack, what the
vendor says it supports (`gpu:` under the component's version in catalog/stacks.yml, with its source)
and, where the wheel could be read, the architectures its GPU libraries really carry (catalog/gpu_code.yml,
measured with msgpu_verify/fatbin.py).

How a GPU of compute capability (CC) M.m runs CUDA code:
- a cubin (SASS) built for sm_XY runs on a GPU of the same major X and a minor >= Y, never on another major
  (a cubin for 8.6 runs on 8.9, not on 9.0);
- PTX for compute_XY is JIT-compiled by the driver for any GPU of CC >= X.Y (slow at first start, cached);
- a library that is "not hardware forward compatible" (cuDNN before 9.0, TensorRT) checks the GPU itself
  and refuses an architecture newer than it knows, whatever PTX it carries.

`fit(code, cc)` judges one component on one CC; `check(components, gpus, ...)` a whole stack on a host's
GPUs, with one line per problem that names the host, the GPU, the component and what works instead.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

# The outcomes of fit(), best first. "outside": runs (same-major cubins) but the GPU is newer than the
# vendor's support matrix; "jit": runs only through the driver's PTX JIT at first start; "single": a component
# that only multi-GPU work loads (NCCL, `multi_gpu_only`) cannot run on the GPU, on a host with one GPU (single-GPU
# work runs; the same on a host with several GPUs is "none"); "none": cannot run.
NATIVE, OUTSIDE, JIT, SINGLE, NONE, UNKNOWN = "native", "outside", "jit", "single", "none", "unknown"
ORDER = {NATIVE: 0, OUTSIDE: 1, JIT: 2, SINGLE: 3, UNKNOWN: 4, NONE: 5}
ABOVE_MAX = ("jit", "same_major", "none")
# "sm_90a" / "9.0a": an architecture-specific target of that CC (it runs on that CC only, as a cubin does).
CC_RE = re.compile(r"^\s*(?:sm_|compute_)?(\d+)(?:\.(\d+))?[af]?\s*$")
# The GPU probe's own test kernel (gpu_probe.py): PTX for compute_50, so it JITs on CC >= 5.0 only.
PROBE_PTX = "5.0"


def cc_tuple(value: Any) -> Optional[Tuple[int, int]]:
    """'8.6' -> (8, 6); 'sm_86' / '86' -> (8, 6); '10.0' -> (10, 0); None or junk -> None."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value)
    match = CC_RE.match(text)
    if not match:
        return None
    major, minor = match.group(1), match.group(2)
    if minor is not None:
        return int(major), int(minor)
    if len(major) < 2:  # "8": a bare major
        return int(major), 0
    return int(major[:-1]), int(major[-1])  # "86" -> 8.6, "100" -> 10.0, "120" -> 12.0


def cc_text(value: Any) -> str:
    parsed = cc_tuple(value)
    return f"{parsed[0]}.{parsed[1]}" if parsed else str(value)


def _worst(outcomes: Sequence[Tuple[str, str]]) -> Tuple[str, str]:
    if not outcomes:
        return NATIVE, ""
    return max(outcomes, key=lambda o: ORDER[o[0]])


def _fit_library(name: str, sass: Sequence[Any], ptx: Sequence[Any], cc: Tuple[int, int]) -> Tuple[str, str]:
    cubins = [c for c in (cc_tuple(s) for s in sass) if c]
    ptxs = [c for c in (cc_tuple(p) for p in ptx) if c]
    if any(c[0] == cc[0] and c[1] <= cc[1] for c in cubins):
        return NATIVE, ""
    jit = [c for c in ptxs if c <= cc]
    has = "SASS " + (", ".join(f"{c[0]}.{c[1]}" for c in sorted(cubins)) or "none")
    has += "; PTX " + (", ".join(f"{c[0]}.{c[1]}" for c in sorted(ptxs)) or "none")
    if jit:
        return JIT, f"has in {name} no cubin for CC {cc[0]}.x, only PTX the driver must JIT at first start ({has})"
    return NONE, f"has in {name} no code that runs on CC {cc[0]}.{cc[1]} ({has})"


def fit(code: Dict[str, Any], cc_value: Any) -> Tuple[str, str]:
    """One component's code on one GPU: (outcome, why). `code` holds any of
    - `libraries`: {file: {sass: [CC...], ptx: [CC...]}} as measured (catalog/gpu_code.yml);
    - `sass`, `ptx` (and `label`): the same read from the build flags where no wheel could be measured;
    - `min`, `max`, `above_max`, `source`: what the vendor documents. Above `max`, `jit` runs a GPU of the
      same major on the newest cubins (outside the matrix) and one of a newer major through PTX JIT;
      `same_major` runs the same major only (not forward compatible); `none` refuses any newer GPU;
    the worst outcome of the two counts."""
    cc = cc_tuple(cc_value)
    if cc is None:
        return UNKNOWN, "the GPU's compute capability is not known"
    code = code or {}
    if not any(code.get(k) for k in ("libraries", "sass", "ptx", "min", "max")):
        return UNKNOWN, "has no record in the catalog of the GPU architectures it runs on"
    outcomes: List[Tuple[str, str]] = []
    for name, lib in sorted((code.get("libraries") or {}).items()):
        outcomes.append(_fit_library(name.rsplit("/", 1)[-1], lib.get("sass") or [], lib.get("ptx") or [], cc))
    if code.get("sass") or code.get("ptx"):  # cited from the build flags where no wheel could be read
        outcomes.append(
            _fit_library(str(code.get("label") or "its kernels"), code.get("sass") or [], code.get("ptx") or [], cc)
        )
    low, high = cc_tuple(code.get("min")), cc_tuple(code.get("max"))
    source = f" ({code['source']})" if code.get("source") else ""
    if low and cc < low:
        outcomes.append((NONE, f"supports CC {low[0]}.{low[1]} and newer{source}"))
    if high and cc > high:
        above = str(code.get("above_max") or "none")
        top = f"{high[0]}.{high[1]}"
        if above in ("jit", "same_major") and cc[0] == high[0]:
            outcomes.append(
                (
                    OUTSIDE,
                    f"is built up to CC {top}: runs on {cc[0]}.{cc[1]} untuned, outside its support matrix{source}",
                )
            )
        elif above == "jit":
            outcomes.append(
                (JIT, f"has code up to CC {top}; a GPU of another major runs it only through PTX JIT{source}")
            )
        elif above == "same_major":
            outcomes.append(
                (
                    NONE,
                    f"has code up to CC {top} and is not hardware forward compatible, so nothing "
                    f"of it runs on CC {cc[0]}.x{source}",
                )
            )
        else:
            outcomes.append((NONE, f"supports CC up to {top} and refuses newer GPUs{source}"))
    return _worst(outcomes)


def gpu_label(gpu: Dict[str, Any]) -> str:
    name = gpu.get("name") or ""
    cc = gpu.get("cc")
    inner = ", ".join(x for x in (name, f"CC {cc_text(cc)}" if cc_tuple(cc) else "CC unknown") if x)
    return f"{gpu.get('id') or 'GPU'} ({inner})"


def judge(components: Sequence[Dict[str, Any]], cc_value: Any, gpu_count: int = 0) -> Dict[str, Any]:
    """A stack's components on one CC: {"outcome": the worst, "problems": [(outcome, "Component version why")]}.

    gpu_count: the GPUs of the host (0: not known). A component marked `multi_gpu_only` (NCCL: only multi-GPU
    and multi-host training load it) that cannot run on the CC is "single" on a host with exactly one GPU."""
    problems = []
    for component in components or []:
        outcome, why = fit(component.get("code") or {}, cc_value)
        label = f"{component.get('name', '?')} {component.get('version', '')}".strip()
        if outcome == NONE and component.get("multi_gpu_only") and gpu_count == 1:
            outcome = SINGLE
            why += (
                ": training on this host's one GPU runs, multi-GPU and multi-host (mpirun) training cannot; "
                "a host with several such GPUs is refused"
            )
        elif outcome == NONE and component.get("multi_gpu_only") and gpu_count > 1:
            why += f" (multi-GPU training on this host's {gpu_count} GPUs loads it; a host with one such GPU would run)"
        if outcome != NATIVE:
            problems.append((outcome, f"{label} {why}".strip()))
    outcome = _worst(problems)[0] if problems else NATIVE
    return {"outcome": outcome, "problems": problems}


def check(
    components: Sequence[Dict[str, Any]],
    gpus: Sequence[Dict[str, Any]],
    host: str = "",
    stack: str = "",
    works: str = "",
) -> Dict[str, Any]:
    """The stack's components against every GPU of a host: {"errors", "warnings", "runs" (bool), "gpus": [...]}.

    components: [{"name": "cuDNN", "version": "8.0.5", "code": {...}}]; gpus: [{"id": "10de:2330", "name", "cc",
    "slot"}]; works: what to offer instead (a catalog stack, or why none runs), appended to each error."""
    host = host or "this host"
    result: Dict[str, Any] = {"errors": [], "warnings": [], "runs": True, "gpus": []}
    seen: Dict[Tuple[Any, Any], Dict[str, Any]] = {}
    for gpu in gpus or []:
        key = (gpu.get("id"), cc_text(gpu.get("cc")))
        if key in seen:
            seen[key]["slots"].append(gpu.get("slot") or "")
            continue
        if cc_tuple(gpu.get("cc")) is None:
            verdict = {"outcome": UNKNOWN, "problems": [(UNKNOWN, "its compute capability is not known")]}
        else:
            verdict = judge(components, gpu.get("cc"), len(gpus or []))
        entry = {
            "id": gpu.get("id"),
            "name": gpu.get("name", ""),
            "cc": gpu.get("cc"),
            "slots": [gpu.get("slot") or ""],
        }
        entry.update(verdict)
        seen[key] = entry
        result["gpus"].append(entry)
    for entry in result["gpus"]:
        where = ", ".join(s for s in entry["slots"] if s)
        gpu = gpu_label(entry) + (f" at {where}" if where else "")
        errors = [why for outcome, why in entry["problems"] if outcome == NONE]
        if errors:
            result["runs"] = False
            fix = f"; allowed: {works}" if works else ""
            result["errors"].append(f"{host}: stack {stack} cannot run on GPU {gpu}: {'; '.join(errors)}{fix}.")
        for outcome, why in entry["problems"]:
            if outcome == JIT:
                result["warnings"].append(f"{host}: GPU {gpu}: {why} (slow first start, then cached).")
            elif outcome == OUTSIDE:
                result["warnings"].append(f"{host}: GPU {gpu}: {why}; not verified by NVIDIA for this GPU.")
            elif outcome == SINGLE:
                result["warnings"].append(f"{host}: GPU {gpu}: {why}.")
            elif outcome == UNKNOWN and cc_tuple(entry.get("cc")) is None:
                result["warnings"].append(
                    f"{host}: GPU {gpu}: not checked against stack {stack} ({why}); the verify step and the "
                    "doctor check it with the compute capability the driver reports."
                )
            elif outcome == UNKNOWN:
                result["warnings"].append(
                    f"{host}: GPU {gpu}: {why}, so whether it runs there is not known; ./toolkit verify runs it."
                )
    return result
