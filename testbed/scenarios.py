"""The test bed's scenarios: the sandbox hosts' settings, the molecule scenarios, the suite's stages.

Used by the development commands (`./toolkit test`, `./toolkit sandbox`, and `provision`, `fetch`,
`verify`, `bench` run without an inventory: cli/), and by the integration and fleet tests. Each scenario's
stack settings (SCENARIO_VARS) and the catalog they are derived from are testbed/stacks.py's.
"""

from __future__ import annotations

import dataclasses
import fcntl
import filecmp
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from testbed import files, fixtures, mirror, sandbox, stacks, suite

# The test bed's stacks (testbed/stacks.py); second_cuda is named here for the tests, as scenarios.second_cuda.
from testbed.stacks import CATALOG, SCENARIO_VARS, ScenarioError, seed_nccl
from testbed.stacks import second_cuda as second_cuda

ROOT = files.ROOT
# The local sandbox host of `./toolkit provision` without an inventory, and its inventory.
SANDBOX_HOST = "msgpu-sandbox-1"
SANDBOX_INVENTORY = files.CACHE / "sandbox" / "inventory.yml"
# The test bed's controller-side artifact cache (stack_artifact_cache_dir).
ARTIFACT_CACHE = files.CACHE / "artifact-cache"
MOLECULE_VARS = files.CACHE / "molecule"
# The repository's own copy of MNIST (the catalog's `mnist.repository_copy`, its last MNIST source).
MNIST_COPY = ROOT / "data" / "mnist"


# The controller's artifact cache filler of the `artifacts` role (its lock and sha256 memo, which
# link_cache_duplicates keeps valid).
artifact_cache = stacks.load_role_file("artifact_cache", "artifacts/files/artifact_cache.py")

# Molecule scenarios: name -> what they prove. Each converges site.yml on a fresh Ubuntu 20.04
# container, converges again demanding changed=0, and runs the testinfra modules.
# cli/checks.py names them in `./toolkit test --help` (SCENARIO_NAMES; a unit test keeps the two equal).
# The suite runs them among its other stages longest first (suite_stages; measured on 2026-12-02 with
# their tests/methods step: runfile 723 s, nvidia_repo 536 s, wheels ~400 s), so the two lanes end close
# together.
SCENARIOS = {
    "default": "the seed's stack: distro driver with real DKMS, CUDA runfile, "
    "cuDNN and the seed's NCCL 2.8.4 tarballs (fixtures), OpenMPI, the MindSpore venv, TensorRT's tarball; "
    "then the system tests on it",
    "runfile": "the driver's runfile --silent --dkms (fixture from Ubuntu's real NVIDIA sources and "
    "libraries) with a real DKMS build (+ a kernel upgrade), and a second CUDA runfile toolkit side by side",
    "nvidia_repo": "NVIDIA's CUDA apt repository (a signed fixture repo on loopback, signed-by keyring): "
    "cuda-drivers with real DKMS, two cuda-toolkit-11-x side by side, libcudnn8, libnccl2",
    "wheels": "cuDNN 8.5, NCCL 2.14 (the stacks' default NCCL) and TensorRT 8.4 from NVIDIA's real PyPI wheels",
}


def verify_vars() -> dict:
    """Verify settings of sandbox hosts: the CUDA runtime the fixture toolkit really carries (NVIDIA's 11.7
    wheel whatever the runfile's name; the judge compares what the process loaded with this).

    MNIST needs no setting: the verify role fills the controller's cache from the catalog's sources in
    order, and where the mirrors are unreachable (this test bed) it gives them up at once and takes the
    repository's copy (data/mnist)."""
    runtime = str(CATALOG["cuda_wheels"]["nvidia-cuda-runtime-cu11"]["version"])
    return {"verify_expect_cuda": ".".join(runtime.split(".")[:2])}


# The scenario whose converged host the system tests (playbooks/verify.yml) run against.
VERIFY_SCENARIO = "default"
VERIFY_HOST = "msgpu-molecule-focal"
# The image that host runs from during the system tests (sandbox.rebase_host): its throwaway copies
# (the doctor's broken hosts) share its files instead of copying them.
VERIFY_IMAGE = "msgpu-verify-host:default"


# The test bed's copy of the catalog, every sandbox host's stack_catalog_file (fixtures.testbed_catalog).
TESTBED_CATALOG = fixtures.TESTBED_CATALOG
FIXTURE_UNPACKED_PER_BYTE = fixtures.FIXTURE_UNPACKED_PER_BYTE


def testbed_catalog(mirror_root: Path | None = None) -> Path:
    """fixtures.testbed_catalog written to TESTBED_CATALOG (which a test points elsewhere)."""
    return fixtures.testbed_catalog(mirror_root, TESTBED_CATALOG)


# Files smaller than this are not worth a hard link.
LINK_MIN_BYTES = 16 * 2**20
_LINKED: set[tuple[int, int]] = set()  # (st_dev, st_ino) of cache files already examined and linked or kept


def link_cache_duplicates(cache: Path | None = None, sources: tuple[Path, ...] = ()) -> int:
    """Hard-link each file of the controller's artifact cache (ARTIFACT_CACHE, top level) that is
    byte-for-byte a file of the same name in the fixture mirror or the fixture builder's wheel downloads
    (.cache/wheels) to that file, so the test bed keeps one copy on disk instead of two (the cache's
    runfile, tarballs and NVIDIA wheels: 2-4 GB during a suite run). Storage only: the product's filler
    writes every file under a temporary name and renames it (roles/artifacts/files/artifact_cache.py), the
    mirror's builders do the same, nothing writes either in place, so a link changes no file anyone
    reads. The swap happens under the filler's lock (a file the filler holds is left for the next pass),
    and the filler's sha256 memo follows the file to its new inode and mtime: same bytes, same sha256, so
    the next cache lookup does not read the file again (it did, 2.4 s in an idempotence run). Returns the
    bytes freed. `./toolkit test` runs it every minute while its stages run."""
    cache = cache or ARTIFACT_CACHE
    sources = sources or (files.CACHE / "mirror", files.CACHE / "wheels")
    if not cache.is_dir():
        return 0
    by_name: dict[str, list[Path]] = {}
    for source in sources:
        if source.is_dir():
            for path in source.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    by_name.setdefault(path.name, []).append(path)
    freed = 0
    for target in sorted(cache.iterdir()):
        try:
            stat = target.stat()
        except OSError:
            continue
        if not target.is_file() or target.is_symlink() or stat.st_size < LINK_MIN_BYTES:
            continue
        if stat.st_nlink > 1 or (stat.st_dev, stat.st_ino) in _LINKED:
            continue
        for source in by_name.get(target.name, []):
            try:
                same_size = source.stat().st_size == stat.st_size and source.stat().st_dev == stat.st_dev
                if not same_size or not filecmp.cmp(source, target, shallow=False):
                    continue
                linked = _link_in_place(cache, target, source, stat)
            except OSError:
                continue
            if linked:
                freed += stat.st_size
            break
        else:
            _LINKED.add((stat.st_dev, stat.st_ino))  # no twin: not compared again
    return freed


def _link_in_place(cache: Path, target: Path, source: Path, compared: os.stat_result) -> bool:
    """Replace `target` (a cache file compared equal to `source` while it had the stat `compared`) with a hard
    link to `source`, under the filler's lock, carrying the filler's sha256 memo entry over; False (nothing
    done) while a filler holds the lock or when the file changed since the comparison."""
    with open(cache / artifact_cache.LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        now = target.stat()
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (compared.st_ino, compared.st_size, compared.st_mtime_ns):
            return False
        partial = target.with_name(f".{target.name}.link-{os.getpid()}")
        os.link(source, partial)
        os.replace(partial, target)
        memo = artifact_cache.load_memo(cache)
        known = memo.get(target.name)
        if isinstance(known, list) and len(known) == 4 and known[:3] == [now.st_size, now.st_mtime_ns, now.st_ino]:
            linked = target.stat()
            memo[target.name] = [linked.st_size, linked.st_mtime_ns, linked.st_ino, known[3]]
            artifact_cache.save_memo(cache, memo)
    return True


def sandbox_group_vars(root: Path, mirror_vars: dict) -> dict:
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
        # The catalog with the fixture CUDA toolkit's size (testbed_catalog).
        "stack_catalog_file": str(testbed_catalog(root)),
        # The seed's NCCL tarball (a fixture) in every scenario but wheels, which runs the default wheel.
        **seed_nccl(),
        **mirror_vars,
        "cudnn_expected_version": reports["cudnn_tarball"],
        "nccl_expected_version": reports["nccl_tarball"],
        "tensorrt_expected_version": reports["tensorrt_tarball"],
        # Ansible's async polls (15 s/10 s/5 s by default): 5 s here, where most installs take seconds. Not
        # shorter: each poll is a module run through `docker exec`, CPU taken from the DKMS build or the
        # benchmark it waits for on these two cores.
        **{f"{role}_poll_seconds": 5 for role in ("nvidia_driver", "cuda", "cuda_library", "verify")},
        # The controller's artifact cache, as on a user's controller: every file fetched once from the
        # fixture mirror (or PyPI), then copied to the hosts.
        "stack_artifact_cache_dir": str(ARTIFACT_CACHE),
    }


@contextmanager
def fixture_mirror() -> Iterator[dict]:
    """Build the NVIDIA fixtures (cached) and serve them on 127.0.0.1 while the block runs.

    Yields the group vars of a sandbox host using it (see sandbox_group_vars). A fixture that cannot be
    built raises fixtures.FixtureError before anything is served.
    """
    root = fixtures.build_mirror()
    with mirror.serving(root) as served:
        print(f"Fixture mirror: {served.base_url} ({root})")
        yield sandbox_group_vars(root, fixtures.inventory_vars(root, served.base_url))


def seed_mnist(cache: Path) -> None:
    """The test bed cannot reach MNIST's mirrors: the repository's copy (data/mnist) goes into the artifact
    cache, where the filler checks it against the catalog's sha256 (`mnist.files`) like a download."""
    (cache / "mnist").mkdir(parents=True, exist_ok=True)
    for path in MNIST_COPY.glob("*.gz"):
        if not (cache / "mnist" / path.name).exists():
            shutil.copy(path, cache / "mnist" / path.name)


def write_group_vars(scenario: str, group_vars: dict) -> dict:
    """The scenario's settings (the sandbox hosts' group vars and SCENARIO_VARS), written where its molecule.yml
    links its group_vars (.cache/molecule/<scenario>/group_vars); returns them."""
    settings = {**group_vars, **SCENARIO_VARS[scenario]}
    folder = MOLECULE_VARS / scenario / "group_vars"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_servers.yml").write_text(json.dumps(settings, indent=2) + "\n")
    return settings


# A molecule scenario run alone (`molecule test -s wheels` after `./toolkit setup`) reads the group vars
# `./toolkit setup` wrote (or the last suite run wrote) and serves the fixture mirror at their URL itself
# (molecule/common/prepare.yml: `python -m testbed.mirror --ensure`). setup uses this port unless
# MSGPU_MIRROR_PORT says another; the suite serves on a free port and rewrites the group vars.
STANDALONE_MIRROR_PORT = 47831
# The image molecule.yml falls back to when MSGPU_SANDBOX_IMAGE is not set (setup tags the current one).
STANDALONE_IMAGE = "msgpu-sandbox:focal"


def prepare_standalone(image: str) -> Path:
    """Make every molecule scenario runnable alone: the fixtures built, each scenario's group vars written
    for a mirror at 127.0.0.1:MSGPU_MIRROR_PORT, the sandbox image tagged STANDALONE_IMAGE, the compiler
    cache folder there. Returns the mirror's root."""
    root = fixtures.build_mirror()
    port = int(os.environ.get("MSGPU_MIRROR_PORT", STANDALONE_MIRROR_PORT))
    group_vars = sandbox_group_vars(root, fixtures.inventory_vars(root, f"http://127.0.0.1:{port}"))
    for name in SCENARIOS:
        write_group_vars(name, group_vars)
    subprocess.run(["docker", "tag", image, STANDALONE_IMAGE], check=True, capture_output=True)
    sandbox.compiler_cache_dir()
    return root


# What `./toolkit test --full` adds to `./toolkit test` (CI): the Serving stage (EXTENDED_STAGES) and the test
# modules marked `extended` (registered in pyproject.toml: tests/system/test_driver_upgrade.py,
# tests/system/test_serving_cpu_steps.py): the costliest parts (cold DKMS builds of another driver branch, a
# second MindSpore stack) whose product paths the CI run still converges or checks by other means
# (docs/testing.md, "The full suite"). On CI's two cores the rest takes about 50 minutes (measured 2026-12-03).
EXTENDED_MARKER = "extended"
EXTENDED_STAGES = ("serving",)


def pytest_command(full: bool) -> str:
    """A stage's pytest command line, up to its paths; it leaves out the extended tests unless `full`."""
    marker = "" if full else f"-m {shlex.quote('not ' + EXTENDED_MARKER)} "
    return f"pytest -q -s -p no:cacheprovider --durations=20 {marker}"


def scenario_stage(name: str, group_vars: dict, env: dict[str, str], full: bool = False) -> suite.Stage:
    """One molecule scenario as a stage. Its converged host outlives molecule's verify step for the tests
    that need a provisioned host, then molecule destroys it: the verify scenario's for the system tests of
    playbooks/verify.yml (tests/system), every other one's for `./toolkit uninstall` of the scenario's
    install methods (tests/methods). `--destroy never` also skips the sequence's first destroy, so
    leftovers of an interrupted run are removed first."""
    what = SCENARIOS[name]
    settings = write_group_vars(name, group_vars)
    if name == VERIFY_SCENARIO:
        # The host's own settings (the scenario's too: TensorRT is on there), so a site.yml run through this
        # inventory (tests/system/test_driver_upgrade.py) converges the same stack.
        inventory = sandbox.write_inventory(
            MOLECULE_VARS / name / "verify-inventory.yml", [VERIFY_HOST], {**settings, **verify_vars()}
        )
        label, tests, basetemp = "system (verify.yml)", "tests/system", "system"
        test_env = {**env, "MSGPU_VERIFY_INVENTORY": str(inventory), "MSGPU_VERIFY_IMAGE": VERIFY_IMAGE}
    else:
        platform = yaml.safe_load((ROOT / "molecule" / name / "molecule.yml").read_text())["platforms"][0]["name"]
        inventory = sandbox.write_inventory(MOLECULE_VARS / name / "uninstall-inventory.yml", [platform], settings)
        # The runfile-only check (nouveau loaded) runs on the runfile host alone: no test skips elsewhere.
        tests = "tests/methods" if name == "runfile" else "tests/methods/test_uninstall_methods.py"
        label, basetemp = "uninstall (its methods)", f"methods-{name}"
        test_env = {**env, "MSGPU_SCENARIO_INVENTORY": str(inventory), "MSGPU_SCENARIO": name}
    leftovers = f"molecule destroy -s {name} >/dev/null 2>&1 || true"
    cleanup = [f"molecule destroy -s {name}"]
    rebase: list[suite.Step] = []
    if name == VERIFY_SCENARIO:
        remove_image = f"docker rmi -f {VERIFY_IMAGE} >/dev/null 2>&1 || true"
        leftovers, cleanup = f"{leftovers}; {remove_image}", [*cleanup, remove_image]
        rebase = [
            suite.Step("rebase on an image", f"python -m testbed.sandbox rebase {VERIFY_HOST} {VERIFY_IMAGE}", env)
        ]
    pytest = pytest_command(full)
    steps = [
        suite.Step("destroy leftovers", leftovers, env),
        suite.Step(f"molecule {name}", f"molecule test -s {name} --destroy never", env),
        *rebase,
        suite.Step(
            label, f"{pytest}--basetemp={shlex.quote(str(files.CACHE / 'pytest' / basetemp))} {tests}", test_env
        ),
    ]
    return suite.Stage(f"molecule {name}", what, steps, cleanup=cleanup)


def pytest_stage(name: str, paths: str, what: str, env: dict[str, str], full: bool = False) -> suite.Stage:
    # Each stage's own temporary folder: pytest runs side by side never tidy up each other's.
    (files.CACHE / "pytest").mkdir(parents=True, exist_ok=True)
    basetemp = shlex.quote(str(files.CACHE / "pytest" / name))
    pytest = pytest_command(full)
    return suite.Stage(name, what, [suite.Step(name, f"{pytest}--basetemp={basetemp} {paths}", env)])


# The unit tests that read what the prepare step builds (the fixture mirror, the driver fixture's .debs) carry
# this pytest marker (registered in pyproject.toml); the others run while it builds them.
PREPARED_MARKER = "prepared"


def unit_stages(env: dict[str, str]) -> tuple[suite.Stage, suite.Stage]:
    """The unit tests as two stages, both run in one copy of the working tree outside the checkout (nothing
    beside it), so a clone anywhere passes them; the fixture caches are this checkout's (MSGPU_CACHE):
    `unit`, the tests that need nothing the prepare step builds (`./toolkit test` runs it, after lint, while it
    prepares the images and fixtures), and `fixtures`, the tests of the fixtures themselves (PREPARED_MARKER),
    among the container stages. With MSGPU_NO_MIRROR_BUILD set, the first stage's tests cannot build the
    mirror (testbed/fixtures.py: build_mirror): a test that needs it and lacks the marker fails, naming it."""
    copy = isolated_copy()
    (files.CACHE / "pytest").mkdir(parents=True, exist_ok=True)
    stages = []
    for name, selected, what, extra in (
        ("unit", f"not {PREPARED_MARKER}", "catalog, resolver, verification, CLI", {"MSGPU_NO_MIRROR_BUILD": "1"}),
        ("fixtures", PREPARED_MARKER, "the NVIDIA fixtures and the fixture apt repository", {}),
    ):
        basetemp = shlex.quote(str(files.CACHE / "pytest" / name))
        command = (
            f"cd {shlex.quote(str(copy))} && pytest -q -p no:cacheprovider -m {shlex.quote(selected)} "
            f"--basetemp={basetemp} tests/unit"
        )
        stages.append(
            suite.Stage(
                name,
                f"unit tests: {what} (in {copy}, a copy of the working tree)",
                [suite.Step(name, command, {**env, "MSGPU_CACHE": str(files.CACHE), **extra})],
            )
        )
    return stages[0], stages[1]


_ISOLATED_COPY: list[Path] = []  # the copy isolated_copy made in this process


def isolated_copy() -> Path:
    """The working tree as a clone elsewhere has it, in a folder whose parent holds nothing else (no
    data folder beside the checkout, no .cache, no .venv): the unit stage runs its tests there to prove
    that a clone anywhere passes them. The files are those git would commit (`git ls-files -co
    --exclude-standard`: tracked, and new ones not ignored), uncommitted changes included, which a
    `git clone` would miss. Built once per process (the unit stages run in it while the suite goes on);
    returns the copy's root. Run pytest on <copy>/tests/unit with MSGPU_CACHE=<this .cache>, so the fixture
    caches are not built twice.
    """
    if _ISOLATED_COPY:
        return _ISOLATED_COPY[0]
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ScenarioError(f"isolated copy: {ROOT} is not a git checkout git can list ({exc})") from exc
    base = Path(tempfile.gettempdir()) / f"msgpu-isolated-{os.getuid()}-{hashlib.sha256(bytes(ROOT)).hexdigest()[:12]}"
    shutil.rmtree(base, ignore_errors=True)
    copy = base / ROOT.name
    for name in sorted(set(listed.split("\0")) - {""}):
        source = ROOT / name
        if name.split("/", 1)[0] in (".cache", ".venv") or not (source.is_file() or source.is_symlink()):
            continue  # the caches, and files deleted in the working tree
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy / name, follow_symlinks=False)
    _ISOLATED_COPY.append(copy)
    return copy


def suite_stages(group_vars: dict, env: dict[str, str], scenario: str = "", full: bool = False) -> list[suite.Stage]:
    """The stages of `./toolkit test` (with `full`, `--full`: the extended tests too, EXTENDED_MARKER), or
    only the molecule scenario `scenario`."""
    if scenario:
        return [scenario_stage(scenario, group_vars, env, full)]
    # Longest first (as measured), so that the two lanes end close together, except that the fleet stage (no
    # DKMS build) runs beside molecule default's first build of the NVIDIA module, and the preflight stage
    # (containers that get almost nothing installed) after it, beside molecule default's rebase: that commit
    # holds the converged host (5.5 GB) twice for about a minute, the suite's disk peak, which the faults
    # stage's host made 1-2 GB higher (run 28: 22.2 GiB with the caches). Measured on 2 cores
    # (2026-12-02): the compiler cache's hit rate stayed at 41 % (most misses are DKMS conftest compiles,
    # which no order makes cacheable) and the suite's wall time did not change. The fixtures' unit tests run
    # last and alone: they build the fixtures no host installs (4.2 GB) from the wheels, fetched again (2.1 GB),
    # which beside molecule wheels' TensorRT install made the run's disk peak (run 29: 24.1 GiB with the caches).
    # The other unit tests ran beside the prepare step (cli/checks.py).
    molecule = {name: scenario_stage(name, group_vars, env, full) for name in SCENARIOS}
    fixtures_unit = dataclasses.replace(unit_stages(env)[1], alone=True)
    stages = [
        molecule[VERIFY_SCENARIO],
        pytest_stage(
            "fleet",
            "tests/fleet",
            "4 containers on their own network: cache, offline, unreachable host, rolling, MPI",
            env,
            full,
        ),
        pytest_stage(
            "preflight",
            "tests/integration --ignore=tests/integration/test_faults.py",
            "the preflight's refusals and check mode on real containers, each host left unchanged",
            env,
            full,
        ),
        pytest_stage(
            "faults",
            "tests/integration/test_faults.py",
            "mirror faults, killed runs, power cuts and interrupted installs on a real container",
            env,
            full,
        ),
        molecule["runfile"],
        molecule["nvidia_repo"],
        pytest_stage(
            "serving",
            "tests/serving",
            "the catalog's stack with MindSpore and Serving from PyPI on a fresh container: role, "
            "launcher, verify.yml's Serving check, uninstall",
            env,
            full,
        ),
        molecule["wheels"],
        fixtures_unit,
    ]
    return [stage for stage in stages if full or stage.name not in EXTENDED_STAGES]


def only_stages(stages: list[suite.Stage], names: str) -> list[suite.Stage]:
    """The stages named in `names` (comma-separated, as the run prints them), in the suite's order."""
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    known = [stage.name for stage in stages]
    unknown = [name for name in wanted if name not in known]
    if unknown or not wanted:
        raise ScenarioError(f"--only: {', '.join(unknown) or repr(names)} unknown; allowed: {', '.join(known)}")
    return [stage for stage in stages if stage.name in wanted]
