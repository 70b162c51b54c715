"""Multi-node MPI on the fleet: playbooks/openmpi.yml on every fleet container (hostfile,
passwordless SSH for the MPI user), then playbooks/mpi_check.yml runs one MPI job across them.

The `fleet` fixture (tests/fleet/conftest.py) gives fresh Ubuntu 20.04 containers on the Docker
network msgpu-fleet; they reach each other by address and by container name, as servers in a rack.
Tests run in file order: converge, state, the MPI job, refusals, then `state: absent` last.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from testbed import fleet as testbed_fleet  # noqa: E402
from testbed import sandbox  # noqa: E402
from tests.conftest import unpinned_files  # noqa: E402
from tests.integration.conftest import Host, pinned_stand_ins, refuse_together  # noqa: E402

MPI_USER = "msgpu"
HOSTFILE = "/etc/msgpu/mpi/hostfile"
CLUSTER_KEY = f"/home/{MPI_USER}/.ssh/id_ed25519_msgpu_mpi"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE)


@dataclass
class Run:
    rc: int
    output: str
    seconds: float

    def changed(self) -> dict[str, int]:
        return {host: int(changed) for host, changed, _, _ in RECAP.findall(self.output)}


@dataclass
class Cluster:
    hosts: list[str]
    inventory: Path
    results: Path
    addresses: dict[str, str]
    timings: dict[str, float] = field(default_factory=dict)


def playbook(name: str, inventory: Path, extra_vars: dict | None = None) -> Run:
    cmd = [str(Path(sys.prefix) / "bin" / "ansible-playbook"), "-i", str(inventory), str(ROOT / "playbooks" / name)]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    started = time.monotonic()
    result = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=ROOT, timeout=900)
    return Run(result.returncode, result.stdout + result.stderr, time.monotonic() - started)


def sh(host: str, script: str, user: str = "root") -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", "-u", user, host, "bash", "-c", script], text=True, capture_output=True)


def read(host: str, path: str) -> str:
    result = sh(host, f"cat {path}")
    assert result.returncode == 0, f"{host}: {path}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def cluster(fleet, catalog, tmp_path_factory) -> Cluster:
    """openmpi.yml converged twice on every fleet host (the second run is the idempotence check)."""
    # Hosts an earlier fleet test powered off (fleet.stopped) are not part of this cluster.
    hosts = list(getattr(fleet, "reachable", fleet.hosts))
    assert len(hosts) >= 2, f"a fleet of at least two hosts is needed, got {hosts}"
    work = tmp_path_factory.mktemp("mpi")
    pinned = {name: "ab" * 32 for name in unpinned_files(catalog)}
    inventory = sandbox.write_inventory(work / "inventory.yml", hosts, {"stack_artifact_checksums": pinned})
    made = Cluster(hosts, inventory, work / "results", {h: testbed_fleet.address(h) for h in hosts})
    first = playbook("openmpi.yml", inventory)
    assert first.rc == 0, first.output[-4000:]
    second = playbook("openmpi.yml", inventory)
    assert second.rc == 0, second.output[-4000:]
    made.timings.update(converge=first.seconds, rerun=second.seconds)
    made.timings["rerun_changed"] = sum(second.changed().values())
    made.timings["rerun_hosts"] = len(second.changed())
    print(f"\n[mpi] openmpi.yml on {len(hosts)} fresh hosts: {first.seconds:.0f} s, re-run {second.seconds:.0f} s")
    return made


def test_second_converge_changes_nothing(cluster):
    assert cluster.timings["rerun_hosts"] == len(cluster.hosts)
    assert cluster.timings["rerun_changed"] == 0


def test_hostfile_lists_every_host_with_one_slot(cluster):
    expected = [f"{cluster.addresses[h]} slots=1" for h in cluster.hosts]
    for host in cluster.hosts:
        lines = [line for line in read(host, HOSTFILE).splitlines() if line and not line.startswith("#")]
        assert lines == expected, host
        assert sh(host, f"stat -c '%U:%G %a' {HOSTFILE}").stdout.strip() == "root:root 644", host


def test_every_host_has_its_own_key_authorized_on_every_host(cluster):
    public = {h: read(h, f"{CLUSTER_KEY}.pub").strip() for h in cluster.hosts}
    assert len(set(public.values())) == len(cluster.hosts), "each host generates its own keypair"
    for host in cluster.hosts:
        assert sh(host, f"stat -c '%U %a' {CLUSTER_KEY}").stdout.strip() == f"{MPI_USER} 600", host
        authorized = read(host, f"/home/{MPI_USER}/.ssh/authorized_keys").splitlines()
        for owner, key in public.items():
            assert key in authorized, f"{owner}'s key missing on {host}"


@pytest.mark.parametrize("by", ["name", "address"])
def test_mpi_user_reaches_every_host_with_strict_host_key_checking(cluster, by):
    source = cluster.hosts[0]
    for target in cluster.hosts[1:]:
        destination = target if by == "name" else cluster.addresses[target]
        result = sh(source, f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes {destination} hostname", user=MPI_USER)
        assert result.returncode == 0, f"{source} -> {destination}: {result.stderr}"
        assert result.stdout.strip() == target


def test_no_host_key_checking_is_switched_off(cluster):
    for host in cluster.hosts:
        config = read(host, f"/home/{MPI_USER}/.ssh/config") + read(host, "/etc/ssh/ssh_config")
        assert "stricthostkeychecking no" not in " ".join(config.lower().split()), host


def test_mpi_check_runs_one_rank_per_host(cluster):
    run = playbook("mpi_check.yml", cluster.inventory, {"verify_results_dir": str(cluster.results)})
    cluster.timings["mpi_check"] = run.seconds
    print(f"\n[mpi] mpi_check.yml: {run.seconds:.0f} s")
    assert run.rc == 0, run.output[-4000:]
    result = json.loads((cluster.results / "mpi_smoke.json").read_text())
    size = len(cluster.hosts)
    assert result["ok"] is True
    assert result["ranks"] == result["expected_ranks"] == size
    assert result["sum"] == result["expected_sum"] == size * (size - 1) // 2
    assert sorted(rank["host"] for rank in result["rank_details"]) == sorted(cluster.hosts)
    assert [h["entry"] for h in result["hosts"]] == [cluster.addresses[h] for h in cluster.hosts]
    assert all(h["answered"] for h in result["hosts"])
    assert result["seconds"] > 0


def test_mpi_check_names_a_host_whose_sshd_is_stopped(cluster):
    silent = cluster.hosts[-1]
    assert sh(silent, "/etc/init.d/ssh stop").returncode == 0
    try:
        run = playbook("mpi_check.yml", cluster.inventory, {"verify_results_dir": str(cluster.results)})
    finally:
        assert sh(silent, "/etc/init.d/ssh start").returncode == 0
    assert run.rc != 0
    message = " ".join(run.output.split())
    assert f"{cluster.addresses[silent]} ({silent}): ssh: connect to host" in message, run.output[-3000:]
    for other in cluster.hosts[:-1]:
        assert f"({other})" not in message.split("did not answer", 1)[-1].split("Result:", 1)[0]
    result = json.loads((cluster.results / "mpi_smoke.json").read_text())
    assert result["ok"] is False
    assert [h["host"] for h in result["hosts"] if h["ssh"].startswith("FAIL")] == [silent]


# Bad settings of the openmpi role: (settings, what the refusal must say is allowed).
BAD_SETTINGS = {
    "slots-zero": ({"openmpi_slots_no_gpu": 0}, "allowed: a positive whole number"),
    "slots-word": ({"openmpi_slots_no_gpu": "two"}, "cannot be converted to an int"),
    "user-empty": ({"openmpi_user": ""}, "allowed: the name of an unprivileged local account"),
    "user-root": ({"openmpi_user": "root"}, "allowed: the name of an unprivileged local account"),
    "user-missing": ({"openmpi_user": "nosuchuser", "openmpi_user_create": False}, "or set openmpi_user_create: true"),
    "hostfile-relative": ({"openmpi_hostfile": "mpi/hosts"}, "allowed: an absolute path"),
}


@pytest.fixture(scope="module")
def refused(cluster, catalog, tmp_path_factory) -> dict:
    """Every bad setting refused by openmpi.yml, in as few runs as the checks allow: each case is an inventory
    host of its own with its settings as host vars, all reaching the first fleet host (refuse_together); the
    hostfile of every host before and after, and each run's changed counts."""
    first = cluster.hosts[0]
    before = {h: read(h, HOSTFILE) for h in cluster.hosts}
    cases = {name: settings for name, (settings, _) in BAD_SETTINGS.items()}
    folder = tmp_path_factory.mktemp("mpi-refused")
    found = refuse_together(Host(first), folder, cases, pinned_stand_ins(catalog), "openmpi.yml")
    after = {h: read(h, HOSTFILE) for h in cluster.hosts}
    return {"cases": found, "before": before, "after": after, "host": first}


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_bad_settings_are_refused_before_any_change(refused, case):
    settings, allowed = BAD_SETTINGS[case]
    assert case in refused["cases"], f"{case} ({settings}) was not refused"
    mine = " ".join(" ".join(refused["cases"][case].lines).split())
    assert all(name in mine for name in settings) and allowed in mine, (mine, refused["cases"][case].output[-3000:])
    output = refused["cases"][case].output
    assert set(Run(1, output, 0).changed().values()) == {0}, output[-3000:]
    assert refused["after"] == refused["before"]
    assert sh(refused["host"], "getent passwd nosuchuser").returncode == 2


def test_absent_removes_what_the_role_added_and_nothing_else(cluster):
    own_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHVzZXJzIG93biBrZXksIG5vdCB0aGUgcm9sZXMAAAAA me@laptop"
    first = cluster.hosts[0]
    assert sh(first, f"echo '{own_key}' >> /home/{MPI_USER}/.ssh/authorized_keys").returncode == 0
    removed = playbook("openmpi.yml", cluster.inventory, {"openmpi_state": "absent"})
    assert removed.rc == 0, removed.output[-4000:]
    again = playbook("openmpi.yml", cluster.inventory, {"openmpi_state": "absent"})
    assert again.rc == 0, again.output[-4000:]
    assert set(again.changed().values()) == {0}, again.output[-4000:]
    for host in cluster.hosts:
        gone = sh(host, f"ls {HOSTFILE} {HOSTFILE.rsplit('/', 1)[0]} {CLUSTER_KEY} {CLUSTER_KEY}.pub 2>/dev/null")
        assert gone.stdout == "", f"{host}: left behind {gone.stdout}"
        ssh_dir = f"/home/{MPI_USER}/.ssh"
        ours = "|".join(["msgpu-openmpi@", "msgpu openmpi", *(re.escape(a) for a in cluster.addresses.values())])
        leftovers = sh(host, f"grep -lE '{ours}' {ssh_dir}/authorized_keys {ssh_dir}/known_hosts {ssh_dir}/config")
        assert leftovers.stdout == "", f"{host}: {leftovers.stdout}"
        assert sh(host, f"getent passwd {MPI_USER}").returncode == 0, f"{host}: the MPI user must stay"
        assert sh(host, "dpkg-query -W -f '${Status}' openmpi-bin").stdout != "install ok installed"
    assert own_key in read(first, f"/home/{MPI_USER}/.ssh/authorized_keys").splitlines()
