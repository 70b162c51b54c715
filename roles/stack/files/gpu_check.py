"""List the NVIDIA GPUs and NVSwitches on the PCI bus from sysfs, as JSON (the `stack` role's GPU preflight).

Runs on the host with the distro's python3 (3.8, standard library only). It reads
<sysfs root>/bus/pci/devices/*/{vendor,device,class}, as lspci does, and keeps vendor 0x10de with
class 0x0300xx (VGA) or 0x0302xx (3D controller, the data-centre GPUs) as GPUs and 0x0680xx
(bridge, "other") as NVSwitches; NVIDIA's audio (0x0403) and USB functions are not GPUs.

    python3 gpu_check.py [--sysfs-root /sys]
    {"gpus": [{"slot": "0000:01:00.0", "id": "10de:2204"}], "nvswitches": []}
"""

import argparse
import json
import os
import re

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"


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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="NVIDIA GPUs and NVSwitches on the PCI bus, as JSON")
    parser.add_argument("--sysfs-root", default="/sys", help="the sysfs mount (default /sys; tests pass a tree)")
    print(json.dumps(scan(parser.parse_args().sysfs_root)))
