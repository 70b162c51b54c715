"""A fleet of four real Ubuntu 20.04 containers: offline refusal before any change, parallel
provisioning with one host unreachable, every NVIDIA file fetched from upstream exactly once however many
hosts need it, and a rolling re-run that fetches and changes nothing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from testbed import scenarios
from tests.integration.conftest import FINGERPRINT

from .conftest import PREFIX, RECAP, ROOT, Fleet, PlaybookRun

CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
STACK = CATALOG["stacks"][CATALOG["default_stack"]]
CUDA = STACK["cuda"]
# The NVIDIA files of the default stack's methods, as paths on the (fixture) mirror; NCCL is the test
# bed's, the seed's tarball (scenarios.seed_nccl; the stack's own default, the PyPI wheel, is no NVIDIA file).
UPSTREAM = {
    "cuda": CATALOG["cuda"][CUDA]["runfile"],
    "cudnn": CATALOG["cudnn"][STACK["cudnn"]]["tarball"],
    "nccl": CATALOG["nccl"][scenarios.seed_nccl()["stack_nccl_version"]]["tarball"],
}
# What these tests install: one part that comes from NVIDIA's servers (NCCL, into the stack's CUDA prefix)
# and OpenMPI for the MPI tests. Their claims (one fetch per file whatever the number of hosts, parallel hosts,
# batches, offline runs) hold for any file, and the controller's cache handles every file alike; the CUDA
# toolkit (a 650 MB fixture runfile unpacked per host), cuDNN (2 GB unpacked per host), the driver (a real DKMS
# build per host) and the MindSpore venv go through the same cache in the molecule scenarios.
INSTALLED = {component: UPSTREAM[component] for component in ("nccl",)}
TAGS = ["--tags", "preflight,nccl,openmpi"]


def mirror_path(entry: dict) -> str:
    return f"{entry['source']}/{entry['path']}"


def test_offline_run_with_files_missing_changes_no_host(fleet: Fleet):
    """stack_offline with an empty cache: the run stops in the preflight, names every missing file and
    where it would come from, and no host (nor the mirror, nor the cache) saw anything happen."""
    for host in fleet.hosts:
        assert fleet.sh(host, "touch /msgpu-marker").returncode == 0
    before = {host: fleet.sh(host, FINGERPRINT).stdout for host in fleet.hosts}
    result = fleet.playbook("site.yml", fleet.inventory(stack_offline=True))
    flat = " ".join(result.output.split())
    assert result.rc != 0, flat[-3000:]
    assert "stack_offline is true" in flat, flat[-4000:]
    assert "nothing was changed on any host" in flat
    for component, entry in UPSTREAM.items():
        assert f"{entry['file']} ({component}), from {fleet.served.base_url}/{mirror_path(entry)}" in flat, flat[-4000:]
    wheel = CATALOG["mindspore"][STACK["mindspore"]]["wheels"]["cp38"]["file"]
    assert f"{wheel} (mindspore), from mindspore-gpu on the pip index" in flat
    assert "./toolkit fetch" in flat
    # Stopped before the first component: nothing downloaded, nothing changed anywhere.
    assert fleet.served.counts == {}
    bookkeeping = (".lock", ".fetch.log", ".sha256-memo.json")
    assert not [p for p in fleet.cache.rglob("*") if p.is_file() and p.name not in bookkeeping]
    assert {host: fleet.sh(host, FINGERPRINT).stdout for host in fleet.hosts} == before
    assert "TASK [nvidia_driver" not in result.output


def test_fleet_converges_in_parallel_with_one_host_unreachable(fleet: Fleet):
    """Four hosts, one powered off: the other three converge in the same run, each NVIDIA file is fetched
    from upstream ONCE (into the controller's cache) and copied to the three hosts, the recap and the
    fleet summary name the unreachable host, and the exit status says the run was not clean."""
    down = fleet.hosts[-1]
    fleet.stop(down)
    result = fleet.playbook("site.yml", fleet.inventory(), args=TAGS)
    recap = result.recap()
    assert result.rc != 0, result.output[-4000:]
    assert recap[down]["unreachable"] == 1, result.output[-4000:]
    for host in fleet.reachable:
        assert recap[host]["failed"] == 0 and recap[host]["unreachable"] == 0, result.output[-6000:]
    flat = " ".join(result.output.split())
    assert f"Fleet summary: 3 of 4 hosts finished ({', '.join(fleet.reachable)})." in flat, flat[-3000:]
    assert f"Did NOT finish (failed or unreachable, see the recap): {down}." in flat
    for component, entry in INSTALLED.items():
        assert fleet.served.fetches(mirror_path(entry)) == 1, (component, fleet.served.counts)
    assert fleet.served.fetches(mirror_path(UPSTREAM["cudnn"])) == 0, fleet.served.counts
    # Real state on every reachable host: the library is there, installed from the pinned file, which the
    # host no longer keeps; OpenMPI answers.
    pinned = fleet.group_vars["stack_artifact_checksums"]
    nccl = UPSTREAM["nccl"]["file"]
    for host in fleet.reachable:
        libs = fleet.sh(host, f"ls /usr/local/cuda-{CUDA}/lib64/ | grep -E '^lib(cudnn|nccl)\\.so\\.[0-9]+$'")
        assert libs.stdout.split() == ["libnccl.so.2"], (host, libs.stdout)
        # The library's marker records the sha256 of the archive it was installed from.
        marker = fleet.sh(host, f"cat /usr/local/cuda-{CUDA}/.msgpu-nccl")
        assert marker.stdout.split() == [pinned[nccl]], (host, marker)
        left = fleet.sh(host, f"test -e /var/cache/msgpu/artifacts/{nccl}")
        assert left.returncode != 0, f"{host}: the installed NCCL archive is still in the host's artifact cache"
        assert fleet.sh(host, "mpirun --version").returncode == 0
    print(f"\nfleet converge (3 reachable hosts + 1 down): {result.seconds:.0f} s; mirror: {fleet.served.counts}")


def plays(output: str) -> list[tuple[str, set[str]]]:
    """Each play the run started, in order (a play in batches once per batch), with the fleet hosts its
    tasks ran on (empty: the header only, no host left)."""
    parts = re.split(r"^PLAY \[(.+?)\] \**$", output, flags=re.M)
    host = re.compile(rf"(?:\[|, | for )({re.escape(PREFIX)}-\d+)\b")
    return [(name, set(host.findall(body))) for name, body in zip(parts[1::2], parts[2::2])]


def rolling(fleet: Fleet, inventory: Path, batch: int) -> PlaybookRun:
    toolkit = [str(Path(sys.prefix) / "bin" / "invoke"), "-r", str(ROOT), "provision", "-i", str(inventory)]
    return fleet.run([*toolkit, "--batch", str(batch), "--extra", " ".join(TAGS)])


def test_rolling_rerun_fetches_nothing_and_changes_nothing(fleet: Fleet):
    """The three converged hosts again, two at a time (./toolkit provision --batch 2: Ansible's serial): NCCL's
    play runs on the first two hosts, then on the third; OpenMPI's fleet-wide settings once for all three;
    every host changed=0, and not one more request reached upstream."""
    counts = dict(fleet.served.counts)
    result = rolling(fleet, fleet.inventory(fleet.reachable), 2)
    assert result.rc == 0, result.output[-4000:]
    assert "site.yml, 2 hosts at a time" in result.output
    started = plays(result.output)
    batches = [hosts for name, hosts in started if name == "NVIDIA NCCL"]
    assert batches == [set(fleet.reachable[:2]), set(fleet.reachable[2:])], started
    assert [hosts for name, hosts in started if name == "OpenMPI"] == [set(fleet.reachable)], started
    rows = RECAP.findall(result.output)  # one run: one recap
    assert sorted(host for host, *_ in rows) == sorted(fleet.reachable), rows
    assert all(changed == unreachable == failed == "0" for _, changed, unreachable, failed in rows), result.output[
        -4000:
    ]
    assert fleet.served.counts == counts
    # The disk check counts only what is not installed yet (a re-run on a nearly full disk passes).
    flat = " ".join(result.output.split())
    complete = flat.count(f"installed already: NCCL {scenarios.seed_nccl()['stack_nccl_version']}.")
    assert complete >= len(fleet.reachable) and complete == flat.count("installed already:"), flat[-4000:]
    print(f"\nrolling re-run, 3 hosts in 2 batches: {result.seconds:.0f} s")


def test_rolling_run_stops_at_a_failed_batch(fleet: Fleet):
    """--batch 2 where the first host fails in NCCL's play (its NCCL is checked against a version it does
    not have): the run stops after that batch. NCCL's play never reaches the third host, OpenMPI's never
    starts, the exit status and the message say why, and nothing more came from upstream."""
    first, second, third = fleet.reachable
    counts = dict(fleet.served.counts)
    inventory = fleet.inventory(fleet.reachable, host_vars={first: {"nccl_expected_version": "1"}})
    result = rolling(fleet, inventory, 2)
    flat = " ".join(result.output.split())
    assert result.rc != 0, flat[-4000:]
    assert "returned '" in flat and "expected 1 (nccl_expected_version" in flat, flat[-4000:]
    assert "Rolling run stopped at the first failed or unreachable host" in flat, flat[-4000:]
    started = plays(result.output)
    assert [hosts for name, hosts in started if name == "NVIDIA NCCL"] == [{first, second}], started
    assert not [name for name, hosts in started if name == "OpenMPI" and hosts], started
    recap = result.recap()
    assert recap[first]["failed"] == 1 and recap[second]["failed"] == recap[third]["failed"] == 0, recap
    assert fleet.served.counts == counts


def test_rolling_run_with_a_host_down_changes_no_host(fleet: Fleet):
    """--batch 2 with the powered-off host in the last batch: the preflight finds it unreachable and the
    rolling run stops there, before any component's play reaches any host; the message names the host."""
    (down,) = fleet.stopped
    counts = dict(fleet.served.counts)
    result = rolling(fleet, fleet.inventory([*fleet.reachable, down]), 2)
    flat = " ".join(result.output.split())
    assert result.rc != 0, flat[-4000:]
    assert f"Rolling run (stack_serial 2): {down} failed the preflight or could not be reached" in flat, flat[-4000:]
    started = plays(result.output)
    components = {"NVIDIA NCCL", "OpenMPI", "NVIDIA driver", "CUDA toolkits"}
    assert not [(name, hosts) for name, hosts in started if name in components and hosts], started
    assert result.recap()[down]["unreachable"] == 1, result.output[-4000:]
    assert fleet.served.counts == counts


def test_fetch_then_an_offline_run_converges_a_fresh_host(fleet: Fleet, tmp_path: Path):
    """`./toolkit fetch` fills a new cache folder from upstream, one request per file; an offline run
    (stack_offline: true) from that folder then converges the host no run has provisioned yet (the one
    powered off so far), with not one request upstream."""
    (fresh,) = fleet.stopped
    cache = tmp_path / "offline-cache"
    counts = dict(fleet.served.counts)
    components = json.dumps({"stack_fetch_components": sorted(INSTALLED)})
    invoke = [str(Path(sys.prefix) / "bin" / "invoke"), "-r", str(ROOT)]
    fetch_inventory = fleet.inventory([fresh], stack_artifact_cache_dir=str(cache))
    only = ["--extra", f"-e '{components}'"]  # the files of these tests' components
    fetched = fleet.run([*invoke, "fetch", "-i", str(fetch_inventory), "--cache", str(cache), *only])
    assert fetched.rc == 0, fetched.output[-4000:]
    for component, entry in INSTALLED.items():
        path = mirror_path(entry)
        assert fleet.served.fetches(path) == counts.get(f"/{path}", 0) + 1, (component, fleet.served.counts)
    counts = dict(fleet.served.counts)
    fleet.start(fresh)
    try:
        inventory = fleet.inventory([fresh], stack_artifact_cache_dir=str(cache), stack_offline=True)
        result = fleet.playbook("site.yml", inventory, args=["--tags", "preflight,nccl"])
        recap = result.recap()
        assert result.rc == 0 and recap[fresh]["changed"] > 0, result.output[-4000:]
        assert recap[fresh]["failed"] == recap[fresh]["unreachable"] == 0, result.output[-4000:]
        assert fleet.served.counts == counts
        libs = fleet.sh(fresh, f"ls /usr/local/cuda-{CUDA}/lib64/ | grep -E '^lib(cudnn|nccl)\\.so\\.[0-9]+$'")
        assert libs.stdout.split() == ["libnccl.so.2"], libs.stdout
        print(f"\nfetch {fetched.seconds:.0f} s, then the offline converge of a fresh host {result.seconds:.0f} s")
    finally:
        fleet.stop(fresh)  # the MPI tests use the three hosts that ran everything
