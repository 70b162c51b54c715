"""The env rule: the shell the stack's env file gives (CUDA_HOME, PATH, LD_LIBRARY_PATH)."""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Optional, Tuple

from .core import Finding, Host


def shell_environment(env_file: str, timeout_s: float = 20.0) -> Tuple[Optional[Dict[str, str]], str]:
    """The environment a clean login-less bash has after sourcing ``env_file``, and what it printed."""
    clean = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    try:
        proc = subprocess.run(
            ["bash", "-c", '. "$1" 1>&2; env -0', "msgpu-doctor", env_file],
            env=clean,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    env: Dict[str, str] = {}
    for item in proc.stdout.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            env[key] = value
    return env, proc.stderr.decode("utf-8", "replace").strip()


def rule_env(host: Host, env: Optional[Dict[str, str]], stderr: str) -> List[Finding]:
    if not host.env_file:
        return []
    if env is None or not host.path(host.env_file).is_file():
        return [
            Finding(
                "env-file-missing",
                "error",
                f"The stack's env file {host.env_file} is missing or cannot be sourced",
                [f"{host.env_file}: {'missing' if not host.path(host.env_file).is_file() else stderr}"],
                "Run `./toolkit provision` (role mindspore writes it, role cuda the CUDA one it sources).",
            )
        ]
    findings: List[Finding] = []
    cuda = host.expect.get("cuda") or {}
    home_expected = cuda.get("home", "")
    home = env.get("CUDA_HOME", "")
    shown_stderr = [f"it printed: {stderr[:300]}"] if stderr else []
    if not home:
        findings.append(
            Finding(
                "cuda-home-unset",
                "error",
                f"CUDA_HOME is not set in the shell of {host.env_file}",
                [f"`. {host.env_file}; echo $CUDA_HOME` is empty", *shown_stderr],
                f"The env file sources {cuda.get('env_file') or '/etc/msgpu/env/cuda-<ver>.sh'}, which exports "
                f"CUDA_HOME={home_expected or '<prefix>/cuda-<ver>'}; run `./toolkit provision` "
                "(role cuda rewrites it).",
            )
        )
    elif home_expected and os.path.normpath(home) != os.path.normpath(home_expected):
        findings.append(
            Finding(
                "cuda-home-wrong",
                "error",
                f"CUDA_HOME is {home}, not the stack's toolkit {home_expected}",
                [f"`. {host.env_file}; echo $CUDA_HOME` = {home}"],
                f"Source only {host.env_file} (it switches toolkits), or fix mindspore_cuda_prefix; "
                "`./toolkit provision` rewrites the env files.",
            )
        )
    path_dirs = [d for d in env.get("PATH", "").split(":") if d]
    nvcc = next((d for d in path_dirs if (host.path(d) / "nvcc").exists()), None)
    if nvcc is None:
        findings.append(
            Finding(
                "cuda-not-on-path",
                "error",
                f"CUDA (nvcc) is not on PATH in the shell of {host.env_file}",
                [
                    f"PATH={env.get('PATH', '')}",
                    f"no nvcc in any of those folders{' (' + home + '/bin)' if home else ''}",
                    *shown_stderr,
                ],
                f"The CUDA env file puts {home_expected or '$CUDA_HOME'}/bin on PATH; run `./toolkit provision` "
                "(role cuda) and source the env file.",
            )
        )
    lib64 = (home_expected or home).rstrip("/") + "/lib64"
    if (home_expected or home) and lib64 not in env.get("LD_LIBRARY_PATH", "").split(":"):
        findings.append(
            Finding(
                "ld-library-path-missing-cuda",
                "warning",
                f"LD_LIBRARY_PATH does not hold {lib64}",
                [f"LD_LIBRARY_PATH={env.get('LD_LIBRARY_PATH', '')}"],
                f"Source {host.env_file}; `./toolkit provision` rewrites it.",
            )
        )
    return findings
