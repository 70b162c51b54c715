"""NVIDIA driver: packages held, nouveau blacklisted, and the DKMS module built and installed
for every kernel that has headers — including kernels whose headers arrived after the driver."""

from __future__ import annotations

import re

import pytest
from conftest import CATALOG

DEFAULT_STACK = CATALOG["stacks"][CATALOG["default_stack"]]
DEFAULT_BRANCH = CATALOG["driver"][DEFAULT_STACK["driver_branch"]]
DKMS_LINE = re.compile(r"^[^,]+, [^,]+, ([^,]+), [^:]+: installed", re.MULTILINE)


def kernels_with_headers(host) -> list[str]:
    out = host.check_output("for d in /lib/modules/*; do [ -e $d/build/Makefile ] && basename $d; done; true")
    return out.split()


@pytest.mark.parametrize("package", DEFAULT_BRANCH["distro"]["packages"])
def test_driver_package_installed_and_held(host, package):
    assert host.package(package).is_installed
    name, selection = host.check_output(f"dpkg --get-selections {package}").split()
    assert (name.split(":")[0], selection) == (package, "hold")  # multi-arch packages print name:amd64


def test_packages_match_the_stack(host, stack):
    for package in stack["driver"]["packages"]:
        assert host.package(package).is_installed, package


def test_every_kernel_with_headers_has_the_module(host, stack):
    kernels = kernels_with_headers(host)
    assert kernels, "no kernel headers installed"
    built = DKMS_LINE.findall(host.check_output(f"dkms status -m {stack['driver']['dkms_module']}"))
    assert sorted(built) == sorted(kernels)


def test_module_files_exist_for_every_kernel(host, stack):
    for kernel in kernels_with_headers(host):
        module = host.file(f"/lib/modules/{kernel}/updates/dkms/{stack['driver']['dkms_module']}.ko")
        assert module.is_file, module.path


def test_module_version_is_the_branch(host, stack):
    kernel = kernels_with_headers(host)[0]
    version = host.check_output(f"modinfo -k {kernel} -F version {stack['driver']['dkms_module']}")
    assert version.split(".")[0] == stack["driver"]["branch"]


def test_nouveau_is_blacklisted(host):
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf")
    assert conf.is_file and conf.user == "root" and conf.mode == 0o644
    assert "blacklist nouveau" in conf.content_string


def test_libcuda_is_in_the_linker_cache(host):
    assert "libcuda.so.1" in host.check_output("ldconfig -p")


def test_nvidia_smi_is_installed(host):
    assert host.exists("nvidia-smi")
