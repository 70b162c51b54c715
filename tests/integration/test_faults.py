"""Faults survived, on a real Ubuntu 20.04 container: the loopback fixture mirror goes down, cuts a
download mid-way, serves a corrupt file; the host loses power at six different points (`docker kill`,
then `docker start`: every process on it dies at once; while downloading, inside the CUDA installer,
while unpacking cuDNN, while copying cuDNN into the live CUDA prefix, during the driver's DKMS build,
during MindSpore's pip install); another process holds the dpkg lock; dpkg was interrupted; a library
reports another version than the one expected (the cuda_library role's refusal). Each test
asserts what the host holds afterwards, not only the exit status: no partial or unverified file
where a later run would trust it, nothing installed from a bad download, and a re-run that converges
to the same state as an undisturbed one (then changed=0).

The tests run in file order on one container (msgpu-it-faults): the later ones start from the
state the earlier ones leave (MindSpore imports with the CUDA, cuDNN and libcuda the earlier ones
installed).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from testbed import fixtures, mirror, scenarios
from tests.conftest import pid_alive

from .conftest import ROOT, Host, host_with_mirror, refusals

CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
STACK = CATALOG["stacks"][CATALOG["default_stack"]]
CUDA = STACK["cuda"]
RUNFILE = CATALOG["cuda"][CUDA]["runfile"]
CUDNN = CATALOG["cudnn"][STACK["cudnn"]]["tarball"]
ARTIFACTS = "/var/cache/msgpu/artifacts"
PREFIX = f"/usr/local/cuda-{CUDA}"
DKMS_MODULE = CATALOG["driver"][STACK["driver_branch"]]["distro"]["dkms_module"]
# A kernel the module is installed for, in dkms 2.8's "nvidia, 470.256.02, K, x86_64: installed" and
# dkms 3's "nvidia/470.256.02, K, x86_64: installed".
DKMS_INSTALLED = re.compile(r"^[^,/\s]+[,/] ?[^,:\s]+, ([^,:\s]+), [^:\s]+: installed", re.M)
KERNELS_WITH_HEADERS = "for d in /lib/modules/*; do [ -e $d/build/Makefile ] && basename $d; done; true"
RECAP = re.compile(r"^\S+\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", re.M)
# A file this big anywhere on the host after a failed download would be a (partial) runfile.
NO_BIG_FILES = (
    "find / -xdev \\( -path /proc -o -path /sys -o -path /usr/lib -o -path /var/lib/docker \\) -prune "
    "-o -type f -size +50M -print"
)
# Fast retries for the tests (the roles' defaults are 3 retries, 10 s apart).
FAST_RETRIES = {
    "cuda_download_retries": 2,
    "cuda_download_delay": 1,
    "cuda_library_download_retries": 2,
    "cuda_library_download_delay": 1,
}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` on this machine (children first reached through /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def unique(pattern: str) -> str:
    """A pgrep/pkill -f pattern that does not match the shell that runs it ("[c]uda" vs "cuda")."""
    return f"[{pattern[0]}]{pattern[1:]}"


class Runs:
    """Playbook runs against the faults container, with the mirror that serves its downloads."""

    def __init__(self, host: Host, served: mirror.Mirror, inventory: Path) -> None:
        self.host, self.served, self.inventory = host, served, inventory

    def command(self, playbook: str, extra_vars: dict | None = None, args: list[str] | None = None) -> list[str]:
        return [
            str(Path(sys.prefix) / "bin" / "ansible-playbook"),
            "-i",
            str(self.inventory),
            str(ROOT / "playbooks" / playbook),
            "-e",
            json.dumps({**FAST_RETRIES, **(extra_vars or {})}),
            *(args or []),
        ]

    @staticmethod
    def env() -> dict[str, str]:
        return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")

    def run(
        self, playbook: str, extra_vars: dict | None = None, args: list[str] | None = None
    ) -> tuple[int, str, float]:
        started = time.monotonic()
        proc = subprocess.run(
            self.command(playbook, extra_vars, args),
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=ROOT,
            timeout=900,
            check=False,
        )
        return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started

    def power_cut(self) -> None:
        """The host loses power: every process in the container dies at once (`docker kill`, SIGKILL to all
        of them, the file system as the kill left it), then it boots again (`docker start`: the same
        container, nothing running)."""
        for action in ("kill", "start"):
            done = subprocess.run(["docker", action, self.host.name], capture_output=True, text=True, check=False)
            assert done.returncode == 0, f"docker {action} {self.host.name}: {done.stderr}"

    def run_killed(self, playbook: str, ready: threading.Event, timeout: float = 300) -> None:
        """Start the playbook, wait until `ready` is set (by a watcher), then cut the host's power, and kill
        ansible-playbook on the controller (which would only find the host gone) with every process it
        started: Ansible's task workers call setsid(), so they are outside its process group and a
        killpg alone leaves them running. Nothing of the run may be left on the controller."""
        with open(os.devnull, "w") as sink:
            proc = subprocess.Popen(
                self.command(playbook), stdout=sink, stderr=sink, env=self.env(), cwd=ROOT, start_new_session=True
            )
        try:
            if not ready.wait(timeout):
                pytest.fail(f"the run of {playbook} never reached the point to interrupt")
            self.power_cut()
        finally:
            os.killpg(proc.pid, signal.SIGSTOP)  # no new worker forks while the tree is read
            tree = [proc.pid, *descendants(proc.pid)]
            os.killpg(proc.pid, signal.SIGKILL)
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while (left := [pid for pid in tree if pid_alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], f"processes of the killed run of {playbook} still run on the controller: {left}"

    def watch_host(
        self, pattern: str, ready: threading.Event, timeout: float = 300, settle: float = 0.0
    ) -> threading.Thread:
        """Set `ready` once a process matching `pattern` has run on the host for `settle` seconds. The host
        itself looks, every 50 ms (a copy of a few seconds is caught inside)."""
        look = (
            f"end=$((SECONDS + {int(timeout)})); until pgrep -f {unique(pattern)!r} >/dev/null; do "
            f"[ $SECONDS -lt $end ] || exit 1; sleep 0.05; done; sleep {settle}; echo found"
        )

        def poll() -> None:
            found = subprocess.run(
                ["docker", "exec", self.host.name, "bash", "-c", look],
                capture_output=True,
                text=True,
                timeout=timeout + 60,
                check=False,
            )
            if found.stdout.strip() == "found":
                ready.set()

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        return thread


def recap(output: str) -> tuple[int, int]:
    found = RECAP.findall(output)
    assert found, output[-3000:]
    changed, failed = found[-1]
    return int(changed), int(failed)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    # The faults are those of the host's own downloads: no controller cache in between. The DKMS builds go
    # through the test bed's compiler cache (a real build either way; the kill test waits for the compiler
    # driver, which runs whether ccache answers a call or gcc compiles it).
    folder = tmp_path_factory.mktemp("faults")
    with host_with_mirror("msgpu-it-faults", folder, {"stack_artifact_cache_dir": ""}, compiler_cache=True) as (
        host,
        served,
        inventory,
    ):
        yield Runs(host, served, inventory)


def runfile_path() -> str:
    return f"nvidia_developer/{RUNFILE['path']}"


def assert_nothing_from_the_runfile(runs: Runs, anywhere: bool = True) -> None:
    """No runfile where the role looks for one, no toolkit; with `anywhere`, no large file at all."""
    host = runs.host
    assert host.sh(f"ls {ARTIFACTS} 2>/dev/null | grep -F {RUNFILE['file']!r}").stdout == "", "runfile left in cache"
    assert host.sh(f"test -e {PREFIX}").returncode != 0, f"{PREFIX} exists after a failed download"
    big = host.sh(NO_BIG_FILES).stdout.split()
    if anywhere:
        assert big == [], f"large files left on the host: {big}"
    elif big:
        print(f"left by the killed download (in Ansible's own temp folder, never read again): {big}")


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("down", r"503|Service Unavailable"),
        ("truncate", r"Incomplete read"),
        ("corrupt", r"The checksum for \S+ did not match"),
    ],
)
def test_a_failing_download_is_retried_then_stops_with_nothing_left(runs, fault, expected):
    before = runs.served.fetches(runfile_path())
    runs.served.inject(runfile_path(), fault)
    try:
        rc, output, wall = runs.run("cuda.yml")
    finally:
        runs.served.heal()
    assert rc != 0, output[-3000:]
    assert re.search(expected, output), output[-3000:]
    reason = re.search(r"failed in task .*", output)
    assert reason, output[-3000:]
    print(f"{fault}: {reason.group(0)[:400]}")
    assert RUNFILE["file"] in output, output[-3000:]
    assert runs.served.fetches(runfile_path()) - before == 1 + FAST_RETRIES["cuda_download_retries"]
    assert_nothing_from_the_runfile(runs)
    print(f"{fault}: failed as it should in {wall:.0f} s")


def test_killed_while_downloading_then_a_flaky_mirror_the_rerun_converges(runs):
    ready = threading.Event()
    runs.served.inject(runfile_path(), "slow", times=1)
    path = "/" + runfile_path()

    def downloading() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and path not in runs.served.counts:
            time.sleep(0.1)
        time.sleep(3)  # well inside the ~20 s slow download
        ready.set()

    threading.Thread(target=downloading, daemon=True).start()
    runs.run_killed("cuda.yml", ready)
    runs.served.heal()
    assert_nothing_from_the_runfile(runs, anywhere=False)
    # The next run meets a mirror that fails twice (down, then a cut download) before it works.
    before = runs.served.fetches(runfile_path())
    runs.served.inject(runfile_path(), "down", times=1)
    runs.served.inject(runfile_path(), "truncate", times=1)
    rc, output, _ = runs.run("cuda.yml", {"cuda_download_retries": 3})
    assert rc == 0, output[-4000:]
    assert runs.served.fetches(runfile_path()) - before == 3
    assert runs.host.sh(f"test -f {PREFIX}/.msgpu-installed").returncode == 0
    # Converged: the next run changes nothing and downloads nothing (the cached runfile is trusted by its
    # checksum, the toolkit by its marker).
    rc, output, _ = runs.run("cuda.yml")
    assert rc == 0 and recap(output) == (0, 0), output[-3000:]
    assert runs.served.fetches(runfile_path()) - before == 3


def test_killed_inside_the_cuda_installer_the_rerun_reinstalls_and_converges(runs):
    # Make the role reinstall: the marker says another installer did it.
    assert runs.host.sh(f"echo stale > {PREFIX}/.msgpu-installed").returncode == 0
    ready = threading.Event()
    runs.watch_host(RUNFILE["file"], ready)
    runs.run_killed("cuda.yml", ready)
    state = runs.host.sh(f"ls -a {PREFIX} 2>&1; ls {PREFIX}.msgpu-installing 2>&1").stdout
    assert runs.host.sh(f"test -f {PREFIX}/.msgpu-installed").returncode != 0, state
    assert runs.host.sh(f"test -f {PREFIX}.msgpu-installing").returncode == 0, state
    rc, output, _ = runs.run("cuda.yml")
    assert rc == 0, output[-4000:]
    nvcc = runs.host.sh(f". /etc/msgpu/env/cuda-{CUDA}.sh && nvcc --version")
    assert f"release {CUDA}" in nvcc.stdout, nvcc.stdout + nvcc.stderr
    assert runs.host.sh(f"test -e {PREFIX}.msgpu-installing").returncode != 0
    rc, output, _ = runs.run("cuda.yml")
    assert rc == 0 and recap(output) == (0, 0), output[-3000:]


def assert_cudnn_converges(runs: Runs) -> None:
    """The run after a cut converges: cuDNN loads from the CUDA prefix and answers its version; a further run
    changes nothing."""
    rc, output, _ = runs.run("cudnn.yml")
    assert rc == 0, output[-4000:]
    loaded = runs.host.sh(
        f". /etc/msgpu/env/cuda-{CUDA}.sh && "
        f"python3 -c \"import ctypes; print(ctypes.CDLL('{PREFIX}/lib64/libcudnn.so.8').cudnnGetVersion())\""
    )
    assert loaded.returncode == 0 and loaded.stdout.strip().isdigit(), loaded.stdout + loaded.stderr
    rc, output, _ = runs.run("cudnn.yml")
    assert rc == 0 and recap(output) == (0, 0), output[-3000:]


def test_killed_while_unpacking_cudnn_the_rerun_converges(runs):
    # cuDNN's libraries need libcuda.so.1 to load (the driver's user-space library, no module).
    driver = CATALOG["driver"][STACK["driver_branch"]]["distro"]["packages"]
    compute = next(p for p in driver if p.startswith("libnvidia-compute"))
    apt = runs.host.sh(f"apt-get update -qq && apt-get install -y -qq --no-install-recommends {compute}")
    assert apt.returncode == 0, apt.stdout[-2000:] + apt.stderr[-2000:]
    ready = threading.Event()
    runs.watch_host(f"tar.*{CUDNN['file']}", ready)
    runs.run_killed("cudnn.yml", ready)
    assert_cudnn_converges(runs)


def test_power_cut_while_copying_cudnn_into_the_live_prefix_the_rerun_converges(runs):
    """The risky window: the role has removed the previous install's files and its marker and is copying the
    new libraries into the live CUDA prefix when the power goes. The next run must see that (no marker),
    install again and load the library; a further run changes nothing."""
    marker = f"{PREFIX}/.msgpu-cudnn"
    assert runs.host.sh(f"test -f {marker}").returncode == 0, runs.host.sh(f"ls -a {PREFIX}").stdout
    # Make the role reinstall: the marker says another artifact was installed.
    assert runs.host.sh(f"echo stale > {marker}").returncode == 0
    ready = threading.Event()
    runs.watch_host(f"cp --no-dereference.*--target-directory={PREFIX}/lib64", ready)
    runs.run_killed("cudnn.yml", ready)
    left = runs.host.sh(f"ls -la {PREFIX}/lib64 | grep -i cudnn; ls -a {PREFIX}").stdout
    print(f"left by the power cut inside the copy:\n{left}")
    assert runs.host.sh(f"test -e {marker}").returncode != 0, f"the marker survived an unfinished copy:\n{left}"
    assert_cudnn_converges(runs)
    assert runs.host.sh(f"test -f {marker}").returncode == 0


def test_apt_waits_for_a_dpkg_lock_held_by_another_process(runs, tmp_path):
    """Waiting, told apart from a run that never met the lock: the lock stays held until the run's own
    `apt-get install` is under way, and then `hold` seconds longer. All that time apt downloads, unpacks and
    installs nothing and the run goes on; once the lock is released apt installs and the run succeeds."""
    host = runs.host
    hold = 10
    packages = ("openmpi-bin", "libopenmpi-dev")
    apt_cache = "ls -A /var/cache/apt/archives /var/cache/apt/archives/partial"
    unpacked = f"dpkg-query -W -f='${{db:Status-Status}}\\n' {' '.join(packages)} 2>/dev/null | grep -v not-installed"
    assert host.sh(unpacked).stdout.strip() == "", "OpenMPI is there before the run"
    cached = host.sh(apt_cache).stdout
    # The install apt-get of the role (the apt module runs it with DPkg::Lock::Timeout = apt_lock_timeout).
    installing = f"{unique('apt-get')}.* install .*{packages[0]}"
    locker = subprocess.Popen(
        [
            "docker",
            "exec",
            "-i",
            host.name,
            "python3",
            "-c",
            "import fcntl, sys\n"
            "files = [open(p, 'w') for p in ('/var/lib/dpkg/lock-frontend', '/var/lib/dpkg/lock')]\n"
            "[fcntl.lockf(f, fcntl.LOCK_EX) for f in files]\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",  # held until the test closes stdin
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "openmpi.log"
    run = None
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        # The host looks for apt's install itself (a `docker exec` per look from here cost ~0.1 s of CPU each).
        reached = threading.Event()
        watcher = runs.watch_host(f"apt-get.* install .*{packages[0]}", reached, timeout=600)
        with log.open("w") as sink:
            run = subprocess.Popen(
                runs.command("openmpi.yml"), stdout=sink, stderr=subprocess.STDOUT, env=runs.env(), cwd=ROOT
            )
        while not reached.wait(0.5):
            assert run.poll() is None, f"the run ended before apt met the lock:\n{log.read_text()[-4000:]}"
            assert watcher.is_alive(), "the run never reached apt's install"
        time.sleep(hold)
        assert run.poll() is None, f"the run did not wait for the lock:\n{log.read_text()[-4000:]}"
        assert host.sh(f"pgrep -f {installing!r}").returncode == 0, "apt-get stopped waiting for the lock"
        assert host.sh("pgrep -x dpkg").returncode != 0, "dpkg ran while the lock was held"
        assert host.sh(unpacked).stdout.strip() == "", "OpenMPI was unpacked while the lock was held"
        assert host.sh(apt_cache).stdout == cached, "apt downloaded packages while the lock was held"
    finally:
        if locker.stdin is not None:
            locker.stdin.close()  # the locker exits: the lock is released
        locker.wait(timeout=60)
        if run is not None and run.poll() is None:
            try:
                run.wait(timeout=900)
            except subprocess.TimeoutExpired:
                run.kill()
                raise
    output = log.read_text()
    assert run.returncode == 0, output[-4000:]
    assert host.sh("dpkg-query -W -f='${Status}' openmpi-bin").stdout == "install ok installed"


def flat(output: str) -> str:
    """The output with its whitespace collapsed: the YAML callback wraps long messages."""
    return " ".join(output.split())


def dpkg_states(host: Host, *packages: str) -> dict[str, str]:
    shown = host.sh(f"dpkg-query -W -f '${{Package}} ${{Status}}\\n' {' '.join(packages)}").stdout
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in shown.splitlines()}


def test_packages_an_interrupted_run_left_are_finished_before_apt_is_used(runs):
    """What `dpkg --audit` lists after a cut: a package unpacked but never configured, and one whose
    unpacking was cut short (half-installed, reinstreq), which `dpkg --configure -a` leaves alone and
    apt reinstalls. --check only reports; the run repairs both before the role, then goes on."""
    host = runs.host
    setup = host.sh(
        "set -e; export DEBIAN_FRONTEND=noninteractive; cd /tmp\n"
        "ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -qq\n"
        "apt-get install -y -qq --no-install-recommends hello >/dev/null\n"
        "apt-get download -qq figlet && dpkg --unpack figlet_*.deb >/dev/null && rm figlet_*.deb\n"
        # What dpkg writes when an unpack starts; a kill leaves it so.
        "sed -i '/^Package: hello$/,/^$/ s/^Status: install ok installed$/Status: install reinstreq half-installed/' "
        "/var/lib/dpkg/status\n"
    )
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-2000:]
    broken = {"figlet": "install ok unpacked", "hello": "install reinstreq half-installed"}
    assert dpkg_states(host, "figlet", "hello") == broken
    audit = host.sh("dpkg --audit").stdout
    assert "figlet" in audit and "hello" in audit, audit

    rc, output, _ = runs.run("openmpi.yml", args=["--check"])
    assert rc == 0, output[-4000:]
    assert "left figlet (unpacked), hello (half-installed, reinstreq); it would be finished" in flat(output)
    assert dpkg_states(host, "figlet", "hello") == broken, "--check changed dpkg's state"

    rc, output, _ = runs.run("openmpi.yml")
    assert rc == 0, output[-4000:]
    assert (
        "finished the package install an interrupted run had left: figlet (unpacked), hello (half-installed, "
        "reinstreq); `dpkg --configure -a`, then `apt-get -f install -y` finished it" in flat(output)
    ), output[-4000:]
    assert recap(output)[0] >= 2, output[-3000:]
    assert host.sh("dpkg --audit").stdout.strip() == ""
    assert dpkg_states(host, "figlet", "hello") == {p: "install ok installed" for p in ("figlet", "hello")}
    host.sh("DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq figlet hello >/dev/null")


def test_killed_during_the_driver_dkms_build_the_rerun_finishes_it_and_converges(runs):
    host = runs.host
    ready = threading.Event()
    # The run's first compiler is DKMS building the module from nvidia-dkms-<branch>'s postinst: gcc-9.real is
    # on the command line of every compiler call, through the test bed's ccache or not (testbed/sandbox.py).
    runs.watch_host("gcc-9.real", ready, timeout=900)
    runs.run_killed("nvidia_driver.yml", ready, timeout=900)
    audit = host.sh("dpkg --audit").stdout.strip()
    status = host.sh(f"dkms status -m {DKMS_MODULE}").stdout.strip()
    print(f"left by the kill: dpkg --audit: {audit!r}; dkms status: {status!r}")
    assert DKMS_INSTALLED.findall(status) == [], status
    rc, output, _ = runs.run("nvidia_driver.yml")
    assert rc == 0, output[-4000:]
    print("repaired:", re.findall(r"finished the package install.{0,200}|DKMS had.{0,300}", flat(output)))
    assert host.sh("dpkg --audit").stdout.strip() == ""
    kernels = host.sh(KERNELS_WITH_HEADERS).stdout.split()
    status = host.sh(f"dkms status -m {DKMS_MODULE}").stdout
    assert kernels and set(kernels) <= set(DKMS_INSTALLED.findall(status)), f"{kernels}: {status}"
    rc, output, _ = runs.run("nvidia_driver.yml")
    assert rc == 0 and recap(output) == (0, 0), output[-3000:]


def test_killed_during_the_mindspore_pip_install_the_rerun_rebuilds_the_venv(runs):
    host = runs.host
    release = STACK["mindspore"]
    ready = threading.Event()
    # The first `pip install` is the verified wheel's (the wheel itself came by `pip download`).
    runs.watch_host("pip install", ready, timeout=900, settle=2)
    runs.run_killed("mindspore.yml", ready, timeout=900)
    home = host.sh("getent passwd msgpu | cut -d: -f6").stdout.strip()
    venv = f"{home}/venvs/mindspore-{release}"
    assert home and host.sh(f"test -e {venv}/.msgpu-installed").returncode != 0, "marker left by a cut install"
    rc, output, _ = runs.run("mindspore.yml")
    assert rc == 0, output[-4000:]
    env_file = f"/etc/msgpu/env/mindspore-{CATALOG['default_stack']}.sh"
    script = "import mindspore, os; print(mindspore.__version__, flush=True); os._exit(0)"
    imported = host.sh(
        f"timeout 300 su - msgpu -c {shlex.quote(f'. {env_file} && {venv}/bin/python -c {shlex.quote(script)}')}"
    )
    assert imported.returncode == 0, imported.stdout[-2000:] + imported.stderr[-2000:]
    assert imported.stdout.strip().splitlines()[-1] == release, imported.stdout
    rc, output, _ = runs.run("mindspore.yml")
    assert rc == 0 and recap(output) == (0, 0), output[-3000:]


def version_code(library: str, version: str) -> int:
    """What the library's version function returns for a release, as its header computes it (the role's
    default expectation): cuDNN major*1000 + minor*100 + patch (major*10000 from 9 on); NCCL
    major*1000 + minor*100 + patch up to 2.8, major*10000 + minor*100 + patch from 2.9 on."""
    major, minor, patch = (int(part) for part in [*version.split("."), "0", "0"][:3])
    scale = 10000 if (library == "cudnn" and major >= 9) or (library == "nccl" and (major, minor) > (2, 8)) else 1000
    return major * scale + minor * 100 + patch


def test_a_library_reporting_another_version_than_expected_is_refused(runs):
    """The cuda_library role's version check: ncclGetVersion() must return nccl_expected_version. The
    test bed's NCCL 2.8.4 tarball carries NCCL 2.14.3's real library (testbed/FIXTURES.md), so without the
    test bed's setting the role expects 2.8.4's own code and must refuse, naming what the library returned,
    what was expected and the variable that says it. The check comes after the install, which is complete
    (marker written last, every recorded file present, no staging left): the run with the right
    expectation then changes nothing and downloads nothing."""
    host = runs.host
    release = scenarios.seed_nccl()["stack_nccl_version"]
    tarball = CATALOG["nccl"][release]["tarball"]
    fixture = fixtures.read_manifest(runs.served.root)[tarball["file"]]
    reported, expected = int(fixture["reports_version"]), version_code("nccl", release)
    assert reported != expected, "the fixture reports its release's own code: nothing to refuse"
    path = f"nvidia_developer/{tarball['path']}"
    before = runs.served.fetches(path)

    # "" is the role's default: NCCL_VERSION_CODE of the stack's release.
    rc, output, _ = runs.run("nccl.yml", {"nccl_expected_version": ""})
    assert rc != 0 and recap(output)[1] == 1, output[-4000:]
    refusal = (
        f"ncclGetVersion() of {PREFIX}/lib64/libnccl.so.2 returned '{reported}', expected {expected} "
        f"(nccl_expected_version, by default NCCL_VERSION_CODE of NCCL {release}; from {tarball['file']})."
    )
    assert refusal in refusals(output), (refusal, refusals(output), output[-4000:])
    assert runs.served.fetches(path) - before == 1

    marker = host.sh(f"cat {PREFIX}/.msgpu-nccl").stdout.strip()
    assert marker == fixture["sha256"], f"install marker {marker!r}"
    recorded = host.sh(f"cat {PREFIX}/.msgpu-nccl.files").stdout.split()
    assert f"lib64/libnccl.so.{release.split('.')[0]}" in recorded and "include/nccl.h" in recorded, recorded
    missing = host.sh(f"cd {PREFIX} && for f in {' '.join(recorded)}; do [ -e $f ] || echo $f; done").stdout.split()
    assert missing == [], f"files the install recorded but left out: {missing}"
    stage = "/var/cache/msgpu/staging/" + re.sub(r"(\.tar)?\.[A-Za-z]+$", "", tarball["file"])
    assert host.sh(f"test -e {shlex.quote(stage)}").returncode != 0, f"{stage} left by the refused run"

    rc, output, _ = runs.run("nccl.yml")
    assert rc == 0 and recap(output) == (0, 0), output[-3000:]
    assert f"ncclGetVersion() = {reported}" in flat(output), output[-3000:]
    assert runs.served.fetches(path) - before == 1
