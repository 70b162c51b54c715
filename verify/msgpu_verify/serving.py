"""MindSpore Serving check: the benchmark's LeNet5 as a servable, queried like a user would.

``python -m msgpu_verify serving --checkpoint CKPT --data MNIST --servables DIR`` runs five steps, each in its
own child process with a hard time limit (the child's whole process group is killed on timeout):

1. ``import``: mindspore_serving (server, client) and mindspore import; their versions (MindSpore's also when
   Serving is missing).
2. ``export``: the checkpoint -> ``DIR/lenet5/1/lenet5.mindir`` (MindIR), ``DIR/lenet5/lenet5_pipeline.py`` (the
   servable's numpy pre/post-processing, a copy of servable_lenet5_pipeline.py) and ``DIR/lenet5/servable_config.py``
   (a copy of servable_lenet5.py, which loads the pipeline file beside it). Idempotent: nothing is rewritten when
   the checkpoint's sha256 and the MindSpore version match the last export and both files are unchanged.
3. ``config``: the servable config imported where ``mindspore_serving.server.register`` is real; the method
   ``predict_digit`` must be registered with input ``image`` and outputs ``digit``, ``score``, and its
   preprocess/postprocess must be the deployed lenet5_pipeline.py's.
4. ``pipeline``: without the server: the deployed lenet5_pipeline.py's preprocess -> the MindIR on CPU
   (mindspore.load + nn.GraphCell) -> its postprocess, on the first N MNIST test images; accuracy against the
   labels, and the largest difference between the servable's input tensor and the benchmark's training tensor.
5. ``server``: start_servables + start_grpc_server on the (loopback) address, N single-image requests with
   mindspore_serving.client.Client, accuracy against the labels, agreement with the pipeline, latency p50/p95,
   server.stop(). Without a GPU, Serving refuses to run a MindIR on the MindSpore backend; its own message is
   recorded and the verdict is NO_DEVICE.

``export`` and ``pipeline`` (the CPU steps) need MindSpore and numpy only: where mindspore_serving is missing but
MindSpore imports (the default stack, whose Serving 1.5.0 comes only from the vendor's server), they still run,
and ``config`` and ``server`` are skipped with the reason.

Verdicts: OK, NO_DEVICE (no GPU; everything that can run without one passed), NOT_INSTALLED (no
mindspore_serving in this Python; the explanation and ``cpu_steps`` say how the CPU steps went), FAIL (the step and
the error; a CPU step that fails is a FAIL with or without Serving), HANG (the step that timed out).
This module's launcher is standard library only (Python 3.8); MindSpore, Serving and numpy are imported
only in the children (``python -m msgpu_verify.serving --child STEP CONFIG``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._args import bounded
from ._digest import sha256_of
from ._proc import RESULT_MARKER, find_result, run_child, strip_markers

SERVABLE = "lenet5"
METHOD = "predict_digit"
INPUTS = ["image"]
OUTPUTS = ["digit", "score"]
MINDIR = "lenet5.mindir"
VERSION = "1"
STAMP = "export.json"
CONFIG_SOURCE = Path(__file__).resolve().parent / "servable_lenet5.py"
# The servable's numpy pre/post-processing, deployed beside servable_config.py (which loads it by this name).
PIPELINE_SOURCE = Path(__file__).resolve().parent / "servable_lenet5_pipeline.py"
PIPELINE_FILE = "lenet5_pipeline.py"
STEPS = ("import", "export", "config", "pipeline", "server")
CPU_STEPS = ("export", "pipeline")  # MindSpore + numpy only: they run without Serving
SERVING = "mindspore_serving"
VERDICTS = ("OK", "NO_DEVICE", "NOT_INSTALLED", "FAIL", "HANG")
PASSING = ("OK", "NO_DEVICE")
STACK_VAR = "stack_serving_enabled"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
MAX_IMAGES = 10000
# What start_servables says when no device can run the MindIR (measured on 2.0.2 without a GPU); another
# RuntimeError on a GPU-less host (a broken servable, a busy port) stays a FAIL.
DEVICE_REFUSALS = ("not support device type", "no cuda-capable device", "cudagetdevicecount")


# ---------------------------------------------------------------------------------------------------------
# Launcher (standard library only)
# ---------------------------------------------------------------------------------------------------------


def servable_paths(servables: Path) -> Dict[str, Path]:
    root = servables / SERVABLE
    return {
        "root": root,
        "config": root / "servable_config.py",
        "pipeline": root / PIPELINE_FILE,
        "version": root / VERSION,
        "mindir": root / VERSION / MINDIR,
        "stamp": root / VERSION / STAMP,
    }


def write_if_changed(path: Path, content: bytes) -> bool:
    """Write ``content`` through a temp file in the same folder; False (nothing written) when it is already there."""
    if path.exists() and path.read_bytes() == content:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix="." + path.name + ".", dir=str(path.parent))
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return True


def test_files(data: Path) -> Tuple[Path, Path]:
    """The MNIST test images and labels in the layout `mnist` prepares (DATA/test/...), or raise ValueError."""
    images, labels = data / "test" / TEST_IMAGES, data / "test" / TEST_LABELS
    missing = [str(p) for p in (images, labels) if not p.is_file()]
    if missing:
        raise ValueError(
            f"--data {data}: {', '.join(missing)} missing; prepare MNIST first (python -m msgpu_verify mnist)"
        )
    return images, labels


def address_problem(address: str) -> Optional[str]:
    """Why ``address`` (HOST:PORT, loopback) cannot be served on, or None when it is free."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return f"--address {address!r}: allowed is HOST:PORT with a port 1-65535, e.g. 127.0.0.1:5500"
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port_text), type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"--address {address!r}: cannot resolve {host!r}: {exc}"
    family, _, _, _, sockaddr = infos[0]
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind(sockaddr)
    except OSError as exc:
        return (
            f"--address {address}: cannot listen there ({exc.strerror or exc}); another server (the serving role's "
            "systemd unit?) holds it: pick a free port (verify_serving_address)"
        )
    finally:
        probe.close()
    return None


def detect_gpus(device: str, nvidia_smi: str) -> Tuple[int, str]:
    """GPUs the server may use: --device none -> 0, GPU -> asked of nvidia-smi but assumed, auto -> nvidia-smi."""
    if device == "none":
        return 0, "--device none: treated as a host without a GPU"
    from .distributed import count_gpus

    count, reason = count_gpus(nvidia_smi) if nvidia_smi else (0, "no nvidia-smi given")
    if device == "GPU" and count == 0:
        return 1, f"--device GPU (assumed present; {reason})"
    return count, reason


class Runner:
    """Runs each step's child with the time limit and PYTHONPATH pointing at this package."""

    def __init__(self, python: str, timeout_s: float, work_dir: Optional[Path] = None) -> None:
        self.python = python
        self.timeout_s = timeout_s
        # Serving writes serving_logs/ and unix_socket_files/ into its working directory: one of ours.
        self.work_dir = work_dir
        package_parent = str(Path(__file__).resolve().parent.parent)
        self.env = dict(os.environ)
        self.env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the servable folder Serving scans
        self.env["PYTHONPATH"] = package_parent + (
            os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else ""
        )

    def __call__(self, step: str, config: Dict[str, Any]) -> Dict[str, Any]:
        argv = [self.python, "-m", "msgpu_verify.serving", "--child", step, json.dumps(config)]
        cwd = "/"
        if self.work_dir is not None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            cwd = str(self.work_dir)
        child = run_child(argv, self.timeout_s, env=self.env, cwd=cwd)
        raw = find_result(child.output)
        tail = "\n".join(strip_markers(child.output))[-3000:]
        if child.timed_out:
            return {"status": "timeout", "error": f"no answer within {self.timeout_s:g} s", "output_tail": tail}
        if raw is None:
            return {
                "status": "failed",
                "error": f"the {step} child exited with {child.returncode}",
                "output_tail": tail,
            }
        try:
            result = json.loads(raw)
        except ValueError as exc:
            return {"status": "failed", "error": f"the {step} child wrote unreadable JSON: {exc}", "output_tail": tail}
        if not isinstance(result, dict):
            return {"status": "failed", "error": f"the {step} child wrote {type(result).__name__}, not an object"}
        if result.get("error"):
            result.setdefault("status", "failed")
            result["output_tail"] = tail
        result.setdefault("status", "ok")
        return result


def _skip(reason: str) -> Dict[str, Any]:
    return {"status": "skipped", "seconds": 0.0, "reason": reason}


def step_export(args: argparse.Namespace, run: Callable, versions: Dict[str, Any]) -> Dict[str, Any]:
    """Export when the checkpoint or MindSpore changed since the last export; (re)write the servable config."""
    checkpoint = Path(args.checkpoint).absolute()
    if not checkpoint.is_file():
        return {
            "status": "failed",
            "error": f"--checkpoint {checkpoint} does not exist: run `python -m msgpu_verify bench "
            "--save-checkpoint PATH` first (the role does that when verify_serving is on)",
        }
    paths = servable_paths(Path(args.servables).absolute())
    wanted = {"checkpoint_sha256": sha256_of(checkpoint), "mindspore": versions.get("mindspore")}
    try:
        stamp = json.loads(paths["stamp"].read_text()) if paths["stamp"].is_file() else None
    except ValueError:
        stamp = None
    result: Dict[str, Any] = {"mindir": str(paths["mindir"]), "checkpoint": str(checkpoint)}
    if stamp == wanted and paths["mindir"].is_file():
        result.update({"status": "ok", "exported": False})
    else:
        result.update(run("export", {"checkpoint": str(checkpoint), "mindir": str(paths["mindir"])}))
        if result["status"] != "ok":
            return result
        write_if_changed(paths["stamp"], (json.dumps(wanted, sort_keys=True) + "\n").encode())
        result["exported"] = True
    # The pipeline first: the config loads it.
    result["pipeline_module"] = str(paths["pipeline"])
    result["pipeline_written"] = write_if_changed(paths["pipeline"], PIPELINE_SOURCE.read_bytes())
    result["config"] = str(paths["config"])
    result["config_written"] = write_if_changed(paths["config"], CONFIG_SOURCE.read_bytes())
    result["changed"] = bool(result["exported"] or result["pipeline_written"] or result["config_written"])
    return result


def _accuracy(digits: List[Any], labels: List[int]) -> Optional[float]:
    if not digits:
        return None
    return round(sum(1 for d, y in zip(digits, labels) if d == y) / len(digits), 5)


def judge_pipeline(result: Dict[str, Any], min_accuracy: float) -> Dict[str, Any]:
    digits, labels = result.get("digits") or [], result.get("labels") or []
    result["accuracy"] = _accuracy(digits, labels)
    if result["status"] == "ok" and (result["accuracy"] is None or result["accuracy"] < min_accuracy):
        result["status"] = "failed"
        result["error"] = (
            f"pipeline accuracy {result['accuracy']} on {len(digits)} test image(s) is below {min_accuracy} "
            "(--min-accuracy): the export or the servable's pre/post-processing does not match the trained model"
        )
    return result


def judge_server(result: Dict[str, Any], pipeline: Dict[str, Any], min_accuracy: float) -> Dict[str, Any]:
    if result["status"] != "ok":
        return result
    digits, labels = result.get("digits") or [], result.get("labels") or []
    result["accuracy"] = _accuracy(digits, labels)
    reference = pipeline.get("digits") or []
    if reference and len(reference) == len(digits):
        result["agreement_with_pipeline"] = round(sum(1 for a, b in zip(digits, reference) if a == b) / len(digits), 5)
    latencies = result.get("latencies_ms") or []
    if latencies:
        ordered = sorted(latencies)
        result["latency_ms"] = {
            "p50": round(statistics.median(ordered), 3),
            "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3),
            "max": round(ordered[-1], 3),
        }
    errors = result.get("errors") or []
    if errors:
        result["status"] = "failed"
        result["error"] = f"{len(errors)} of {len(digits)} request(s) failed; first: {errors[0]}"
    elif result["accuracy"] is None or result["accuracy"] < min_accuracy:
        result["status"] = "failed"
        result["error"] = (
            f"server accuracy {result['accuracy']} on {len(digits)} test image(s) is below {min_accuracy} "
            "(--min-accuracy)"
        )
    return result


def decide(steps: Dict[str, Dict[str, Any]], gpus: int) -> Tuple[str, str, Optional[str]]:
    """(verdict, explanation, failed step) from the steps' results and the GPUs the host has.

    Steps in order: the first that hung, failed or was refused decides. Missing Serving is judged last, so a
    CPU step that failed without it (a broken export) is still a FAIL; otherwise it is NOT_INSTALLED."""
    missing = (steps.get("import") or {}).get("missing")
    for name in STEPS:
        step = steps.get(name) or {}
        status = step.get("status")
        if name == "import" and missing:
            continue
        if status == "timeout":
            return "HANG", f"step {name}: {step.get('error')}; its process group was killed", name
        if status == "failed":
            return "FAIL", f"step {name}: {step.get('error')}", name
        if status == "refused":
            if gpus > 0 or not is_device_refusal(step.get("refusal", "")):
                where = f"a host with {gpus} GPU(s)" if gpus else "this host (not for want of a device)"
                return "FAIL", f"step {name}: Serving refused to start on {where}: {step['refusal']}", name
            return (
                "NO_DEVICE",
                "no GPU: install, import, export, servable config and the CPU pipeline passed; the server cannot run "
                f"the model here (Serving: {first_line(step['refusal'])})",
                None,
            )
    if missing:
        return "NOT_INSTALLED", not_installed_text(steps), "import"
    server = steps.get("server") or {}
    if server.get("status") != "ok":
        return "FAIL", "the server step did not run", "server"
    text = (
        f"{server.get('images')} image(s) over gRPC at {server.get('address')}: accuracy {server.get('accuracy')}, "
        f"p50 {(server.get('latency_ms') or {}).get('p50')} ms"
    )
    return "OK", text, None


def not_installed_text(steps: Dict[str, Dict[str, Any]]) -> str:
    """What is missing, where it comes from, and how far the CPU steps got without it."""
    imported = steps.get("import") or {}
    error = f" ({imported['error']})" if imported.get("error") else ""
    text = (
        f"{imported['missing']} is not installed in this Python ({imported.get('python') or 'the MindSpore venv'}): "
        f"the serving role installs it when {STACK_VAR} is true{error}"
    )
    pipeline = steps.get("pipeline") or {}
    if pipeline.get("status") == "ok":
        return (
            f"{text}; the CPU steps (export, pipeline) passed without it: MindSpore {imported.get('mindspore')}, "
            f"accuracy {pipeline.get('accuracy')} on {pipeline.get('images')} test image(s)"
        )
    return f"{text}; the CPU steps (export, pipeline) did not run: {pipeline.get('reason') or 'no result'}"


def cpu_steps_summary(steps: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The CPU steps' statuses and whether both passed (they run with or without Serving)."""
    summary: Dict[str, Any] = {name: (steps.get(name) or {}).get("status") for name in CPU_STEPS}
    summary["passed"] = all(summary[name] == "ok" for name in CPU_STEPS)
    return summary


def is_device_refusal(text: str) -> bool:
    """Serving's own words for "no device can run this model" (2.0.2 without a GPU: 'Not support device type')."""
    lowered = str(text).lower()
    return any(marker in lowered for marker in DEVICE_REFUSALS)


def first_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[0] if lines else "")[:limit]


def not_run_notes(steps: Dict[str, Dict[str, Any]]) -> List[str]:
    notes = []
    for name in STEPS:
        step = steps.get(name) or {}
        if step.get("status") == "skipped":
            notes.append(f"{name}: {step.get('reason')}")
        elif step.get("status") == "refused":
            notes.append(
                f"{name}: the servable was not started and not queried: without a GPU Serving has no backend for a "
                f"MindIR model (MindSpore Lite, which would run it on CPU, is not part of the stack). Serving said: "
                f"{first_line(step.get('refusal', ''), 600)}"
            )
    return notes


def after_import(imported: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """(why every later step is skipped, why only the steps needing Serving are skipped), each None or a reason.

    Serving missing but MindSpore importing: the CPU steps (export, pipeline) still run."""
    if imported["status"] == "ok":
        return None, None
    if imported.get("missing") != SERVING:
        return f"step import did not pass ({imported['status']})", None
    if not imported.get("mindspore"):
        return f"MindSpore does not import either: {imported.get('mindspore_error') or 'no version reported'}", None
    return None, f"needs {SERVING}, which is not installed in this Python (step import)"


def run_launcher(args: argparse.Namespace, runner: Optional[Callable] = None) -> Dict[str, Any]:
    started = time.monotonic()
    # The children run in their own working directory (Serving writes logs there): every path they get is absolute.
    servables = Path(args.servables).absolute()
    run = runner or Runner(args.python, args.timeout, servables.resolve().parent / "serving-work")
    document: Dict[str, Any] = {
        "servable": {
            "name": SERVABLE,
            "method": METHOD,
            "inputs": INPUTS,
            "outputs": OUTPUTS,
            "directory": str(servables),
            "mindir": str(servable_paths(servables)["mindir"]),
        },
        "address": args.address,
        "checkpoint": args.checkpoint,
        "images": args.images,
        "timeout_s": args.timeout,
        "min_accuracy": args.min_accuracy,
        "hostname": socket.gethostname(),
    }
    gpus, gpu_reason = detect_gpus(args.device, args.nvidia_smi)
    document["device"] = {"requested": args.device, "gpus": gpus, "reason": gpu_reason}
    steps: Dict[str, Dict[str, Any]] = {}
    document["steps"] = steps

    def timed(name: str, action: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        begin = time.monotonic()
        try:
            result = action()
        except (OSError, ValueError) as exc:
            result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = round(time.monotonic() - begin, 3)
        steps[name] = result
        return result

    imported = timed("import", lambda: run("import", {}))
    versions = {key: imported.get(key) for key in ("mindspore", "mindspore_serving", "python")}
    document["versions"] = versions
    document["mindspore_serving_version"] = versions.get("mindspore_serving")
    data = Path(args.data).absolute()
    order: List[Tuple[str, Callable[[], Dict[str, Any]]]] = [
        ("export", lambda: step_export(args, run, versions)),
        ("config", lambda: run("config", {"servables": str(servables)})),
        (
            "pipeline",
            lambda: judge_pipeline(
                run("pipeline", {**_data_config(data, args.images), "servables": str(servables)}), args.min_accuracy
            ),
        ),
        ("server", lambda: _server_step(args, run, steps, data, gpus)),
    ]
    blocked, without_serving = after_import(imported)
    for name, action in order:
        if without_serving and name not in CPU_STEPS:
            steps[name] = _skip(without_serving)
            continue
        if blocked:
            steps[name] = _skip(blocked)
            continue
        result = timed(name, action)
        if result["status"] not in ("ok", "refused"):
            blocked = f"step {name} did not pass ({result['status']})"
    verdict, explanation, failed = decide(steps, gpus)
    document.update(
        {
            "verdict": verdict,
            "explanation": explanation,
            "failed_step": failed,
            "not_run": not_run_notes(steps),
            "elapsed_s": round(time.monotonic() - started, 3),
        }
    )
    pipeline, server = steps.get("pipeline") or {}, steps.get("server") or {}
    document["pipeline_accuracy"] = pipeline.get("accuracy")
    document["cpu_steps"] = cpu_steps_summary(steps)
    document["server_accuracy"] = server.get("accuracy")
    document["latency_ms"] = server.get("latency_ms")
    for step in steps.values():  # the per-image lists served their purpose; keep the JSON readable
        for key in ("digits", "labels", "latencies_ms"):
            step.pop(key, None)
    return document


def _data_config(data: Path, images: int) -> Dict[str, Any]:
    test_images, test_labels = test_files(data)
    return {"images_file": str(test_images), "labels_file": str(test_labels), "count": images, "data": str(data)}


def _server_step(
    args: argparse.Namespace, run: Callable, steps: Dict[str, Dict[str, Any]], data: Path, gpus: int
) -> Dict[str, Any]:
    problem = address_problem(args.address)
    if problem:
        return {"status": "failed", "error": problem, "address": args.address}
    config = {
        **_data_config(data, args.images),
        "servables": str(Path(args.servables).absolute()),
        "address": args.address,
        "device_type": "GPU" if args.device == "GPU" else None,
    }
    result = run("server", config)
    result["address"] = args.address
    result["gpus"] = gpus
    return judge_server(result, steps.get("pipeline") or {}, args.min_accuracy)


def summary_line(document: Dict[str, Any]) -> str:
    steps = document.get("steps") or {}
    timing = ", ".join(f"{n} {steps[n].get('status')} {steps[n].get('seconds')} s" for n in STEPS if n in steps)
    return f"serving: {document['verdict']} - {document['explanation']} [{timing}]"


_images = bounded("--images", int, 1, MAX_IMAGES, f"a whole number from 1 to {MAX_IMAGES}")
_seconds = bounded("--timeout", float, 5, float("inf"), "a number of seconds >= 5")
_share = bounded("--min-accuracy", float, 0.0, 1.0, "a fraction from 0 to 1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="the LeNet5 checkpoint (bench --save-checkpoint)")
    parser.add_argument("--data", required=True, help="MNIST as `mnist` prepares it (DATA/test/t10k-*)")
    parser.add_argument("--servables", required=True, help="servable directory (DIR/lenet5/... is written)")
    parser.add_argument("--address", default="127.0.0.1:5500", help="gRPC address of the server (loopback)")
    parser.add_argument("--device", default="auto", choices=["auto", "GPU", "none"])
    parser.add_argument("--images", type=_images, default=100, help="MNIST test images to query (first N)")
    parser.add_argument("--timeout", type=_seconds, default=300.0, help="hard limit of each step's child (s)")
    parser.add_argument("--min-accuracy", type=_share, default=0.9, help="lowest accepted top-1 accuracy")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="for --device auto ('' = no GPU)")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the children")
    parser.add_argument("--json")


# ---------------------------------------------------------------------------------------------------------
# Children (import MindSpore, Serving, numpy)
# ---------------------------------------------------------------------------------------------------------


def _emit(result: Dict[str, Any]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, (RESULT_MARKER + " " + json.dumps(result) + "\n").encode("utf-8"))
    os._exit(0)


def child_import(_: Dict[str, Any]) -> Dict[str, Any]:
    result: Dict[str, Any] = {"python": sys.executable}
    try:
        import mindspore_serving
        from mindspore_serving import client, server  # noqa: F401
    except ImportError as exc:
        name = getattr(exc, "name", None) or ""
        missing = SERVING if name.split(".")[0] == SERVING else None
        result.update({"status": "failed", "error": f"{type(exc).__name__}: {exc}", "missing": missing})
        if missing:  # the CPU steps can still run where MindSpore imports
            result.update(_mindspore_version())
        return result
    import mindspore

    result["mindspore_serving"] = getattr(mindspore_serving, "__version__", None) or _dist_version("mindspore_serving")
    result["mindspore"] = mindspore.__version__
    return result


def _mindspore_version() -> Dict[str, Any]:
    """{"mindspore": version}, or {"mindspore": None, "mindspore_error": why} when it does not import."""
    try:
        import mindspore
    except Exception as exc:  # any import failure (a missing CUDA library is an OSError or ImportError)
        return {"mindspore": None, "mindspore_error": f"{type(exc).__name__}: {exc}"[:500]}
    return {"mindspore": mindspore.__version__}


def _dist_version(name: str) -> Optional[str]:
    try:
        from importlib import metadata

        return metadata.version(name.replace("_", "-"))
    except Exception:  # only a label for the report
        return None


def child_export(config: Dict[str, Any]) -> Dict[str, Any]:
    """Checkpoint -> MindIR (input float32 (1, 1, 32, 32)), written beside and renamed into place."""
    import mindspore as ms
    import numpy as np
    from mindspore import context

    from .lenet import LeNet5

    # mindspore.context: 1.5 has no top-level set_context / GRAPH_MODE (2.x has both, and still this module).
    context.set_context(mode=context.GRAPH_MODE, device_target="CPU")
    net = LeNet5()
    answer = ms.load_param_into_net(net, ms.load_checkpoint(config["checkpoint"]))
    # 1.5 returns the network's parameters that were not loaded; 2.x (those, the checkpoint's unused ones).
    not_loaded = answer[0] if isinstance(answer, tuple) else answer
    if not_loaded:
        return {"status": "failed", "error": f"checkpoint lacks parameters: {not_loaded}"}
    net.set_train(False)
    mindir = Path(config["mindir"])
    mindir.parent.mkdir(parents=True, exist_ok=True)
    temp_base = mindir.parent / (".export-" + str(os.getpid()))
    ms.export(net, ms.Tensor(np.zeros((1, 1, 32, 32), np.float32)), file_name=str(temp_base), file_format="MINDIR")
    written = Path(str(temp_base) + ".mindir")
    os.chmod(str(written), 0o644)
    os.replace(str(written), str(mindir))
    return {"bytes": mindir.stat().st_size}


def _load_file(path: Path, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load_servable_config(servables: str) -> Any:
    """Import DIR/lenet5/servable_config.py with its folder on sys.path, as module servable_config.

    Serving 2.0.2's worker (server/worker/_worker.py, _load_servable_config) appends DIR to sys.path and imports
    ``lenet5.servable_config``; the config loads its lenet5_pipeline.py by path, so either way works."""
    folder = Path(servables) / SERVABLE
    sys.path.insert(0, str(folder))
    return _load_file(folder / "servable_config.py", "servable_config")


def _load_pipeline_module(servables: str) -> Any:
    """The deployed DIR/lenet5/lenet5_pipeline.py (numpy only: no Serving needed)."""
    return _load_file(Path(servables) / SERVABLE / PIPELINE_FILE, "lenet5_pipeline")


# Where register_method hands a method's signature to the C++ registry: Serving >= 1.6 (2.0.2 included) calls
# ServableRegister_.register_method, Serving 1.x before that ServableStorage_.register_method; neither has a
# Python getter for the signatures afterwards, so the signature is read on its way in.
REGISTRIES = (
    ("ServableRegister_", "Serving >= 1.6 (2.x): ServableRegister_.register_method in server.register.method"),
    ("ServableStorage_", "Serving 1.x: ServableStorage_.register_method in server.register.method"),
)


def capture_registrations(method_module: Any) -> Tuple[List[Dict[str, Any]], str]:
    """Wrap the registry object ``method_module`` calls so every registered method signature is also kept."""
    found = [(a, text) for a, text in REGISTRIES if hasattr(getattr(method_module, a, None), "register_method")]
    if not found:
        raise RuntimeError(
            "mindspore_serving.server.register.method has neither ServableRegister_ nor ServableStorage_: "
            "a Serving release this check does not know"
        )
    attribute, label = found[0]
    real = getattr(method_module, attribute)
    captured: List[Dict[str, Any]] = []

    class Capture:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def register_method(signature: Any) -> Any:
            captured.append(
                {
                    "servable": signature.servable_name,
                    "method": signature.method_name,
                    "inputs": list(signature.inputs),
                    "outputs": list(signature.outputs),
                }
            )
            return real.register_method(signature)

    setattr(method_module, attribute, Capture())
    return captured, label


def child_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """Import the deployed servable_config.py with the real register module; check predict_digit's signature."""
    from mindspore_serving.server.register import method as method_module

    captured, api = capture_registrations(method_module)
    module = _load_servable_config(config["servables"])
    result: Dict[str, Any] = {"api": api, "registered": captured}
    mine = [entry for entry in captured if entry["method"] == METHOD]
    problems = []
    if not mine:
        problems.append(f"method {METHOD} is not registered (registered: {[e['method'] for e in captured]})")
    else:
        entry = mine[-1]
        result.update({"method": entry["method"], "inputs": entry["inputs"], "outputs": entry["outputs"]})
        if entry["servable"] != SERVABLE:
            problems.append(f"servable name {entry['servable']!r} (want {SERVABLE!r}: the folder name)")
        if entry["inputs"] != INPUTS:
            problems.append(f"inputs {entry['inputs']} (want {INPUTS})")
        if entry["outputs"] != OUTPUTS:
            problems.append(f"outputs {entry['outputs']} (want {OUTPUTS})")
    mindir = Path(config["servables"]) / SERVABLE / VERSION / MINDIR
    if not mindir.is_file():
        problems.append(f"{mindir} (declared by declare_model) is missing")
    deployed = str((Path(config["servables"]) / SERVABLE / PIPELINE_FILE).resolve())
    for name in ("preprocess", "postprocess"):
        function = getattr(module, name, None)
        if not callable(function):
            problems.append(f"servable_config.py defines no {name}()")
            continue
        # The pipeline step runs the deployed pipeline file's functions: the server must run the same ones.
        source = getattr(getattr(function, "__code__", None), "co_filename", "")
        if not source or str(Path(source).resolve()) != deployed:
            problems.append(f"servable_config.py's {name}() comes from {source or 'nowhere'}, not {deployed}")
    if problems:
        result.update({"status": "failed", "error": "; ".join(problems)})
    return result


def _read_mnist(config: Dict[str, Any]):
    import numpy as np

    count = int(config["count"])
    with open(config["images_file"], "rb") as handle:
        handle.seek(16)
        images = np.frombuffer(handle.read(count * 784), dtype=np.uint8).reshape(-1, 784)
    with open(config["labels_file"], "rb") as handle:
        handle.seek(8)
        labels = np.frombuffer(handle.read(count), dtype=np.uint8)
    return images, labels


def child_pipeline(config: Dict[str, Any]) -> Dict[str, Any]:
    """The servable's preprocess -> MindIR (CPU) -> postprocess, per image, as the server would run it.

    The pre/post-processing is the deployed lenet5_pipeline.py (what servable_config.py loads), so this step needs
    MindSpore and numpy but not Serving."""
    import mindspore as ms
    import numpy as np
    from mindspore import context, nn

    context.set_context(mode=context.GRAPH_MODE, device_target="CPU")
    # The functions servable_config.py hands Serving, from the deployed file itself: no Serving import needed.
    servable = _load_pipeline_module(config["servables"])
    graph = nn.GraphCell(ms.load(str(Path(config["servables"]) / SERVABLE / VERSION / MINDIR)))
    images, labels = _read_mnist(config)
    digits: List[int] = []
    scores: List[float] = []
    tensors = []
    started = time.perf_counter()
    for raw in images:
        x = servable.preprocess(raw.tobytes())
        tensors.append(x)
        logits = graph(ms.Tensor(x[None, ...])).asnumpy()[0]
        digit, score = servable.postprocess(logits)
        digits.append(int(digit))
        scores.append(float(score))
    seconds = time.perf_counter() - started
    from .lenet import preprocessed_arrays

    bench_x, bench_y = preprocessed_arrays(config["data"], False, len(images))
    difference = float(np.abs(np.stack(tensors) - bench_x).max())
    return {
        "images": len(digits),
        "digits": digits,
        "labels": [int(y) for y in labels],
        "labels_match_bench": bool((bench_y == labels).all()),
        "mean_score": round(sum(scores) / len(scores), 5) if scores else None,
        "ms_per_image": round(seconds * 1000.0 / max(1, len(digits)), 3),
        "preprocess_max_abs_diff_vs_bench": round(difference, 6),
        "device": "CPU",
    }


def child_server(config: Dict[str, Any]) -> Dict[str, Any]:
    """Start the servable and the gRPC server, query each image with the client, stop."""
    import numpy as np
    from mindspore_serving import server
    from mindspore_serving.client import Client

    images, labels = _read_mnist(config)
    started = time.perf_counter()
    options: Dict[str, Any] = {"servable_directory": config["servables"], "servable_name": SERVABLE, "device_ids": 0}
    if config.get("device_type"):
        options["device_type"] = config["device_type"]
    try:
        server.start_servables(server.ServableStartConfig(**options))
    except RuntimeError as exc:
        return {"status": "refused", "refusal": str(exc)[-2000:], "start_s": round(time.perf_counter() - started, 3)}
    result: Dict[str, Any] = {"start_s": None}
    try:
        server.start_grpc_server(config["address"])
        result["start_s"] = round(time.perf_counter() - started, 3)
        client = Client(config["address"], SERVABLE, METHOD)
        digits: List[Optional[int]] = []
        scores: List[float] = []
        latencies: List[float] = []
        errors: List[str] = []
        for raw in images:
            begin = time.perf_counter()
            answer = client.infer([{"image": raw.tobytes()}])
            latencies.append((time.perf_counter() - begin) * 1000.0)
            item = answer[0] if isinstance(answer, list) and answer else answer
            if not isinstance(item, dict) or "error" in item or "digit" not in item:
                errors.append(str(item)[:300])
                digits.append(None)
                continue
            digits.append(int(np.asarray(item["digit"]).reshape(-1)[0]))
            scores.append(float(np.asarray(item["score"]).reshape(-1)[0]))
        result.update(
            {
                "images": len(images),
                "digits": digits,
                "labels": [int(y) for y in labels],
                "latencies_ms": [round(v, 3) for v in latencies],
                "errors": errors,
                "mean_score": round(sum(scores) / len(scores), 5) if scores else None,
            }
        )
    finally:
        server.stop()
    return result


CHILDREN: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "import": child_import,
    "export": child_export,
    "config": child_config,
    "pipeline": child_pipeline,
    "server": child_server,
}


def _child_main(step: str, config_text: str) -> None:
    try:
        result = CHILDREN[step](json.loads(config_text))
    except BaseException as exc:  # every failure becomes the step's result
        import traceback

        result = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }
    _emit(result)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    _child_main(sys.argv[2], sys.argv[3])
