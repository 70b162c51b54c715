"""How long each msgpu_verify command can take at worst, from the same limits the command itself obeys.

Every check runs its work in children with a hard limit (``_proc.run_child``: past it the child's whole process
group is killed), so each command's worst-case wall time is a sum over what it runs, in seconds:

    warmup       T + 2K + W           (the identity lookup, then the probe gets what is left of T, at least 1 s)
    judge        T + K + [P + K] + W  ([...] on a GPU unless --no-driver-probe: the driver probe, gpu_probe.py)
    bench        T + K + [F*T + K] + W
                                      (T: --timeout, else BENCH_TIMEOUT_S / BENCH_QUICK_TIMEOUT_S;
                                       [...] with --compare-seed: the seed's script gets F times the limit)
    distributed  [S] + H + T + K + [J] + W
                                      ([S] unless --gpus: nvidia-smi -L; H: hostname -I; [J] with --nvidia-smi:
                                       the GPU sampler's last join)
    serving      [S] + N*(T + K) + W  ([S] unless --device none: nvidia-smi -L; N children, one per step)
    gpu-smoke    G + K + 2*(Tw + 2K) + (Tj + K + P + K) + [Tb + K] + W
                                      (the GPU probe G, two warm-ups, the judge on the GPU, [...] with --data:
                                       the quick benchmark)

K = CHILD_KILL_S, W = OWN_WORK_S, P = DRIVER_PROBE_S, F = SEED_TIMEOUT_FACTOR, S = NVIDIA_SMI_S, H = HOSTNAME_S,
J = SAMPLER_JOIN_S, N = SERVING_CHILDREN, G = GPU_SMOKE_PROBE_S. ``python -m msgpu_verify limits COMMAND [ITS
ARGUMENTS]`` prints the worst case of exactly that command line (the command's own parser reads the arguments, its
defaults included).

The verify role's ``async:`` limits are these formulas, term by term over the same settings, plus one margin
(``verify_async_margin``), so a check's own limit always fires first and Python, not Ansible, records the HANG
(tests/unit/test_verify_limits.py renders the role's expressions and compares). Standard library only, Python 3.8,
and no import of the other msgpu_verify modules: any of them may import this one.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, Optional

# A child past its limit (_proc.kill_group, run_child): SIGTERM and up to 2 s grace, SIGKILL and up to 2 s, then up
# to 10 s for the pipe's last output: 14 s, rounded up.
CHILD_KILL_S = 15.0
# The command's own work around its children: the interpreter and its imports, reading MNIST's headers, writing the
# JSON. Bench assumes --data is already prepared (the role's "Prepare MNIST" task; otherwise the download's own
# limits, `mnist --timeout/--retries`, come on top).
OWN_WORK_S = 30.0
# The judge's driver probe (gpu_probe.py in its own child, on a GPU). judge.DRIVER_PROBE_TIMEOUT is the same number
# (a test keeps them equal); judge.py may import it from here.
DRIVER_PROBE_S = 60.0
# The benchmark's training child's limit without --timeout, and with --quick (bench_timeout_s): the defaults of
# `python -m msgpu_verify bench` (bench.run_bench runs its child under them).
BENCH_TIMEOUT_S = 900.0
BENCH_QUICK_TIMEOUT_S = 80.0
# The seed's script (bench --compare-seed) runs under this many times the benchmark's limit: it preprocesses every
# epoch and prints every step, so it is several times slower than ours.
SEED_TIMEOUT_FACTOR = 3
# `nvidia-smi -L` (distributed.count_gpus: the data-parallel launcher and Serving's --device auto).
NVIDIA_SMI_S = 30.0
# `hostname -I` (distributed.local_names).
HOSTNAME_S = 5.0
# The data-parallel launcher's GPU sampler: its last nvidia-smi query (10 s) ends within this join.
SAMPLER_JOIN_S = 15.0
# Serving's children, one per step (serving.STEPS: import, export, config, pipeline, server; a test keeps them equal).
SERVING_CHILDREN = 5
# gpu-smoke's first step, gpu_probe.py in a child (smoke.gpu_smoke's probe_timeout; a test keeps them equal).
GPU_SMOKE_PROBE_S = 120.0


def warmup_s(timeout_s: float) -> float:
    """``warmup --timeout T``: the identity lookup (min(120, T/4)) and the probe share T (the probe gets what is
    left, at least 1 s, inside W); each child may need K more to be killed."""
    return float(timeout_s) + 2 * CHILD_KILL_S + OWN_WORK_S


def judge_s(timeout_s: float, driver_probe: bool = True) -> float:
    """``judge --timeout T``: the probe child, then (on a GPU, unless --no-driver-probe) the driver probe's child."""
    probe = DRIVER_PROBE_S + CHILD_KILL_S if driver_probe else 0.0
    return float(timeout_s) + CHILD_KILL_S + probe + OWN_WORK_S


def bench_timeout_s(timeout_s: Optional[float], quick: bool) -> float:
    """The benchmark's training child's limit: ``timeout_s``, else BENCH_QUICK_TIMEOUT_S with --quick,
    BENCH_TIMEOUT_S without."""
    return float(timeout_s) if timeout_s else (BENCH_QUICK_TIMEOUT_S if quick else BENCH_TIMEOUT_S)


def bench_s(timeout_s: float, compare_seed: bool = False) -> float:
    """``bench --timeout T`` (T resolved: bench_timeout_s): the training child, then with --compare-seed the
    seed's child under SEED_TIMEOUT_FACTOR x T."""
    seed = SEED_TIMEOUT_FACTOR * float(timeout_s) + CHILD_KILL_S if compare_seed else 0.0
    return float(timeout_s) + CHILD_KILL_S + seed + OWN_WORK_S


def distributed_s(timeout_s: float, count_gpus: bool = True, sample_gpus: bool = True) -> float:
    """``distributed --timeout T``: nvidia-smi -L (unless --gpus), hostname -I, the mpirun job, the sampler's join
    (with --nvidia-smi)."""
    gpus = NVIDIA_SMI_S if count_gpus else 0.0
    join = SAMPLER_JOIN_S if sample_gpus else 0.0
    return gpus + HOSTNAME_S + float(timeout_s) + CHILD_KILL_S + join + OWN_WORK_S


def serving_s(timeout_s: float, count_gpus: bool = True) -> float:
    """``serving --timeout T`` (each step's limit): nvidia-smi -L (unless --device none), then one child per step."""
    gpus = NVIDIA_SMI_S if count_gpus else 0.0
    return gpus + SERVING_CHILDREN * (float(timeout_s) + CHILD_KILL_S) + OWN_WORK_S


def gpu_smoke_s(warmup_timeout_s: float, judge_timeout_s: float, bench_timeout_s: float, bench: bool = True) -> float:
    """``gpu-smoke``: the GPU probe, two warm-ups, the judge on the GPU, then (with --data) the quick benchmark, one
    after the other in one process (W once)."""
    steps = GPU_SMOKE_PROBE_S + CHILD_KILL_S
    steps += 2 * (warmup_s(warmup_timeout_s) - OWN_WORK_S) + judge_s(judge_timeout_s, True) - OWN_WORK_S
    steps += bench_s(bench_timeout_s, False) - OWN_WORK_S if bench else 0.0
    return steps + OWN_WORK_S


def constants() -> Dict[str, float]:
    """The fixed terms of the role's checks by name (the verify role's ``__verify_limits`` holds the same)."""
    return {
        "child_kill_s": CHILD_KILL_S,
        "own_work_s": OWN_WORK_S,
        "driver_probe_s": DRIVER_PROBE_S,
        "seed_timeout_factor": SEED_TIMEOUT_FACTOR,
        "nvidia_smi_s": NVIDIA_SMI_S,
        "hostname_s": HOSTNAME_S,
        "sampler_join_s": SAMPLER_JOIN_S,
        "serving_children": SERVING_CHILDREN,
        "gpu_smoke_probe_s": GPU_SMOKE_PROBE_S,
    }


COMMANDS = ("warmup", "judge", "bench", "distributed", "serving", "gpu-smoke")


def worst_case_s(args: argparse.Namespace) -> float:
    """The worst case of one parsed ``python -m msgpu_verify`` command line (its parser's Namespace)."""
    command = args.command
    if command == "warmup":
        return warmup_s(args.timeout)
    if command == "judge":
        return judge_s(args.timeout, args.device.upper() == "GPU" and not args.no_driver_probe)
    if command == "bench":
        return bench_s(bench_timeout_s(args.timeout, args.quick), args.compare_seed)
    if command == "distributed":
        return distributed_s(args.timeout, args.gpus is None, bool(args.nvidia_smi))
    if command == "serving":
        return serving_s(args.timeout, args.device != "none" and bool(args.nvidia_smi))
    if command == "gpu-smoke":
        return gpu_smoke_s(args.warmup_timeout, args.judge_timeout, args.bench_timeout, bool(args.data))
    raise ValueError(f"no worst case for {command!r}: allowed are {', '.join(COMMANDS)}")


def describe(args: argparse.Namespace) -> Dict[str, Any]:
    """What ``python -m msgpu_verify limits`` prints as JSON: the command, its worst case, the fixed terms."""
    return {"command": args.command, "worst_case_s": worst_case_s(args), "constants": constants()}
