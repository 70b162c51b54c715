"""The fleet benchmark (./toolkit bench --fleet): what the controller's artifact cache buys a fleet.

On sandbox containers of the fleet network (testbed/fleet.py), NVIDIA's files served by the counting
loopback mirror (standing in for upstream), it measures:
  1. bytes fetched from upstream to converge 1 host, and to converge 4 hosts (each from an empty cache);
  2. wall time to converge 1 fresh host and 4 fresh hosts from a warm cache (4 hosts in parallel);
  3. the idempotent re-run of the converged hosts, 1 and 4 (seconds, changed count), with the CPU time it
     took on the controller (ansible-playbook and every process it started) and inside the hosts (their
     cgroups). The controller's 4-vs-1 CPU ratio is its per-host overhead; on a machine with fewer cores
     than hosts the wall-time ratio is bounded below by the CPU the hosts' own module runs need;
  4. the floor: the same 1 and 4 hosts running a playbook of as many no-op tasks per host as the re-run has
     results (Ansible's own cost per task and host: what a playbook of that size costs with nothing to do).
By default the run covers the parts that come from NVIDIA's servers plus OpenMPI (preflight, cuda, cudnn,
nccl, openmpi); `full` runs the whole site.yml (a real DKMS build and the MindSpore venv per host: on a
2-core machine that takes an hour). Prints the numbers and writes them as JSON.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from testbed import fixtures, mirror, sandbox
from testbed import fleet as fleet_bed

ROOT = Path(__file__).resolve().parent.parent
HOSTS = [f"msgpu-bench-{n}" for n in range(1, 5)]
SUBSET = "preflight,cuda,cudnn,nccl,openmpi"
# A host's line of the play recap; ok + skipped is how many task results it had (what the floor's playbook gets).
RECAP = re.compile(
    r"^(?P<host>msgpu-bench-\d+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)",
    re.M,
)


def _host_cpu_seconds(hosts: list[str]) -> float:
    """CPU time used so far by every process of these containers (their cgroup: v2's cpu.stat, v1's cpuacct)."""
    read = (
        "if [ -r /sys/fs/cgroup/cpu.stat ]; then sed -n 's/^usage_usec \\(.*\\)/\\1e-6/p' /sys/fs/cgroup/cpu.stat; "
        "else sed 's/$/e-9/' /sys/fs/cgroup/cpuacct/cpuacct.usage; fi"
    )
    total = 0.0
    for host in hosts:
        out = sandbox.run(["docker", "exec", host, "sh", "-c", read], capture=True).stdout.split()
        if not out:
            raise RuntimeError(f"{host}: no cgroup CPU counter (cpu.stat or cpuacct.usage)")
        total += float(out[0])
    return total


def _controller_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _converge(
    inventory: Path, tags: str, playbook: Path = ROOT / "playbooks/site.yml"
) -> tuple[float, dict[str, int], str]:
    cmd = [str(Path(sys.prefix) / "bin" / "ansible-playbook"), "-i", str(inventory), str(playbook)]
    if tags:
        cmd += ["--tags", tags]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    started = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.monotonic() - started
    lines = [m.groupdict() for m in RECAP.finditer(result.stdout)]
    recap = {line["host"]: int(line["changed"]) for line in lines}
    failed = [line["host"] for line in lines if int(line["unreachable"]) or int(line["failed"])]
    if result.returncode != 0 or failed:
        raise RuntimeError(f"converge failed on {failed or 'the run'}:\n{(result.stdout + result.stderr)[-4000:]}")
    return seconds, recap, result.stdout


def _floor(work: Path, tasks: int) -> dict:
    """Ansible's own cost per host on this machine: a playbook of `tasks` tasks that do nothing (set_fact of a
    small template, no host call), as many as one host's re-run of the toolkit has results, on the same 4
    containers with the same inventory layout and ansible.cfg, once for 1 host and once for 4. Its 4-vs-1 ratio
    is what Ansible alone gets for that many tasks per host on this machine: what the toolkit's ratio
    compares with (docs/testing.md, "Fleet re-run" numbers)."""
    playbook = work / "floor.yml"
    steps = [
        {"name": f"No-op {n}", "ansible.builtin.set_fact": {f"__floor_{n % 5}": f"{{{{ {n} + 1 }}}}"}}
        for n in range(tasks)
    ]
    playbook.write_text(json.dumps([{"name": "Floor", "hosts": "gpu_servers", "gather_facts": False, "tasks": steps}]))
    fleet_bed.stop(HOSTS)
    fleet_bed.start(HOSTS)
    row: dict = {"tasks_per_host": tasks}
    for hosts in (HOSTS[:1], HOSTS):
        inventory = sandbox.write_inventory(work / f"floor-{len(hosts)}.yml", hosts, {})
        controller = _controller_cpu_seconds()
        seconds, _, _ = _converge(inventory, "", playbook)
        row[f"seconds_{len(hosts)}"] = round(seconds, 1)
        row[f"controller_cpu_seconds_{len(hosts)}"] = round(_controller_cpu_seconds() - controller, 1)
    row["ratio_4_vs_1"] = round(row["seconds_4"] / row["seconds_1"], 2)
    print(f"[bench --fleet] floor: {row}", flush=True)
    return row


def run(out: Path, full: bool = False, group_vars_for=None) -> dict:
    """Run the benchmark; `group_vars_for(root, base_url)` gives the sandbox group vars (scenarios.py)."""
    tags = "" if full else SUBSET
    root = fixtures.build_mirror()
    work = sandbox.CACHE / "bench-fleet"
    results: dict = {"scope": "site.yml" if full else f"site.yml --tags {tags}", "hosts_max": len(HOSTS)}

    def step(name: str, hosts: list[str], cache: Path, fresh_cache: bool) -> dict:
        if fresh_cache:
            shutil.rmtree(cache, ignore_errors=True)
        fleet_bed.stop(HOSTS)
        fleet_bed.start(hosts)
        with mirror.serving(root) as served:
            # The same tasks on every host of a 1-host and a 4-host run: the MPI cluster's SSH trust, which
            # openmpi_cluster sets up by default only for a play of several hosts (a lone host: one that will
            # join later). Without it the ratios also counted the 4-host runs' extra work per host.
            group_vars = {
                **group_vars_for(root, served.base_url),
                "stack_artifact_cache_dir": str(cache),
                "openmpi_cluster": True,
            }
            inventory = sandbox.write_inventory(work / f"{name}.yml", hosts, group_vars)
            print(f"[bench --fleet] {name}: converging {len(hosts)} host(s) ...", flush=True)
            seconds, _, _ = _converge(inventory, tags)
            row = {"hosts": len(hosts), "seconds": round(seconds, 1), "bytes_upstream": served.bytes_sent}
            row["requests_upstream"] = sum(served.counts.values())
            if name.startswith("warm-"):
                # The idempotent re-run of the same hosts: what the controller spends per host once nothing
                # is left to do (issue 16's "4 hosts vs 1" benchmark).
                controller, inside = _controller_cpu_seconds(), _host_cpu_seconds(hosts)
                rerun, rerun_recap, rerun_out = _converge(inventory, tags)
                row["idempotent_rerun"] = {
                    "task_results_per_host": max(int(m["ok"]) + int(m["skipped"]) for m in RECAP.finditer(rerun_out)),
                    "seconds": round(rerun, 1),
                    "changed": sum(rerun_recap.values()),
                    "controller_cpu_seconds": round(_controller_cpu_seconds() - controller, 1),
                    "hosts_cpu_seconds": round(_host_cpu_seconds(hosts) - inside, 1),
                }
                if name == "warm-1":
                    results["idempotent_rerun"] = row["idempotent_rerun"]
        print(f"[bench --fleet] {name}: {row}", flush=True)
        return row

    try:
        results["cold-1"] = step("cold-1", HOSTS[:1], work / "cache-1", True)
        results["cold-4"] = step("cold-4", HOSTS, work / "cache-4", True)
        results["warm-4"] = step("warm-4", HOSTS, work / "cache-4", False)
        results["warm-1"] = step("warm-1", HOSTS[:1], work / "cache-4", False)
        results["floor"] = _floor(work, results["warm-1"]["idempotent_rerun"]["task_results_per_host"])
    finally:
        fleet_bed.stop(HOSTS)
    results["bytes_ratio_4_vs_1"] = round(
        results["cold-4"]["bytes_upstream"] / max(results["cold-1"]["bytes_upstream"], 1), 3
    )
    results["time_ratio_4_vs_1_warm"] = round(results["warm-4"]["seconds"] / results["warm-1"]["seconds"], 2)
    results["rerun_ratio_4_vs_1"] = round(
        results["warm-4"]["idempotent_rerun"]["seconds"] / results["warm-1"]["idempotent_rerun"]["seconds"], 2
    )
    reruns = {n: results[f"warm-{n}"]["idempotent_rerun"] for n in (1, 4)}
    results["rerun_controller_cpu_ratio_4_vs_1"] = round(
        reruns[4]["controller_cpu_seconds"] / max(reruns[1]["controller_cpu_seconds"], 0.1), 2
    )
    # The CPU the whole re-run needed (controller and hosts): on fewer cores than hosts, wall time follows it.
    results["rerun_cpu_ratio_4_vs_1"] = round(
        sum(reruns[4][k] for k in ("controller_cpu_seconds", "hosts_cpu_seconds"))
        / max(sum(reruns[1][k] for k in ("controller_cpu_seconds", "hosts_cpu_seconds")), 0.1),
        2,
    )
    # The toolkit's ratio against the floor's: above 1, the toolkit's tasks cost more per host than Ansible's own.
    results["rerun_ratio_vs_floor"] = round(results["rerun_ratio_4_vs_1"] / results["floor"]["ratio_4_vs_1"], 2)
    results["goals"] = {
        "time_ratio_4_vs_1_warm <= 1.5": results["time_ratio_4_vs_1_warm"] <= 1.5,
        "rerun_ratio_4_vs_1 <= 1.5, changed=0": results["rerun_ratio_4_vs_1"] <= 1.5
        and results["warm-4"]["idempotent_rerun"]["changed"] == 0,
        "rerun_controller_cpu_ratio_4_vs_1 <= 1.5": results["rerun_controller_cpu_ratio_4_vs_1"] <= 1.5,
        "bytes_ratio_4_vs_1 == 1": results["bytes_ratio_4_vs_1"] == 1.0,
        "idempotent_rerun <= 60 s, changed=0": results["idempotent_rerun"]["seconds"] <= 60
        and results["idempotent_rerun"]["changed"] == 0,
    }
    results["machine"] = {"cpus": os.cpu_count()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-fleet.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
