"""The doctor's rules on substituted file trees (root, /proc, /sys under tmp_path).

Each test builds a healthy host tree, breaks one thing and asserts the finding's id, severity,
evidence and fix; the healthy tree gives no error and no warning. The real broken states in a
provisioned container are tests/system/test_doctor.py.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

from msgpu_verify import doctor  # noqa: E402
from msgpu_verify.__main__ import main as cli_main  # noqa: E402

from tests.unit.conftest import STUB_RTX3090, STUB_VARIABLES  # noqa: E402

KERNEL = "5.4.0-100-generic"
CUDA_HOME = "/usr/local/cuda-11.1"
VENV = "/home/msgpu/venvs/mindspore-1.5.1"
ENV_FILE = "/etc/msgpu/env/mindspore-ms1.5-cuda11.1.sh"
SITE = VENV + "/lib/python3.8/site-packages"
EXPECT = {
    "host": "gpu1",
    "stack": "ms1.5-cuda11.1",
    "no_gpu": False,
    "env_file": ENV_FILE,
    "minimum_driver": "450.80.02",
    "driver": {"branch": "470", "method": "distro", "dkms_module": "nvidia", "packages": ["nvidia-dkms-470"]},
    "cuda": {"version": "11.1", "method": "runfile", "home": CUDA_HOME},
    "cudnn": {"version": "8.0.5", "method": "tarball"},
    "nccl": {"version": "2.8.4", "method": "tarball"},
    "mindspore": {
        "package": "mindspore-gpu",
        "version": "1.5.1",
        "pins": ["numpy<1.24", "pillow<10"],
        "libraries_required": ["libcudart.so.11.0", "libcudnn.so.8", "libcuda.so.1"],
        "libraries_optional": ["libnccl.so.2"],
    },
}

# /lib/systemd/system/nvidia-persistenced.service exactly as Ubuntu 20.04 ships it in
# nvidia-compute-utils-470 470.256.02-0ubuntu0.20.04.1 (the package the distro method installs and
# cuda_repo's metapackage pulls in; dpkg-deb -x of the package the test bed caches).
FOCAL_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

"""
FOCAL_UNIT_PATH = "/lib/systemd/system/nvidia-persistenced.service"
# `nvidia-smi -q` of a host with two GeForce RTX 2070 (driver 450.102.04), as pasted in a public note,
# cut after each GPU's "Inforom Version" block.
NVIDIA_SMI_Q_OFF = """
==============NVSMI LOG==============

Timestamp                                 : Wed Mar 10 19:55:06 2021
Driver Version                            : 450.102.04
CUDA Version                              : 11.0

Attached GPUs                             : 2
GPU 00000000:01:00.0
    Product Name                          : GeForce RTX 2070
    Product Brand                         : GeForce
    Display Mode                          : Enabled
    Display Active                        : Disabled
    Persistence Mode                      : Disabled
    MIG Mode
        Current                           : N/A
        Pending                           : N/A
    Accounting Mode                       : Disabled
    Accounting Mode Buffer Size           : 4000
    Driver Model
        Current                           : N/A
        Pending                           : N/A
    Serial Number                         : N/A
    GPU UUID                              : GPU-b13cc585-b683-a9a8-ac8d-7541ac69a33c
    Minor Number                          : 0
    VBIOS Version                         : 90.06.18.00.9E
    MultiGPU Board                        : No
    Board ID                              : 0x100
    GPU Part Number                       : N/A
    Inforom Version
        Image Version                     : G001.0000.02.04
        OEM Object                        : 1.1
        ECC Object                        : N/A
        Power Management Object           : N/A

GPU 00000000:05:00.0
    Product Name                          : GeForce RTX 2070
    Product Brand                         : GeForce
    Display Mode                          : Disabled
    Display Active                        : Disabled
    Persistence Mode                      : Disabled
    MIG Mode
        Current                           : N/A
        Pending                           : N/A
    Accounting Mode                       : Disabled
    Accounting Mode Buffer Size           : 4000
    Driver Model
        Current                           : N/A
        Pending                           : N/A
    Serial Number                         : N/A
    GPU UUID                              : GPU-5feaad6f-89e7-0a87-176f-6d96ce187460
    Minor Number                          : 1
    VBIOS Version                         : 90.06.2E.40.DC
    MultiGPU Board                        : No
    Board ID                              : 0x500
    GPU Part Number                       : N/A
    Inforom Version
        Image Version                     : G001.0000.02.04
        OEM Object                        : 1.1
        ECC Object                        : N/A
        Power Management Object           : N/A

"""
# The same host after `nvidia-smi -pm 1`: only the Persistence Mode lines differ.
NVIDIA_SMI_Q_ON = NVIDIA_SMI_Q_OFF.replace(
    "Persistence Mode                      : Disabled", "Persistence Mode                      : Enabled"
)
# What nvidia-smi prints (exit status 9) where the NVIDIA module is not loaded.
NVIDIA_SMI_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
    "NVIDIA driver is installed and running.\\n"
)
PERSISTENCED_ON = ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced", "--persistence-mode", "--verbose"]
PERSISTENCED_OFF = [
    "/usr/bin/nvidia-persistenced",
    "--user",
    "nvidia-persistenced",
    "--no-persistence-mode",
    "--verbose",
]


def role_dropin() -> str:
    """The nvidia_driver role's drop-in as the role renders it (its template and its vars)."""
    role = ROOT / "roles" / "nvidia_driver"
    variables = yaml.safe_load((role / "vars" / "main.yml").read_text())
    template = jinja2.Template((role / "templates" / "nvidia-persistenced-persistence.conf.j2").read_text())
    return template.render(
        nvidia_driver_branch="470",
        __nvidia_driver_persistenced_command=variables["__nvidia_driver_persistenced_command"],
    )


def role_dropin_path() -> str:
    variables = yaml.safe_load((ROOT / "roles" / "nvidia_driver" / "vars" / "main.yml").read_text())
    return variables["__nvidia_driver_persistenced_dropin"].replace(
        "{{ __nvidia_driver_persistenced_dropin_dir }}", variables["__nvidia_driver_persistenced_dropin_dir"]
    )


def elf(needed: List[str], rpath: Optional[str] = None, runpath: Optional[str] = None) -> bytes:
    """A 64-bit ELF with a PT_DYNAMIC of DT_NEEDED entries and an optional DT_RPATH / DT_RUNPATH."""
    strtab, offsets = b"\0", {}
    for text in [t for t in (rpath, runpath) if t] + needed:
        offsets[text] = len(strtab)
        strtab += text.encode() + b"\0"
    header_size, ph_size = 64, 56
    strtab_off = header_size + 2 * ph_size
    entries = [(1, offsets[n]) for n in needed]
    entries += [(15, offsets[rpath])] if rpath else []
    entries += [(29, offsets[runpath])] if runpath else []
    entries += [(5, strtab_off), (10, len(strtab)), (0, 0)]
    dyn_off = strtab_off + len(strtab)
    dynamic = b"".join(struct.pack("<qQ", t, v) for t, v in entries)
    total = dyn_off + len(dynamic)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, header_size, 0, 0, 64, ph_size, 2, 0, 0, 0)
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, total, total, 0x1000)
    dyn = struct.pack("<IIQQQQQQ", 2, 6, dyn_off, dyn_off, dyn_off, len(dynamic), len(dynamic), 8)
    return header + load + dyn + strtab + dynamic


def write(path: Path, text: str = "", data: Optional[bytes] = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if data is not None:
        path.write_bytes(data)
    else:
        path.write_text(text)
    return path


def library(root: Path, folder: str, soname: str, real: str) -> None:
    write(root / folder.lstrip("/") / real, data=b"\x7fELF")
    link = root / folder.lstrip("/") / soname
    if not link.exists():
        link.symlink_to(real)


class Tree:
    """A healthy GPU host below tmp_path; tests break one thing each."""

    def __init__(self, base: Path) -> None:
        self.root, self.proc, self.sys = base / "root", base / "proc", base / "sys"
        r = self.root
        write(self.proc / "modules", "nvidia 35000000 0 - Live 0x0\nnvidia_uvm 1 0 - Live 0x0\n")
        write(self.proc / "sys/kernel/osrelease", KERNEL + "\n")
        for gpu in ("0000:01:00.0", "0000:02:00.0"):
            (self.proc / "driver/nvidia/gpus" / gpu).mkdir(parents=True)
        write(self.sys / "module/nvidia/version", "470.82.01\n")
        write(self.sys / doctor.SECURE_BOOT_VAR, data=b"\x06\x00\x00\x00\x00")
        write(r / "etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n")
        write(r / f"lib/modules/{KERNEL}/build/Makefile", "all:\n")
        write(r / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko", data=b"module" + doctor.MODULE_SIGNATURE_MAGIC)
        write(r / f"var/lib/dkms/nvidia/470.82.01/{KERNEL}/x86_64/module/nvidia.ko", data=b"module")
        write(r / "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
        write(r / "etc/ld.so.conf.d/x86_64-linux-gnu.conf", "/usr/lib/x86_64-linux-gnu\n")
        library(r, "/usr/lib/x86_64-linux-gnu", "libcuda.so.1", "libcuda.so.470.82.01")
        library(r, "/usr/lib/x86_64-linux-gnu", "libnvidia-ml.so.1", "libnvidia-ml.so.470.82.01")
        library(r, CUDA_HOME + "/lib64", "libcudart.so.11.0", "libcudart.so.11.1.74")
        library(r, CUDA_HOME + "/lib64", "libcudnn.so.8", "libcudnn.so.8.0.5")
        library(r, CUDA_HOME + "/lib64", "libnccl.so.2", "libnccl.so.2.8.4")
        write(r / CUDA_HOME.lstrip("/") / "bin/nvcc", "#!/bin/sh\n")
        write(r / "etc/msgpu/env/cuda-11.1.sh", f"export CUDA_HOME={CUDA_HOME}\nexport PATH={CUDA_HOME}/bin:$PATH\n")
        write(
            r / ENV_FILE.lstrip("/"),
            f". {r}/etc/msgpu/env/cuda-11.1.sh\n"
            f"export LD_LIBRARY_PATH={CUDA_HOME}/lib64\nexport VIRTUAL_ENV={VENV}\nexport PATH={VENV}/bin:$PATH\n",
        )
        library(r, CUDA_HOME + "/lib64", "libcurand.so.10", "libcurand.so.10.2.10.91")
        write(r / SITE.lstrip("/") / "mindspore/lib/libmindspore_gvar.so", data=b"\x7fELF")
        needed = ["libcudart.so.11.0", "libcudnn.so.8", "libcurand.so.10", "libmindspore_gvar.so", "libc.so.6"]
        library(r, "/lib/x86_64-linux-gnu", "libc.so.6", "libc-2.31.so")
        ext = elf(needed, rpath="$ORIGIN/lib::/usr/local/cuda-11.1/lib64")
        write(r / SITE.lstrip("/") / "mindspore/_c_expression.cpython-38-x86_64-linux-gnu.so", data=ext)
        for name, version in (("mindspore_gpu", "1.5.1"), ("numpy", "1.21.6"), ("Pillow", "9.5.0")):
            self.dist(name, version)
        # Persistence mode on: Ubuntu's unit, the role's drop-in, the daemon it starts, and a stand-in
        # nvidia-smi (<root>/usr/bin/nvidia-smi) that prints a real `nvidia-smi -q`.
        write(r / FOCAL_UNIT_PATH.lstrip("/"), FOCAL_PERSISTENCED_UNIT)
        write(r / role_dropin_path().lstrip("/"), role_dropin())
        self.daemon(PERSISTENCED_ON)
        self.nvidia_smi(NVIDIA_SMI_Q_ON)
        self.expect = json.loads(json.dumps(EXPECT))

    def daemon(self, argv: List[str], pid: int = 1815) -> None:
        write(self.proc / str(pid) / "cmdline", data=b"\0".join(a.encode() for a in argv) + b"\0")

    def nvidia_smi(self, output: str, status: int = 0) -> Path:
        write(self.root / "usr/share/msgpu-test/nvidia-smi-q.txt", output)
        program = write(
            self.root / "usr/bin/nvidia-smi",
            '#!/bin/sh\n[ "$1" = -q ] || exit 2\ncat "$(dirname "$0")/../share/msgpu-test/nvidia-smi-q.txt"\n'
            f"exit {status}\n",
        )
        program.chmod(0o755)
        return program

    def dist(self, name: str, version: str) -> None:
        write(
            self.root / SITE.lstrip("/") / f"{name}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        )

    def host(
        self,
        environ: Optional[Dict[str, str]] = None,
        device_id: Optional[int] = None,
        nvidia_smi: Optional[str] = None,
    ) -> doctor.Host:
        return doctor.Host(
            root=self.root,
            proc=self.proc,
            sys=self.sys,
            expect=self.expect,
            env_file=ENV_FILE,
            environ=environ or {},
            device_id=device_id,
            nvidia_smi=nvidia_smi,
        )

    def diagnose(self, **kwargs) -> Dict:
        return doctor.diagnose(self.host(**kwargs))


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


def by_id(document: Dict) -> Dict[str, Dict]:
    return {f["id"]: f for f in document["findings"]}


def problems(document: Dict) -> Dict[str, Dict]:
    return {k: f for k, f in by_id(document).items() if f["severity"] in ("error", "warning")}


def test_healthy_host_has_no_error_and_no_warning(tree: Tree) -> None:
    document = tree.diagnose()
    assert problems(document) == {}, problems(document)
    assert document["ok"] is True
    found = by_id(document)["libraries-found"]["evidence"]
    assert any(line.startswith("libcudart.so.11.0 -> ") and "libcudart.so.11.1.74 (RPATH)" in line for line in found)
    assert any("libcuda.so.470.82.01" in line for line in found)
    assert document["elapsed_s"] < 5


def test_nouveau_loaded(tree: Tree) -> None:
    write(tree.proc / "modules", "nouveau 2347008 0 - Live 0x0\n")
    finding = by_id(tree.diagnose())["nouveau-loaded"]
    assert finding["severity"] == "error"
    assert "nouveau 2347008" in finding["evidence"][0]
    assert "nvidia_driver_blacklist_nouveau" in finding["fix"] and "update-initramfs" in finding["fix"]


def test_blacklist_missing(tree: Tree) -> None:
    (tree.root / "etc/modprobe.d/blacklist-nouveau.conf").unlink()
    finding = by_id(tree.diagnose())["nouveau-not-blacklisted"]
    assert finding["severity"] == "warning"
    assert "/etc/modprobe.d/blacklist-nouveau.conf" in finding["fix"]


def test_new_kernel_headers_without_module(tree: Tree) -> None:
    write(tree.root / "lib/modules/5.4.0-200-generic/build/Makefile", "all:\n")
    finding = by_id(tree.diagnose())["dkms-module-missing"]
    assert finding["severity"] == "error" and "5.4.0-200-generic" in finding["title"]
    assert "dkms autoinstall -k 5.4.0-200-generic" in finding["fix"]
    assert any("DKMS has not built it" in e for e in finding["evidence"])


def test_canonicals_precompiled_module_counts_as_the_kernels_module(tree: Tree) -> None:
    """linux-modules-nvidia-<branch>-<kernel> installs kernel/nvidia-<branch>/nvidia.ko (nvidia_driver_module:
    precompiled): a kernel with headers and that module lacks nothing; under Secure Boot it is checked too."""
    write(tree.root / "lib/modules/5.4.0-200-generic/build/Makefile", "all:\n")
    module = tree.root / "lib/modules/5.4.0-200-generic/kernel/nvidia-535/nvidia.ko"
    write(module, data=b"module" + doctor.MODULE_SIGNATURE_MAGIC)
    assert "dkms-module-missing" not in by_id(tree.diagnose())
    write(tree.sys / doctor.SECURE_BOOT_VAR, data=b"\x06\x00\x00\x00\x01")
    (tree.root / f"lib/modules/{KERNEL}").rename(tree.root / "lib/modules/5.4.0-1-generic")
    module.write_bytes(b"unsigned module")
    finding = by_id(tree.diagnose())["secure-boot-unsigned-module"]
    assert any("kernel/nvidia-535/nvidia.ko has no appended module signature" in e for e in finding["evidence"])


def test_running_kernel_without_module(tree: Tree) -> None:
    (tree.root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko").unlink()
    (tree.root / f"lib/modules/{KERNEL}/build/Makefile").unlink()
    finding = by_id(tree.diagnose())["driver-module-missing-running-kernel"]
    assert finding["severity"] == "error" and KERNEL in finding["title"]
    assert f"linux-headers-{KERNEL}" in finding["fix"]


def test_secure_boot_with_unsigned_module(tree: Tree) -> None:
    write(tree.sys / doctor.SECURE_BOOT_VAR, data=b"\x06\x00\x00\x00\x01")
    write(tree.root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko", data=b"unsigned module")
    finding = by_id(tree.diagnose())["secure-boot-unsigned-module"]
    assert finding["severity"] == "error"
    assert any("no appended module signature" in e for e in finding["evidence"])
    assert "update-secureboot-policy --enroll-key" in finding["fix"]


def test_secure_boot_with_signed_module_is_fine(tree: Tree) -> None:
    write(tree.sys / doctor.SECURE_BOOT_VAR, data=b"\x06\x00\x00\x00\x01")
    assert "secure-boot-unsigned-module" not in by_id(tree.diagnose())


def test_driver_older_than_cuda_minimum(tree: Tree) -> None:
    write(tree.sys / "module/nvidia/version", "418.226.00\n")
    library(tree.root, "/usr/lib/x86_64-linux-gnu", "libnvidia-ml.so.1", "libnvidia-ml.so.418.226.00")
    (tree.root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").unlink()
    (tree.root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.418.226.00")
    found = by_id(tree.diagnose())
    finding = found["driver-too-old"]
    assert finding["severity"] == "error" and "418.226.00" in finding["title"] and "450.80.02" in finding["title"]
    assert "stack_driver_branch" in finding["fix"]
    assert "nvml-mismatch" not in found


def test_nvml_mismatch(tree: Tree) -> None:
    write(tree.sys / "module/nvidia/version", "470.57.02\n")
    finding = by_id(tree.diagnose())["nvml-mismatch"]
    assert finding["severity"] == "error"
    assert "470.57.02" in finding["title"] and "470.82.01" in finding["title"]
    assert "reboot" in finding["fix"]


# /proc/driver/nvidia/version of real hosts: NVIDIA's proprietary module (the 470 branch on focal, a
# two-part release) and the open kernel modules (515 and later; one in a vGPU guest).
@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.00  Thu Oct 14 10:24:40 UTC 2021\n"
            "GCC version:  gcc version 9.3.0 (Ubuntu 9.3.0-17ubuntu1~20.04)\n",
            "470.82.00",
        ),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  Thu May  2 14:37:44 UTC 2024\n"
            "GCC version:  gcc version 9.4.0 (Ubuntu 9.4.0-1ubuntu1~20.04.2)\n",
            "470.256.02",
        ),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.86  Tue Oct 26 21:55:45 UTC 2021\n", "470.86"),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  "
            "(dvs-builder@U16-T02-35-3)  Sat Aug 19 01:13:10 UTC 2023\n",
            "535.104.05",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.42.02  Release Build  "
            "(dvs-builder@U16-I3-A03-02-4)  Mon May 13 17:10:33 UTC 2024\n"
            "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n",
            "555.42.02",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  (VirtualGPU)\n",
            "560.35.03",
        ),
        ("GCC version:  gcc version 9.3.0 (Ubuntu 9.3.0-17ubuntu1~20.04)\n", None),
        ("", None),
    ],
)
def test_nvrm_version_of_proprietary_and_open_kernel_modules(text: str, version: Optional[str]) -> None:
    assert doctor.nvrm_version(text) == version


def test_loaded_open_kernel_module_read_from_proc(tree: Tree) -> None:
    """Without /sys/module/nvidia/version the doctor reads /proc/driver/nvidia/version: the open kernel
    modules' line names the release after "for x86_64", which the old pattern missed (driver-not-loaded)."""
    (tree.sys / "module/nvidia/version").unlink()
    write(
        tree.proc / "driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  "
        "(dvs-builder@U16-T02-35-3)  Sat Aug 19 01:13:10 UTC 2023\nGCC version:  gcc version 9.4.0 (Ubuntu "
        "9.4.0-1ubuntu1~20.04.2)\n",
    )
    found = by_id(tree.diagnose())
    assert "driver-not-loaded" not in found
    mismatch = found["nvml-mismatch"]  # the tree's user space is 470.82.01
    assert "535.104.05" in mismatch["title"]
    assert mismatch["evidence"][0] == f"{tree.proc / 'driver/nvidia/version'}: 535.104.05"
    write(
        tree.proc / "driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.82.01  Tue Oct 26 21:55:45 UTC 2021\n",
    )
    assert problems(tree.diagnose()) == {}


def test_driver_not_loaded_unless_no_gpu(tree: Tree) -> None:
    (tree.sys / "module/nvidia/version").unlink()
    assert by_id(tree.diagnose())["driver-not-loaded"]["severity"] == "error"
    tree.expect["no_gpu"] = True
    assert "driver-not-loaded" not in by_id(tree.diagnose())


@pytest.mark.parametrize(
    ("soname", "severity", "variable"),
    [
        ("libcudnn.so.8", "error", "stack_cudnn_method=tarball"),
        ("libcudart.so.11.0", "error", "stack_cuda_method=runfile"),
        ("libcuda.so.1", "error", "stack_driver_method=distro"),
        ("libnccl.so.2", "warning", "stack_nccl_method=tarball"),
    ],
)
def test_missing_library_names_its_provider(tree: Tree, soname: str, severity: str, variable: str) -> None:
    folder = "usr/lib/x86_64-linux-gnu" if soname == "libcuda.so.1" else CUDA_HOME.lstrip("/") + "/lib64"
    (tree.root / folder / soname).unlink()
    finding = by_id(tree.diagnose())[f"library-missing:{soname}"]
    assert finding["severity"] == severity
    assert variable in finding["fix"]
    assert any("/usr/local/cuda-11.1/lib64" in e for e in finding["evidence"])


def test_missing_library_the_extension_links_beyond_the_catalog(tree: Tree) -> None:
    (tree.root / CUDA_HOME.lstrip("/") / "lib64/libcurand.so.10").unlink()
    document = tree.diagnose()
    finding = by_id(document)["library-missing:libcurand.so.10"]
    assert finding["severity"] == "error" and "DT_NEEDED" in finding["title"]
    assert "stack_cuda_method=runfile" in finding["fix"]
    # The wheel's own libraries resolve through $ORIGIN/lib.
    assert "library-missing:libmindspore_gvar.so" not in by_id(document)


def test_rpath_shadows_ld_library_path(tree: Tree) -> None:
    other = "/opt/cuda-11.4/lib64"
    library(tree.root, other, "libcudart.so.11.0", "libcudart.so.11.4.43")
    env = tree.root / ENV_FILE.lstrip("/")
    env.write_text(env.read_text().replace(f"LD_LIBRARY_PATH={CUDA_HOME}/lib64", f"LD_LIBRARY_PATH={other}"))
    found = by_id(tree.diagnose())
    finding = found["rpath-shadows-ld-library-path"]
    assert finding["severity"] == "error"
    assert any("libcudart.so.11.0: RPATH gives" in e and "11.4.43" in e for e in finding["evidence"])
    assert finding["evidence"][0].endswith(
        "DT_RPATH: " + SITE + "/mindspore/lib:/usr/local/cuda-11.1/lib64 (searched before LD_LIBRARY_PATH)"
    )
    assert "ld-library-path-missing-cuda" in found


def test_cuda_home_unset_and_not_on_path(tree: Tree) -> None:
    write(tree.root / "etc/msgpu/env/cuda-11.1.sh", "true\n")
    found = by_id(tree.diagnose())
    assert found["cuda-home-unset"]["severity"] == "error"
    assert "./toolkit provision" in found["cuda-home-unset"]["fix"]
    assert found["cuda-not-on-path"]["severity"] == "error"


def test_env_file_missing(tree: Tree) -> None:
    (tree.root / ENV_FILE.lstrip("/")).unlink()
    assert by_id(tree.diagnose())["env-file-missing"]["severity"] == "error"


def test_numpy_outside_pins(tree: Tree) -> None:
    import shutil

    shutil.rmtree(tree.root / SITE.lstrip("/") / "numpy-1.21.6.dist-info")
    tree.dist("numpy", "1.24.4")
    finding = by_id(tree.diagnose())["pin-violated:numpy"]
    assert finding["severity"] == "error" and "numpy 1.24.4" in finding["title"] and "numpy<1.24" in finding["title"]
    assert "msgpu-constraints.txt" in finding["fix"]


def test_cpu_and_gpu_mindspore_both_installed(tree: Tree) -> None:
    tree.dist("mindspore", "1.5.1")
    finding = by_id(tree.diagnose())["mindspore-packages-conflict"]
    assert finding["severity"] == "error"
    assert "pip uninstall -y mindspore mindspore-gpu" in finding["fix"]


def test_device_id_outside_cuda_visible_devices(tree: Tree) -> None:
    finding = by_id(tree.diagnose(environ={"CUDA_VISIBLE_DEVICES": "1"}, device_id=1))["device-id-not-visible"]
    assert finding["severity"] == "error"
    assert "CUDA_VISIBLE_DEVICES='1'" in finding["evidence"][0]
    assert "device_id 0..0" in finding["fix"]
    assert "device-id-not-visible" not in by_id(tree.diagnose(environ={"CUDA_VISIBLE_DEVICES": "0,1"}, device_id=1))


def test_cuda_visible_devices_out_of_range(tree: Tree) -> None:
    finding = by_id(tree.diagnose(environ={"CUDA_VISIBLE_DEVICES": "3"}))["cuda-visible-devices-out-of-range"]
    assert "the host has 2" in finding["title"]


def mpi_rank(tree: Tree, pid: int, rank: int, env: Dict[str, str]) -> None:
    base = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "PMIX_NAMESPACE": "job-7"}
    data = b"\0".join(f"{k}={v}".encode() for k, v in {**base, **env}.items()) + b"\0"
    write(tree.proc / str(pid) / "environ", data=data)
    write(tree.proc / str(pid) / "cmdline", data=b"python\0train.py\0")


def test_mpi_ranks_bound_to_one_gpu(tree: Tree) -> None:
    for pid, rank in ((101, 0), (102, 1)):
        mpi_rank(tree, pid, rank, {"CUDA_VISIBLE_DEVICES": "0"})
    finding = by_id(tree.diagnose())["mpi-ranks-one-gpu"]
    assert finding["severity"] == "error" and "All 2 MPI ranks of job job-7" in finding["title"]
    assert "OMPI_COMM_WORLD_LOCAL_RANK" in finding["fix"]


def test_mpi_ranks_on_their_own_gpus_are_fine(tree: Tree) -> None:
    for pid, rank in ((101, 0), (102, 1)):
        mpi_rank(tree, pid, rank, {"CUDA_VISIBLE_DEVICES": str(rank)})
    mpi_rank(tree, 103, 2, {})  # picks its GPU itself: unknown, never an alarm
    assert "mpi-ranks-one-gpu" not in by_id(tree.diagnose())


def test_elf_reader_reads_rpath_and_needed(tmp_path: Path) -> None:
    path = write(tmp_path / "x.so", data=elf(["libfoo.so.1"], rpath="/a:/b"))
    assert doctor.elf_dynamic(path) == {"needed": ["libfoo.so.1"], "rpath": ["/a:/b"], "runpath": []}
    assert doctor.elf_dynamic(write(tmp_path / "text", "not an elf")) == {}


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("1.23.5", "<1.24", True),
        ("1.24.0", "<1.24", False),
        ("1.24.4", ">=1.17,<1.24", False),
        ("9.5.0", "<10", True),
        ("10.0.1", "<10", False),
        ("1.5.1", "==1.5.*", True),
        ("1.6.0", "~=1.5.0", False),
    ],
)
def test_pin_specifiers(version: str, spec: str, ok: bool) -> None:
    assert doctor.satisfies(version, spec) is ok


def test_cli_exit_code_json_and_text(tree: Tree, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    expect = write(tmp_path / "expect.json", json.dumps(tree.expect))
    args = ["doctor", "--expect", str(expect), "--root", str(tree.root), "--proc", str(tree.proc)]
    args += ["--sys", str(tree.sys), "--json", str(tmp_path / "out.json")]
    assert cli_main(args) == 0
    assert "0 error(s), 0 warning(s)" in capsys.readouterr().out
    write(tree.proc / "modules", "nouveau 1 0 - Live 0x0\n")
    assert cli_main(args) == 1
    text = capsys.readouterr().out
    assert "ERROR   nouveau, the open-source driver" in text and "fix:" in text and "seen:" in text
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["counts"]["error"] == 1 and document["findings"][0]["id"] == "nouveau-loaded"
    assert os.path.basename(document["env_file"]) == os.path.basename(ENV_FILE)


def test_role_interface_inline_expectations_and_json_line(
    tree: Tree, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """What roles/verify tasks/doctor.yml runs: `python3 <folder>/doctor --json-line --expect-json '<json>'`."""
    write(tree.proc / "modules", "nouveau 1 0 - Live 0x0\n")
    args = ["--json-line", "--expect-json", json.dumps(tree.expect), "--root", str(tree.root)]
    args += ["--proc", str(tree.proc), "--sys", str(tree.sys)]
    assert doctor.main(args) == 1
    lines = capsys.readouterr().out.splitlines()
    marked = [line for line in lines if line.startswith(doctor.JSON_LINE + " ")]
    assert len(marked) == 1 and lines[-1] == marked[0]
    document = json.loads(marked[0][len(doctor.JSON_LINE) + 1 :])
    assert document["expect"]["stack"] == "ms1.5-cuda11.1" and document["env_file"] == ENV_FILE
    assert [f["id"] for f in document["findings"] if f["severity"] == "error"] == ["nouveau-loaded"]
    assert lines[0].startswith("doctor: gpu1 (stack ms1.5-cuda11.1): 1 error(s)")


# ------------------------------------------------------------------------------------ persistence mode


def files(tree: Dict[str, str]):
    """list_dir and read over {absolute path: text}, for doctor.load_unit."""

    def list_dir(folder: str) -> List[str]:
        prefix = folder.rstrip("/") + "/"
        return sorted({p[len(prefix) :].split("/")[0] for p in tree if p.startswith(prefix)})

    return list_dir, tree.get


def test_focal_unit_alone_runs_without_persistence_mode() -> None:
    unit = doctor.load_unit(doctor.PERSISTENCED_UNIT, *files({FOCAL_UNIT_PATH: FOCAL_PERSISTENCED_UNIT}))
    assert unit.path == FOCAL_UNIT_PATH and unit.dropins == []
    assert unit.values("Service", "ExecStart") == [" ".join(PERSISTENCED_OFF)]
    assert doctor.exec_argv(unit.value("Service", "ExecStart")) == PERSISTENCED_OFF
    assert doctor.persistence_mode_in(PERSISTENCED_OFF[1:]) is False
    assert doctor.unit_bool(unit.value("Unit", "StopWhenUnneeded")) is True
    assert unit.value("Service", "Type") == "forking" and unit.values("Install", "WantedBy") == []


def test_role_dropin_over_the_focal_unit_turns_persistence_mode_on() -> None:
    dropin = role_dropin_path()
    assert dropin == doctor.PERSISTENCED_DROPIN
    unit = doctor.load_unit(
        doctor.PERSISTENCED_UNIT, *files({FOCAL_UNIT_PATH: FOCAL_PERSISTENCED_UNIT, dropin: role_dropin()})
    )
    assert unit.sources == [FOCAL_UNIT_PATH, dropin]
    # `ExecStart=` resets the packaged command line: exactly one is left (Type=forking allows one).
    assert unit.values("Service", "ExecStart") == [" ".join(PERSISTENCED_ON)]
    argv = doctor.exec_argv(unit.value("Service", "ExecStart"))
    assert "--persistence-mode" in argv and "--no-persistence-mode" not in argv
    assert doctor.persistence_mode_in(argv[1:]) is True
    assert argv[1:3] == ["--user", "nvidia-persistenced"]  # the user the package's postinst creates
    assert unit.value("Unit", "StopWhenUnneeded") == "false"
    assert doctor.unit_bool(unit.value("Unit", "StopWhenUnneeded"), default=True) is False
    assert unit.values("Install", "WantedBy") == ["multi-user.target"]
    # What the unit keeps from the package.
    assert unit.value("Service", "ExecStopPost") == "/bin/rm -rf /var/run/nvidia-persistenced"
    assert unit.value("Unit", "Description") == "NVIDIA Persistence Daemon"


def test_dropins_apply_in_file_name_order_across_folders_and_hide_same_names() -> None:
    base = "nvidia-persistenced.service.d"
    tree = {
        FOCAL_UNIT_PATH: FOCAL_PERSISTENCED_UNIT,
        f"/etc/systemd/system/{base}/msgpu-persistence.conf": role_dropin(),
        # Same file name in a less important folder: hidden by /etc's.
        f"/lib/systemd/system/{base}/msgpu-persistence.conf": "[Unit]\nStopWhenUnneeded=true\n",
        # Sorted after msgpu-persistence.conf although it is in /run: it has the last word.
        f"/run/systemd/system/{base}/zz-admin.conf": "[Service]\nExecStart=\nExecStart=-/usr/bin/nvidia-persistenced "
        "--user nvidia-persistenced \\\n  --no-persistence-mode\n",
        # Not a .conf: ignored.
        f"/etc/systemd/system/{base}/notes.txt": "[Unit]\nStopWhenUnneeded=true\n",
    }
    unit = doctor.load_unit(doctor.PERSISTENCED_UNIT, *files(tree))
    assert unit.dropins == [
        f"/etc/systemd/system/{base}/msgpu-persistence.conf",
        f"/run/systemd/system/{base}/zz-admin.conf",
    ]
    assert unit.value("Unit", "StopWhenUnneeded") == "false"
    argv = doctor.exec_argv(unit.value("Service", "ExecStart"))
    assert argv == PERSISTENCED_OFF[:4]  # the '-' prefix dropped, the continued line joined
    assert doctor.persistence_mode_in(argv[1:]) is False


def test_an_exec_start_without_reset_adds_a_second_command() -> None:
    tree = {
        FOCAL_UNIT_PATH: FOCAL_PERSISTENCED_UNIT,
        "/etc/systemd/system/nvidia-persistenced.service.d/a.conf": "[Service]\nExecStart=/bin/true\n",
    }
    unit = doctor.load_unit(doctor.PERSISTENCED_UNIT, *files(tree))
    assert unit.values("Service", "ExecStart") == [" ".join(PERSISTENCED_OFF), "/bin/true"]


def test_a_unit_in_etc_replaces_the_packaged_one() -> None:
    """The runfile method's unit lives in /etc/systemd/system: it wins over any packaged one."""
    own = "[Service]\nType=forking\nExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced\n"
    unit = doctor.load_unit(
        doctor.PERSISTENCED_UNIT,
        *files({FOCAL_UNIT_PATH: FOCAL_PERSISTENCED_UNIT, "/etc/systemd/system/nvidia-persistenced.service": own}),
    )
    assert unit.path == "/etc/systemd/system/nvidia-persistenced.service"
    assert doctor.persistence_mode_in(doctor.exec_argv(unit.value("Service", "ExecStart"))[1:]) is True  # default
    assert unit.value("Unit", "StopWhenUnneeded") is None
    missing = doctor.load_unit(doctor.PERSISTENCED_UNIT, *files({}))
    assert missing.path is None and missing.sources == [] and missing.settings == {}


def test_gpu_persistence_from_real_nvidia_smi_q() -> None:
    assert doctor.gpu_persistence(NVIDIA_SMI_Q_OFF) == [
        {"bus_id": "00000000:01:00.0", "product": "GeForce RTX 2070", "persistence": "Disabled"},
        {"bus_id": "00000000:05:00.0", "product": "GeForce RTX 2070", "persistence": "Disabled"},
    ]
    assert [g["persistence"] for g in doctor.gpu_persistence(NVIDIA_SMI_Q_ON)] == ["Enabled", "Enabled"]
    assert doctor.gpu_persistence(NVIDIA_SMI_NO_DRIVER) == []


def test_persistence_mode_on_is_quiet(tree: Tree) -> None:
    assert "persistence-mode-off" not in by_id(tree.diagnose())


def test_persistence_mode_off_with_ubuntus_unit(tree: Tree) -> None:
    """What a distro install without the role's drop-in looks like: Ubuntu's unit started the daemon."""
    (tree.root / doctor.PERSISTENCED_DROPIN.lstrip("/")).unlink()
    tree.daemon(PERSISTENCED_OFF)
    tree.nvidia_smi(NVIDIA_SMI_Q_OFF)
    document = tree.diagnose()
    finding = by_id(document)["persistence-mode-off"]
    assert finding["severity"] == "warning" and document["ok"] is True
    assert finding["title"].startswith("Persistence mode is off on 2 of 2 GPU(s)")
    stand_in = tree.root / "usr/bin/nvidia-smi"
    assert finding["evidence"][:2] == [
        f"`{stand_in} -q`: GPU 00000000:01:00.0 (GeForce RTX 2070): Persistence Mode : Disabled",
        f"`{stand_in} -q`: GPU 00000000:05:00.0 (GeForce RTX 2070): Persistence Mode : Disabled",
    ]
    assert finding["evidence"][2] == f"{tree.proc}/1815/cmdline: {' '.join(PERSISTENCED_OFF)}"
    assert finding["evidence"][3] == (
        f"nvidia-persistenced.service as systemd merges {FOCAL_UNIT_PATH}: ExecStart={' '.join(PERSISTENCED_OFF)}; "
        "StopWhenUnneeded=true"
    )
    fix = finding["fix"]
    assert "Ubuntu's packaged unit" in fix and doctor.PERSISTENCED_DROPIN in fix
    assert "nvidia_driver_persistence_mode: true" in fix and "./toolkit provision" in fix
    assert "StopWhenUnneeded=false" in fix and "--persistence-mode" in fix and "`sudo nvidia-smi -pm 1`" in fix


def test_persistence_mode_off_although_the_dropin_is_there(tree: Tree) -> None:
    """The drop-in is in place but the daemon still runs the packaged command line: restart it."""
    tree.daemon(PERSISTENCED_OFF)
    tree.nvidia_smi(
        NVIDIA_SMI_Q_OFF.replace("Persistence Mode                      : Disabled", "Persistence Mode : Enabled", 1)
    )
    finding = by_id(tree.diagnose())["persistence-mode-off"]
    assert finding["title"].startswith("Persistence mode is off on 1 of 2 GPU(s)")
    assert [e.split(": GPU ")[1] for e in finding["evidence"] if ": GPU " in e] == [
        "00000000:05:00.0 (GeForce RTX 2070): Persistence Mode : Disabled"
    ]
    assert any(
        e.endswith(
            f"merges {FOCAL_UNIT_PATH} + {doctor.PERSISTENCED_DROPIN}: ExecStart={' '.join(PERSISTENCED_ON)}; "
            "StopWhenUnneeded=false"
        )
        for e in finding["evidence"]
    )
    assert "sudo systemctl restart nvidia-persistenced" in finding["fix"]


def test_persistence_mode_off_without_a_daemon_or_unit(tree: Tree) -> None:
    (tree.proc / "1815/cmdline").unlink()
    (tree.root / doctor.PERSISTENCED_DROPIN.lstrip("/")).unlink()
    (tree.root / FOCAL_UNIT_PATH.lstrip("/")).unlink()
    tree.nvidia_smi(NVIDIA_SMI_Q_OFF)
    finding = by_id(tree.diagnose())["persistence-mode-off"]
    assert f"no nvidia-persistenced process runs ({tree.proc}/<pid>/cmdline)" in finding["evidence"]
    assert any(e.startswith("no nvidia-persistenced.service in /etc/systemd/system") for e in finding["evidence"])
    assert finding["fix"].startswith("There is no nvidia-persistenced.service")


def test_persistence_mode_from_the_daemon_when_nvidia_smi_cannot_answer(tree: Tree) -> None:
    tree.nvidia_smi(NVIDIA_SMI_NO_DRIVER, status=9)
    assert "persistence-mode-off" not in by_id(tree.diagnose())  # the daemon runs --persistence-mode
    tree.daemon(PERSISTENCED_OFF)
    finding = by_id(tree.diagnose())["persistence-mode-off"]
    assert finding["severity"] == "warning"
    assert finding["title"] == "nvidia-persistenced runs with --no-persistence-mode: persistence mode is off"
    assert finding["evidence"][0].startswith(f"GPUs not asked: `{tree.root / 'usr/bin/nvidia-smi'} -q` exited with 9")
    assert "couldn't communicate with the NVIDIA driver" in finding["evidence"][0]
    # No nvidia-smi to ask at all ('' on the command line): the same from the daemon alone.
    finding = by_id(doctor.diagnose(tree.host(nvidia_smi="")))["persistence-mode-off"]
    assert finding["evidence"][0] == "GPUs not asked: no nvidia-smi on this host"


def test_persistence_mode_is_not_asked_on_a_host_without_gpu(tree: Tree) -> None:
    tree.daemon(PERSISTENCED_OFF)
    tree.nvidia_smi(NVIDIA_SMI_Q_OFF)
    tree.expect["no_gpu"] = True
    assert "persistence-mode-off" not in by_id(tree.diagnose())


def test_cli_names_the_nvidia_smi_to_ask(tree: Tree, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    elsewhere = write(tmp_path / "bin/nvidia-smi", f"#!/bin/sh\ncat {tmp_path}/q.txt\n")
    elsewhere.chmod(0o755)
    write(tmp_path / "q.txt", NVIDIA_SMI_Q_OFF)
    args = ["--expect-json", json.dumps(tree.expect), "--root", str(tree.root), "--proc", str(tree.proc)]
    args += ["--sys", str(tree.sys), "--json", "-"]
    assert doctor.main(args) == 0
    assert "persistence-mode-off" not in by_id(json.loads(capsys.readouterr().out))
    assert doctor.main([*args, "--nvidia-smi", str(elsewhere)]) == 0  # a warning, not an error
    finding = by_id(json.loads(capsys.readouterr().out))["persistence-mode-off"]
    assert finding["evidence"][0].startswith(f"`{elsewhere} -q`: GPU 00000000:01:00.0")


# ------------------------------------------------------------------------------------------- GPU probe
# The doctor runs the real gpu_probe.py (through judge.run_driver_probe, in a child) against the stand-in
# libcuda / libnvidia-ml of tests/unit/stub_cuda (tests/unit/conftest.py builds them); the stubs answer from
# the STUB_* variables, which the probe's child inherits from this process.

RTX3090 = STUB_RTX3090


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch, stub_cuda: Dict[str, str]):
    """Sets the stubs' variables (two healthy RTX 3090 with driver 470.82.01, persistence on, no ECC unless
    overridden) and returns a function that runs the doctor on the tree with the probe on the stubs."""
    for name in STUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    defaults = {
        "STUB_CUDA_DEVICES": ",".join([RTX3090] * 2),
        "STUB_NVML_DRIVER": "470.82.01",
        "STUB_NVML_PERSISTENCE": "1",
        "STUB_NVML_ECC": "unsupported",
    }

    def run(tree: Tree, libcuda: Optional[str] = None, timeout_s: float = 30.0, **stub: object) -> Dict:
        for name, value in {**defaults, **stub}.items():
            monkeypatch.setenv(name, str(value))
        host = tree.host()
        host.gpu_probe, host.gpu_probe_timeout_s = True, timeout_s
        host.libcuda, host.libnvml = libcuda or stub_cuda["cuda"], stub_cuda["nvml"]
        return doctor.diagnose(host)

    return run


def test_a_working_gpu_probe_adds_nothing_and_is_recorded(tree: Tree, gpus) -> None:
    document = gpus(tree)
    assert problems(document) == {}, problems(document)
    probe = document["gpu_probe"]
    assert probe["state"] == "ran" and probe["verdict"] == "OK"
    assert probe["summary"] == "OK (2 x NVIDIA GeForce RTX 3090)"
    assert probe["document"]["nvml"]["driver_version"] == "470.82.01"
    assert "gpu-probe" in document["rules"]
    assert doctor.render(document).splitlines()[1] == "GPU probe (no MindSpore): OK (2 x NVIDIA GeForce RTX 3090)"


@pytest.mark.parametrize(
    ("code", "name", "meaning", "fix"),
    [
        (999, "CUDA_ERROR_UNKNOWN", "the driver failed without saying why", "sudo modprobe nvidia_uvm"),
        (3, "CUDA_ERROR_NOT_INITIALIZED", "cuInit failed earlier", "Reload the driver or reboot"),
        # The stub's cuGetErrorName does not know 803 and 804: gpu_probe.py's own table names them.
        (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "different driver releases", "Reboot so the kernel module"),
        (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward-compatibility", "cuda-compat"),
    ],
)
def test_cuinit_failing_names_the_cuda_error_and_what_it_means(
    tree: Tree, gpus, code: int, name: str, meaning: str, fix: str
) -> None:
    write(tree.proc / "modules", "nvidia 35000000 0 - Live 0x0\n")  # nvidia_uvm not loaded
    document = gpus(tree, STUB_CUDA_INIT_RESULT=code)
    finding = by_id(document)["cuda-init-failed"]
    assert finding["severity"] == "error" and document["ok"] is False
    assert finding["title"].startswith(f"The CUDA driver fails before any framework: cuInit returned {name} ({code}): ")
    assert meaning in finding["title"]
    assert f"cuInit returned {name} ({code}): " in "\n".join(finding["evidence"])
    assert "NVML: driver 470.82.01" in finding["evidence"]
    assert fix in finding["fix"] and "gpu-probe" in finding["fix"]
    assert (f"{tree.proc / 'modules'}: nvidia_uvm is not loaded" in finding["evidence"]) is (code == 999)
    assert document["gpu_probe"]["verdict"] == "DRIVER_ERROR"


def test_no_device_while_the_module_is_loaded(tree: Tree, gpus) -> None:
    document = gpus(tree, STUB_CUDA_INIT_RESULT=100, CUDA_VISIBLE_DEVICES="")
    finding = by_id(document)["cuda-no-device"]
    assert finding["severity"] == "error"
    assert "cuInit returned CUDA_ERROR_NO_DEVICE (100): the driver sees no CUDA-capable GPU" in "\n".join(
        finding["evidence"]
    )
    assert "the doctor's CUDA_VISIBLE_DEVICES=''" in finding["evidence"]
    assert "nvidia-modprobe" in finding["fix"] and "Xid 79" in finding["fix"]
    # The module not loaded: driver-not-loaded says it, with the probe's answer, and no second finding.
    (tree.sys / "module/nvidia/version").unlink()
    document = gpus(tree, STUB_CUDA_INIT_RESULT=100)
    assert "cuda-no-device" not in by_id(document)
    evidence = by_id(document)["driver-not-loaded"]["evidence"]
    assert evidence[-1].startswith(
        "GPU probe (gpu_probe.py, no MindSpore): NO_DEVICE: cuInit says CUDA_ERROR_NO_DEVICE"
    )


def test_a_host_without_gpus_on_purpose_stays_quiet_whatever_the_probe_says(tree: Tree, gpus, tmp_path: Path) -> None:
    """stack_no_gpu (the sandbox): no device, no libcuda at all, or a failing cuInit add no finding, not even a
    note (tests/system/test_doctor.py allows none); the answer is in the document."""
    tree.expect["no_gpu"] = True
    without = {f["id"] for f in doctor.diagnose(tree.host())["findings"]}
    for stub in ({"STUB_CUDA_INIT_RESULT": 100}, {"STUB_CUDA_DEVICES": ""}, {"STUB_CUDA_INIT_RESULT": 999}):
        document = gpus(tree, STUB_NVML_INIT_RESULT=9, **stub)
        assert {f["id"] for f in document["findings"]} == without, (stub, document["findings"])
        assert document["gpu_probe"]["verdict"] in ("NO_DEVICE", "DRIVER_ERROR")
    document = gpus(tree, libcuda=str(tmp_path / "libcuda.so.1"))
    assert {f["id"] for f in document["findings"]} == without
    assert document["gpu_probe"]["verdict"] == "NO_DRIVER"
    assert doctor.render(document).splitlines()[1].startswith("GPU probe (no MindSpore): NO_DRIVER: ")


def test_libcuda_installed_but_unloadable(tree: Tree, gpus) -> None:
    broken = tree.root / "usr/lib/x86_64-linux-gnu/libcuda.so.470.82.01"  # 4 bytes, not a library
    document = gpus(tree, libcuda=str(broken))
    finding = by_id(document)["cuda-driver-unloadable"]
    assert finding["severity"] == "error" and "driver-user-space-missing" not in by_id(document)
    assert "cannot be loaded" in finding["evidence"][0] and str(broken) in finding["evidence"][0]


@pytest.mark.parametrize(
    ("kernel", "step", "error"),
    [
        ("launch_fail", "cuLaunchKernel", "CUDA_ERROR_LAUNCH_FAILED (719) - the kernel crashed on the GPU"),
        ("jit_fail", "cuModuleLoadData", "CUDA_ERROR_INVALID_PTX (218) - the driver cannot JIT-compile PTX"),
        ("wrong", "result", "1 of 256 results wrong, first out[7]"),
    ],
)
def test_a_kernel_that_fails_on_one_gpu(tree: Tree, gpus, kernel: str, step: str, error: str) -> None:
    document = gpus(tree, STUB_CUDA_KERNEL=kernel, STUB_CUDA_BAD_DEVICE=1)
    finding = by_id(document)["gpu-kernel-failed"]
    assert finding["severity"] == "error"
    assert finding["title"].startswith("A tiny CUDA kernel fails on 1 of 2 GPU(s) without any framework")
    assert finding["evidence"][0].startswith(
        f"GPU 1 (NVIDIA GeForce RTX 3090, compute capability 8.6): {step} failed: {error}"
    )
    assert len(finding["evidence"]) == 2 and finding["evidence"][1] == "NVML: driver 470.82.01"
    assert "nvidia-smi -r -i" in finding["fix"]


def test_the_running_driver_against_the_catalogs(tree: Tree, gpus) -> None:
    finding = by_id(gpus(tree, STUB_NVML_DRIVER="535.104.05"))["driver-version-unexpected"]
    assert finding["severity"] == "warning"
    assert (
        finding["title"] == "The running driver is 535.104.05, the stack installs branch 470 (distro's nvidia-dkms-470)"
    )
    assert finding["evidence"][0] == "NVML (gpu_probe.py) nvmlSystemGetDriverVersion: 535.104.05"
    assert "driver-version-unexpected" not in by_id(gpus(tree, STUB_NVML_DRIVER="470.256.02"))  # same branch
    tree.expect["driver"] = {"branch": "470", "method": "runfile", "version": "470.82.01", "packages": []}
    assert "driver-version-unexpected" not in by_id(gpus(tree, STUB_NVML_DRIVER="470.82.01"))
    finding = by_id(gpus(tree, STUB_NVML_DRIVER="470.256.02"))["driver-version-unexpected"]
    assert finding["title"] == "The running driver is 470.256.02, the stack installs the runfile's 470.82.01"


def test_nvml_refusing_with_a_version_mismatch_is_the_nvml_mismatch(tree: Tree, gpus) -> None:
    """The library files' versions agree, yet NVML says the loaded module is another release (nvmlInit_v2
    answers 18): the existing nvml-mismatch finding, with NVML's words."""
    document = gpus(tree, STUB_NVML_INIT_RESULT=18)
    finding = by_id(document)["nvml-mismatch"]
    assert finding["severity"] == "error"
    assert finding["title"] == (
        "NVML driver/library version mismatch: nvmlInit_v2: Driver/library version mismatch (18)"
    )
    assert finding["evidence"][-1] == "NVML (gpu_probe.py): nvmlInit_v2: Driver/library version mismatch (18)"
    assert "reboot" in finding["fix"]
    assert "nvml-mismatch" not in by_id(gpus(tree, STUB_NVML_INIT_RESULT=9))  # "Driver Not Loaded" is not it


def test_persistence_mode_off_from_nvml(tree: Tree, gpus) -> None:
    """NVML answers where nvidia-smi cannot (none on this host), and overrides the daemon's command line: the
    daemon runs --persistence-mode, so today's rule alone is quiet."""
    tree.nvidia_smi(NVIDIA_SMI_NO_DRIVER, status=9)
    assert "persistence-mode-off" not in by_id(gpus(tree))  # NVML says on
    finding = by_id(gpus(tree, STUB_NVML_PERSISTENCE=0))["persistence-mode-off"]
    assert finding["severity"] == "warning"
    assert finding["title"].startswith("Persistence mode is off on 2 of 2 GPU(s)")
    assert finding["evidence"][:2] == [
        "NVML (gpu_probe.py) nvmlDeviceGetPersistenceMode: GPU 0 00000000:01:00.0 (NVIDIA GeForce RTX 3090): off",
        "NVML (gpu_probe.py) nvmlDeviceGetPersistenceMode: GPU 1 00000000:02:00.0 (NVIDIA GeForce RTX 3090): off",
    ]
    assert finding["evidence"][2].startswith("nvidia-smi gave no GPUs: ")
    assert "`sudo nvidia-smi -pm 1`" in finding["fix"]
    # Both answer: both are shown, nvidia-smi's lines first.
    tree.nvidia_smi(NVIDIA_SMI_Q_OFF)
    evidence = by_id(gpus(tree, STUB_NVML_PERSISTENCE=0))["persistence-mode-off"]["evidence"]
    assert "Persistence Mode : Disabled" in evidence[0] and "nvmlDeviceGetPersistenceMode" in evidence[2]
    # A host without GPUs on purpose: never.
    tree.expect["no_gpu"] = True
    assert "persistence-mode-off" not in by_id(gpus(tree, STUB_NVML_PERSISTENCE=0))


def test_ecc_off_is_a_note(tree: Tree, gpus) -> None:
    finding = by_id(gpus(tree, STUB_NVML_ECC=0))["ecc-off"]
    assert finding["severity"] == "info"
    assert finding["title"].startswith("ECC is off on 2 of 2 GPU(s) that support it")
    assert (
        finding["evidence"][1]
        == "NVML (gpu_probe.py) nvmlDeviceGetEccMode: GPU 1 00000000:02:00.0 (NVIDIA GeForce RTX 3090): off"
    )
    assert "nvidia-smi -e 1" in finding["fix"]
    for ecc in (1, "unsupported"):
        assert "ecc-off" not in by_id(gpus(tree, STUB_NVML_ECC=ecc))


@pytest.mark.parametrize(
    ("action", "severity", "said"),
    [("hang", "error", "did not finish within 1 s"), ("abort", "warning", "killed by signal 6")],
)
def test_a_probe_that_hangs_or_crashes(tree: Tree, gpus, action: str, severity: str, said: str) -> None:
    started = time.monotonic()
    document = gpus(tree, timeout_s=1.0, STUB_CUDA_INIT_ACTION=action)
    assert time.monotonic() - started < 15
    finding = by_id(document)["gpu-probe-no-answer"]
    assert finding["severity"] == severity and said in finding["evidence"][0]
    assert document["gpu_probe"]["state"] == ("timeout" if action == "hang" else "crashed")
    tree.expect["no_gpu"] = True
    assert "gpu-probe-no-answer" not in by_id(gpus(tree, timeout_s=1.0, STUB_CUDA_INIT_ACTION=action))


def test_the_probe_is_not_run_on_a_substituted_root_unless_asked(tree: Tree, gpus) -> None:
    document = tree.diagnose()
    assert document["gpu_probe"]["state"] == "skipped" and "--root" in document["gpu_probe"]["reason"]
    host = tree.host()
    host.gpu_probe = False
    assert doctor.diagnose(host)["gpu_probe"]["reason"] == "--no-gpu-probe"


def _doctor_file(tmp_path: Path, tree: Tree, script: Path, stub_cuda: Dict[str, str], *extra: str):
    args = [sys.executable, str(script), "--expect-json", json.dumps(tree.expect), "--root", str(tree.root)]
    args += ["--proc", str(tree.proc), "--sys", str(tree.sys), "--json", "-", "--libcuda", stub_cuda["cuda"]]
    args += ["--libnvml", stub_cuda["nvml"], *extra]
    env = {**os.environ, "STUB_CUDA_DEVICES": RTX3090, "STUB_CUDA_KERNEL": "launch_fail"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path), check=False)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def copy_doctor(folder: Path, *beside: str) -> Path:
    """The doctor's folder (its .py files, as the verify role copies them) into ``folder``, with ``beside`` (files
    of the package) next to it; the copied doctor folder."""
    source = ROOT / "verify" / "msgpu_verify"
    (folder / "doctor").mkdir(parents=True)
    for path in sorted((source / "doctor").glob("*.py")):
        (folder / "doctor" / path.name).write_bytes(path.read_bytes())
    for name in beside:
        (folder / name).write_bytes((source / name).read_bytes())
    return folder / "doctor"


def test_doctor_folder_as_a_file_runs_the_probe_from_the_files_beside_it(tree: Tree, tmp_path: Path, stub_cuda) -> None:
    """What the verify role does: the doctor's folder with judge.py, _proc.py, gpu_probe.py, compute.py and
    __init__.py beside it in a folder named msgpu_verify, `python3 <folder>/doctor ...` (no PYTHONPATH); the doctor's
    folder copied alone runs without them."""
    script = copy_doctor(tmp_path / "scratch" / "msgpu_verify", *doctor.PROBE_FILES)
    document = _doctor_file(tmp_path, tree, script, stub_cuda, "--gpu-probe")
    assert document["gpu_probe"]["verdict"] == "KERNEL_FAILED"
    assert by_id(document)["gpu-kernel-failed"]["severity"] == "error"
    document = _doctor_file(tmp_path, tree, script / "__main__.py", stub_cuda, "--no-gpu-probe")
    assert document["gpu_probe"]["reason"] == "--no-gpu-probe" and "gpu-kernel-failed" not in by_id(document)
    (script.parent / "judge.py").unlink()
    document = _doctor_file(tmp_path, tree, script, stub_cuda, "--gpu-probe")
    assert document["gpu_probe"]["state"] == "skipped" and "judge.py" in document["gpu_probe"]["reason"]
    assert "gpu-kernel-failed" not in by_id(document)
    alone = copy_doctor(tmp_path / "alone")
    alone = alone.rename(alone.with_name("msgpu-doctor"))  # its folder may have any name
    document = _doctor_file(tmp_path, tree, alone, stub_cuda, "--gpu-probe")
    assert document["gpu_probe"]["state"] == "skipped" and "(it runs alone)" in document["gpu_probe"]["reason"]
    assert "gpu-kernel-failed" not in by_id(document) and "nouveau-not-blacklisted" not in by_id(document)


# ------------------------------------------------------------------------------------ the stack's GPU code
# rule compute: compute.py's rule (through judge.check_gpu_code) on the compute capability the GPU probe reads,
# against expect["gpu_code"] (stack_resolved.gpu_code, which roles/verify tasks/doctor.yml passes).

from tests.unit.conftest import GPU_CODE, H100, K80, RTX4090  # noqa: E402


def test_a_gpu_the_stack_cannot_run_on_is_an_error(tree: Tree, gpus) -> None:
    tree.expect["gpu_code"] = GPU_CODE
    document = gpus(tree, STUB_CUDA_DEVICES=",".join([H100] * 2))
    assert document["ok"] is False and "compute" in document["rules"]
    finding = by_id(document)["gpu-unsupported"]
    assert finding["severity"] == "error"
    assert finding["title"] == (
        "Stack ms1.5-cuda11.1 cannot run on 2 GPU(s) of this host: NVIDIA H100 80GB HBM3 (compute capability 9.0)"
    )
    assert finding["evidence"][0].startswith(
        "gpu1: stack ms1.5-cuda11.1 cannot run on GPU NVIDIA H100 80GB HBM3 (CC 9.0) at device 0 00000000:01:00.0, "
        "device 1 00000000:02:00.0: cuDNN 8.0.5 has code up to CC 8.6 and is not hardware forward compatible"
    )
    assert finding["evidence"][1] == (
        "compute capability from the GPU probe (gpu_probe.py: cuDeviceGetAttribute): NVIDIA H100 80GB HBM3 at "
        "device 0 00000000:01:00.0, device 1 00000000:02:00.0: 9.0"
    )
    assert finding["evidence"][2].startswith("the stack's libraries support: MindSpore 1.5.1 (libmindspore_gpu.so: ")
    assert finding["fix"].startswith("stack_name: auto picks a catalog stack that runs here")
    # MindSpore's PTX-only library on the same GPUs: a warning beside it.
    assert by_id(document)["gpu-jit-only"]["severity"] == "warning"


def test_jit_only_and_outside_the_matrix_are_warnings(tree: Tree, gpus) -> None:
    tree.expect["gpu_code"] = GPU_CODE
    found = problems(gpus(tree, STUB_CUDA_DEVICES=RTX3090))
    assert set(found) == {"gpu-jit-only"}
    assert "MindSpore 1.5.1 " in found["gpu-jit-only"]["evidence"][0]
    assert found["gpu-jit-only"]["evidence"][0].endswith("(slow first start, then cached).")
    found = problems(gpus(tree, STUB_CUDA_DEVICES=RTX4090))
    assert set(found) == {"gpu-jit-only", "gpu-outside-matrix"}
    assert "cuDNN 8.0.5 is built up to CC 8.6: runs on 8.9 untuned" in found["gpu-outside-matrix"]["evidence"][0]
    # A component the catalog has no record of: a warning that says so.
    tree.expect["gpu_code"] = [{"name": "TensorRT", "version": "7.2.2", "code": {}}]
    assert set(problems(gpus(tree, STUB_CUDA_DEVICES=RTX3090))) == {"gpu-code-unknown"}


def test_one_gpu_that_the_stacks_nccl_cannot_run_on_is_a_single_gpu_warning(tree: Tree, gpus) -> None:
    nccl = {
        "name": "NCCL",
        "version": "2.14.3",
        "code": {"libraries": {"nvidia/nccl/lib/libnccl.so.2": {"sass": ["7.0", "8.0"], "ptx": []}}},
        "multi_gpu_only": True,
    }
    tree.expect["gpu_code"] = [nccl]
    found = problems(gpus(tree, STUB_CUDA_DEVICES=H100))
    assert set(found) == {"gpu-single-only"}
    finding = found["gpu-single-only"]
    assert finding["severity"] == "warning"
    assert "multi-GPU and multi-host (mpirun) training cannot run here" in finding["title"]
    assert finding["evidence"][0].startswith("gpu1: GPU NVIDIA H100 80GB HBM3 (CC 9.0) at device 0")
    assert "NCCL 2.14.3 has in libnccl.so.2 no code that runs on CC 9.0" in finding["evidence"][0]
    # Two of them: an error, as the preflight refuses it.
    found = by_id(gpus(tree, STUB_CUDA_DEVICES=",".join([H100] * 2)))
    assert found["gpu-unsupported"]["severity"] == "error" and "gpu-single-only" not in found
    assert "multi-GPU training on this host's 2 GPUs loads it" in found["gpu-unsupported"]["evidence"][0]


def test_no_gpu_code_no_probe_or_no_gpu_on_purpose_is_quiet(tree: Tree, gpus) -> None:
    assert "gpu-unsupported" not in by_id(gpus(tree, STUB_CUDA_DEVICES=H100))  # expect has no gpu_code
    tree.expect["gpu_code"] = GPU_CODE
    assert "gpu-unsupported" not in by_id(tree.diagnose())  # the probe did not run (substituted root)
    tree.expect["no_gpu"] = True
    assert "gpu-unsupported" not in by_id(gpus(tree, STUB_CUDA_DEVICES=H100))


def test_a_gpu_below_the_probes_ptx_is_not_blamed_on_the_driver(tree: Tree, gpus) -> None:
    document = gpus(tree, STUB_CUDA_DEVICES=f"{K80},{RTX3090}", STUB_CUDA_KERNEL="jit_fail")
    found = by_id(document)
    below = found["gpu-below-probe"]
    assert below["severity"] == "warning"
    assert below["title"] == (
        "The GPU probe cannot check 1 of 2 GPU(s): compute capability 3.7 is below what the probe (PTX 5.0) can run"
    )
    assert below["evidence"][0] == (
        "GPU 0 (Tesla K80): cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218): compute capability 3.7 is below "
        "what the probe (PTX 5.0) can run"
    )
    assert "blames neither the driver nor the GPU" in below["fix"]
    # The RTX 3090 failing the same way is still the driver's or the GPU's fault, and only it is counted there.
    assert found["gpu-kernel-failed"]["title"].startswith("A tiny CUDA kernel fails on 1 of 2 GPU(s)")
    assert "Tesla K80" not in "\n".join(found["gpu-kernel-failed"]["evidence"])
    found = by_id(gpus(tree, STUB_CUDA_DEVICES=K80, STUB_CUDA_KERNEL="jit_fail"))
    assert "gpu-below-probe" in found and "gpu-kernel-failed" not in found


def test_doctor_folder_as_a_file_runs_the_gpu_code_rule_from_compute_py_beside_it(
    tree: Tree, tmp_path: Path, stub_cuda
) -> None:
    assert "compute.py" in doctor.PROBE_FILES
    script = copy_doctor(tmp_path / "scratch" / "msgpu_verify", *doctor.PROBE_FILES)
    folder = script.parent
    tree.expect["gpu_code"] = GPU_CODE
    args = [
        sys.executable,
        str(script),
        "--expect-json",
        json.dumps(tree.expect),
        "--root",
        str(tree.root),
    ]
    args += ["--proc", str(tree.proc), "--sys", str(tree.sys), "--json", "-", "--libcuda", stub_cuda["cuda"]]
    args += ["--libnvml", stub_cuda["nvml"], "--gpu-probe"]
    env = {k: v for k, v in os.environ.items() if k not in STUB_VARIABLES and k != "PYTHONPATH"}
    env["STUB_CUDA_DEVICES"] = H100
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path), check=False)
    assert done.returncode == 1, done.stderr
    assert by_id(json.loads(done.stdout))["gpu-unsupported"]["severity"] == "error"
    (folder / "compute.py").unlink()
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path), check=False)
    document = json.loads(done.stdout)
    assert document["gpu_probe"]["state"] == "skipped" and "compute.py" in document["gpu_probe"]["reason"]
    assert "gpu-unsupported" not in by_id(document)


# -------------------------------------------------------------------------------------------- which NCCL loads
# Real layouts (read from the wheels in .cache/gpu_code): 1.5.1 has lib/libgpu_collective.so (DT_NEEDED
# libnccl.so.2, no RPATH) and no NCCL of its own; 1.10.0 lib/libnvidia_collective.so and lib/libgpu_collective.so
# (RPATH $ORIGIN) beside its own lib/libnccl.so.2 ("NCCL version 2.7.6+cuda11.1"); 2.0.0 one
# lib/plugin/gpu<CUDA>/{libnvidia_collective.so (RPATH $ORIGIN), libnccl.so.2} per CUDA it was built for.

MS_LIB = SITE + "/mindspore/lib"


def nccl_blob(version: str) -> bytes:
    """A stand-in libnccl.so.2 as the wheels bundle it: no version in the file name, NCCL's banner inside."""
    return b"\x7fELF" + b"\0" * 4096 + f"NCCL version {version}+cuda11.1\0".encode() + b"\0" * 64


def collective(tree: Tree, folder: str, bundled: Optional[str], **dynamic: str) -> None:
    write(
        tree.root / folder.lstrip("/") / "libnvidia_collective.so", data=elf(["libnccl.so.2", "libc.so.6"], **dynamic)
    )
    if bundled:
        write(tree.root / folder.lstrip("/") / "libnccl.so.2", data=nccl_blob(bundled))


def test_a_bundled_nccl_of_another_release_shadows_the_stacks(tree: Tree) -> None:
    collective(tree, MS_LIB, "2.7.6", rpath="$ORIGIN")
    write(
        tree.root / MS_LIB.lstrip("/") / "libgpu_collective.so", data=elf(["libmpi.so.40", "libnccl.so.2"], "$ORIGIN")
    )
    finding = by_id(tree.diagnose())["nccl-shadowed"]
    assert finding["severity"] == "warning"
    assert finding["title"] == (
        "MindSpore loads the NCCL its wheel bundles (2.7.6), not the stack's (2.8.4): libgpu_collective.so finds it "
        "first through its DT_RPATH"
    )
    assert finding["evidence"] == [
        f"{MS_LIB}/libgpu_collective.so links libnccl.so.2 (DT_NEEDED)",
        f"{MS_LIB}/libnvidia_collective.so links it too, beside it (the same search)",
        f"loads first: {MS_LIB}/libnccl.so.2 (NCCL 2.7.6; DT_RPATH of {MS_LIB}/libgpu_collective.so)",
        f"then: {CUDA_HOME}/lib64/libnccl.so.2 -> {CUDA_HOME}/lib64/libnccl.so.2.8.4 (NCCL 2.8.4; DT_RPATH of "
        f"{SITE}/mindspore/_c_expression.cpython-38-x86_64-linux-gnu.so "
        "(in the chain that loads libgpu_collective.so))",
        f"the stack's NCCL: {CUDA_HOME}/lib64/libnccl.so.2 -> {CUDA_HOME}/lib64/libnccl.so.2.8.4 (NCCL 2.8.4; "
        "LD_LIBRARY_PATH)",
        "catalog: nccl 2.8.4 (tarball)",
    ]
    assert f"LD_PRELOAD={CUDA_HOME}/lib64/libnccl.so.2" in finding["fix"]
    # The same release bundled: still said, as a note.
    collective(tree, MS_LIB, "2.8.4", rpath="$ORIGIN")
    assert by_id(tree.diagnose())["nccl-shadowed"]["severity"] == "info"


def test_a_collective_library_without_rpath_loads_the_stacks_nccl(tree: Tree) -> None:
    write(tree.root / MS_LIB.lstrip("/") / "libgpu_collective.so", data=elf(["libmpi.so.40", "libnccl.so.2"]))
    document = tree.diagnose()
    assert problems(document) == {}
    finding = by_id(document)["nccl-loaded"]
    assert finding["severity"] == "info" and finding["fix"] == "Nothing to do."
    assert finding["title"] == (
        f"MindSpore's libgpu_collective.so loads {CUDA_HOME}/lib64/libnccl.so.2 (NCCL 2.8.4): the stack's NCCL"
    )
    # The catalog wants another release than the one installed: a warning.
    tree.expect["nccl"] = {"version": "2.14.3", "method": "wheel"}
    finding = by_id(tree.diagnose())["nccl-loaded"]
    assert finding["severity"] == "warning" and "release 2.8.4, not the expected 2.14.3" in finding["title"]
    assert "./toolkit provision" in finding["fix"]
    # A site that says what its NCCL reports (nccl_expected_version, NCCL_VERSION_CODE, as the cuda_library role
    # checks it: the test bed's tarball fixtures carry NCCL 2.14.3 under the 2.8.4 name) is compared with that.
    tree.expect["nccl"] = {"version": "2.14.3", "method": "tarball", "expected_version": "2804"}
    finding = by_id(tree.diagnose())["nccl-loaded"]
    assert finding["severity"] == "info" and finding["fix"] == "Nothing to do."
    assert "catalog: nccl 2.14.3 (tarball); nccl_expected_version 2804: release 2.8.4" in finding["evidence"]
    tree.expect["nccl"]["expected_version"] = "21403"
    assert by_id(tree.diagnose())["nccl-loaded"]["severity"] == "warning"


def test_a_runpath_lets_ld_library_path_win(tree: Tree) -> None:
    collective(tree, MS_LIB, "2.7.6", runpath="$ORIGIN")
    finding = by_id(tree.diagnose())["nccl-loaded"]
    assert finding["severity"] == "info"
    assert finding["evidence"][1] == (
        f"loads first: {CUDA_HOME}/lib64/libnccl.so.2 -> {CUDA_HOME}/lib64/libnccl.so.2.8.4 (NCCL 2.8.4; "
        "LD_LIBRARY_PATH)"
    )
    assert finding["evidence"][2] == (
        f"then: {MS_LIB}/libnccl.so.2 (NCCL 2.7.6; DT_RUNPATH of {MS_LIB}/libnvidia_collective.so)"
    )


def test_the_2x_plugin_for_the_stacks_cuda_is_the_one_that_counts(tree: Tree) -> None:
    for cuda, nccl in (("10.1", "2.4.8"), ("11.1", "2.7.6"), ("11.6", "2.7.8")):
        collective(tree, f"{MS_LIB}/plugin/gpu{cuda}", nccl, rpath="$ORIGIN")
    finding = by_id(tree.diagnose())["nccl-shadowed"]
    assert finding["title"].startswith("MindSpore loads the NCCL its wheel bundles (2.7.6), not the stack's (2.8.4)")
    assert finding["evidence"][0] == f"{MS_LIB}/plugin/gpu11.1/libnvidia_collective.so links libnccl.so.2 (DT_NEEDED)"
    assert finding["evidence"][1] == (
        f"not loaded with the stack's CUDA 11.1: {MS_LIB}/plugin/gpu10.1/libnvidia_collective.so, "
        f"{MS_LIB}/plugin/gpu11.6/libnvidia_collective.so "
        "(the wheel loads the GPU plugin folder for the installed CUDA)"
    )
    tree.expect["cuda"]["version"] = "11.4"  # no gpu11.4: the newest older one
    assert by_id(tree.diagnose())["nccl-shadowed"]["evidence"][0].startswith(f"{MS_LIB}/plugin/gpu11.1/")
    tree.expect["cuda"]["version"] = "11.6"
    assert "(2.7.8)" in by_id(tree.diagnose())["nccl-shadowed"]["title"]


def test_only_the_bundled_nccl_is_found(tree: Tree) -> None:
    (tree.root / CUDA_HOME.lstrip("/") / "lib64/libnccl.so.2").unlink()
    collective(tree, MS_LIB, "2.7.6", rpath="$ORIGIN")
    finding = by_id(tree.diagnose())["nccl-loaded"]
    assert finding["severity"] == "warning"
    assert finding["title"] == (
        f"MindSpore's libnvidia_collective.so loads {MS_LIB}/libnccl.so.2 (NCCL 2.7.6): the wheel's own copy; the "
        "stack's NCCL is not where the linker looks"
    )
    assert (
        "the stack's NCCL 2.8.4: no libnccl.so.2 on LD_LIBRARY_PATH, in ld.so.cache or the default folders"
        in finding["evidence"]
    )


def test_nccl_versions_and_the_elf_reader_on_odd_files(tmp_path: Path) -> None:
    library(tmp_path, "/lib", "libnccl.so.2", "libnccl.so.2.14.3")
    assert doctor.nccl_version(tmp_path / "lib/libnccl.so.2") == "2.14.3"  # from the real file's name
    blob = write(tmp_path / "b/libnccl.so.2", data=nccl_blob("2.7.6"))
    assert doctor.nccl_version(blob) == "2.7.6"  # from NCCL's banner inside
    assert doctor.nccl_version(write(tmp_path / "c/libnccl.so.2", data=b"")) is None
    assert doctor.nccl_version(tmp_path / "missing") is None
    for data in (b"\x7fELF", b"\x7fELF" + b"\x02\x01" + b"\0" * 58, elf(["libnccl.so.2"])[:100], b"not an elf"):
        assert doctor.elf_dynamic(write(tmp_path / "odd.so", data=data)) == {}
    path = write(tmp_path / "x.so", data=elf(["libnccl.so.2"], rpath="$ORIGIN", runpath="/opt/r"))
    assert doctor.elf_dynamic(path) == {"needed": ["libnccl.so.2"], "rpath": ["$ORIGIN"], "runpath": ["/opt/r"]}
