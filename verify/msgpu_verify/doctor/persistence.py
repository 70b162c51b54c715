"""The persistence rule: persistence mode per GPU (`nvidia-smi -q`, NVML through the GPU probe) and how
systemd would start nvidia-persistenced, as the cause."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .core import Finding, Host, read_bytes
from .probe_record import probe_nvml_devices
from .systemd import SYSTEMD_UNIT_DIRS, exec_argv, host_unit, unit_bool

PERSISTENCED_UNIT = "nvidia-persistenced.service"


# The nvidia_driver role's drop-in for Ubuntu's unit (distro and cuda_repo methods).
PERSISTENCED_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/msgpu-persistence.conf"


def persistence_mode_in(argv: Sequence[str]) -> bool:
    """Whether nvidia-persistenced started with ``argv`` turns persistence mode on: its default, unless a
    --no-persistence-mode comes after the last --persistence-mode."""
    mode = True
    for arg in argv:
        if arg == "--persistence-mode":
            mode = True
        elif arg == "--no-persistence-mode":
            mode = False
    return mode


def persistenced_processes(host: Host) -> List[Tuple[int, List[str]]]:
    """(pid, argv) of every running nvidia-persistenced."""
    found: List[Tuple[int, List[str]]] = []
    try:
        pids = sorted((p for p in os.listdir(host.proc) if p.isdigit()), key=int)
    except OSError:
        return found
    for pid in pids:
        raw = read_bytes(host.proc / pid / "cmdline") or b""
        argv = [arg.decode("utf-8", "replace") for arg in raw.rstrip(b"\0").split(b"\0")] if raw else []
        if argv and os.path.basename(argv[0]) == "nvidia-persistenced":
            found.append((int(pid), argv))
    return found


def nvidia_smi_program(host: Host) -> Optional[str]:
    if host.nvidia_smi is not None:
        return host.nvidia_smi or None
    if host.root != Path("/"):
        stand_in = str(host.path("/usr/bin/nvidia-smi"))
        return stand_in if os.access(stand_in, os.X_OK) else None
    found = shutil.which("nvidia-smi")
    return found or ("/usr/bin/nvidia-smi" if os.access("/usr/bin/nvidia-smi", os.X_OK) else None)


def nvidia_smi_query(host: Host, timeout_s: float = 30.0) -> Tuple[Optional[str], str]:
    """`nvidia-smi -q` (asked once per run), or None and why it did not answer."""
    if "nvidia_smi_q" in host.cache:
        return host.cache["nvidia_smi_q"]
    program = nvidia_smi_program(host)
    answer: Tuple[Optional[str], str]
    if not program:
        answer = None, "no nvidia-smi on this host"
    else:
        try:
            done = subprocess.run(
                [program, "-q"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            answer = None, f"`{program} -q` did not answer within {timeout_s:.0f} s"
        except OSError as exc:
            answer = None, f"`{program} -q` cannot run: {exc}"
        else:
            text = done.stdout.decode("utf-8", "replace")
            if done.returncode == 0:
                answer = text, f"`{program} -q`"
            else:
                answer = None, f"`{program} -q` exited with {done.returncode}: {text.strip()[-300:] or 'no output'}"
    host.cache["nvidia_smi_q"] = answer
    return answer


def gpu_persistence(text: str) -> List[Dict[str, str]]:
    """Each GPU of `nvidia-smi -q`: its bus id, product name and persistence mode (Enabled, Disabled)."""
    gpus: List[Dict[str, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        header = re.fullmatch(r"GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)", stripped)
        if header:
            gpus.append({"bus_id": header.group(1), "product": "", "persistence": ""})
            continue
        item = re.match(r"(Product Name|Persistence Mode)\s*:\s*(.*)$", stripped)
        if item and gpus:
            key = "product" if item.group(1) == "Product Name" else "persistence"
            gpus[-1][key] = gpus[-1][key] or item.group(2).strip()
    return gpus


def rule_persistence(host: Host) -> List[Finding]:
    """Persistence mode off on a GPU host, from `nvidia-smi -q` and NVML (the GPU probe's nvmlDeviceGetPersistenceMode:
    either answers when the other cannot; both are shown when both answer; or, when neither can, from how the
    running nvidia-persistenced was started), with how systemd would start the daemon as the cause."""
    if host.expect.get("no_gpu"):
        return []
    text, asked = nvidia_smi_query(host)
    gpus = gpu_persistence(text or "")
    off = [g for g in gpus if g["persistence"].lower() == "disabled"]
    nvml = [d for d in probe_nvml_devices(host) if d.get("persistence_mode") in ("on", "off")]
    nvml_off = [d for d in nvml if d["persistence_mode"] == "off"]
    daemons = persistenced_processes(host)
    daemons_off = [(pid, argv) for pid, argv in daemons if not persistence_mode_in(argv[1:])]
    if gpus or nvml:
        if not off and not nvml_off:
            return []
    elif not daemons_off:
        return []
    evidence: List[str] = []
    if gpus or nvml:
        evidence += [
            f"{asked}: GPU {gpu['bus_id']} ({gpu['product'] or '?'}): Persistence Mode : {gpu['persistence']}"
            for gpu in off[:8]
        ]
        if len(off) > 8:
            evidence.append(f"... and {len(off) - 8} more GPU(s) with Persistence Mode : Disabled")
        evidence += [
            "NVML (gpu_probe.py) nvmlDeviceGetPersistenceMode: GPU {} {}({}): off".format(
                d.get("index"), f"{d['pci_bus_id']} " if d.get("pci_bus_id") else "", d.get("name") or "?"
            )
            for d in nvml_off[:8]
        ]
        if len(nvml_off) > 8:
            evidence.append(f"... and {len(nvml_off) - 8} more GPU(s) NVML reports with persistence mode off")
        if not gpus:
            evidence.append(f"nvidia-smi gave no GPUs: {asked}")
        count, total = (len(off), len(gpus)) if gpus else (len(nvml_off), len(nvml))
        title = (
            f"Persistence mode is off on {count} of {total} GPU(s): every CUDA program waits for the driver "
            "to initialize them, and they are torn down again when the last one exits"
        )
    else:
        evidence.append(f"GPUs not asked: {asked}")
        title = "nvidia-persistenced runs with --no-persistence-mode: persistence mode is off"
    evidence += [f"{host.proc}/{pid}/cmdline: {' '.join(argv)}" for pid, argv in daemons]
    if not daemons:
        evidence.append(f"no nvidia-persistenced process runs ({host.proc}/<pid>/cmdline)")
    unit = host_unit(host, PERSISTENCED_UNIT)
    exec_start = unit.values("Service", "ExecStart")
    stop_when_unneeded = unit.value("Unit", "StopWhenUnneeded")
    if unit.path is None:
        evidence.append(f"no {unit.name} in {', '.join(SYSTEMD_UNIT_DIRS)}")
        cause = (
            f"There is no {unit.name}: the driver packages (nvidia-compute-utils-<branch>) install it, and for "
            "the runfile method the nvidia_driver role does."
        )
    else:
        evidence.append(
            f"{unit.name} as systemd merges {' + '.join(unit.sources)}: "
            f"ExecStart={exec_start[-1] if exec_start else '(none)'}; "
            f"StopWhenUnneeded={stop_when_unneeded if stop_when_unneeded is not None else 'false (default)'}"
        )
        unit_on = bool(exec_start) and persistence_mode_in(exec_argv(exec_start[-1])[1:])
        if not unit_on or unit_bool(stop_when_unneeded):
            cause = (
                "The unit starts the daemon with persistence mode off (and StopWhenUnneeded=true stops it again): "
                f"that is Ubuntu's packaged unit without the nvidia_driver role's drop-in {PERSISTENCED_DROPIN}."
            )
        else:
            cause = (
                "The unit would turn persistence mode on, but the daemon runs an older command line or does not "
                "run: `sudo systemctl daemon-reload && sudo systemctl enable nvidia-persistenced && "
                "sudo systemctl restart nvidia-persistenced`."
            )
    return [
        Finding(
            "persistence-mode-off",
            "warning",
            title,
            evidence,
            cause + " Keep nvidia_driver_persistence_mode: true (the default) and run `./toolkit provision`: the "
            f"nvidia_driver role writes {PERSISTENCED_DROPIN} ([Service] ExecStart= then ExecStart=/usr/bin/"
            "nvidia-persistenced --user nvidia-persistenced --persistence-mode --verbose; [Unit] "
            "StopWhenUnneeded=false; the runfile method's own unit runs the same command line), then enables "
            "and restarts nvidia-persistenced. Right now, until the next reboot: `sudo nvidia-smi -pm 1`.",
        )
    ]
