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


def _mpi_user(host_vars: dict) -> str:
    return host_vars.get("openmpi_user") or host_vars.get("mindspore_user") or "msgpu"


def _hostfile(host_vars: dict) -> str:
    return host_vars.get("openmpi_hostfile") or "/etc/msgpu/mpi/hostfile"


def test_mpi_user_exists(host, host_vars):
    assert host.user(_mpi_user(host_vars)).exists


def test_mpi_hostfile_is_root_owned_and_world_readable(host, host_vars):
    hostfile = host.file(_hostfile(host_vars))
    assert hostfile.is_file
    assert (hostfile.user, hostfile.group, hostfile.mode) == ("root", "root", 0o644)


def test_mpi_hostfile_lists_this_host_with_a_slot_per_gpu(host, host_vars):
    """One `<address> slots=<n>` line per host; this host's line carries one of its own addresses
    and one slot per NVIDIA GPU (openmpi_slots_no_gpu, default 1, without a GPU)."""
    lines = [
        line.split()
        for line in host.file(_hostfile(host_vars)).content_string.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines and all(len(words) == 2 and words[1].startswith("slots=") for words in lines), lines
    own = set(host.check_output("hostname --all-ip-addresses").split()) | {host_vars.get("openmpi_address")}
    mine = [words for words in lines if words[0] in own]
    assert len(mine) == 1, f"this host ({sorted(a for a in own if a)}) in the hostfile: {lines}"
    # NVIDIA VGA or 3D controllers, as the stack preflight counts them (not a card's audio function).
    gpus = int(
        host.check_output(
            'for d in /sys/bus/pci/devices/*; do echo "$(cat $d/vendor):$(cat $d/class)"; done 2>/dev/null'
            " | grep -cE '^0x10de:0x030[02]' || true"
        )
    )
    expected = gpus or int(host_vars.get("openmpi_slots_no_gpu", 1))
    assert mine[0][1] == f"slots={expected}"
