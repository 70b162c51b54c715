"""Run every rule in order into one JSON document, and render it for people."""

from __future__ import annotations

import socket
import time
from typing import Any, Dict, List, Optional

from .core import SEVERITIES, Finding, Host
from .devices import rule_devices, rule_mpi
from .driver import rule_driver
from .env import rule_env, shell_environment
from .gpu import rule_gpu_probe
from .gpu_code import rule_compute
from .kernel import rule_dkms, rule_nouveau, rule_secure_boot, running_kernel
from .libraries import rule_libraries
from .nccl import rule_nccl
from .packages import rule_python_packages
from .persistence import rule_persistence
from .probe_record import gpu_probe_record

RULES = (
    "nouveau",
    "dkms",
    "secure-boot",
    "driver",
    "persistence",
    "gpu-probe",
    "compute",
    "env",
    "libraries",
    "nccl",
    "python-packages",
    "devices",
    "mpi",
)


def diagnose(host: Host) -> Dict[str, Any]:
    """Run every rule; the JSON document (findings sorted by severity)."""
    started = time.monotonic()
    env: Optional[Dict[str, str]] = None
    stderr = ""
    if host.env_file:
        env, stderr = shell_environment(str(host.path(host.env_file)))
    shell = env or dict(host.environ)
    findings: List[Finding] = []
    findings += rule_nouveau(host)
    findings += rule_dkms(host)
    findings += rule_secure_boot(host)
    findings += rule_driver(host)
    findings += rule_persistence(host)
    findings += rule_gpu_probe(host)
    findings += rule_compute(host)
    findings += rule_env(host, env, stderr)
    findings += rule_libraries(host, shell)
    findings += rule_nccl(host, shell)
    findings += rule_python_packages(host, shell)
    findings += rule_devices(host, shell)
    findings += rule_mpi(host)
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    return {
        "host": host.expect.get("host") or socket.gethostname(),
        "stack": host.expect.get("stack"),
        "env_file": host.env_file,
        "kernel": running_kernel(host),
        "roots": {"root": str(host.root), "proc": str(host.proc), "sys": str(host.sys)},
        "rules": list(RULES),
        "counts": counts,
        "ok": counts["error"] == 0,
        "findings": [f.as_dict() for f in findings],
        "elapsed_s": round(time.monotonic() - started, 3),
        "expect": host.expect,
        "gpu_probe": gpu_probe_record(host),
    }


def render(document: Dict[str, Any]) -> str:
    """Human output: one summary line, then each finding with its evidence and fix."""
    counts = document["counts"]
    lines = [
        "doctor: {} (stack {}): {} error(s), {} warning(s), {} note(s) in {} s".format(
            document["host"],
            document.get("stack") or "?",
            counts["error"],
            counts["warning"],
            counts["info"],
            document["elapsed_s"],
        )
    ]
    probe = document.get("gpu_probe") or {}
    if probe:
        lines.append(
            "GPU probe (no MindSpore): "
            + str(probe.get("summary") or probe.get("verdict"))
            + (f": {probe.get('reason')}" if probe.get("state") == "ran" and probe.get("verdict") != "OK" else "")
        )
    for finding in document["findings"]:
        lines.append("")
        lines.append("{:<7} {}  [{}]".format(finding["severity"].upper(), finding["title"], finding["id"]))
        for item in finding["evidence"]:
            lines.append("        seen: " + item)
        lines.append("        fix:  " + finding["fix"])
    if not counts["error"] and not counts["warning"]:
        lines.append("")
        lines.append("No problems found by: " + ", ".join(document["rules"]) + ".")
    return "\n".join(lines)
