"""The doctor's core: a finding, the host it reads (its roots, what the stack expects, a per-run cache) and
the two file readers every rule uses. Standard library only, Python 3.8."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

SEVERITIES = ("error", "warning", "info")


# The GPU probe (gpu_probe.py: libcuda and NVML through ctypes, no MindSpore) runs through the judge's
# run_driver_probe, in a child with a hard timeout: a broken driver can hang in cuInit.
GPU_PROBE_TIMEOUT = 30.0


@dataclass
class Finding:
    id: str
    severity: str
    title: str
    evidence: List[str]
    fix: str

    def as_dict(self) -> Dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
        }


@dataclass
class Host:
    """Where the doctor reads from, and what the stack expects (empty when no --expect was given)."""

    root: Path = Path("/")
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    expect: Dict[str, Any] = field(default_factory=dict)
    env_file: str = ""
    kernel: str = ""
    environ: Dict[str, str] = field(default_factory=dict)
    device_id: Optional[int] = None
    # nvidia-smi to ask (`-q`): None finds it (PATH, or <root>/usr/bin/nvidia-smi under a substituted
    # root, where a stand-in can print a real GPU host's output); '' asks none.
    nvidia_smi: Optional[str] = None
    # The GPU probe: None runs it on the real root only (a substituted tree's libraries are not this
    # machine's), True always, False never; libcuda/libnvml ('' = the probe's default) name the libraries.
    gpu_probe: Optional[bool] = None
    gpu_probe_timeout_s: float = GPU_PROBE_TIMEOUT
    libcuda: str = ""
    libnvml: str = ""
    cache: Dict[str, Any] = field(default_factory=dict)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def shown(self, path: Path) -> str:
        """A path as the evidence shows it: absolute on the host when the root is substituted."""
        try:
            return "/" + str(path.relative_to(self.root)) if self.root != Path("/") else str(path)
        except ValueError:
            return str(path)


Rule = Callable[[Host], List[Finding]]


def read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_bytes(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:
        return None
