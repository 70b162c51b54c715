"""Settings that change what the roles leave on a host, each converged once on the provisioned host
(molecule default's) and then turned back, so the modules that follow see the stack as provisioned:

- `nvidia_driver_hold: false`: the driver packages are released for apt's upgrades (dpkg selection
  "install"); the default run holds them again;
- `cuda_profile_d: true`: /etc/profile.d/msgpu-cuda.sh sources the default toolkit's env file, so a login
  shell finds nvcc; the default run removes it, and a login shell finds no toolkit.
"""

from __future__ import annotations

from pathlib import Path

from tests.system.conftest import CATALOG, changed, on_host, playbook

STACK = CATALOG["stacks"][CATALOG["default_stack"]]
DRIVER_PACKAGES = CATALOG["driver"][STACK["driver_branch"]]["distro"]["packages"]
PROFILE = "/etc/profile.d/msgpu-cuda.sh"


def selections(host: str) -> dict[str, str]:
    """dpkg's selection (hold / install) of each of the stack's driver packages."""
    shown = on_host(host, "dpkg --get-selections " + " ".join(DRIVER_PACKAGES)).stdout.split("\n")
    return {fields[0].split(":")[0]: fields[1] for fields in map(str.split, shown) if len(fields) == 2}


def login_shell(host: str) -> str:
    """What a login shell of the MPI/venv user finds: nvcc's path and CUDA_HOME."""
    found = on_host(host, "su - msgpu -c 'command -v nvcc; echo \"CUDA_HOME=${CUDA_HOME:-}\"'")
    assert found.returncode in (0, 1), found.stderr
    return found.stdout


def test_hold_off_and_profile_d_on_converge_and_the_defaults_come_back(inventory: Path, host: str) -> None:
    """Both settings in one run (the driver and the CUDA role), then the provisioned settings in one more."""
    cuda_home = f"/usr/local/cuda-{STACK['cuda']}"
    tags = "preflight,nvidia_driver,cuda"
    assert selections(host) == dict.fromkeys(DRIVER_PACKAGES, "hold"), selections(host)
    assert on_host(host, f"test -e {PROFILE}").returncode != 0
    assert f"{cuda_home}/bin/nvcc" not in login_shell(host)

    proc, wall = playbook(inventory, {"nvidia_driver_hold": False, "cuda_profile_d": True}, tags)
    print(f"nvidia_driver_hold false, cuda_profile_d true: {wall:.1f} s")
    assert changed(proc, host) > 0
    assert selections(host) == dict.fromkeys(DRIVER_PACKAGES, "install"), selections(host)
    assert not set(DRIVER_PACKAGES) & set(on_host(host, "apt-mark showhold").stdout.split())
    assert on_host(host, f"stat -c '%U:%G %a' {PROFILE}").stdout.strip() == "root:root 644"
    shell = login_shell(host)
    assert f"{cuda_home}/bin/nvcc" in shell and f"CUDA_HOME={cuda_home}" in shell, shell

    proc, wall = playbook(inventory, {}, tags)
    print(f"back to the provisioned settings: {wall:.1f} s")
    assert changed(proc, host) > 0
    assert selections(host) == dict.fromkeys(DRIVER_PACKAGES, "hold"), selections(host)
    assert on_host(host, f"test -e {PROFILE}").returncode != 0
    assert f"{cuda_home}/bin/nvcc" not in login_shell(host)
