"""Command line: ``python -m msgpu_verify <command> ...``.

Commands: judge, warmup, gpu-smoke, mnist, bench, serving, distributed, report, seed, doctor, gpu-probe, limits.

verify/README.md describes every command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import bench as bench_mod
from . import distributed as distributed_mod
from . import doctor as doctor_mod
from . import gpu_probe as gpu_probe_mod
from . import judge as judge_mod
from . import limits as limits_mod
from . import mnist as mnist_mod
from . import serving as serving_mod
from . import smoke as smoke_mod
from . import warmup as warmup_mod
from ._args import bounded


def write_json(document: Dict[str, Any], path: Optional[str]) -> None:
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def cmd_judge(args: argparse.Namespace) -> int:
    expected = {
        "mindspore": args.expect_mindspore,
        "cuda": args.expect_cuda,
        "cudnn_major": args.expect_cudnn_major,
    }
    document = judge_mod.judge(
        args.python,
        args.device,
        args.timeout,
        expected,
        driver_probe=not args.no_driver_probe,
        gpu_code=args.gpu_code,
        host=args.host,
        stack=args.stack,
    )
    document["accept"] = list(args.accept)
    write_json(document, args.json)
    print(judge_mod.summary_line(document))
    if not args.json:
        print(json.dumps(document, sort_keys=True))
    return judge_mod.exit_code(document, args.accept)


def cmd_warmup(args: argparse.Namespace) -> int:
    no_gpu = "stack_no_gpu: true" if args.no_gpu else None
    document = warmup_mod.warmup(args.python, args.timeout, root=args.root, no_gpu_reason=no_gpu, force=args.force)
    write_json(document, args.json)
    print(warmup_mod.summary_line(document))
    if not args.json:
        print(json.dumps(document, sort_keys=True))
    return warmup_mod.exit_code(document)


def cmd_gpu_smoke(args: argparse.Namespace) -> int:
    return smoke_mod.run(args)


def parse_checksums(args: argparse.Namespace) -> Dict[str, str]:
    sums: Dict[str, str] = {}
    if args.sha256_file:
        sums.update(mnist_mod.parse_sha256sums(Path(args.sha256_file).read_text()))
    for item in args.sha256 or []:
        name, sep, value = item.partition("=")
        if not sep or len(value) != 64:
            raise mnist_mod.MnistError(f"--sha256 wants NAME=HEX (64 hex digits), got {item!r}")
        sums[name] = value.lower()
    return sums


def cmd_mnist(args: argparse.Namespace) -> int:
    try:
        before = mnist_mod.is_complete(Path(args.dest))
        dest = mnist_mod.prepare(
            args.source, args.dest, parse_checksums(args), args.ca_bundle, args.timeout, args.retries
        )
    except (mnist_mod.MnistError, OSError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"mnist: ERROR {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"ok": True, "changed": not before, "dest": str(dest)}))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    try:
        document = _bench(run_bench, args)
    except (mnist_mod.MnistError, OSError) as exc:
        document = {"error": f"cannot prepare MNIST from {args.data}: {exc}", "device": args.device}
    write_json(document, args.json)
    if "error" in document:
        print(f"bench: ERROR {document['error']}", file=sys.stderr)
        if not args.json:
            print(json.dumps(document, sort_keys=True))
        return 1
    seed = document.get("seed") or {}
    feeder = document.get("feeder") or {}
    print(
        "bench: {} images/s (feeder alone {} images/s, bound by {}), accuracy {}, p50 {} ms, seed {} images/s, "
        "ratio {} ({} s)".format(
            document.get("images_per_s"),
            feeder.get("images_per_s"),
            document.get("bound_by"),
            document.get("accuracy"),
            (document.get("step_time_ms") or {}).get("p50"),
            seed.get("images_per_s"),
            document.get("ratio"),
            document.get("elapsed_s"),
        )
    )
    if not args.json:
        print(json.dumps(document, sort_keys=True))
    return 0


def _bench(run_bench, args: argparse.Namespace) -> Dict[str, Any]:
    return run_bench(
        device=args.device,
        data=args.data,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        sink=args.sink,
        quick=args.quick,
        compare_seed=args.compare_seed,
        timeout_s=args.timeout,
        python=args.python,
        random_seed=args.random_seed,
        checkpoint=args.save_checkpoint,
    )


def _launch(module, args: argparse.Namespace) -> int:
    """A check with a launcher (serving, distributed): run it, write and print its document, exit by verdict."""
    document = module.run_launcher(args)
    write_json(document, args.json)
    print(module.summary_line(document))
    if not args.json:
        print(json.dumps(document, sort_keys=True))
    return 0 if document["verdict"] in module.PASSING else 1


def cmd_serving(args: argparse.Namespace) -> int:
    return _launch(serving_mod, args)


def cmd_distributed(args: argparse.Namespace) -> int:
    return _launch(distributed_mod, args)


def cmd_distributed_worker(args: argparse.Namespace) -> int:
    return distributed_mod.worker_main(args)


def cmd_report(args: argparse.Namespace) -> int:
    from .report import fleet_lines, write_report

    paths = write_report(
        Path(args.input),
        Path(args.out),
        args.title,
        slow_below=args.slow_below,
        distributed=Path(args.distributed) if args.distributed else None,
        mpi_smoke=Path(args.mpi_smoke) if args.mpi_smoke else None,
    )
    for path in paths:
        print(path)
    summary = json.loads(paths[-1].read_text())
    for line in fleet_lines(summary["fleet"]):
        print(line)
    return 0


def cmd_limits(args: argparse.Namespace) -> int:
    """The worst-case wall time of one command line, read by that command's own parser (its defaults included)."""
    if not args.argv or args.argv[0] not in limits_mod.COMMANDS:
        print(f"limits: name one of {', '.join(limits_mod.COMMANDS)} and its arguments", file=sys.stderr)
        return 2
    document = limits_mod.describe(build_parser().parse_args(args.argv))
    print(json.dumps(document, sort_keys=True) if args.json else f"{document['worst_case_s']:g}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    return doctor_mod.run(args)


def cmd_gpu_probe(args: argparse.Namespace) -> int:
    return gpu_probe_mod.run(args)


# Numbers on the command line, refused outside their range (argparse exits 2 with the message); the
# factory is msgpu_verify._args's, shared by every command. A day is the longest any check may take;
# 0 < x is sys.float_info.min.
_bounded = bounded
_POSITIVE = sys.float_info.min
_DAY = 86400.0
_timeout = _bounded("--timeout", float, 1, _DAY, "a number of seconds from 1 to 86400")
_retries = _bounded("--retries", int, 0, 100, "a whole number from 0 to 100")
_epochs = _bounded("--epochs", int, 1, 1000, "a whole number from 1 to 1000")
_batch_size = _bounded("--batch-size", int, 1, 60000, "a whole number from 1 to 60000 (the MNIST training images)")
_lr = _bounded("--lr", float, _POSITIVE, 10.0, "a learning rate, 0 < x <= 10")
_momentum = _bounded("--momentum", float, 0.0, 1.0, "a fraction from 0 to 1")
_random_seed = _bounded("--random-seed", int, 0, 2**32 - 1, "a whole number from 0 to 4294967295")
_fraction = _bounded("--slow-below", float, _POSITIVE, 1.0, "a fraction of the median, 0 < x <= 1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m msgpu_verify", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    sub.required = True

    p = sub.add_parser("judge", help="run_check + an independent Mul in a child with a timeout, one verdict")
    p.add_argument("--device", default="GPU", choices=["GPU", "CPU"])
    p.add_argument("--timeout", type=_timeout, default=120.0)
    p.add_argument(
        "--accept",
        nargs="+",
        action="extend",
        default=[],
        choices=list(judge_mod.VERDICTS),
        help="verdicts that also exit 0 (repeatable)",
    )
    p.add_argument("--expect-mindspore")
    p.add_argument("--expect-cuda")
    p.add_argument("--expect-cudnn-major")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json")
    p.add_argument(
        "--no-driver-probe",
        action="store_true",
        help="on a GPU, do not run gpu_probe.py (the driver without MindSpore) to explain the verdict",
    )
    judge_mod.add_gpu_code_arguments(p)
    p.set_defaults(func=cmd_judge)

    p = sub.add_parser("warmup", help="first CUDA context once per host and user: the kernel JIT, timed, cached")
    p.add_argument("--timeout", type=_timeout, default=warmup_mod.DEFAULT_TIMEOUT)
    p.add_argument("--no-gpu", action="store_true", help="the host has no GPU on purpose (stack_no_gpu): skip")
    p.add_argument("--force", action="store_true", help="warm again even when the marker says it is done")
    p.add_argument("--root", default="/", help=argparse.SUPPRESS)  # tests: where proc/ and dev/ are
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json")
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("gpu-smoke", help="GPU probe, first and second CUDA context, judge, quick bench: one JSON")
    smoke_mod.add_arguments(p, _timeout)
    p.set_defaults(func=cmd_gpu_smoke)

    p = sub.add_parser("mnist", help="prepare DEST/train and DEST/test from a folder or an http(s) URL")
    p.add_argument("--source", required=True)
    p.add_argument("--sha256-file")
    p.add_argument("--sha256", action="append", metavar="NAME=HEX")
    p.add_argument("--dest", required=True)
    p.add_argument("--ca-bundle")
    p.add_argument("--timeout", type=_timeout, default=60.0)
    p.add_argument("--retries", type=_retries, default=3)
    p.set_defaults(func=cmd_mnist)

    p = sub.add_parser("bench", help="the seed's LeNet5 training, measured")
    p.add_argument("--device", default="CPU", choices=["CPU", "GPU"])
    p.add_argument("--data", required=True)
    p.add_argument(
        "--epochs", type=_epochs, default=bench_mod.DEFAULT_EPOCHS, help=f"default {bench_mod.DEFAULT_EPOCHS}"
    )
    p.add_argument("--batch-size", type=_batch_size, default=bench_mod.BATCH_SIZE)
    p.add_argument("--lr", type=_lr, default=bench_mod.LR)
    p.add_argument("--momentum", type=_momentum, default=bench_mod.MOMENTUM)
    p.add_argument("--sink", default="auto", choices=["auto", "on", "off"])
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"at most {bench_mod.QUICK_EPOCHS} epochs (still every image); default --timeout "
        f"{limits_mod.BENCH_QUICK_TIMEOUT_S:g} s",
    )
    p.add_argument(
        "--random-seed",
        type=_random_seed,
        default=bench_mod.RANDOM_SEED,
        help=f"weights and shuffles (default {bench_mod.RANDOM_SEED}: every run comparable)",
    )
    p.add_argument("--compare-seed", action="store_true")
    p.add_argument("--save-checkpoint", metavar="PATH", help="save the trained LeNet5 there (for `serving`)")
    p.add_argument(
        "--timeout",
        type=_timeout,
        help=f"the training child's limit (s; default {limits_mod.BENCH_TIMEOUT_S:g}, --quick "
        f"{limits_mod.BENCH_QUICK_TIMEOUT_S:g}; the seed's script gets {limits_mod.SEED_TIMEOUT_FACTOR}x it)",
    )
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serving", help="LeNet5 as a MindSpore Serving servable: export, validate, serve, query")
    serving_mod.add_arguments(p)
    p.set_defaults(func=cmd_serving)

    p = sub.add_parser("distributed", help="data-parallel LeNet5 under mpirun + NCCL: every GPU busy, one verdict")
    distributed_mod.add_launcher_arguments(p)
    p.set_defaults(func=cmd_distributed)

    p = sub.add_parser("distributed-worker", help="one rank of `distributed` (started by mpirun; imports MindSpore)")
    distributed_mod.add_worker_arguments(p)
    p.set_defaults(func=cmd_distributed_worker)

    p = sub.add_parser("report", help="report.md, report.html and summary.json over host results")
    p.add_argument("--input", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="MindSpore GPU fleet verification")
    p.add_argument("--slow-below", type=_fraction, default=0.8, help="flag hosts below this share of the median")
    p.add_argument("--distributed", help="distributed.json (default: found next to or in --input)")
    p.add_argument("--mpi-smoke", help="mpi_smoke.json (default: found next to or in --input)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("doctor", help="read the host's state and explain what keeps MindSpore off the GPU")
    doctor_mod.add_arguments(p)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("gpu-probe", help="libcuda + NVML through ctypes: devices, a PTX kernel on each, one verdict")
    gpu_probe_mod.add_arguments(p)
    p.set_defaults(func=cmd_gpu_probe)

    p = sub.add_parser(
        "limits",
        help="the worst-case seconds of a command line (warmup, judge, bench, distributed, serving): limits.py",
        description="Prints the worst-case wall time (s) of `python -m msgpu_verify COMMAND ARGS`, from the limits "
        "that command line sets (its own defaults included), e.g. `limits bench --data D --timeout 1800 "
        "--compare-seed`. The formulas: msgpu_verify/limits.py.",
    )
    p.add_argument("--json", action="store_true", help="the command, its worst case and the formulas' fixed terms")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS]")
    p.set_defaults(func=cmd_limits)

    sub.add_parser("seed", help="the seed's main.py command line (--data_url=DIR ...) on the fast harness")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "seed":  # the seed's own options (--data_url=...) pass through untouched
        from .seed_main import main as seed_main

        return seed_main(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
