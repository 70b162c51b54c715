"""GPU smoke test for a lab's first GPU host: one command, under ten minutes on a healthy host, one JSON.

``python -m msgpu_verify gpu-smoke --out FILE [--data MNIST]`` runs, each in its own child with its own limit:

1. gpu_probe (libcuda + NVML through ctypes): the driver's view, a PTX kernel on every GPU;
2. the MindSpore warm-up in a fresh process against an EMPTY kernel cache (first CUDA context: the JIT cost);
3. the same again in a second fresh process (the cache working: this one should take seconds);
4. the run_check judge and 5. the quick LeNet5 benchmark, with generous limits.

The kernel cache is a new folder (``--cache-dir`` to name one; the default is removed at the end) so the first run
really compiles; every child gets it as CUDA_CACHE_PATH. A step is SKIPPED with the reason when an earlier one shows
there is no GPU (or that going on is pointless). With ``--gpu-code`` (the stack's components, stack_resolved.gpu_code)
compute.py's rule runs on the compute capability the GPU probe read (``compute``): a GPU the stack cannot run on stops
the smoke test there, GPU_UNSUPPORTED, before minutes of warm-up. Verdicts: OK (exit 0), NO_GPU, GPU_UNSUPPORTED, HANG,
FAILED (exit 1).
Standard library only; Python 3.8.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from . import judge as judge_mod
from . import warmup as warmup_mod
from ._proc import run_child

VERDICTS = ("OK", "NO_GPU", "GPU_UNSUPPORTED", "HANG", "FAILED")
NO_GPU_PROBE = ("NO_DRIVER", "NO_DEVICE")
STEPS = ("gpu_probe", "warmup_first", "warmup_second", "judge", "bench")
# The second warm-up counts as served from the cache when its GPU part takes under half the first one's, or when
# the first one was this short anyway (nothing worth caching: the wheel has SASS for this GPU).
CACHE_NOTHING_S = 10.0


def _step(status: str, reason: str = "", **fields: Any) -> Dict[str, Any]:
    step: Dict[str, Any] = {"status": status, "reason": reason}
    step.update(fields)
    return step


def _skipped(reason: str) -> Dict[str, Any]:
    return _step("skipped", reason, verdict=None, seconds=None)


def run_gpu_probe(timeout_s: float, libcuda: Optional[str], libnvml: Optional[str]) -> Dict[str, Any]:
    """gpu_probe.py in a child (a driver that hangs cannot hang the smoke test); its JSON document."""
    script = Path(__file__).resolve().with_name("gpu_probe.py")
    argv = [sys.executable, str(script)]
    argv += ["--libcuda", libcuda] if libcuda else []
    argv += ["--libnvml", libnvml] if libnvml else []
    child = run_child(argv, timeout_s=timeout_s, cwd="/")
    document: Dict[str, Any] = {}
    for line in child.output.splitlines():
        if line.startswith("{"):
            try:
                document = json.loads(line)
            except ValueError:
                continue
    if not document:
        how = f"timed out after {timeout_s:g} s" if child.timed_out else f"exited {child.returncode} without JSON"
        document = {"verdict": "DRIVER_ERROR", "reason": "the GPU probe " + how, "output_tail": child.output[-2000:]}
    document["elapsed_s"] = child.elapsed_s
    return document


def _warmup_step(document: Dict[str, Any]) -> Dict[str, Any]:
    return _step(
        "ran",
        document["explanation"],
        verdict=document["verdict"],
        seconds=document.get("seconds"),
        gpu_seconds=document.get("gpu_seconds"),
        stage_seconds=document.get("stage_seconds"),
        document=document,
    )


def jit_summary(first: Dict[str, Any], second: Dict[str, Any]) -> Dict[str, Any]:
    """First against second warm-up: the JIT cost and whether the cache served the second one."""
    f_gpu, s_gpu = first.get("gpu_seconds"), second.get("gpu_seconds")
    summary: Dict[str, Any] = {
        "first_s": first.get("seconds"),
        "second_s": second.get("seconds"),
        "first_gpu_s": f_gpu,
        "second_gpu_s": s_gpu,
        "ratio": None,
        "jit_cost_s": None,
        "cache_works": None,
    }
    if isinstance(f_gpu, (int, float)) and isinstance(s_gpu, (int, float)):
        summary["ratio"] = round(f_gpu / max(s_gpu, 0.001), 2)  # the GPU stages' seconds, import left out
        summary["jit_cost_s"] = round(f_gpu - s_gpu, 3)
        summary["cache_works"] = bool(f_gpu < CACHE_NOTHING_S or s_gpu < f_gpu / 2)
        if f_gpu < CACHE_NOTHING_S:
            summary["note"] = (
                f"the first context took only {f_gpu} s on the GPU: little or nothing to JIT-compile for this GPU"
            )
    return summary


def gpu_smoke(
    python: str,
    warmup_timeout: float = warmup_mod.DEFAULT_TIMEOUT,
    judge_timeout: float = 600.0,
    bench_timeout: float = 600.0,
    data: Optional[str] = None,
    cache_dir: Optional[str] = None,
    root: str = "/",
    libcuda: Optional[str] = None,
    libnvml: Optional[str] = None,
    expected: Optional[Dict[str, Optional[str]]] = None,
    probe_timeout: float = 120.0,
    bench: Optional[Callable[..., Dict[str, Any]]] = None,
    gpu_code: Optional[List[Dict[str, Any]]] = None,
    host: str = "",
    stack: str = "",
) -> Dict[str, Any]:
    """Every step in order; the smoke test's JSON document. Sets CUDA_CACHE_PATH in this process's environment."""
    started = time.monotonic()
    fresh = cache_dir is None
    cache = Path(tempfile.mkdtemp(prefix="msgpu-gpu-smoke-cache-")) if fresh else Path(cache_dir or "")
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    was_empty = not any(cache.iterdir())
    os.environ["CUDA_CACHE_PATH"] = str(cache)
    if libnvml:
        os.environ["MSGPU_LIBNVML"] = libnvml
    if libcuda:  # the judge's own driver probe (and its GPU code check) reads the same driver
        os.environ["MSGPU_LIBCUDA"] = libcuda
    doc: Dict[str, Any] = {
        "host": warmup_mod.hostname(),
        "user": warmup_mod.username(),
        "python": python,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cache": dict(warmup_mod.cache_settings(dict(os.environ)), fresh=fresh, was_empty=was_empty),
        "limits_s": {
            "gpu_probe": probe_timeout,
            "warmup": warmup_timeout,
            "judge": judge_timeout,
            "bench": bench_timeout,
        },
        "order": list(STEPS),
        "steps": {},
    }
    steps = doc["steps"]
    try:
        probe = run_gpu_probe(probe_timeout, libcuda, libnvml)
        steps["gpu_probe"] = _step(
            "ran",
            str(probe.get("reason") or ""),
            verdict=probe.get("verdict"),
            seconds=probe.get("elapsed_s"),
            context_seconds=[d.get("context_seconds") for d in probe.get("devices") or []],
            document=probe,
        )
        stop: Optional[str] = None
        verdict, explanation = "OK", ""
        if probe.get("verdict") in NO_GPU_PROBE:
            stop = "the GPU probe found no GPU ({}: {})".format(probe["verdict"], probe.get("reason"))
            verdict, explanation = "NO_GPU", stop
        probe_record = {"state": "ran", "verdict": probe.get("verdict"), "document": probe}
        doc["compute"] = judge_mod.check_gpu_code(gpu_code, probe_record, host, stack)
        if stop is None and doc["compute"].get("errors"):
            stop = "the stack cannot run on this host's GPUs: " + " ".join(doc["compute"]["errors"])
            verdict = "GPU_UNSUPPORTED"
            explanation = stop + " The stack's libraries support: {}.".format(doc["compute"]["supports"])
        if stop is None:
            first = warmup_mod.warmup(python, warmup_timeout, root=root, force=True, libnvml=libnvml)
            steps["warmup_first"] = _warmup_step(first)
            if first["verdict"] != "OK":
                stop = "the first warm-up did not run on the GPU ({}: {})".format(
                    first["verdict"], first["explanation"]
                )
                verdict = {"SKIPPED": "NO_GPU", "HANG": "HANG"}.get(first["verdict"], "FAILED")
                explanation = stop
        else:
            steps["warmup_first"] = _skipped(stop)
        if stop is None:
            second = warmup_mod.warmup(python, warmup_timeout, root=root, force=True, libnvml=libnvml)
            steps["warmup_second"] = _warmup_step(second)
            doc["jit"] = jit_summary(first, second)
            if second["verdict"] != "OK":
                verdict = "HANG" if second["verdict"] == "HANG" else "FAILED"
                explanation = "the second warm-up failed after the first passed ({}: {})".format(
                    second["verdict"], second["explanation"]
                )
            elif doc["jit"]["cache_works"] is False:
                verdict = "FAILED"
                explanation = (
                    "the kernel cache did not serve the second process: {} s on the GPU after {} s the first time; "
                    "check CUDA_CACHE_MAXSIZE (>= 2 GiB), CUDA_CACHE_DISABLE and that {} is writable".format(
                        doc["jit"]["second_gpu_s"], doc["jit"]["first_gpu_s"], cache
                    )
                )
        else:
            steps["warmup_second"] = _skipped(stop)
        judged: Optional[Dict[str, Any]] = None
        if stop is None:
            judged = judge_mod.judge(
                python, "GPU", judge_timeout, expected or {}, gpu_code=gpu_code, host=host, stack=stack
            )
            steps["judge"] = _step(
                "ran", judged["explanation"], verdict=judged["verdict"], seconds=judged["elapsed_s"], document=judged
            )
            if judged["verdict"] != "OK":
                stop = "the judge says {}: {}".format(judged["verdict"], judged["explanation"])
                if verdict == "OK":
                    verdict = {"NO_GPU": "NO_GPU", "HANG": "HANG", "GPU_UNSUPPORTED": "GPU_UNSUPPORTED"}.get(
                        judged["verdict"], "FAILED"
                    )
                    explanation = stop
        else:
            steps["judge"] = _skipped(stop)
        if stop is None and not data:
            steps["bench"] = _skipped("no MNIST folder given (--data)")
        elif stop is None:
            if bench is None:
                from .bench import run_bench as bench
            try:
                result = bench(device="GPU", data=data, quick=True, timeout_s=bench_timeout, python=python)
            except Exception as exc:  # MNIST that cannot be prepared: the step's failure, not the smoke test's
                result = {"error": f"{type(exc).__name__}: {exc}"}
            ok = "error" not in result
            steps["bench"] = _step(
                "ran",
                str(result.get("error") or "quick LeNet5 on the GPU"),
                verdict="OK" if ok else "FAILED",
                seconds=result.get("elapsed_s"),
                images_per_s=result.get("images_per_s"),
                accuracy=result.get("accuracy"),
                document=result,
            )
            if not ok and verdict == "OK":
                verdict, explanation = "FAILED", "the quick benchmark failed: " + str(result["error"])
        else:
            steps["bench"] = _skipped(stop)
        if verdict == "OK":
            jit = doc.get("jit") or {}
            explanation = "first CUDA context {} s (JIT), second {} s (cache), judge OK, benchmark {}".format(
                jit.get("first_s"),
                jit.get("second_s"),
                "{} images/s".format(steps["bench"].get("images_per_s"))
                if steps["bench"]["status"] == "ran"
                else "skipped (" + steps["bench"]["reason"] + ")",
            )
        if doc["compute"].get("warnings"):
            explanation = explanation.rstrip() + " Note: " + " ".join(doc["compute"]["warnings"])
        doc["verdict"], doc["explanation"] = verdict, explanation
    finally:
        if fresh:
            shutil.rmtree(str(cache), ignore_errors=True)
        doc["elapsed_s"] = round(time.monotonic() - started, 3)
    return doc


def summary_line(document: Dict[str, Any]) -> str:
    return "gpu-smoke: {} ({} s) {}".format(document["verdict"], document["elapsed_s"], document["explanation"])


def add_arguments(parser: argparse.ArgumentParser, timeout: Callable[[str], float]) -> None:
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--data", help="MNIST folder (IDX files, raw or .gz) for the quick benchmark; none: skipped")
    parser.add_argument("--warmup-timeout", type=timeout, default=warmup_mod.DEFAULT_TIMEOUT)
    parser.add_argument("--judge-timeout", type=timeout, default=600.0)
    parser.add_argument("--bench-timeout", type=timeout, default=600.0)
    parser.add_argument("--cache-dir", help="kernel cache folder (default: a new empty one, removed at the end)")
    parser.add_argument("--expect-mindspore")
    parser.add_argument("--expect-cuda")
    parser.add_argument("--expect-cudnn-major")
    parser.add_argument("--libcuda", help="libcuda for the GPU probe (default: $MSGPU_LIBCUDA or libcuda.so.1)")
    parser.add_argument("--libnvml", help="libnvidia-ml (default: $MSGPU_LIBNVML or libnvidia-ml.so.1)")
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)  # tests: where proc/ and dev/ are
    parser.add_argument("--python", default=sys.executable)
    judge_mod.add_gpu_code_arguments(parser)


def run(args: argparse.Namespace) -> int:
    expected = {"mindspore": args.expect_mindspore, "cuda": args.expect_cuda, "cudnn_major": args.expect_cudnn_major}
    document = gpu_smoke(
        args.python,
        warmup_timeout=args.warmup_timeout,
        judge_timeout=args.judge_timeout,
        bench_timeout=args.bench_timeout,
        data=args.data,
        cache_dir=args.cache_dir,
        root=args.root,
        libcuda=args.libcuda,
        libnvml=args.libnvml,
        expected={k: v for k, v in expected.items() if v},
        gpu_code=args.gpu_code,
        host=args.host,
        stack=args.stack,
    )
    target = Path(args.out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(summary_line(document))
    return 0 if document["verdict"] == "OK" else 1
