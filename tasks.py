"""Tasks of the MindSpore GPU toolkit (run them through ./toolkit, which sets up .venv first).

./toolkit --list                  all tasks
./toolkit provision               provision one local sandbox host (no GPU), end to end
./toolkit provision -i inventory/mysite/hosts.yml
./toolkit test                    lint + unit + integration + fleet + serving + molecule, as CI runs it

Once .venv exists, the same tasks run with invoke itself, from the root or any folder below it:
. .venv/bin/activate; invoke --list; invoke verify -i inventory/mysite/hosts.yml
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from invoke import Collection, Context, Exit, task

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from testbed import fixtures, mirror, sandbox, suite  # noqa: E402  (needs ROOT on sys.path)

VENV_BIN = Path(sys.prefix) / "bin"
SANDBOX_HOST = "msgpu-sandbox-1"
SANDBOX_INVENTORY = sandbox.CACHE / "sandbox" / "inventory.yml"
# The test bed's controller-side artifact cache (stack_artifact_cache_dir).
ARTIFACT_CACHE = sandbox.CACHE / "artifact-cache"
MOLECULE_VARS = sandbox.CACHE / "molecule"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for every tool: the venv first on PATH, the project's ansible.cfg."""
    env = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": os.environ.get("ANSIBLE_FORCE_COLOR", "0"),
        "PY_COLORS": os.environ.get("PY_COLORS", "0"),
    }
    env.update(extra or {})
    return env


def _free_gib() -> str:
    return f"{shutil.disk_usage(ROOT).free / 2**30:.1f}"


def _run(c: Context, cmd: str, env: dict[str, str] | None = None, what: str = "") -> float:
    """Run `cmd` from the project root; raise Exit naming the step when it fails. Returns seconds."""
    started = time.monotonic()
    # Free disk at each step: the sandbox hosts and caches take tens of GB, and a CI machine's free
    # space varies; a step that runs out says so here.
    print(f"\n==> {what or cmd} [{_free_gib()} GiB free]", flush=True)
    with c.cd(str(ROOT)):
        result = c.run(cmd, env=_env(env), warn=True, pty=False)
    elapsed = time.monotonic() - started
    if result is None or not result.ok:
        raise Exit(
            f"FAILED: {what or cmd} (exit {getattr(result, 'exited', '?')}, {elapsed:.0f} s, {_free_gib()} GiB free)",
            code=1,
        )
    print(f"<== {what or cmd}: ok in {elapsed:.0f} s [{_free_gib()} GiB free]", flush=True)
    return elapsed


@contextmanager
def _fixture_mirror() -> Iterator[dict]:
    """Build the NVIDIA fixtures (cached) and serve them on 127.0.0.1 while the block runs.

    Yields the group vars of a sandbox host using it (see _sandbox_group_vars).
    """
    try:
        root = fixtures.build_mirror()
    except fixtures.FixtureError as exc:
        raise Exit(f"fixtures: {exc}", code=1) from exc
    with mirror.serving(root) as served:
        print(f"Fixture mirror: {served.base_url} ({root})")
        yield _sandbox_group_vars(root, fixtures.inventory_vars(root, served.base_url))


def _write_group_vars(scenario: str, group_vars: dict) -> None:
    """Molecule scenarios link their group_vars to .cache/molecule/<scenario>/group_vars."""
    folder = MOLECULE_VARS / scenario / "group_vars"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_servers.yml").write_text(json.dumps(group_vars, indent=2) + "\n")


def _sandbox_image(flavour: str = "focal") -> str:
    try:
        return sandbox.build_image(flavour)
    except sandbox.SandboxError as exc:
        raise Exit(f"sandbox: {exc}", code=1) from exc


@task
def setup(c: Context) -> None:
    """Install the pinned controller tools into .venv and prepare the sandbox image (Docker)."""
    _run(c, f"{shlex.quote(str(VENV_BIN / 'pip'))} install -q -r requirements.txt", what="pip install")
    print(f"sandbox image: {_sandbox_image()}")


@task
def lint(c: Context) -> None:
    """yamllint, ansible-lint (production profile), ruff, and a syntax check of site.yml."""
    _run(c, "yamllint --strict .", what="yamllint")
    _run(c, "ansible-lint --profile production --offline", what="ansible-lint (production)")
    _run(c, "ruff check .", what="ruff")
    _run(
        c,
        "ansible-playbook --syntax-check -i inventory/example/hosts.yml playbooks/site.yml",
        what="site.yml syntax check",
    )


# Molecule scenarios: name -> what they prove. Each converges site.yml on a fresh Ubuntu 20.04
# container, converges again demanding changed=0, and runs the testinfra modules.
SCENARIOS = {
    "default": "the seed's stack: distro driver with real DKMS (+ a kernel upgrade), CUDA runfile, "
    "cuDNN and the seed's NCCL 2.8.4 tarballs (fixtures), OpenMPI, the MindSpore venv, TensorRT's tarball; "
    "then the system tests on it",
    "wheels": "cuDNN 8.5, NCCL 2.14 (the stacks' default NCCL) and TensorRT 8.4 from NVIDIA's real PyPI wheels",
    "nvidia_repo": "NVIDIA's CUDA apt repository (a signed fixture repo on loopback, signed-by keyring): "
    "cuda-drivers with real DKMS, two cuda-toolkit-11-x side by side, libcudnn8, libnccl2",
    "runfile": "the driver's runfile --silent --dkms (fixture from Ubuntu's real NVIDIA sources and "
    "libraries) with a real DKMS build, and a second CUDA runfile toolkit side by side",
}


@functools.lru_cache(maxsize=1)
def _catalog() -> dict:
    """The catalog, parsed once per process (`invoke --list` reads it for SCENARIO_VARS at import)."""
    return yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())


def _wheel_overrides() -> dict:
    """For each of cuDNN and NCCL, the version the default stack accepts that has a `wheel`
    artifact in the catalog (versions live only there)."""
    catalog = _catalog()
    stack = catalog["stacks"][catalog["default_stack"]]
    overrides: dict = {}
    for component in ("cudnn", "nccl"):
        accepted = [stack[component], *stack.get("also_accepts", {}).get(component, [])]
        version = next(v for v in accepted if "wheel" in catalog[component][v])
        overrides.update({f"stack_{component}_version": version, f"stack_{component}_method": "wheel"})
    return overrides


def _seed_nccl() -> dict:
    """The seed's NCCL, the tarball the default stack accepts (2.8.4; a fixture here). The stack's own
    default is NCCL's PyPI wheel (the tarball has no public checksum); the wheels scenario runs that."""
    catalog = _catalog()
    stack = catalog["stacks"][catalog["default_stack"]]
    accepted = [stack["nccl"], *stack.get("also_accepts", {}).get("nccl", [])]
    version = next(
        v for v in accepted if f"+cuda{stack['cuda']}_" in catalog["nccl"][v].get("tarball", {}).get("file", "")
    )
    return {"stack_nccl_version": version, "stack_nccl_method": "tarball"}


def _second_cuda() -> list[str]:
    """A second CUDA toolkit for side-by-side tests: the newest catalog CUDA other than the default
    stack's that the stack's driver branch can run."""
    catalog = _catalog()
    stack = catalog["stacks"][catalog["default_stack"]]
    driver = catalog["driver"][stack["driver_branch"]]["version"]

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split("."))

    fits = [
        v for v, entry in catalog["cuda"].items() if v != stack["cuda"] and key(entry["minimum_driver"]) <= key(driver)
    ]
    return sorted(fits, key=key)[-1:]


SCENARIO_VARS: dict[str, dict] = {
    # The seed's stack with TensorRT (for MindSpore Serving) by the stack's default method, tarball.
    "default": {"stack_tensorrt_enabled": True},
    "wheels": {
        **_wheel_overrides(),
        # TensorRT from NVIDIA's nvidia-tensorrt wheel: the version the default stack accepts that has one.
        "stack_tensorrt_enabled": True,
        "stack_tensorrt_method": "wheel",
        "stack_tensorrt_version": next(
            version
            for stack in [_catalog()["stacks"][_catalog()["default_stack"]]]
            for version in [stack["tensorrt"], *stack.get("also_accepts", {}).get("tensorrt", [])]
            if "wheel" in _catalog()["tensorrt"][version]
        ),
    },
    "nvidia_repo": {
        **{f"stack_{c}_method": "cuda_repo" for c in ("driver", "cuda", "cudnn", "nccl")},
        "stack_cuda_extra_versions": _second_cuda(),
    },
    "runfile": {"stack_driver_method": "runfile", "stack_cuda_extra_versions": _second_cuda()},
}
# The scenario whose converged host the system tests (playbooks/verify.yml) run against.
VERIFY_SCENARIO = "default"
VERIFY_HOST = "msgpu-molecule-focal"


def _sandbox_group_vars(root: Path, mirror_vars: dict) -> dict:
    """Group vars of every sandbox host: no GPU, NVIDIA sources on the fixture mirror.

    The cuDNN/NCCL tarball fixtures carry the real binaries of NVIDIA's wheels whatever their names say,
    so the roles' version checks expect what those binaries report (testbed/FIXTURES.md).
    """
    manifest = fixtures.read_manifest(root)
    reports = {entry["kind"]: entry["reports_version"] for entry in manifest.values()}
    return {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "stack_no_gpu": True,
        # The seed's NCCL tarball (a fixture) in every scenario but wheels, which runs the default wheel.
        **_seed_nccl(),
        **mirror_vars,
        "cudnn_expected_version": reports["cudnn_tarball"],
        "nccl_expected_version": reports["nccl_tarball"],
        "tensorrt_expected_version": reports["tensorrt_tarball"],
        # Ansible's async polls: short here, where a package install takes seconds (15 s/10 s/5 s by default).
        **{f"{role}_poll_seconds": 2 for role in ("nvidia_driver", "cuda", "cuda_library", "verify")},
        # The controller's artifact cache, as on a user's controller: every file fetched once from the
        # fixture mirror (or PyPI), then copied to the hosts.
        "stack_artifact_cache_dir": str(ARTIFACT_CACHE),
    }


def _scenario_stage(name: str, group_vars: dict, env: dict[str, str]) -> suite.Stage:
    """One molecule scenario as a stage; the verify scenario keeps its host for the system tests."""
    what = SCENARIOS[name]
    _write_group_vars(name, {**group_vars, **SCENARIO_VARS[name]})
    if name != VERIFY_SCENARIO:
        return suite.Stage(f"molecule {name}", what, [suite.Step(f"molecule {name}", f"molecule test -s {name}", env)])
    # The provisioned host outlives molecule's verify step for the system tests of playbooks/verify.yml,
    # then molecule destroys it. `--destroy never` also skips the sequence's first destroy, so leftovers
    # of an interrupted run are removed first.
    # The host's own settings (the scenario's too: TensorRT is on there), so a site.yml run through this
    # inventory (tests/system/test_driver_upgrade.py) converges the same stack.
    inventory = sandbox.write_inventory(
        MOLECULE_VARS / name / "verify-inventory.yml",
        [VERIFY_HOST],
        {**group_vars, **SCENARIO_VARS[name], **_verify_vars()},
    )
    return suite.Stage(
        f"molecule {name}",
        what,
        [
            suite.Step("destroy leftovers", f"molecule destroy -s {name} >/dev/null 2>&1 || true", env),
            suite.Step(f"molecule {name}", f"molecule test -s {name} --destroy never", env),
            suite.Step(
                "system (verify.yml)",
                f"pytest -q -s -p no:cacheprovider --basetemp={shlex.quote(str(sandbox.CACHE / 'pytest' / 'system'))} "
                "tests/system",
                {**env, "MSGPU_VERIFY_INVENTORY": str(inventory)},
            ),
        ],
        cleanup=[f"molecule destroy -s {name}"],
    )


def _pytest_stage(name: str, paths: str, what: str, env: dict[str, str]) -> suite.Stage:
    # Each stage's own temporary folder: pytest runs side by side never tidy up each other's.
    (sandbox.CACHE / "pytest").mkdir(parents=True, exist_ok=True)
    basetemp = shlex.quote(str(sandbox.CACHE / "pytest" / name))
    return suite.Stage(
        name, what, [suite.Step(name, f"pytest -q -s -p no:cacheprovider --basetemp={basetemp} {paths}", env)]
    )


def _unit_stage(env: dict[str, str]) -> suite.Stage:
    """The unit tests, run in a copy of the working tree outside the checkout (nothing beside it), so a
    clone anywhere passes them; the fixture caches are this checkout's (MSGPU_CACHE)."""
    copy = _isolated_copy()
    basetemp = shlex.quote(str(sandbox.CACHE / "pytest" / "unit"))
    (sandbox.CACHE / "pytest").mkdir(parents=True, exist_ok=True)
    command = f"cd {shlex.quote(str(copy))} && pytest -q -p no:cacheprovider --basetemp={basetemp} tests/unit"
    return suite.Stage(
        "unit",
        f"catalog, resolver, fixtures, verification package (in {copy}, a copy of the working tree)",
        [suite.Step("unit", command, {**env, "MSGPU_CACHE": str(sandbox.CACHE)})],
    )


def _isolated_copy() -> Path:
    """The working tree as a clone elsewhere has it, in a folder whose parent holds nothing else (no
    data folder beside the checkout, no .cache, no .venv): the unit stage runs its tests there to prove
    that a clone anywhere passes them. The files are those git would commit (`git ls-files -co
    --exclude-standard`: tracked, and new ones not ignored), uncommitted changes included, which a
    `git clone` would miss. Rebuilt on every call; returns the copy's root. Run pytest on
    <copy>/tests/unit with MSGPU_CACHE=<this .cache>, so the fixture caches are not built twice.
    """
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise Exit(f"isolated copy: {ROOT} is not a git checkout git can list ({exc})", code=1) from exc
    base = Path(tempfile.gettempdir()) / f"msgpu-isolated-{os.getuid()}-{hashlib.sha256(bytes(ROOT)).hexdigest()[:12]}"
    shutil.rmtree(base, ignore_errors=True)
    copy = base / ROOT.name
    for name in sorted(set(listed.split("\0")) - {""}):
        source = ROOT / name
        if name.split("/", 1)[0] in (".cache", ".venv") or not (source.is_file() or source.is_symlink()):
            continue  # the caches, and files deleted in the working tree
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy / name, follow_symlinks=False)
    return copy


@task(
    help={
        "fast": "Lint and unit tests only (no containers).",
        "keyword": "Only tests whose names match this pytest -k expression (skips lint and molecule).",
        "scenario": f"Only this molecule scenario ({', '.join(SCENARIOS)}); skips lint, unit and integration tests.",
        "lanes": "How many stages run at the same time (default 2, or MSGPU_TEST_LANES; 1: one after another).",
    }
)
def test(c: Context, fast: bool = False, keyword: str = "", scenario: str = "", lanes: int = 0) -> None:
    """The whole suite as CI runs it: lint, unit tests, sandbox integration tests, molecule scenarios."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    if keyword:
        _sandbox_image()
        _run(c, f"pytest -q -k {shlex.quote(keyword)} tests/unit tests/integration")
        return
    if scenario and scenario not in SCENARIOS:
        raise Exit(f"--scenario: '{scenario}' is unknown; allowed: {', '.join(SCENARIOS)}", code=2)
    lanes = lanes or int(os.environ.get("MSGPU_TEST_LANES", "2"))
    if lanes < 1:
        raise Exit(f"--lanes: '{lanes}' is not allowed; allowed: 1 or more", code=2)
    if not scenario:
        timings["lint"] = _timed(lambda: lint(c))
    if fast:
        timings["unit"] = _run(c, "pytest -q tests/unit", what="unit tests (catalog, resolver, fixtures)")
        print(f"\nAll checks passed in {time.monotonic() - started:.0f} s.")
        return
    prepare_started = time.monotonic()
    image = _sandbox_image()
    if not scenario:
        _sandbox_image("bullseye")
    env = {"MSGPU_SANDBOX_IMAGE": image}
    with _fixture_mirror() as group_vars:
        timings["prepare (images, fixtures)"] = time.monotonic() - prepare_started
        if scenario:
            stages = [_scenario_stage(scenario, group_vars, env)]
        else:
            # Longest first, so that the lanes end close together; the unit tests fill the gap at the end.
            stages = [
                _scenario_stage(VERIFY_SCENARIO, group_vars, env),
                _pytest_stage(
                    "faults",
                    "tests/integration/test_faults.py",
                    "mirror faults, killed runs and interrupted installs on a real container",
                    env,
                ),
                _pytest_stage(
                    "preflight",
                    "tests/integration --ignore=tests/integration/test_faults.py",
                    "the preflight's refusals and check mode on real containers, each host left unchanged",
                    env,
                ),
                _pytest_stage(
                    "fleet",
                    "tests/fleet",
                    "4 containers on their own network: cache, offline, unreachable host, rolling, MPI",
                    env,
                ),
                *(_scenario_stage(name, group_vars, env) for name in SCENARIOS if name != VERIFY_SCENARIO),
                _pytest_stage(
                    "serving",
                    "tests/serving",
                    "the catalog's stack with MindSpore and Serving from PyPI on a fresh container: role, "
                    "launcher, verify.yml's Serving check, uninstall",
                    env,
                ),
                _unit_stage(env),
            ]
        runner = suite.Runner(ROOT, RESULTS / "test-logs", _env(), lanes=lanes)
        print(f"\n{len(stages)} stages, {lanes} at a time; logs in {runner.log_dir}", flush=True)
        results = runner.run(stages)
    total = time.monotonic() - started
    report = suite.write_report(RESULTS / "test-timings.json", timings, results, runner, total)
    print("\nStage times:")
    for name, seconds in timings.items():
        print(f"  {name:<28} {seconds:7.0f} s")
    for result in results:
        steps = ", ".join(f"{k} {v:.0f} s" for k, v in result.steps.items())
        print(f"  {result.stage:<28} {result.seconds:7.0f} s  {'ok' if result.ok else 'FAILED'}  ({steps})")
    print(
        f"Peak disk used by the run: {report['peak_disk_used_gib']} GiB (free at start "
        f"{report['free_disk_at_start_gib']} GiB); wall time {total:.0f} s; numbers in {RESULTS / 'test-timings.json'}"
    )
    failed = [r for r in results if not r.ok]
    if failed:
        raise Exit("FAILED: " + "; ".join(f"{r.stage} at {r.failed_step} (log: {r.log})" for r in failed), code=1)
    print(f"\nAll checks passed in {total:.0f} s.")


def _timed(action) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


@task(
    help={
        "inventory": "Inventory of real hosts; without it one local sandbox container is provisioned.",
        "limit": "Ansible --limit pattern.",
        "check": "Dry run: ansible-playbook --check --diff.",
        "extra": 'Extra ansible-playbook arguments, e.g. "-e stack_cudnn_method=wheel".',
        "batch": "Rolling mode: provision this many hosts at a time, stop at the first failed batch (0: all at once).",
    }
)
def provision(
    c: Context, inventory: str = "", limit: str = "", check: bool = False, extra: str = "", batch: int = 0
) -> None:
    """Provision the GPU stack with playbooks/site.yml (a local sandbox host when no inventory is given)."""
    if batch < 0:
        raise Exit(f"--batch: '{batch}' is not allowed; allowed: 0 (all hosts at once) or a positive number", code=2)
    args = ["ansible-playbook", "-i", "INVENTORY", "playbooks/site.yml"]
    if limit and not batch:
        args += ["--limit", limit]
    if check:
        args += ["--check", "--diff"]
    if inventory:
        if not Path(inventory).exists():
            raise Exit(f"--inventory: '{inventory}' does not exist (copy inventory/example to start one)", code=2)
        # Absolute: the commands run in the project root, invoke itself may run in any folder below it.
        inventory = str(Path(inventory).resolve())
        args[2] = inventory
        cmd = " ".join(shlex.quote(a) for a in args) + (f" {extra}" if extra else "")
        if batch:
            _rolling(c, cmd, inventory, limit, batch, extra)
        else:
            _run(c, cmd, what="ansible-playbook site.yml")
        return
    print(f"No inventory given: provisioning the local sandbox host {SANDBOX_HOST} (no GPU), with NVIDIA's")
    print("downloads served from a loopback mirror of fixtures built from NVIDIA's PyPI wheels.")
    with _fixture_mirror() as group_vars:
        args[2] = str(_sandbox_up(group_vars))
        cmd = " ".join(shlex.quote(a) for a in args) + (f" {extra}" if extra else "")
        _run(c, cmd, what="ansible-playbook site.yml")
    print("Done. Look around with: ./toolkit sandbox shell   (then: source /etc/msgpu/env/cuda-*.sh; nvcc --version)")


def _fleet_hosts(inventory: str, limit: str) -> list[str]:
    """The inventory's hosts of the provisioned group (gpu_servers), in inventory order, within --limit."""
    args = [str(VENV_BIN / "ansible"), "-i", inventory, "gpu_servers", "--list-hosts"]
    if limit:
        args += ["--limit", limit]
    result = subprocess.run(args, capture_output=True, text=True, env=_env(), cwd=ROOT)
    if result.returncode != 0:
        raise Exit(f"could not list the hosts of {inventory}: {result.stderr.strip()[-500:]}", code=2)
    return [line.strip() for line in result.stdout.splitlines()[1:] if line.strip()]


def _rolling(c: Context, cmd: str, inventory: str, limit: str, batch: int, extra: str) -> None:
    """Run site.yml on `batch` hosts at a time; stop at the first batch with a failed or unreachable host.

    OpenMPI's cluster settings (hostfile, SSH trust between hosts) describe the whole fleet, not a
    batch: the batches skip the openmpi tag, and one openmpi.yml run over every host follows them.
    """
    hosts = _fleet_hosts(inventory, limit)
    batches = [hosts[i : i + batch] for i in range(0, len(hosts), batch)]
    for number, group in enumerate(batches, 1):
        try:
            _run(
                c,
                f"{cmd} --skip-tags openmpi --limit {shlex.quote(','.join(group))}",
                what=f"batch {number}/{len(batches)}: {', '.join(group)}",
            )
        except Exit as exc:
            untouched = [h for later in batches[number:] for h in later]
            raise Exit(
                f"{exc.message}\nRolling run stopped at batch {number} of {len(batches)} ({', '.join(group)}); "
                f"not started: {', '.join(untouched) or 'none'}. Fix the host, then run again (finished hosts re-run "
                "with no changes).",
                code=1,
            ) from exc
    if "--tags" not in extra or "openmpi" in extra:
        openmpi = ["ansible-playbook", "-i", inventory, "playbooks/openmpi.yml", "--limit", ",".join(hosts)]
        _run(c, " ".join(shlex.quote(a) for a in openmpi), what=f"OpenMPI for the whole fleet ({len(hosts)} hosts)")
    print(f"Rolling run: {len(hosts)} hosts in {len(batches)} batches of up to {batch}, all finished.")


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
    cmd = _playbook_args(
        "playbooks/site.yml",
        _target_inventory(inventory),
        limit,
        {COMPONENT_STATES[name]: "absent" for name in chosen},
        extra,
    )
    _run(c, cmd, what=f"ansible-playbook site.yml, state absent: {', '.join(chosen)}")


# The repository's own copy of MNIST (the catalog's `mnist.repository_copy`, its last MNIST source).
MNIST_COPY = ROOT / "data" / "mnist"
RESULTS = ROOT / "artifacts"


def _verify_vars() -> dict:
    """Verify settings of sandbox hosts: the CUDA runtime the fixture toolkit really carries (NVIDIA's 11.7
    wheel whatever the runfile's name; the judge compares what the process loaded with this).

    MNIST needs no setting: the verify role fills the controller's cache from the catalog's sources in
    order, and where the mirrors are unreachable (this test bed) it gives them up at once and takes the
    repository's copy (data/mnist)."""
    runtime = str(_catalog()["cuda_wheels"]["nvidia-cuda-runtime-cu11"]["version"])
    return {"verify_expect_cuda": ".".join(runtime.split(".")[:2])}


def _playbook_args(playbook: str, inventory: str, limit: str, extra_vars: dict, extra: str) -> str:
    args = ["ansible-playbook", "-i", inventory, playbook, "-e", json.dumps(extra_vars)]
    if limit:
        args += ["--limit", limit]
    return " ".join(shlex.quote(a) for a in args) + (f" {extra}" if extra else "")


def _target_inventory(inventory: str) -> str:
    """The user's inventory, or the local sandbox host (which must have been provisioned)."""
    if inventory:
        if not Path(inventory).exists():
            raise Exit(f"--inventory: '{inventory}' does not exist (copy inventory/example to start one)", code=2)
        # Absolute: the commands run in the project root, invoke itself may run in any folder below it.
        return str(Path(inventory).resolve())
    if not (sandbox.docker_ready() and sandbox.host_running(SANDBOX_HOST) and SANDBOX_INVENTORY.exists()):
        raise Exit(f"the sandbox host {SANDBOX_HOST} is not running: run ./toolkit provision first", code=2)
    print(f"No inventory given: using the local sandbox host {SANDBOX_HOST} (no GPU).")
    return str(SANDBOX_INVENTORY)


def _print_summary(folder: Path) -> dict:
    summary_file = folder / "summary.json"
    if not summary_file.exists():
        raise Exit(f"no report in {folder}: the verify playbook did not get to write it", code=1)
    summary = json.loads(summary_file.read_text())
    # The fleet comparison: hosts that failed or are slow against the fleet's median, and the
    # data-parallel and MPI checks across hosts.
    fleet = summary.get("fleet") or {}
    for entry in fleet.get("table", []):
        if entry["status"] != "OK":
            print(f"{entry['status']} {entry['host']}: {entry['reason']}")
    if fleet.get("distributed"):
        print(f"data-parallel: {fleet['distributed']['verdict']} {fleet['distributed'].get('explanation') or ''}")
    print(f"\nReport: {folder / 'report.html'} and report.md; per-host JSON in {folder / 'hosts'}")
    return summary


@task(
    help={
        "inventory": "Inventory of real hosts; without it the local sandbox host (./toolkit provision first).",
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
    target = _target_inventory(inventory)
    extra_vars = {"verify_quick": quick, "verify_results_dir": str(folder), **({} if inventory else _verify_vars())}
    started = time.monotonic()
    try:
        _run(
            c,
            _playbook_args("playbooks/verify.yml", target, limit, extra_vars, extra),
            what="ansible-playbook verify.yml",
        )
    finally:
        # A failed host still has its verdict in the report: say where it is either way.
        if (folder / "summary.json").exists():
            _print_summary(folder)
        print(f"verify wall time: {time.monotonic() - started:.0f} s")


@task(
    help={
        "inventory": "Inventory of real hosts; without it the local sandbox host (./toolkit provision first).",
        "limit": "Ansible --limit pattern: the lab's first GPU host.",
        "out": "Folder for the JSON files (default artifacts/verify/gpu-smoke).",
        "extra": 'Extra ansible-playbook arguments, e.g. "-e verify_warmup_timeout=3600".',
    }
)
def gpu_smoke(c: Context, inventory: str = "", limit: str = "", out: str = "", extra: str = "") -> None:
    """GPU smoke test: GPU probe, first and second CUDA context (JIT cost, cache), judge, quick bench; one JSON."""
    folder = Path(out).resolve() if out else RESULTS / "verify" / "gpu-smoke"
    target = _target_inventory(inventory)
    extra_vars = {"verify_gpu_smoke_results_dir": str(folder), **({} if inventory else _verify_vars())}
    _run(c, _playbook_args("playbooks/gpu_smoke.yml", target, limit, extra_vars, extra), what="gpu_smoke.yml")
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
        "inventory": "Inventory of real hosts; without it the local sandbox host (./toolkit provision first).",
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
    """The LeNet5 benchmark (3 epochs, full MNIST) and, in the same run, the seed's script for the ratio."""
    if fleet:
        from testbed import fleet_bench

        folder = Path(out).resolve() if out else RESULTS / "bench"
        results = fleet_bench.run(
            folder, full, lambda root, url: _sandbox_group_vars(root, fixtures.inventory_vars(root, url))
        )
        print(json.dumps(results, indent=2))
        print(f"Numbers: {folder / 'bench-fleet.json'}")
        return
    if device not in ("", "GPU", "CPU"):
        raise Exit(f"--device: '{device}' is not allowed; allowed: GPU, CPU (or empty for auto)", code=2)
    folder = Path(out).resolve() if out else RESULTS / "bench"
    target = _target_inventory(inventory)
    extra_vars = {
        "verify_judge": False,
        "verify_distributed": False,
        "verify_compare_seed": True,
        "verify_bench_device": device,
        "verify_results_dir": str(folder),
        **({} if inventory else _verify_vars()),
    }
    _run(c, _playbook_args("playbooks/verify.yml", target, limit, extra_vars, ""), what="benchmark (verify.yml)")
    # The report's summary already holds every host's numbers (report.py summary_row).
    rows = _print_summary(folder)["hosts"]
    for row in rows:
        print(
            f"{row['host']}: {row['device']} {row['images_per_s']} images/s (median of epochs >= 2), "
            f"accuracy {row['accuracy']}; seed script {row['seed_images_per_s']} images/s; ratio {row['ratio']}"
        )
    (folder / "bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"Numbers: {folder / 'bench.json'}")


def _sandbox_up(group_vars: dict | None = None) -> Path:
    try:
        sandbox.ensure_docker()
        if not sandbox.host_running(SANDBOX_HOST):
            sandbox.start_host(SANDBOX_HOST)
    except sandbox.SandboxError as exc:
        raise Exit(f"sandbox: {exc}", code=1) from exc
    return sandbox.write_inventory(SANDBOX_INVENTORY, [SANDBOX_HOST], group_vars)


@task(positional=["action"], help={"action": "up | down | shell | status"})
def sandbox_host(c: Context, action: str) -> None:
    """Manage the local sandbox host (an Ubuntu 20.04 container without a GPU)."""
    if action == "up":
        print(f"{SANDBOX_HOST} is up; inventory: {_sandbox_up()}")
    elif action == "down":
        sandbox.stop_host(SANDBOX_HOST)
        print(f"{SANDBOX_HOST} removed")
    elif action == "shell":
        _sandbox_up()
        os.execvp("docker", ["docker", "exec", "-it", SANDBOX_HOST, "bash", "-l"])
    elif action == "status":
        running = sandbox.docker_ready() and sandbox.host_running(SANDBOX_HOST)
        print(f"{SANDBOX_HOST}: {'running' if running else 'not running'}; image {sandbox.image_tag()}")
    else:
        raise Exit(f"sandbox: unknown action '{action}'; allowed: up, down, shell, status", code=2)


def _seed_mnist(cache: Path) -> None:
    """The test bed cannot reach MNIST's mirrors: the repository's copy (data/mnist) goes into the artifact
    cache, where the filler checks it against the catalog's sha256 (`mnist.files`) like a download."""
    (cache / "mnist").mkdir(parents=True, exist_ok=True)
    for path in MNIST_COPY.glob("*.gz"):
        if not (cache / "mnist" / path.name).exists():
            shutil.copy(path, cache / "mnist" / path.name)


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
            target = _target_inventory(inventory)
        else:
            group_vars = stack.enter_context(_fixture_mirror())
            target = str(sandbox.write_inventory(sandbox.CACHE / "fetch" / "inventory.yml", [SANDBOX_HOST], group_vars))
            folder = folder or Path(group_vars["stack_artifact_cache_dir"])
            _seed_mnist(folder)
        stop = threading.Event()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            threading.Thread(target=_follow, args=(folder / ".fetch.log", stop), daemon=True).start()
        try:
            _run(
                c,
                _playbook_args("playbooks/fetch.yml", target, "", extra_vars, extra),
                what="ansible-playbook fetch.yml",
            )
        finally:
            stop.set()


namespace = Collection(setup, lint, test, provision, uninstall, verify, bench, fetch)
namespace.add_task(sandbox_host, name="sandbox")


@task(
    help={
        "inventory": "Inventory of real hosts; without it the local sandbox host (./toolkit provision first).",
        "host": "Only this host (an Ansible --limit pattern).",
        "json": "Print every host's findings as JSON instead of the text report.",
        "out": "Folder for the findings (default artifacts/doctor).",
    }
)
def doctor(c: Context, inventory: str = "", host: str = "", json_: bool = False, out: str = "") -> None:
    """Explain a broken GPU host: each finding with its severity, evidence and fix (exit 1 on an error)."""
    folder = Path(out).resolve() if out else RESULTS / "doctor"
    target = _target_inventory(inventory)
    started = time.monotonic()
    args = _playbook_args("playbooks/doctor.yml", target, host, {"verify_doctor_results_dir": str(folder)}, "")
    with c.cd(str(ROOT)):
        result = c.run(args, env=_env(), warn=True, pty=False, hide=True)
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


namespace.add_task(doctor)
namespace.add_task(gpu_smoke, name="gpu-smoke")
