"""The doctor (`./toolkit doctor`, playbooks/doctor.yml) against a provisioned sandbox host, healthy and broken.

`./toolkit test` runs this module after molecule default converges, with MSGPU_VERIFY_INVENTORY naming
an inventory of that container. The healthy host is only read (the doctor writes nothing but its own
folder). Every breakage happens in a throwaway container started from a `docker commit` of that host
(names start with msgpu-h3-doctor), so the other system tests keep an intact host; a finalizer removes
the containers and the image. Under `./toolkit test` the host already runs from an image of itself
(MSGPU_VERIFY_IMAGE): the copies start from that one, and only their changes take disk.

What is broken for real in the copy: the nouveau blacklist file, the DKMS module of a kernel that has
headers, cuDNN's library, numpy (a real pip install outside the pin), the CPU `mindspore` wheel next
to `mindspore-gpu`, the CUDA env file, a /usr/local/cuda RPATH copy, CUDA_VISIBLE_DEVICES/DEVICE_ID,
two real `mpirun` ranks on one GPU. A container cannot load kernel modules or boot with Secure Boot,
so nouveau loaded, Secure Boot on, an old or mismatched loaded NVIDIA module come from a substituted
/proc or /sys tree (--proc/--sys) next to the container's real files (its real unsigned nvidia.ko,
its real libnvidia-ml). GPUs with persistence mode off come from a stand-in nvidia-smi (--nvidia-smi)
printing a real host's `nvidia-smi -q`; the nvidia-persistenced unit the doctor reads is the container's
real one (Ubuntu's packaged unit and the nvidia_driver role's drop-in).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

from testbed import sandbox  # noqa: E402
from tests.unit.test_verify_doctor import NVIDIA_SMI_Q_OFF  # noqa: E402  (a real `nvidia-smi -q`)

VENV_BIN = Path(sys.executable).parent
PREFIX = "msgpu-h3-doctor"
DOCTOR_DIR = "/tmp/msgpu-doctor"
# What a container cannot show, whatever its state: reported as notes, never as problems.
CONTAINER_NOTES = {
    "kernel-modules-unreadable",
    "secure-boot-unknown",
    "running-kernel-not-installed",
    "libraries-found",
}
# Which libnccl.so.2 MindSpore's collective library loads: said on every host with one (info when it is the stack's).
NCCL_NOTE = "nccl-loaded"
MINDSPORE_USER = "msgpu"  # the mindspore role's default mindspore_user


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def inventory_hosts(inventory: Path) -> tuple[list[str], dict]:
    group = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_servers"]
    return list(group["hosts"]), dict(group.get("vars") or {})


def run_doctor_task(inventory: Path, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float]:
    """`invoke doctor -i INVENTORY` as `./toolkit doctor` runs it."""
    args = [str(VENV_BIN / "invoke"), "doctor", "-i", str(inventory), "--out", str(out), *extra]
    started = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=False)
    return proc, time.monotonic() - started


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)}: {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def healthy(
    inventory: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict, subprocess.CompletedProcess, float]:
    out = tmp_path_factory.mktemp("doctor-healthy")
    proc, wall = run_doctor_task(inventory, out)
    print(f"invoke doctor (healthy host): {wall:.1f} s wall")
    hosts = {p.stem: json.loads(p.read_text()) for p in sorted((out / "hosts").glob("*.json"))}
    return hosts, proc, wall


def test_healthy_sandbox_raises_no_false_alarm(healthy) -> None:
    hosts, proc, _ = healthy
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert hosts, "no findings fetched"
    for name, document in hosts.items():
        ids = {f["id"]: f for f in document["findings"]}
        assert document["counts"]["error"] == 0, f"{name}: {json.dumps(document['findings'])[:3000]}"
        # Anything but the container's notes and the note of which NCCL MindSpore loads is a false alarm: a
        # newcomer's first doctor run warns about nothing (the CUDA 11.1 fixture carries libnvrtc.so.11.1, the
        # name mindspore-gpu 1.5 loads for graph kernels, as NVIDIA's toolkit does: testbed/FIXTURES.md).
        allowed = CONTAINER_NOTES | {NCCL_NOTE}
        assert set(ids) <= allowed, f"{name}: unexpected findings {json.dumps(document['findings'])[:3000]}"
        assert document["counts"]["warning"] == 0, f"{name}: {json.dumps(document['findings'])[:3000]}"
        # mindspore-gpu 1.5.1 bundles no NCCL: its collective library loads the stack's, the release the site's
        # nccl_expected_version says (the 2.8.4 tarball fixture carries NCCL 2.14.3): a note, not a warning.
        assert ids[NCCL_NOTE]["severity"] == "info", ids[NCCL_NOTE]
        assert ids[NCCL_NOTE]["title"].endswith("(NCCL 2.14.3): the stack's NCCL"), ids[NCCL_NOTE]
        # Every library the wheel needs at import resolves, and the doctor says where.
        for soname in document["expect"]["mindspore"]["libraries_required"]:
            assert any(line.startswith(soname + " -> ") for line in ids["libraries-found"]["evidence"]), soname
    assert "0 error(s)" in proc.stdout


def test_doctor_runs_in_seconds(healthy) -> None:
    hosts, _, wall = healthy
    for name, document in hosts.items():
        assert document["elapsed_s"] < 10, f"{name}: the doctor itself took {document['elapsed_s']} s"
    assert wall < 120, f"invoke doctor took {wall:.0f} s"


@pytest.fixture(scope="module")
def image(inventory: Path, healthy) -> Iterator[tuple[str, dict]]:
    """The provisioned host, committed, and what the stack expects of it (as the role passed it)."""
    host = inventory_hosts(inventory)[0][0]
    expected = healthy[0][host]["expect"]
    # `./toolkit test` already runs the host from an image of itself (MSGPU_VERIFY_IMAGE, made by
    # testbed/sandbox.py rebase_host after its converge): copies of it share its files.
    shared = os.environ.get("MSGPU_VERIFY_IMAGE", "")
    if shared:
        running = docker("inspect", "-f", "{{.Config.Image}}", host).stdout.strip()
        assert running == shared, f"{host} runs from {running}, not from MSGPU_VERIFY_IMAGE={shared}"
        yield shared, expected
        return
    tag = f"{PREFIX}:{uuid.uuid4().hex[:10]}"
    started = time.monotonic()
    docker("commit", host, tag)
    print(f"docker commit {host}: {time.monotonic() - started:.0f} s")
    try:
        yield tag, expected
    finally:
        docker("rmi", "-f", tag, check=False)


class Broken:
    """A throwaway copy of the provisioned host, with this checkout's doctor (its folder, run as a file) and the
    stack's expectations."""

    def __init__(self, image: str, name: str, expected: dict, scratch: Path) -> None:
        self.name = name
        self.expect = expected
        docker("rm", "-f", name, check=False)
        docker("run", "-d", "--name", name, "--hostname", name, "--label", sandbox.LABEL, "--network", "host", image)
        (scratch / "expect.json").write_text(json.dumps(expected))
        docker("exec", name, "mkdir", "-p", DOCTOR_DIR)
        docker("cp", str(ROOT / "verify" / "msgpu_verify" / "doctor"), f"{name}:{DOCTOR_DIR}/doctor")
        docker("cp", str(scratch / "expect.json"), f"{name}:{DOCTOR_DIR}/expect.json")

    def sh(self, script: str, user: str = "root", check: bool = True) -> subprocess.CompletedProcess:
        return docker("exec", "-u", user, self.name, "bash", "-ec", script, check=check)

    def doctor(self, *args: str, env: dict[str, str] | None = None, user: str = "root") -> tuple[dict, int]:
        flags = [item for key, value in (env or {}).items() for item in ("-e", f"{key}={value}")] + ["-u", user]
        argv = ["/usr/bin/python3", f"{DOCTOR_DIR}/doctor", "--expect", f"{DOCTOR_DIR}/expect.json", "--json", "-"]
        proc = docker("exec", *flags, self.name, *argv, *args, check=False)
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
        return json.loads(proc.stdout), proc.returncode


@pytest.fixture
def broken(image: tuple[str, dict], request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broken]:
    name = f"{PREFIX}-{request.node.name.replace('_', '-')[:40].strip('-')}"
    host = Broken(image[0], name, image[1], tmp_path)
    try:
        yield host
    finally:
        docker("rm", "-f", name, check=False)


def finding(document: dict, finding_id: str, severity: str = "error") -> dict:
    found = {f["id"]: f for f in document["findings"]}
    assert finding_id in found, f"{finding_id} not named; findings: {json.dumps(document['findings'])[:3000]}"
    assert found[finding_id]["severity"] == severity, found[finding_id]
    return found[finding_id]


def expect(host: Broken) -> dict:
    return host.expect


def test_copy_is_healthy_before_it_is_broken(broken: Broken) -> None:
    document, rc = broken.doctor()
    problems = {f["id"] for f in document["findings"] if f["severity"] != "info"}
    assert rc == 0 and problems == set(), document["findings"]


def test_blacklist_missing(broken: Broken) -> None:
    broken.sh("grep -lx 'blacklist nouveau' /etc/modprobe.d/*.conf /lib/modprobe.d/*.conf | xargs -r rm -f")
    document, _ = broken.doctor()
    assert "/etc/modprobe.d/blacklist-nouveau.conf" in finding(document, "nouveau-not-blacklisted", "warning")["fix"]


def test_headers_for_a_kernel_without_the_module(broken: Broken) -> None:
    # A kernel with headers whose DKMS module is gone: what a kernel upgrade leaves when the build fails.
    kernel = broken.sh(
        "for d in /lib/modules/*; do [ -e $d/build/Makefile ] && basename $d; done | sort | tail -1"
    ).stdout.strip()
    assert kernel, "the provisioned host has no kernel with headers"
    version = broken.sh("ls /var/lib/dkms/nvidia | grep -E '^[0-9]' | head -1").stdout.strip()
    broken.sh(f"dkms remove -m nvidia -v {version} -k {kernel} >/dev/null")
    document, rc = broken.doctor()
    found = finding(document, "dkms-module-missing")
    assert rc == 1 and kernel in found["title"]
    assert f"dkms autoinstall -k {kernel}" in found["fix"]


def test_library_removed(broken: Broken) -> None:
    home = expect(broken)["cuda"]["home"]
    broken.sh(f"mkdir -p /root/moved && mv {home}/lib64/libcudnn.so.8* /root/moved/ && ldconfig")
    document, rc = broken.doctor()
    found = finding(document, "library-missing:libcudnn.so.8")
    assert rc == 1 and "stack_cudnn_method=" in found["fix"] and "cuda_library" in found["fix"]


def test_library_the_extension_links_beyond_the_catalog(broken: Broken) -> None:
    """libcurand.so.10 is not in the catalog's list, but _c_expression links it: the doctor reads DT_NEEDED,
    and the real import agrees."""
    home = expect(broken)["cuda"]["home"]
    broken.sh(f"mkdir -p /root/moved && mv {home}/lib64/libcurand.so.10* /root/moved/ && ldconfig")
    document, rc = broken.doctor()
    found = finding(document, "library-missing:libcurand.so.10")
    assert rc == 1 and "DT_NEEDED" in found["title"] and "stack_cuda_method=" in found["fix"]
    env_file = expect(broken)["env_file"]
    imported = broken.sh(
        f". {env_file} && timeout 120 python -c 'import mindspore' 2>&1 || true", user=MINDSPORE_USER
    ).stdout
    assert "libcurand.so.10: cannot open shared object file" in imported, imported[-2000:]


def _pip(broken: Broken, packages: str) -> None:
    venv = broken.sh(f". {expect(broken)['env_file']} && echo $VIRTUAL_ENV", user=MINDSPORE_USER).stdout.strip()
    broken.sh(
        f"PIP_CONSTRAINT= {venv}/bin/pip install -q --no-deps --disable-pip-version-check "
        f"--cert /etc/ssl/certs/ca-certificates.crt {packages}",
        user=MINDSPORE_USER,
    )


def test_numpy_outside_the_pin(broken: Broken) -> None:
    _pip(broken, "numpy==1.24.4")
    document, rc = broken.doctor()
    found = finding(document, "pin-violated:numpy")
    assert rc == 1 and "numpy 1.24.4" in found["title"] and "numpy<1.24" in found["title"]
    assert "msgpu-constraints.txt" in found["fix"]


# The CPU package `mindspore` for cp38 on PyPI is 2.0.0 only, a 200+ MB download per run: a stand-in
# wheel with the CPU package's name and the stack's release, installed by the venv's real pip, leaves
# the same record on disk (a second mindspore*.dist-info owning files under mindspore/).
CPU_WHEEL = r"""
import base64, hashlib, sys, zipfile
version = sys.argv[1]
name = "mindspore-%s-py3-none-any.whl" % version
info = "mindspore-%s.dist-info/" % version
files = {
    "mindspore/_cpu_package_stand_in.txt": b"installed by tests/system/test_doctor.py\n",
    info + "METADATA": ("Metadata-Version: 2.1\nName: mindspore\nVersion: %s\n" % version).encode(),
    info + "WHEEL": b"Wheel-Version: 1.0\nGenerator: msgpu-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
record = "".join("%s,%s,%d\n" % (p, digest(d), len(d)) for p, d in files.items()) + info + "RECORD,,\n"
with zipfile.ZipFile("/tmp/" + name, "w") as wheel:
    for path, data in files.items():
        wheel.writestr(path, data)
    wheel.writestr(info + "RECORD", record)
print("/tmp/" + name)
"""


def test_cpu_and_gpu_mindspore_both_installed(broken: Broken) -> None:
    version = expect(broken)["mindspore"]["version"]
    broken.sh(f"cat > /tmp/cpu_wheel.py <<'EOF'\n{CPU_WHEEL}\nEOF", user=MINDSPORE_USER)
    wheel = broken.sh(f"python3 /tmp/cpu_wheel.py {version}", user=MINDSPORE_USER).stdout.strip()
    _pip(broken, wheel)
    document, rc = broken.doctor()
    found = finding(document, "mindspore-packages-conflict")
    assert rc == 1 and "pip uninstall -y mindspore mindspore-gpu" in found["fix"]


def test_cuda_home_unset_in_the_env_file(broken: Broken) -> None:
    cuda_env = expect(broken)["cuda"]["env_file"]
    broken.sh(f"sed -i -e '/CUDA_HOME/d' -e '/CUDA_PATH/d' -e '/PATH=/d' {cuda_env}")
    document, rc = broken.doctor()
    assert rc == 1
    assert "./toolkit provision" in finding(document, "cuda-home-unset")["fix"]
    finding(document, "cuda-not-on-path")


def test_rpath_copy_shadows_ld_library_path(broken: Broken) -> None:
    # The wheel's RPATH names a /usr/local/cuda-* folder that is searched before LD_LIBRARY_PATH:
    # another CUDA runtime there wins over the env file's choice.
    found = broken.doctor()[0]
    libs = {f["id"]: f for f in found["findings"]}["libraries-found"]["evidence"]
    cudart = next(line for line in libs if line.startswith("libcudart.so.11.0 -> "))
    rpath = libs[0].split(";")[0].rsplit(": ", 1)[1].split(":")
    rpath_dir = next((d for d in rpath if d.startswith("/usr/local/cuda")), "")
    home = expect(broken)["cuda"]["home"]
    assert rpath_dir, "the wheel's RPATH names no /usr/local/cuda folder"
    if os.path.normpath(rpath_dir) == os.path.normpath(home + "/lib64"):
        # The RPATH folder is the stack's own toolkit: point LD_LIBRARY_PATH at another copy instead.
        broken.sh(f"mkdir -p /opt/other/lib64 && cp -L {home}/lib64/libcudart.so.11.0 /opt/other/lib64/")
        env_file = expect(broken)["env_file"]
        broken.sh(f"sed -i 's#{home}/lib64#/opt/other/lib64#g' {env_file}")
    else:
        broken.sh(
            f"mkdir -p {rpath_dir} && cp -L {home}/lib64/libcudart.so.11.0 {rpath_dir}/libcudart.so.11.0 "
            f"&& printf shadow >> {rpath_dir}/libcudart.so.11.0"
        )
    document, rc = broken.doctor()
    found = finding(document, "rpath-shadows-ld-library-path")
    assert rc == 1 and any(e.startswith("libcudart.so.11.0: RPATH gives") for e in found["evidence"]), cudart
    assert "/usr/local/cuda" in found["fix"]


def test_device_id_outside_cuda_visible_devices(broken: Broken) -> None:
    document, rc = broken.doctor(env={"CUDA_VISIBLE_DEVICES": "0", "DEVICE_ID": "1"})
    found = finding(document, "device-id-not-visible")
    assert rc == 1 and "device_id 1" in found["title"] and "CUDA_VISIBLE_DEVICES='0'" in found["evidence"][0]


MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "-x", "CUDA_VISIBLE_DEVICES=0", "sleep", "120"]


def test_mpi_ranks_all_bound_to_one_gpu(broken: Broken) -> None:
    docker("exec", "-d", "-u", MINDSPORE_USER, "-w", "/tmp", broken.name, *MPIRUN)
    deadline = time.monotonic() + 30
    while broken.sh(f"pgrep -c -u {MINDSPORE_USER} -x sleep || true").stdout.strip() != "2":
        assert time.monotonic() < deadline, broken.sh(f"pgrep -a -u {MINDSPORE_USER} || true").stdout
        time.sleep(0.5)
    # As the ranks' owner: root in a container has no ptrace right to read other users' /proc/<pid>/environ
    # (on a real host root has; the doctor then says which processes it could not read).
    document, rc = broken.doctor(user=MINDSPORE_USER)
    found = finding(document, "mpi-ranks-one-gpu")
    assert rc == 1 and "All 2 MPI ranks" in found["title"] and "OMPI_COMM_WORLD_LOCAL_RANK" in found["fix"]


def _fake_tree(broken: Broken, files: dict[str, str]) -> None:
    script = " && ".join(
        f"mkdir -p $(dirname {path}) && printf '{content}' > {path}" for path, content in files.items()
    )
    broken.sh(script)


def test_nouveau_loaded_substituted_proc(broken: Broken) -> None:
    _fake_tree(broken, {"/tmp/proc/modules": "nouveau 2347008 1 - Live 0x0\\n"})
    document, rc = broken.doctor("--proc", "/tmp/proc")
    found = finding(document, "nouveau-loaded")
    assert rc == 1 and "nouveau 2347008" in found["evidence"][0]


def test_secure_boot_with_the_real_unsigned_module(broken: Broken) -> None:
    # Secure Boot's EFI variable is substituted; the module checked is the container's real DKMS build.
    _fake_tree(
        broken, {"/tmp/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c": "\\6\\0\\0\\0\\1"}
    )
    kernel = broken.sh("ls /lib/modules | sort | tail -1").stdout.strip()
    document, rc = broken.doctor("--sys", "/tmp/sys", "--kernel", kernel)
    found = finding(document, "secure-boot-unsigned-module")
    assert rc == 1 and any("nvidia.ko" in e for e in found["evidence"])


def test_driver_older_than_the_cuda_minimum_substituted_sys(broken: Broken) -> None:
    _fake_tree(broken, {"/tmp/sys/module/nvidia/version": "418.226.00\\n"})
    document, rc = broken.doctor("--sys", "/tmp/sys")
    found = finding(document, "driver-too-old")
    assert rc == 1 and expect(broken)["minimum_driver"] in found["title"]
    # The container's real user-space NVML is the stack's branch, so the loaded 418 also mismatches it.
    finding(document, "nvml-mismatch")


def test_nvml_mismatch_substituted_sys(broken: Broken) -> None:
    real = broken.sh("readlink -f $(ldconfig -p | awk '/libnvidia-ml.so.1 .*x86-64/ {print $NF; exit}')").stdout
    version = real.strip().rsplit(".so.", 1)[1]
    major, rest = version.split(".", 1)
    _fake_tree(broken, {"/tmp/sys/module/nvidia/version": f"{major}.1.1\\n"})
    document, rc = broken.doctor("--sys", "/tmp/sys")
    found = finding(document, "nvml-mismatch")
    assert rc == 1 and version in found["title"] and "reboot" in found["fix"]
    assert "driver-too-old" not in {f["id"] for f in document["findings"]}, rest


def test_persistence_mode_off_with_the_real_persistenced_unit(broken: Broken, tmp_path: Path) -> None:
    """GPUs with persistence mode off (a stand-in nvidia-smi, expectations of a GPU host): the doctor names
    the unit systemd would start, merged from the container's real files: Ubuntu's unit with the
    nvidia_driver role's drop-in (persistence mode on: the daemon needs a restart), then without it."""
    scratch = f"{DOCTOR_DIR}/gpu"
    write = {"expect.json": json.dumps({**expect(broken), "no_gpu": False}), "q.txt": NVIDIA_SMI_Q_OFF}
    write["nvidia-smi"] = f"#!/bin/sh\ncat {scratch}/q.txt\n"
    for name, text in write.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "nvidia-smi").chmod(0o755)
    broken.sh(f"mkdir -p {scratch}")
    for name in write:
        docker("cp", str(tmp_path / name), f"{broken.name}:{scratch}/{name}")
    args = ("--expect", f"{scratch}/expect.json", "--nvidia-smi", f"{scratch}/nvidia-smi")
    dropin = "/etc/systemd/system/nvidia-persistenced.service.d/msgpu-persistence.conf"

    def unit_line(found: dict) -> str:
        return next(e for e in found["evidence"] if e.startswith("nvidia-persistenced.service as systemd merges "))

    found = finding(broken.doctor(*args)[0], "persistence-mode-off", "warning")
    assert found["title"].startswith("Persistence mode is off on 2 of 2 GPU(s)")
    line = unit_line(found)
    assert f"/lib/systemd/system/nvidia-persistenced.service + {dropin}: " in line, line
    assert line.endswith("--persistence-mode --verbose; StopWhenUnneeded=false"), line
    assert "sudo systemctl restart nvidia-persistenced" in found["fix"]
    broken.sh(f"rm {dropin}")
    found = finding(broken.doctor(*args)[0], "persistence-mode-off", "warning")
    line = unit_line(found)
    assert line.endswith("--no-persistence-mode --verbose; StopWhenUnneeded=true"), line
    assert "Ubuntu's packaged unit" in found["fix"] and dropin in found["fix"] and "nvidia-smi -pm 1" in found["fix"]


def test_invoke_doctor_fails_a_broken_host_and_names_the_fix(inventory: Path, broken: Broken, tmp_path: Path) -> None:
    """The whole path: `invoke doctor` (playbooks/doctor.yml) on a broken copy exits non-zero and says why."""
    home = expect(broken)["cuda"]["home"]
    broken.sh(f"rm -f {home}/lib64/libcudart.so.11.0* && ldconfig")
    _, group_vars = inventory_hosts(inventory)
    broken_inventory = sandbox.write_inventory(tmp_path / "inventory.yml", [broken.name], group_vars)
    proc, wall = run_doctor_task(broken_inventory, tmp_path / "out")
    print(f"invoke doctor (broken host): {wall:.1f} s wall")
    assert proc.returncode != 0
    assert "library-missing:libcudart.so.11.0" in proc.stdout and "stack_cuda_method=" in proc.stdout
    document = json.loads((tmp_path / "out" / "hosts" / f"{broken.name}.json").read_text())
    assert document["ok"] is False
