"""OpenMPI: the stack's release, usable by an ordinary user (mpirun must not run as root)."""

from __future__ import annotations

import pytest
from conftest import CATALOG

DEFAULT_STACK = CATALOG["stacks"][CATALOG["default_stack"]]
PACKAGES = CATALOG["openmpi"][DEFAULT_STACK["openmpi"]]["distro"]["ubuntu-20.04"]


@pytest.mark.parametrize("package", PACKAGES)
def test_package_installed_at_stack_release(host, stack, package):
    pkg = host.package(package)
    assert pkg.is_installed
    assert pkg.version.split("-")[0] == stack["openmpi"]["version"]


def test_mpirun_reports_stack_release(host, stack):
    out = host.check_output("mpirun --version")
    assert f"(Open MPI) {stack['openmpi']['version']}" in out


def test_mpi_library_is_in_the_linker_cache(host):
    assert "libmpi.so.40" in host.check_output("ldconfig -p")


def test_two_ranks_run_as_an_unprivileged_user(host):
    """A real 2-process MPI job, as `nobody`: proves the runtime works without root."""
    cmd = host.run(
        "cd /tmp && su -s /bin/sh nobody -c 'HOME=/tmp mpirun --oversubscribe -np 2 printenv OMPI_COMM_WORLD_RANK'"
    )
    assert cmd.rc == 0, cmd.stderr
    assert sorted(cmd.stdout.split()) == ["0", "1"]
