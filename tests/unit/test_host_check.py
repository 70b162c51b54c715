"""The preflight's one read of a host (roles/stack/files/host_check.py), run as roles/stack/tasks/host.yml runs
it: `python3 -c TEXT` with its options as arguments. The GPU part is in
test_gpu_support.py, the fabric manager's in test_fabricmanager.py."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST_CHECK = ROOT / "roles" / "stack" / "files" / "host_check.py"
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def read(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", HOST_CHECK.read_text(), *args], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def efi_tree(tmp_path: Path, value: bytes | None) -> Path:
    """A sysfs tree with EFI, and a SecureBoot variable holding `value` after its 4 attribute bytes (None: none)."""
    root = tmp_path / "sys"
    (root / "firmware" / "efi" / "efivars").mkdir(parents=True)
    if value is not None:
        (root / "firmware" / "efi" / "efivars" / SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00" + value)
    return root


def test_only_what_is_asked_is_read(tmp_path):
    assert read("--sysfs-root", str(tmp_path)) == {"gpus": [], "nvswitches": []}


def test_the_machine_id_is_read_when_asked():
    expected = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        if Path(path).is_file() and Path(path).read_text().strip():
            expected = Path(path).read_text().strip()
            break
    found = read("--sysfs-root", "/nonexistent", "--machine-id")
    assert found == {"gpus": [], "nvswitches": [], "machine_id": expected}


def test_the_python_tag_of_a_running_interpreter():
    found = read("--python", sys.executable)["python"]
    assert found == {"tag": "cp{}{}".format(*sys.version_info[:2]), "error": ""}


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"])
def test_an_interpreter_that_does_not_run_has_no_tag_and_says_why(python):
    found = read("--python", python)["python"]
    assert found["tag"] == ""
    assert found["error"], found


def test_free_space_is_what_df_says(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"\0" * (1 << 20))  # nothing else on the file system may move it between the two reads
    free = read("--prefix", str(tmp_path))["free_kb"]
    df = subprocess.run(["df", "-Pk", str(tmp_path)], capture_output=True, text=True, check=True)
    available = int(df.stdout.splitlines()[-1].split()[3])
    assert abs(free - available) <= 64 * 1024, (free, available)  # other writers on this machine: 64 MiB slack


def test_a_prefix_that_does_not_exist_has_no_free_space(tmp_path):
    assert read("--prefix", str(tmp_path / "missing"))["free_kb"] is None


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg (a Debian or Ubuntu machine)")
def test_parts_by_path_under_the_prefix_or_by_every_package_installed(tmp_path):
    (tmp_path / "cuda-11.1" / "bin").mkdir(parents=True)
    parts = [
        {"name": "CUDA", "path": "cuda-11.1/bin", "packages": [], "mb": 1},
        {"name": "cuDNN", "path": "cuda-11.1/lib64/libcudnn.so.8", "packages": [], "mb": 1},
        {"name": "base", "path": "", "packages": ["dpkg", "bash"], "mb": 1},
        {"name": "half", "path": "", "packages": ["dpkg", "msgpu-no-such-package"], "mb": 1},
        {"name": "none", "path": "", "packages": [], "mb": 1},
    ]
    found = read("--prefix", str(tmp_path), "--parts", json.dumps(parts))["parts"]
    assert found == [True, False, True, False, False]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(b"\x01", "SecureBoot enabled"), (b"\x00", "SecureBoot disabled"), (None, "SecureBoot disabled")],
)
def test_secure_boot_from_the_efi_variable_of_a_substituted_tree(tmp_path, value, expected):
    root = efi_tree(tmp_path, value)
    assert read("--sysfs-root", str(root), "--secure-boot")["secure_boot"] == expected


def test_a_tree_without_efi_is_a_legacy_boot(tmp_path):
    found = read("--sysfs-root", str(tmp_path), "--secure-boot")["secure_boot"]
    assert found == "legacy BIOS boot (no EFI): Secure Boot not applicable"
