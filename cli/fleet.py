"""The operator's commands on a fleet: provision, uninstall, fetch, verify, gpu-smoke, bench, doctor.

Given an inventory they run ansible-playbook on it and never load the test bed; without one they use the
local sandbox host (cli/local.py, testbed/), imported in that branch only.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import threading
import time
from pathlib import Path

from invoke import Context, Exit, task

from cli import local
from cli.common import (
    RESULTS,
    ROOT,
    command,
    env,
    playbook_args,
    print_summary,
    run,
    target_inventory,
    user_inventory,
)

REAL_HOSTS = "Inventory of real hosts; without it the local sandbox host (./toolkit provision first)."


@task(
    help={
        "inventory": "Inventory of real hosts; without it one local sandbox container is provisioned.",
        "limit": "Ansible --limit pattern.",
        "check": "Dry run: ansible-playbook --check --diff.",
        "extra": 'Extra ansible-playbook arguments, e.g. "-e stack_cudnn_method=wheel".',
        "batch": "Rolling mode: each component goes to this many hosts at a time, the first failed host stops the run "
        "(0: all at once).",
    }
)
def provision(
    c: Context, inventory: str = "", limit: str = "", check: bool = False, extra: str = "", batch: int = 0
) -> None:
    """Provision the GPU stack with playbooks/site.yml (a local sandbox host when no inventory is given)."""
    if batch < 0:
        raise Exit(f"--batch: '{batch}' is not allowed; allowed: 0 (all hosts at once) or a positive number", code=2)
    options = (["--limit", limit] if limit else []) + (["--check", "--diff"] if check else [])
    # Rolling runs are Ansible's own: serial and max_fail_percentage in the component plays (stack_serial).
    options += ["-e", f"stack_serial={batch}"] if batch else []

    def site(target: str) -> str:
        return command(["ansible-playbook", "-i", target, "playbooks/site.yml", *options], extra)

    if inventory:
        target = user_inventory(inventory)
        what = f"ansible-playbook site.yml, {batch} hosts at a time" if batch else "ansible-playbook site.yml"
        try:
            run(c, site(target), what=what)
        except Exit as exc:
            if not batch:
                raise
            raise Exit(
                f"{exc.message}\nRolling run stopped at the first failed or unreachable host (the recap names it): "
                f"the component it failed in reached no host of a later batch, and no later component started. "
                "Fix the host, then run again (finished hosts re-run with no changes).",
                code=1,
            ) from exc
        return
    print(
        f"No inventory given: provisioning the local sandbox host {local.sandbox_host_name()} (no GPU), with NVIDIA's"
    )
    print("downloads served from a loopback mirror of fixtures built from NVIDIA's PyPI wheels.")
    with local.fixture_mirror() as group_vars:
        run(c, site(str(local.sandbox_up(group_vars))), what="ansible-playbook site.yml")
    print("Done. Look around with: ./toolkit sandbox shell   (then: source /etc/msgpu/env/cuda-*.sh; nvcc --version)")


# Each component's playbook (its tag) and the variable that sets its role's state; `uninstall` sets
# them to absent. site.yml runs them in its own order; every role's `absent` copes with what another
# one already removed (e.g. the cuDNN files inside a CUDA tree that is gone).
COMPONENT_STATES = {
    "nvidia_driver": "nvidia_driver_state",
    "cuda": "cuda_state",
    "cudnn": "cudnn_state",
    "nccl": "nccl_state",
    "openmpi": "openmpi_state",
    "mindspore": "mindspore_state",
    "tensorrt": "tensorrt_state",
    "serving": "serving_state",
}


@task(
    help={
        "inventory": "Inventory of real hosts; without it the local sandbox host.",
        "limit": "Ansible --limit pattern.",
        "component": f"Only these components, comma-separated ({', '.join(COMPONENT_STATES)}); default: all.",
        "check": "Dry run: ansible-playbook --check --diff.",
    }
)
def uninstall(c: Context, inventory: str = "", limit: str = "", component: str = "", check: bool = False) -> None:
    """Remove what site.yml installed (state: absent for every component, or only the named ones)."""
    chosen = [name.strip() for name in component.split(",") if name.strip()] or list(COMPONENT_STATES)
    unknown = [name for name in chosen if name not in COMPONENT_STATES]
    if unknown:
        raise Exit(f"--component: {', '.join(unknown)} unknown; allowed: {', '.join(COMPONENT_STATES)}", code=2)
    extra = f"--tags {shlex.quote(','.join(['preflight', *chosen]))}" + (" --check --diff" if check else "")
    cmd = playbook_args(
        "playbooks/site.yml",
        target_inventory(inventory),
        limit,
        {COMPONENT_STATES[name]: "absent" for name in chosen},
        extra,
    )
    run(c, cmd, what=f"ansible-playbook site.yml, state absent: {', '.join(chosen)}")


def _sandbox_verify_vars(inventory: str) -> dict:
    """No settings for the user's hosts; the sandbox host's verify settings without an inventory."""
    return {} if inventory else local.verify_vars()


@task(
    help={
        "inventory": REAL_HOSTS,
        "limit": "Ansible --limit pattern.",
        "quick": "The short run: judge + a small training run, well under 90 s per host.",
        "out": "Folder for the results and the report (default artifacts/verify).",
        "extra": 'Extra ansible-playbook arguments, e.g. "-e verify_bench_device=CPU".',
    }
)
def verify(
    c: Context, inventory: str = "", limit: str = "", quick: bool = False, out: str = "", extra: str = ""
) -> None:
    """Prove every host works: run_check judge + LeNet5 benchmark on all hosts in parallel, one report."""
    folder = Path(out).resolve() if out else RESULTS / "verify"
    target = target_inventory(inventory)
    extra_vars = {"verify_quick": quick, "verify_results_dir": str(folder), **_sandbox_verify_vars(inventory)}
    started = time.monotonic()
    try:
        run(
            c,
            playbook_args("playbooks/verify.yml", target, limit, extra_vars, extra),
            what="ansible-playbook verify.yml",
        )
    finally:
        # A failed host still has its verdict in the report: say where it is either way.
        if (folder / "summary.json").exists():
            print_summary(folder)
        print(f"verify wall time: {time.monotonic() - started:.0f} s")


@task(
    help={
        "inventory": REAL_HOSTS,
        "limit": "Ansible --limit pattern: the lab's first GPU host.",
        "out": "Folder for the JSON files (default artifacts/verify/gpu-smoke).",
        "extra": 'Extra ansible-playbook arguments, e.g. "-e verify_warmup_timeout=3600".',
    }
)
def gpu_smoke(c: Context, inventory: str = "", limit: str = "", out: str = "", extra: str = "") -> None:
    """GPU smoke test: GPU probe, first and second CUDA context (JIT cost, cache), judge, quick bench; one JSON."""
    folder = Path(out).resolve() if out else RESULTS / "verify" / "gpu-smoke"
    target = target_inventory(inventory)
    extra_vars = {"verify_gpu_smoke_results_dir": str(folder), **_sandbox_verify_vars(inventory)}
    run(c, playbook_args("playbooks/gpu_smoke.yml", target, limit, extra_vars, extra), what="gpu_smoke.yml")
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        jit = doc.get("jit") or {}
        print(f"{path.stem}: {doc.get('verdict')} {doc.get('explanation')}")
        if jit:
            first, second, ratio = jit.get("first_s"), jit.get("second_s"), jit.get("ratio")
            print(f"  first CUDA context {first} s, second {second} s, ratio {ratio}")
    print(f"Results: {folder}")


@task(
    help={
        "inventory": REAL_HOSTS,
        "limit": "Ansible --limit pattern.",
        "device": "GPU or CPU; empty: GPU where the host has one.",
        "out": "Folder for the results (default artifacts/bench).",
        "fleet": "Instead: the fleet benchmark on 4 sandbox containers (artifact cache bytes, 1 vs 4 hosts, re-run).",
        "full": "With --fleet: the whole site.yml per host (an hour on 2 cores) instead of the NVIDIA parts + OpenMPI.",
    }
)
def bench(
    c: Context,
    inventory: str = "",
    limit: str = "",
    device: str = "",
    out: str = "",
    fleet: bool = False,
    full: bool = False,
) -> None:
    """The full LeNet5 benchmark (verify_bench_epochs epochs, all of MNIST) and the seed's script for the ratio."""
    folder = Path(out).resolve() if out else RESULTS / "bench"
    if fleet:
        results = local.fleet_bench(folder, full)  # the fleet benchmark runs on the test bed
        print(json.dumps(results, indent=2))
        print(f"Numbers: {folder / 'bench-fleet.json'}")
        return
    # --device: the verify role's argument spec (roles/verify/meta/argument_specs.yml) refuses other values.
    target = target_inventory(inventory)
    extra_vars = {
        "verify_judge": False,
        "verify_distributed": False,
        "verify_compare_seed": True,
        "verify_bench_device": device,
        "verify_results_dir": str(folder),
        **_sandbox_verify_vars(inventory),
    }
    run(c, playbook_args("playbooks/verify.yml", target, limit, extra_vars, ""), what="benchmark (verify.yml)")
    # The report's summary already holds every host's numbers (report.py summary_row).
    rows = print_summary(folder)["hosts"]
    for row in rows:
        print(
            f"{row['host']}: {row['device']} {row['images_per_s']} images/s (median of epochs >= 2), "
            f"accuracy {row['accuracy']}; seed script {row['seed_images_per_s']} images/s; ratio {row['ratio']}"
        )
    (folder / "bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"Numbers: {folder / 'bench.json'}")


def _follow(path: Path, stop: threading.Event) -> None:
    """Print the lines appended to `path` until `stop` is set (the cache filler's progress)."""
    position = path.stat().st_size if path.exists() else 0
    while not stop.wait(1.0):
        if path.exists() and path.stat().st_size > position:
            with open(path) as log:
                log.seek(position)
                sys.stdout.write(log.read())
                position = log.tell()
            sys.stdout.flush()


@task(
    help={
        "inventory": "Inventory of the site to fetch for (its stack settings); without it the sandbox's.",
        "cache": "The cache folder (default: the inventory's stack_artifact_cache_dir, else ~/.cache/msgpu/artifacts).",
        "extra": 'Extra ansible-playbook arguments, e.g. "-e stack_tensorrt_enabled=true".',
    }
)
def fetch(c: Context, inventory: str = "", cache: str = "", extra: str = "") -> None:
    """Fill the controller's artifact cache with every file the inventory's hosts need (hosts are not contacted).

    For an air-gapped site: run it where the internet is reachable, copy the folder to the site's controller, and
    provision there with stack_offline: true (a missing file then stops the run before any host changes).
    """
    extra_vars = {"stack_artifact_cache_dir": str(Path(cache).resolve())} if cache else {}
    folder = Path(cache).resolve() if cache else None
    with contextlib.ExitStack() as stack:
        if inventory:
            target = target_inventory(inventory)
        else:
            # No inventory: the sandbox host's settings.
            target, sandbox_cache = local.fetch_inventory(stack.enter_context(local.fixture_mirror()))
            folder = folder or sandbox_cache
        stop = threading.Event()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            threading.Thread(target=_follow, args=(folder / ".fetch.log", stop), daemon=True).start()
        try:
            run(
                c,
                playbook_args("playbooks/fetch.yml", target, "", extra_vars, extra),
                what="ansible-playbook fetch.yml",
            )
        finally:
            stop.set()


@task(
    help={
        "inventory": REAL_HOSTS,
        "host": "Only this host (an Ansible --limit pattern).",
        "json": "Print every host's findings as JSON instead of the text report.",
        "out": "Folder for the findings (default artifacts/doctor).",
    }
)
def doctor(c: Context, inventory: str = "", host: str = "", json_: bool = False, out: str = "") -> None:
    """Explain a broken GPU host: each finding with its severity, evidence and fix (exit 1 on an error)."""
    folder = Path(out).resolve() if out else RESULTS / "doctor"
    target = target_inventory(inventory)
    started = time.monotonic()
    args = playbook_args("playbooks/doctor.yml", target, host, {"verify_doctor_results_dir": str(folder)}, "")
    with c.cd(str(ROOT)):
        result = c.run(args, env=env(), warn=True, pty=False, hide=True)
    found = sorted((folder / "hosts").glob("*.json"))
    for path in found:
        if json_:
            print(path.read_text())
        else:
            print(path.with_suffix(".txt").read_text())
    print(f"doctor wall time: {time.monotonic() - started:.1f} s; findings in {folder / 'hosts'}")
    if result is None or not result.ok:
        if not found:
            print(result.stdout[-4000:] if result is not None else "", result.stderr[-2000:] if result else "")
        errors = [p.stem for p in found if not json.loads(p.read_text())["ok"]]
        raise Exit(f"doctor: error-level findings on {', '.join(errors) or 'the hosts (see above)'}", code=1)
