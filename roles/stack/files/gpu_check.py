"""List the NVIDIA GPUs and NVSwitches on the PCI bus from sysfs, as JSON (the `stack` role's GPU preflight).

Runs on the host with the distro's python3 (3.8, standard library only). It reads
<sysfs root>/bus/pci/devices/*/{vendor,device,class}, as lspci does, and keeps vendor 0x10de with
class 0x0300xx (VGA) or 0x0302xx (3D controller, the data-centre GPUs) as GPUs and 0x0680xx
(bridge, "other") as NVSwitches; NVIDIA's audio (0x0403) and USB functions are not GPUs.

    python3 gpu_check.py [--sysfs-root /sys]
    {"gpus": [{"slot": "0000:01:00.0", "id": "10de:2204"}], "nvswitches": []}

NVSwitch hosts need NVIDIA's fabric manager at exactly the driver's version (it refuses to start
otherwise). `--fabricmanager PACKAGE=DRIVER_PACKAGE` (repeatable) adds what apt on this host says of
each pair, from `apt-cache policy` (read-only): the driver package's version (installed, else apt's
candidate), the fabric manager's versions apt has, and the one whose upstream version (no epoch, no
Debian revision) equals the driver's, or "" when none does. `--apt PACKAGE` adds apt's view of more
packages (is NVIDIA's CUDA repository indexed here?).

    python3 gpu_check.py --fabricmanager nvidia-fabricmanager-535=libnvidia-compute-535
    {..., "fabricmanager": {"nvidia-fabricmanager-535": {"driver_package": "libnvidia-compute-535",
     "driver": "535.230.02-0ubuntu0.20.04.1", "driver_installed": false, "driver_upstream": "535.230.02",
     "versions": ["535.247.01-0ubuntu0.20.04.1"], "upstreams": ["535.247.01"], "match": ""}}, "apt": {}}
"""

import argparse
import json
import os
import re
import subprocess

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"
# A version line of `apt-cache policy`'s version table: "     535.247.01-0ubuntu0.20.04.1 500", the
# installed one marked " *** "; the source lines below each are indented further.
POLICY_VERSION = re.compile(r"^ (?:\*\*\*| {3}) (\S+) -?\d+$")


def read(path):
    try:
        with open(path) as handle:
            return handle.read().strip().lower()
    except OSError:
        return ""


def scan(sysfs_root="/sys"):
    found = {"gpus": [], "nvswitches": []}
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    for slot in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        device = os.path.join(base, slot)
        if read(os.path.join(device, "vendor")) != NVIDIA:
            continue
        klass, devid = read(os.path.join(device, "class")), read(os.path.join(device, "device"))
        if not re.match(r"^0x[0-9a-f]{4}$", devid):
            continue
        entry = {"slot": slot, "id": "10de:" + devid[2:]}
        if klass[:6] in GPU_CLASSES:
            found["gpus"].append(entry)
        elif klass[:6] == NVSWITCH_CLASS:
            found["nvswitches"].append(entry)
    return found


def upstream(version):
    """The upstream part of a Debian version: '1:535.230.02-0ubuntu0.20.04.1' -> '535.230.02'."""
    version = re.sub(r"^[0-9]+:", "", str(version or "").strip())
    return version.rsplit("-", 1)[0] if "-" in version else version


def parse_policy(text):
    """`apt-cache policy PACKAGE` (LC_ALL=C) -> installed, candidate (both "" for "(none)" or a package
    apt does not know) and every version in its table, in apt's order (newest first)."""
    info = {"installed": "", "candidate": "", "versions": []}
    for line in (text or "").splitlines():
        stripped = line.strip()
        for field in ("installed", "candidate"):
            if stripped.lower().startswith(field + ":"):
                value = stripped.split(":", 1)[1].strip()
                info[field] = "" if value in ("(none)", "") else value
        found = POLICY_VERSION.match(line)
        if found and found.group(1) not in info["versions"]:
            info["versions"].append(found.group(1))
    return info


def fabricmanager(fm_policy, driver_policy, driver_package=""):
    """The fabric manager version to install with the driver: the first version apt has of it (the
    installed one first) whose upstream version equals the driver package's (installed, else apt's
    candidate); "" when none does or apt knows no driver version."""
    driver = driver_policy["installed"] or driver_policy["candidate"]
    wanted = upstream(driver)
    ordered = ([fm_policy["installed"]] if fm_policy["installed"] else []) + fm_policy["versions"]
    match = next((v for v in ordered if driver and upstream(v) == wanted), "")
    return {
        "driver_package": driver_package,
        "driver": driver,
        "driver_installed": bool(driver_policy["installed"]),
        "driver_upstream": wanted,
        "versions": fm_policy["versions"],
        "upstreams": [upstream(v) for v in fm_policy["versions"]],
        "match": match,
    }


def apt_policy(package):
    """apt's view of one package (read-only; no package lists refreshed here)."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        result = subprocess.run(
            ["apt-cache", "policy", package],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            check=False,
        )
    except OSError:  # no apt on this host
        return parse_policy("")
    return parse_policy(result.stdout)


def main(argv=None):
    parser = argparse.ArgumentParser(description="NVIDIA GPUs and NVSwitches on the PCI bus, as JSON")
    parser.add_argument("--sysfs-root", default="/sys", help="the sysfs mount (default /sys; tests pass a tree)")
    parser.add_argument(
        "--fabricmanager",
        action="append",
        default=[],
        metavar="PACKAGE=DRIVER_PACKAGE",
        help="a fabric manager package and the driver package whose version it must equal (apt-cache policy)",
    )
    parser.add_argument("--apt", action="append", default=[], metavar="PACKAGE", help="apt's view of a package")
    args = parser.parse_args(argv)
    found = scan(args.sysfs_root)
    if args.fabricmanager or args.apt:
        found["fabricmanager"] = {}
        for pair in args.fabricmanager:
            package, _, driver_package = pair.partition("=")
            found["fabricmanager"][package] = fabricmanager(
                apt_policy(package), apt_policy(driver_package), driver_package
            )
        found["apt"] = {package: apt_policy(package) for package in args.apt}
    return found


if __name__ == "__main__":
    print(json.dumps(main()))
