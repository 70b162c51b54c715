"""Preflight against real containers: it refuses bad settings and unsuitable hosts with a
message that names the variable, and in every case the host is left exactly as it was."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from testbed import fingerprint, sandbox, scenarios
from tests.conftest import RESOLVER_REFUSALS, ROOT, unpinned_files

from .conftest import Host, pinned_stand_ins, refuse_together, run_playbook

# The stand-in checksums the test inventories carry, less those of the vendor's MindSpore wheels.
_NVIDIA_ONLY = {
    name: "ab" * 32
    for name in unpinned_files(yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text()))
    if not name.startswith("mindspore")
}


def test_good_configuration_passes_and_changes_nothing(focal_host, inventory_for):
    before = focal_host.fingerprint()
    result = run_playbook("preflight.yml", inventory_for(focal_host))
    assert result.rc == 0, result.output
    assert "ms1.5-cuda11.1: mindspore-gpu 1.5.1 (cp38)" in result.output
    assert "installed already: none of its parts." in " ".join(result.output.split())
    assert "changed=0" in result.output
    assert focal_host.fingerprint() == before


def test_a_local_copy_that_is_not_its_pin_is_refused_before_any_host_changes(focal_host, inventory_for, tmp_path):
    """stack_local_artifacts: the user's copy of a pinned file (the seed's cuDNN tarball, pinned by the catalog)
    is hashed on the controller in the preflight, with the controller's artifact cache off; a wrong copy stops
    the run naming the setting, both sums and the pin. The same copy with its own sum given passes."""
    from testbed.fixtures import sha256_file

    name = scenarios.CATALOG["cudnn"]["8.0.5"]["tarball"]["file"]
    copy = tmp_path / name
    copy.write_bytes(b"not NVIDIA's cuDNN\n")
    got = sha256_file(copy)
    before = focal_host.fingerprint()
    result = run_playbook(
        "site.yml", inventory_for(focal_host, group_vars={"stack_local_artifacts": {name: str(copy)}})
    )
    output = " ".join(result.output.split())
    assert result.rc != 0
    assert (
        f"stack_local_artifacts.{name}: '{copy}' has sha256 {got}, but {name} is pinned to "
        f"{scenarios.CATALOG['cudnn']['8.0.5']['tarball']['sha256']} by the catalog's sha256 (Spack cudnn recipe"
    ) in output
    assert "PLAY [NVIDIA driver]" not in result.output
    # The user's own sum for the file: its copy matches, the preflight passes.
    result = run_playbook(
        "preflight.yml",
        inventory_for(
            focal_host,
            group_vars={"stack_local_artifacts": {name: str(copy)}, "stack_artifact_checksums": {name: got}},
        ),
    )
    assert result.rc == 0, result.output[-4000:]
    assert focal_host.fingerprint() == before


# Bookkeeping, not state: apt's package lists are refreshed even in --check (metadata the dry run
# needs to know the packages), apt logs its simulated installs (/var/log/apt), and Ansible keeps its
# async job status in ~/.ansible_async (as it keeps its temp files in ~/.ansible).
APT_METADATA = ("/var/lib/apt/lists", "/var/cache/apt", "/var/log/apt", "/root/.ansible_async")


# apt's metadata is pruned from the walk (its parents are listed either way, as for Ansible's own folders).
CHECK_FINGERPRINT = fingerprint.script(marker="/msgpu-marker", prune=(*fingerprint.PRUNE, *APT_METADATA))


def _without_apt_metadata(host: Host) -> list[str]:
    result = host.sh(CHECK_FINGERPRINT)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


RECAP = re.compile(r"^(\S+)\s*:\s*ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


@pytest.fixture(scope="module")
def check_mode_run(tmp_path_factory, catalog):
    """One fresh host per molecule scenario, each with that scenario's install methods, and ONE
    `site.yml --check --diff` over all of them (the hosts run in parallel, as a fleet would): the
    fingerprints of every host before and after, and the run."""
    hosts = {scenario: Host(f"msgpu-it-check-{scenario.replace('_', '-')}") for scenario in scenarios.SCENARIO_VARS}
    try:
        for host in hosts.values():
            sandbox.start_host(host.name)
            assert host.sh("touch /msgpu-marker").returncode == 0
        before = {scenario: _without_apt_metadata(host) for scenario, host in hosts.items()}
        inventory = sandbox.write_inventory(
            tmp_path_factory.mktemp("check-mode") / "inventory.yml",
            [host.name for host in hosts.values()],
            {
                "stack_artifact_checksums": {name: "ab" * 32 for name in unpinned_files(catalog)},
                "stack_artifact_cache_dir": "",
            },
            host_vars={host.name: scenarios.SCENARIO_VARS[scenario] for scenario, host in hosts.items()},
        )
        result = run_playbook("site.yml", inventory, args=["--check", "--diff"])
        after = {scenario: _without_apt_metadata(host) for scenario, host in hosts.items()}
        yield hosts, before, result, after
    finally:
        for host in hosts.values():
            sandbox.stop_host(host.name)


@pytest.mark.parametrize("scenario", list(scenarios.SCENARIO_VARS))
def test_check_mode_changes_nothing_for_each_scenarios_methods(check_mode_run, scenario):
    """site.yml --check --diff with each molecule scenario's install methods on a fresh host: it
    completes, and the host is unchanged (package database and every file, apt's lists aside)."""
    hosts, before, result, after = check_mode_run
    name = hosts[scenario].name
    assert result.rc == 0, result.output[-5000:]
    recap = {host: (int(unreachable), int(failed)) for host, unreachable, failed in RECAP.findall(result.output)}
    assert recap.get(name) == (0, 0), (name, recap, result.output[-5000:])
    assert after[scenario] == before[scenario]


# Refusals through site.yml on a real host, each with the texts ONE line of its refusal must carry.
REFUSALS = [
    pytest.param(
        {"stack_name": "ms9.9-cuda99"},
        [
            "stack_name: 'ms9.9-cuda99' is not in the catalog",
            "allowed: ms1.5-cuda11.1, ms1.10-cuda11.1, ms2.0-cuda11.1, ms2.2-cuda11.6",
        ],
        id="unknown-stack",
    ),
    pytest.param(
        {"stack_name": "ms2.2-cuda11.6", "stack_cudnn_version": "8.0.5"},
        ["stack_cudnn_version:", "not CUDA 11.6", "allowed for CUDA 11.6: 8.5.0"],
        id="cudnn-vs-cuda",
    ),
    pytest.param(
        {"stack_name": "ms2.2-cuda11.6", "stack_driver_branch": "470"},
        ["stack_driver_branch:", "below the minimum 510.39.01", "allowed: 510, 525, 535, 570"],
        id="driver-below-cuda",
    ),
    pytest.param(
        {"stack_cudnn_method": "wheel"},
        ["stack_cudnn_method: cuDNN 8.0.5 has no 'wheel' artifact", "allowed for it: tarball, cuda_repo"],
        id="method-not-for-version",
    ),
    pytest.param(
        {"stack_cudnn_method": "conda"},
        ['stack_cudnn_method: "conda" is not allowed', "allowed: tarball, cuda_repo, wheel"],
        id="unknown-method",
    ),
    pytest.param(
        {"stack_no_gpu": "maybe"},
        ['stack_no_gpu: "maybe" is not allowed', "allowed: true or false"],
        id="not-a-bool",
    ),
    pytest.param(
        {"stack_python": "/usr/bin/python2.7"},
        ["stack_python '/usr/bin/python2.7' is cp27", "has wheels for cp37, cp38, cp39 only"],
        id="python-without-wheel",
    ),
    pytest.param(
        {"stack_python": "/opt/python3.9/bin/python3"},
        ["stack_python", "does not run on this host", "Allowed: an interpreter with one of those tags"],
        id="python-missing",
    ),
    pytest.param(
        {"stack_no_gpu": False},
        ["no NVIDIA GPU on the PCI bus", "stack_no_gpu: true", "allowed: true, false"],
        id="no-gpu",
    ),
    pytest.param(
        {"stack_mindspore_version": "1.5.0", "stack_artifact_checksums": _NVIDIA_ONLY},
        [
            "stack_artifact_checksums.mindspore_gpu-1.5.0-cp38-cp38-linux_x86_64.whl:",
            "allowed: the sha256 of your copy",
            "stack_local_artifacts",
        ],
        id="unpinned-vendor-wheel",
    ),
    pytest.param(
        {"stack_install_prefix": "/nonexistent"},
        ["stack_install_prefix '/nonexistent' does not exist"],
        id="bad-prefix",
    ),
]


@pytest.fixture(scope="module")
def refused(focal_host, catalog, tmp_path_factory):
    """Every case of REFUSALS and of the resolver's unit tests (RESOLVER_REFUSALS), refused by site.yml on
    the same container (conftest.refuse_together: a few runs instead of one per case), and the host's
    fingerprint before and after all of them."""
    cases = {f"refusal-{param.id}": param.values[0] for param in REFUSALS}
    for param in RESOLVER_REFUSALS:
        settings = param.values[0]
        cases[f"resolver-{param.id}"] = {
            ("stack_name" if key == "name" else f"stack_{key}"): value for key, value in settings.items()
        }
    before = focal_host.fingerprint()
    found = refuse_together(focal_host, tmp_path_factory.mktemp("refusals"), cases, pinned_stand_ins(catalog))
    return found, before, focal_host.fingerprint()


@pytest.mark.parametrize(("extra_vars", "expected"), REFUSALS)
def test_refusal_names_the_variable_and_leaves_the_host_unchanged(refused, request, extra_vars, expected):
    """One refusal line carries every expected text: the variable with what is wrong and what is allowed,
    not words scattered over the output (another line may carry an "allowed:" of its own)."""
    found, before, after = refused
    case = found.get(f"refusal-{request.node.callspec.id}")
    assert case is not None, (extra_vars, "was not refused", sorted(found))
    assert any(all(text in line for text in expected) for line in case.lines), (expected, case.lines)
    assert after == before


@pytest.mark.parametrize(("settings", "variable", "allowed"), RESOLVER_REFUSALS)
def test_configuration_refusal_leaves_the_host_unchanged(refused, request, settings, variable, allowed):
    """Every refusal of the resolver's unit tests, this time through site.yml on a real host."""
    found, before, after = refused
    case = found.get(f"resolver-{request.node.callspec.id}")
    assert case is not None, (settings, "was not refused", sorted(found))
    # The refusal line of this very variable says what is allowed (as the resolver's unit test demands of
    # its errors): the preflight's own message, also for a value outside an argument spec's choices.
    mine = [line for line in case.lines if line.startswith(f"{variable}: ")]
    assert any(allowed in line for line in mine), (variable, allowed, case.lines)
    # Refused on the controller, before any host is contacted.
    assert "Gather the facts the checks need" not in case.output
    assert after == before


def test_disk_check_counts_only_the_parts_not_yet_installed(focal_host, inventory_for):
    """/dev/shm is a 64 MiB tmpfs in every Docker container: far too small for a new stack, enough
    for a re-run once the parts' install markers are there (a converged host on a nearly full disk).
    With the real catalog's figures (the test bed's hosts use a copy with the fixture toolkit's size)."""
    prefix = "/dev/shm/msgpu-prefix"
    settings = {"stack_install_prefix": prefix, "stack_catalog_file": str(ROOT / "catalog" / "stacks.yml")}
    assert focal_host.sh(f"mkdir -p {prefix}").returncode == 0
    try:
        empty = run_playbook("preflight.yml", inventory_for(focal_host), settings)
        assert empty.rc != 0
        flat = " ".join(empty.output.split())
        assert f"stack_install_prefix '{prefix}' has" in flat
        assert "needs 10800 MiB more there (CUDA 11.1, cuDNN 8.0.5, NCCL 2.14.3; 10800 MiB in all)" in flat

        markers = ("cuda-11.1/.msgpu-installed", "cuda-11.1/.msgpu-cudnn")
        assert focal_host.sh(f"mkdir -p {prefix}/cuda-11.1 && cd {prefix} && touch {' '.join(markers)}").returncode == 0
        partial = run_playbook("preflight.yml", inventory_for(focal_host), settings)
        assert partial.rc != 0
        assert "needs 300 MiB more there (NCCL 2.14.3; 10800 MiB in all)" in " ".join(partial.output.split())

        assert focal_host.sh(f"touch {prefix}/cuda-11.1/.msgpu-nccl").returncode == 0
        complete = run_playbook("preflight.yml", inventory_for(focal_host), settings)
        assert complete.rc == 0, complete.output[-3000:]
        assert "installed already: CUDA 11.1, cuDNN 8.0.5, NCCL 2.14.3." in " ".join(complete.output.split())
    finally:
        focal_host.sh(f"rm -rf {prefix}")


def test_unsupported_os_is_refused(bullseye_host, inventory_for):
    before = bullseye_host.fingerprint()
    result = run_playbook("site.yml", inventory_for(bullseye_host))
    assert result.rc != 0
    flat = " ".join(result.output.split())
    assert "the operating system Debian 11" in flat, flat
    assert "(facts ansible_distribution/ansible_distribution_version) is not supported; allowed: ubuntu-20.04" in flat
    assert bullseye_host.fingerprint() == before


def test_inventory_without_the_group_is_refused(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"children": {"webservers": {"hosts": {"web1": {}}}}}}))
    result = run_playbook("site.yml", inventory)
    assert result.rc != 0
    flat = " ".join(result.output.split())
    assert "stack_group: the inventory has no hosts in group 'gpu_servers'" in flat, flat
    assert "webservers" in flat


def test_bad_global_setting_stops_every_host(focal_host, bullseye_host, inventory_for):
    """Config errors are fatal for all hosts before any host is even contacted."""
    result = run_playbook("site.yml", inventory_for(focal_host, bullseye_host), {"stack_name": "nope"})
    assert result.rc != 0
    assert "Gather the facts the checks need" not in result.output


def test_an_unreachable_host_does_not_stop_the_others(focal_host, inventory_for):
    """One host of the fleet is down (a container that does not exist): the others run to the end and
    the recap names the unreachable one; the run's exit status says something went wrong."""
    gone = Host("msgpu-it-gone")
    result = run_playbook("preflight.yml", inventory_for(focal_host, gone, down=(gone,)))
    assert result.rc != 0, result.output[-3000:]
    recap = dict(re.findall(r"^(msgpu-it-\S+)\s*:\s*(ok=.*)$", result.output, re.M))
    assert re.search(r"unreachable=1\b", recap.get(gone.name, "")), result.output[-3000:]
    assert re.search(r"unreachable=0\s+failed=0\b", recap.get(focal_host.name, "")), result.output[-3000:]
    assert "ms1.5-cuda11.1: mindspore-gpu 1.5.1 (cp38)" in result.output
    assert "installed already: none of its parts." in " ".join(result.output.split())
