"""The doctor's command line (``python -m msgpu_verify doctor``, ``python -m msgpu_verify.doctor``, and its folder
run as a file): the host from the arguments, the text or JSON out, exit 1 on an error-level finding."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from .core import GPU_PROBE_TIMEOUT, Host
from .runner import diagnose, render

JSON_LINE = "@@MSGPU_DOCTOR_JSON@@"
# The first line of the package's docstring: what --help says the doctor does.
DESCRIPTION = "The doctor: read a host's state and explain, in plain words, what keeps MindSpore off its GPUs."


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
    """``python -m msgpu_verify.doctor ...`` and ``python3 <folder>/doctor ...`` (__main__.py): the folder runs
    alone too."""
    parser = argparse.ArgumentParser(prog="msgpu doctor", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
