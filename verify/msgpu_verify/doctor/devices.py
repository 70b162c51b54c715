"""The devices and mpi rules: which GPUs a process can see (CUDA_VISIBLE_DEVICES, device_id) and MPI ranks that
share one GPU."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from .core import Finding, Host, read_bytes


def gpu_count(host: Host) -> Tuple[Optional[int], str]:
    gpus = host.proc / "driver/nvidia/gpus"
    if gpus.is_dir():
        return len([p for p in gpus.iterdir() if p.is_dir()]), str(gpus)
    devices = [p for p in host.path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]
    if devices:
        return len(devices), host.shown(host.path("/dev")) + "/nvidia<N>"
    return None, ""


def _visible(value: Optional[str]) -> Optional[List[str]]:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def rule_devices(host: Host, env: Dict[str, str]) -> List[Finding]:
    findings: List[Finding] = []
    value = host.environ.get("CUDA_VISIBLE_DEVICES", env.get("CUDA_VISIBLE_DEVICES"))
    device_id = host.device_id
    if device_id is None and (host.environ.get("DEVICE_ID") or "").strip().isdigit():
        device_id = int(host.environ["DEVICE_ID"])
    count, count_from = gpu_count(host)
    visible = _visible(value)
    evidence = [f"CUDA_VISIBLE_DEVICES={value!r}" if value is not None else "CUDA_VISIBLE_DEVICES unset"]
    if device_id is not None:
        evidence.append(f"device_id {device_id} (DEVICE_ID / --device-id)")
    if count is not None:
        evidence.append(f"{count} GPU(s) in {count_from}")
    if visible is not None and (not visible or visible[0] in ("-1", "NoDevFiles")):
        if not host.expect.get("no_gpu"):
            findings.append(
                Finding(
                    "cuda-visible-devices-empty",
                    "error",
                    "CUDA_VISIBLE_DEVICES hides every GPU",
                    evidence,
                    "Unset CUDA_VISIBLE_DEVICES or list the GPUs to use (e.g. `export CUDA_VISIBLE_DEVICES=0,1`).",
                )
            )
        return findings
    if visible and count:
        wrong = [v for v in visible if v.isdigit() and int(v) >= count]
        if wrong:
            findings.append(
                Finding(
                    "cuda-visible-devices-out-of-range",
                    "error",
                    f"CUDA_VISIBLE_DEVICES names GPU {', '.join(wrong)}, but the host has {count}",
                    evidence,
                    f"Use indices 0..{count - 1} (`nvidia-smi -L` lists them).",
                )
            )
    available = len(visible) if visible is not None else count
    if device_id is not None and available is not None and device_id >= available:
        findings.append(
            Finding(
                "device-id-not-visible",
                "error",
                f"device_id {device_id} is not among the {available} GPU(s) this process can see",
                evidence,
                "MindSpore's device_id counts inside CUDA_VISIBLE_DEVICES: with CUDA_VISIBLE_DEVICES="
                f"{value or '<list>'} use device_id 0..{max(available - 1, 0)} "
                "(`context.set_context(device_id=...)` or DEVICE_ID), or widen CUDA_VISIBLE_DEVICES.",
            )
        )
    return findings


def mpi_ranks(host: Host) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Processes that are MPI ranks (OpenMPI or PMIx environment), with the GPUs they could use, and the
    processes whose environment this user may not read (another user's, without root's ptrace right)."""
    ranks: List[Dict[str, Any]] = []
    unreadable: List[str] = []
    try:
        pids = [p for p in os.listdir(host.proc) if p.isdigit()]
    except OSError:
        return ranks, unreadable
    for pid in pids:
        try:
            raw: Optional[bytes] = (host.proc / pid / "environ").read_bytes()
        except PermissionError:
            unreadable.append(pid)
            continue
        except OSError:
            continue
        if not raw or (b"OMPI_COMM_WORLD_RANK=" not in raw and b"PMIX_RANK=" not in raw):
            continue
        env = dict(item.decode("utf-8", "replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)
        rank = env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK")
        job = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid") or env.get("OMPI_MCA_orte_ess_jobid", "?")
        opened: List[str] = []
        try:
            for fd in os.listdir(host.proc / pid / "fd"):
                target = os.readlink(str(host.proc / pid / "fd" / fd))
                if re.fullmatch(r"/dev/nvidia\d+", target):
                    opened.append(target)
        except OSError:
            pass
        cmdline = (read_bytes(host.proc / pid / "cmdline") or b"").replace(b"\0", b" ").decode("utf-8", "replace")
        ranks.append(
            {
                "pid": int(pid),
                "job": job,
                "rank": rank,
                "local_rank": env.get("OMPI_COMM_WORLD_LOCAL_RANK"),
                "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                "device_id": env.get("DEVICE_ID"),
                "opened": sorted(set(opened)),
                "cmdline": cmdline.strip()[:200],
            }
        )
    return ranks, unreadable


def _effective_gpu(rank: Dict[str, Any]) -> Optional[str]:
    if rank["opened"]:
        return ",".join(rank["opened"])
    visible = _visible(rank["cuda_visible_devices"])
    device = rank["device_id"]
    if visible is None or not visible:
        return None  # the program may pick its GPU itself (set_context(device_id=local rank)): cannot tell
    index = int(device) if device is not None and str(device).isdigit() else 0
    if len(visible) == 1 or device is not None:
        return visible[index] if index < len(visible) else None
    return None


def rule_mpi(host: Host) -> List[Finding]:
    ranks, unreadable = mpi_ranks(host)
    by_job: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for rank in ranks:
        by_job.setdefault(rank["job"], {}).setdefault(str(rank["rank"]), rank)
    findings: List[Finding] = []
    for job, members in sorted(by_job.items()):
        if len(members) < 2:
            continue
        gpus = {r: _effective_gpu(m) for r, m in members.items()}
        known = [g for g in gpus.values() if g is not None]
        if len(known) == len(members) and len(set(known)) == 1:
            findings.append(
                Finding(
                    "mpi-ranks-one-gpu",
                    "error",
                    f"All {len(members)} MPI ranks of job {job} use the same GPU ({known[0]})",
                    [
                        "pid {pid} rank {rank}: CUDA_VISIBLE_DEVICES={cuda_visible_devices} DEVICE_ID={device_id} "
                        "opened {opened} ({cmdline})".format(**m)
                        for _, m in sorted(members.items())
                    ],
                    "Give each rank its own GPU: in the script "
                    "`context.set_context(device_id=int(os.environ['OMPI_COMM_WORLD_LOCAL_RANK']))` and do not "
                    "pass one "
                    "fixed CUDA_VISIBLE_DEVICES/DEVICE_ID to every rank (`mpirun -x CUDA_VISIBLE_DEVICES=0` does).",
                )
            )
    if unreadable:
        findings.append(
            Finding(
                "processes-unreadable",
                "info",
                f"The environment of {len(unreadable)} process(es) of other users cannot be read",
                [f"{host.proc}/<pid>/environ: permission denied for pid {', '.join(sorted(unreadable, key=int)[:10])}"],
                "Run the doctor as root (`./toolkit doctor` does) to check every MPI rank's GPU binding.",
            )
        )
    return findings
