"""What the `stack` role's preflight reads of a host (roles/stack/tasks/host.yml), in one call, as JSON.

Runs on the host with the distro's python3 (3.8, standard library only), read-only: the preflight passes
this file's text as an argument (`python3 -c TEXT ARGS`, quoted), one host call for all of it.

The NVIDIA GPUs and NVSwitches on the PCI bus, from sysfs: it reads
<sysfs root>/bus/pci/devices/*/{vendor,device,class}, as lspci does, and keeps vendor 0x10de with
class 0x0300xx (VGA) or 0x0302xx (3D controller, the data-centre GPUs) as GPUs and 0x0680xx
(bridge, "other") as NVSwitches; NVIDIA's audio (0x0403) and USB functions are not GPUs.

    python3 host_check.py [--sysfs-root /sys]
    {"gpus": [{"slot": "0000:01:00.0", "id": "10de:2204"}], "nvswitches": []}

`--python PATH` adds the interpreter's wheel tag ("python": {"tag": "cp38", "error": ""}; tag "" and the
reason when it does not run); `--prefix PATH` the space free there ("free_kb", as `df -Pk` says it; null when
the path does not exist); `--parts JSON` (a list of {"path", "packages"}, the catalog's parts of the stack)
whether each is installed ("parts": [true, false, ...]: the path under the prefix exists, or every package is
installed); `--secure-boot` the Secure Boot state as one line of text ("secure_boot": mokutil's first line
when the sysfs root is /sys and mokutil is there, else the EFI variable under the sysfs root, else legacy boot);
`--machine-id` systemd's machine id ("machine_id": /etc/machine-id, else /var/lib/dbus/machine-id, else ""), which
the preflight compares with the controller's (a run whose target is the machine Ansible runs on never reboots it).

NVSwitch hosts need NVIDIA's fabric manager at exactly the driver's version (it refuses to start
otherwise). `--fabricmanager PACKAGE=DRIVER_PACKAGE` (repeatable) adds what apt on this host says of
each pair, from `apt-cache policy` (read-only): the driver package's version (installed, else apt's
candidate), the fabric manager's versions apt has, and the one whose upstream version (no epoch, no
Debian revision) equals the driver's, or "" when none does. `--apt PACKAGE` adds apt's view of more
packages (is NVIDIA's CUDA repository indexed here?).

    python3 host_check.py --fabricmanager nvidia-fabricmanager-535=libnvidia-compute-535
    {..., "fabricmanager": {"nvidia-fabricmanager-535": {"driver_package": "libnvidia-compute-535",
     "driver": "535.230.02-0ubuntu0.20.04.1", "driver_installed": false, "driver_upstream": "535.230.02",
     "versions": ["535.247.01-0ubuntu0.20.04.1"], "upstreams": ["535.247.01"], "match": ""}}, "apt": {}}
"""

import argparse
import glob
import json
import os
import re
import shutil
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


def python_tag(python):
    """{"tag": the interpreter's wheel tag ('cp38'), "error": ''}, or tag '' and why it does not run."""
    try:
        result = subprocess.run(
            [python, "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        return {"tag": "", "error": str(exc)}
    if result.returncode != 0:
        return {"tag": "", "error": (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]}
    return {"tag": result.stdout.strip(), "error": ""}


def free_kb(path):
    """The space free for unprivileged use under `path` in KiB, as `df -Pk` says it; None when it does not exist."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize // 1024


def installed_packages(packages):
    """How many of `packages` dpkg has installed."""
    if not packages:
        return 0
    try:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f=${db:Status-Status}\n", *packages],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            check=False,
        )
    except OSError:  # no dpkg on this host
        return 0
    return result.stdout.split().count("installed")


def parts_installed(prefix, parts):
    """For each part ({"path", "packages"}): its path under `prefix` exists, or (no path) every package is installed."""
    found = []
    for part in parts:
        path, packages = part.get("path") or "", part.get("packages") or []
        if path:
            found.append(os.path.exists(os.path.join(prefix, path)))
        else:
            found.append(bool(packages) and installed_packages(packages) == len(packages))
    return found


def secure_boot(sysfs_root="/sys"):
    """The Secure Boot state as one line: mokutil's, or read from the EFI variable."""
    if sysfs_root == "/sys" and shutil.which("mokutil"):
        # "EFI variables are not supported" (legacy boot) exits non-zero; the text says it all.
        result = subprocess.run(
            ["mokutil", "--sb-state"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
        )
        return (result.stdout.splitlines() or [""])[0]
    if os.path.isdir(os.path.join(sysfs_root, "firmware", "efi")):
        found = sorted(glob.glob(os.path.join(sysfs_root, "firmware", "efi", "efivars", "SecureBoot-*")))
        try:
            with open(found[0], "rb") as handle:
                value = handle.read()  # 4 bytes of attributes, then the value
        except (IndexError, OSError):
            value = b""
        return "SecureBoot enabled" if value[-1:] == b"\x01" else "SecureBoot disabled"
    return "legacy BIOS boot (no EFI): Secure Boot not applicable"


def machine_id():
    """systemd's machine id (/etc/machine-id, else D-Bus's copy): the same machine, however it is reached."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as handle:
                value = handle.read().strip()
        except OSError:
            continue
        if value:
            return value
    return ""


def main(argv=None):
    parser = argparse.ArgumentParser(description="What the stack role's preflight reads of a host, as JSON")
    parser.add_argument("--sysfs-root", default="/sys", help="the sysfs mount (default /sys; tests pass a tree)")
    parser.add_argument(
        "--fabricmanager",
        action="append",
        default=[],
        metavar="PACKAGE=DRIVER_PACKAGE",
        help="a fabric manager package and the driver package whose version it must equal (apt-cache policy)",
    )
    parser.add_argument("--apt", action="append", default=[], metavar="PACKAGE", help="apt's view of a package")
    parser.add_argument("--python", help="an interpreter whose wheel tag to read")
    parser.add_argument("--prefix", help="the install prefix: the space free there, and where --parts are")
    parser.add_argument("--parts", help='JSON list of {"path", "packages"}: which parts of the stack are installed')
    parser.add_argument("--secure-boot", action="store_true", help="read the Secure Boot state")
    parser.add_argument("--machine-id", action="store_true", help="read systemd's machine id (is it the controller?)")
    args = parser.parse_args(argv)
    found = scan(args.sysfs_root)
    if args.machine_id:
        found["machine_id"] = machine_id()
    if args.python:
        found["python"] = python_tag(args.python)
    if args.prefix:
        found["free_kb"] = free_kb(args.prefix)
        found["parts"] = parts_installed(args.prefix, json.loads(args.parts or "[]"))
    if args.secure_boot:
        found["secure_boot"] = secure_boot(args.sysfs_root)
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
