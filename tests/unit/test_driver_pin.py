"""The runfile method's apt pin (roles/nvidia_driver/templates/apt-pin-runfile-driver.j2) names the driver
packages with apt globs; the runfile install's refusal (install_runfile.yml) finds the same packages among
the installed ones with a regex. Both lists live in roles/nvidia_driver/vars/main.yml: here they must pick
the same names. The pin's effect on apt (`Candidate: (none)`) is checked on the runfile host
(verify/testinfra/test_nvidia_driver.py)."""

from __future__ import annotations

import fnmatch
import re

import pytest
import yaml

from tests.conftest import ROOT

VARS = yaml.safe_load((ROOT / "roles" / "nvidia_driver" / "vars" / "main.yml").read_text())
CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
REGEX = re.compile(VARS["__nvidia_driver_packaged_driver_regex"])
GLOBS = VARS["__nvidia_driver_packaged_driver_globs"]
TEMPLATE = (ROOT / "roles" / "nvidia_driver" / "templates" / "apt-pin-runfile-driver.j2").read_text()

# Names from Ubuntu 20.04's archive and NVIDIA's CUDA repository, pinned or not, beside the catalog's own.
OTHER_NAMES = [
    "nvidia-driver-470-server",
    "nvidia-headless-470",
    "nvidia-headless-no-dkms-535",
    "nvidia-kernel-common-535-server",
    "nvidia-kernel-source-470",
    "cuda-drivers-fabricmanager-470",
    "cuda-drivers",
    "nvidia-settings",
    "nvidia-prime",
    "nvidia-cuda-toolkit",
    "nvidia-utils",
    "libnvidia-gl-470",
    "libnvidia-compute",
    "nvidia-fabricmanager-470",
    "linux-modules-nvidia-470-generic",
    "libcudnn8",
    "xserver-xorg-video-nvidia-470",
]


def catalog_names() -> list[str]:
    names = []
    for branch in CATALOG["driver"].values():
        for method in ("distro", "cuda_repo"):
            names += (branch.get(method) or {}).get("packages", [])
    return names


def by_globs(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in GLOBS)


@pytest.mark.parametrize("name", catalog_names() + OTHER_NAMES)
def test_the_pin_globs_and_the_refusal_regex_pick_the_same_packages(name):
    assert by_globs(name) == bool(REGEX.match(name)), (name, GLOBS, REGEX.pattern)


def test_every_driver_package_of_the_catalog_is_pinned():
    names = catalog_names()
    assert names and all(by_globs(name) for name in names), [n for n in names if not by_globs(n)]
    assert not by_globs("nvidia-settings") and not by_globs("libnvidia-gl-470")


def test_the_pin_uses_globs_not_a_regex():
    """apt matches a regex pin against every package name at every apt call (~4 s on a runfile host of the
    test bed); the template writes the globs, space-separated on one Package line."""
    package_lines = [line for line in TEMPLATE.splitlines() if line.startswith("Package:")]
    assert package_lines == ["Package: {{ __nvidia_driver_packaged_driver_globs | join(' ') }}"], package_lines
    assert all("/" not in glob and " " not in glob for glob in GLOBS), GLOBS
