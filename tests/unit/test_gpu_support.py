"""The GPU preflight: host_check.py on substituted sysfs trees, then the `stack_gpu_support` filter with the
real catalog/gpu_ids.yml (generated from Ubuntu focal's nvidia-driver-<branch> packages)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, load_module

GPU_CHECK = ROOT / "roles" / "stack" / "files" / "host_check.py"
DATA = ROOT / "catalog" / "gpu_ids.yml"

# (slot, vendor, device, class) as sysfs writes them.
HOST_BRIDGE = ("0000:00:00.0", "0x8086", "0x3e10", "0x060000")
BMC_VGA = ("0000:05:00.0", "0x1a03", "0x2000", "0x030000")  # ASPEED: a VGA controller, not NVIDIA's


def gpu(bus: int, device: str, klass: str = "0x030000") -> list[tuple[str, str, str, str]]:
    """An NVIDIA card: function 0 is the GPU, function 1 (consumer cards) its HDMI audio (0x0403)."""
    functions = [(f"0000:{bus:02x}:00.0", "0x10de", device, klass)]
    if klass == "0x030000":
        functions.append((f"0000:{bus:02x}:00.1", "0x10de", "0x1aef", "0x040300"))
    return functions


MACHINES = {
    "rtx3090x4": [HOST_BRIDGE, BMC_VGA, *(f for bus in (0x01, 0x21, 0x41, 0x61) for f in gpu(bus, "0x2204"))],
    "rtx4090": [HOST_BRIDGE, *gpu(0x01, "0x2684")],
    "h100": [HOST_BRIDGE, BMC_VGA, *gpu(0x19, "0x2330", "0x030200")],
    "a100": [HOST_BRIDGE, *gpu(0x07, "0x20B0", "0x030200")],  # sysfs writes lowercase; be lenient anyway
    "mixed": [HOST_BRIDGE, *gpu(0x01, "0x2204"), *gpu(0x41, "0x2684")],
    "hgx": [
        HOST_BRIDGE,
        *(f for bus in range(0x10, 0x18) for f in gpu(bus, "0x2330", "0x030200")),
        *((f"0000:{bus:02x}:00.0", "0x10de", "0x22a3", "0x068000") for bus in range(0x20, 0x24)),
    ],
    "none": [HOST_BRIDGE, BMC_VGA],
}


def sysfs(root, machine: str):
    """A sysfs tree for the machine under root (built once: tests scan the same machine again)."""
    devices = root / "sys" / "bus" / "pci" / "devices"
    if devices.is_dir():
        return root / "sys"
    devices.mkdir(parents=True)
    for slot, vendor, device, klass in MACHINES[machine]:
        folder = devices / slot
        folder.mkdir()
        for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
            (folder / name).write_text(value + "\n")
    return root / "sys"


def scan(tmp_path, machine: str) -> dict:
    """host_check.py's GPU read, run as a python3 subprocess."""
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--sysfs-root", str(sysfs(tmp_path, machine))],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def gpu_ids() -> dict:
    return yaml.safe_load(DATA.read_text())


@pytest.fixture(scope="module")
def support():
    return load_module("gpu_support", ROOT / "roles" / "stack" / "filter_plugins" / "gpu_support.py").gpu_support


@pytest.fixture
def check(tmp_path, support, gpu_ids, catalog):
    """Scan a machine, then run the filter: by default the real catalog's branches and the seed's CUDA 11.1."""

    def run(machine: str, branch: str, branches: dict | None = None, minimum: str = "450.80.02", **kwargs):
        found = scan(tmp_path / machine, machine)
        return support(gpu_ids, branches or catalog["driver"], minimum, branch, found, host="gpu01", **kwargs)

    return run


def branches_of(gpu_ids: dict, *names: str) -> dict:
    """Catalog driver entries for branches the catalog may gain (another part of issue 15), versions from the data."""
    return {b: {"version": gpu_ids["branches"][b]["driver_version"]} for b in names}


# --- host_check.py ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "ids"),
    [
        ("rtx3090x4", ["10de:2204"] * 4),
        ("rtx4090", ["10de:2684"]),
        ("h100", ["10de:2330"]),
        ("a100", ["10de:20b0"]),
        ("mixed", ["10de:2204", "10de:2684"]),
        ("hgx", ["10de:2330"] * 8),
        ("none", []),
    ],
)
def test_host_check_keeps_nvidia_vga_and_3d_functions_only(tmp_path, machine, ids):
    found = scan(tmp_path, machine)
    assert [g["id"] for g in found["gpus"]] == ids
    assert all(re.match(r"^0000:[0-9a-f]{2}:00\.0$", g["slot"]) for g in found["gpus"])


def test_host_check_reports_nvswitches_apart(tmp_path):
    found = scan(tmp_path, "hgx")
    assert [s["id"] for s in found["nvswitches"]] == ["10de:22a3"] * 4
    assert {s["slot"] for s in found["nvswitches"]}.isdisjoint({g["slot"] for g in found["gpus"]})
    assert scan(tmp_path / "other", "rtx3090x4")["nvswitches"] == []


def test_host_check_without_a_pci_bus(tmp_path):
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--sysfs-root", str(tmp_path / "nothing")], capture_output=True, text=True
    )
    assert (result.returncode, json.loads(result.stdout)) == (0, {"gpus": [], "nvswitches": []})


# --- the data: generated, never typed ---------------------------------------------------------


def test_gpu_ids_is_the_generated_file(gpu_ids):
    text = DATA.read_text()
    assert text.startswith("---\n# GENERATED by `python catalog/tools/gpu_ids.py`")
    assert "do not edit by hand" in text.splitlines()[1]
    assert gpu_ids["gpu_ids_format"] == 1
    for branch, record in gpu_ids["branches"].items():
        assert record["package"] == f"nvidia-driver-{branch}"
        assert re.match(r"^\d+\.\d+(\.\d+)?-\S+$", record["version"]), record
        assert record["source"] == "Ubuntu focal archive (focal-updates/focal-security)"
        if "transitional_to" in record:
            assert "ids" not in record
            assert "ids" in gpu_ids["branches"][record["transitional_to"]]
            continue
        assert record["version"].startswith(record["driver_version"] + "-")
        assert record["driver_version"].split(".")[0] == branch
        assert record["ids"] == sorted(set(record["ids"])) and record["count"] == len(record["ids"])
        assert all(re.match(r"^[0-9a-f]{4}$", i) for i in record["ids"]), branch
    driven = {i for r in gpu_ids["branches"].values() for i in r.get("ids", [])}
    assert set(gpu_ids["names"]) <= driven
    assert all(re.match(r"^[0-9a-f]{4}$", i) for i in gpu_ids["names"])


def test_gpu_ids_match_what_the_packages_say(gpu_ids):
    branches = gpu_ids["branches"]
    assert {"2204", "20b0"} <= set(branches["470"]["ids"])  # RTX 3090, A100 40GB
    assert {"2684", "2330", "2331"}.isdisjoint(branches["470"]["ids"])  # RTX 4090, H100 SXM and PCIe
    assert {"2204", "20b0", "2684", "2330", "2331"} <= set(branches["535"]["ids"]) & set(branches["570"]["ids"])
    assert branches["510"]["transitional_to"] == "535"
    assert gpu_ids["names"]["2204"] == "NVIDIA GeForce RTX 3090"
    assert gpu_ids["names"]["2684"] == "NVIDIA GeForce RTX 4090"


def test_every_catalog_branch_has_data(gpu_ids, catalog):
    assert set(catalog["driver"]) <= set(gpu_ids["branches"])


# --- a branch given by name -------------------------------------------------------------------


@pytest.mark.parametrize("machine", ["rtx3090x4", "a100"])
def test_470_drives_ampere(check, machine):
    result = check(machine, "470")
    assert (result["branch"], result["errors"]) == ("470", [])
    assert result["reason"].startswith('stack_driver_branch "470" drives every GPU of gpu01')


def test_470_refuses_an_rtx_4090_naming_it_and_the_branches_that_drive_it(check):
    (error,) = check("rtx4090", "470")["errors"]
    assert error.startswith(
        'stack_driver_branch: "470" does not drive GPU 10de:2684 (NVIDIA GeForce RTX 4090) on gpu01'
    )
    assert "at 0000:01:00.0" in error
    # 510 and 525 are in the catalog only as runfiles and CUDA-repository packages (focal's are transitional):
    # the distro method's choices are the branches whose own packages drive the GPU.
    assert "which branches 535, 570 drive" in error
    assert error.endswith('allowed: a branch that drives every GPU of the host: 570, 535 (or "auto").')


def test_470_refuses_an_h100(check):
    (error,) = check("hgx", "470")["errors"]  # eight of them: one message
    assert "GPU 10de:2330 (NVIDIA H100 80GB HBM3) on gpu01 at 0000:10:00.0, 0000:11:00.0" in error


def test_a_mixed_box_is_refused_for_the_gpu_the_branch_lacks_only(check):
    (error,) = check("mixed", "470")["errors"]
    assert "10de:2684" in error and "10de:2204" not in error
    assert check("mixed", "535")["errors"] == []


def test_newer_branches_drive_everything(check, gpu_ids):
    branches = branches_of(gpu_ids, "470", "535", "570")
    for machine in ("rtx3090x4", "rtx4090", "h100", "a100", "mixed", "hgx"):
        for branch in ("535", "570"):
            assert check(machine, branch, branches)["errors"] == [], (machine, branch)
    (error,) = check("rtx4090", "470", branches)["errors"]
    assert "which branches 535, 570 drive; allowed: a branch that drives every GPU of the host: 570, 535" in error


def test_no_catalog_branch_drives_the_gpu(check, gpu_ids):
    (error,) = check("h100", "470", branches_of(gpu_ids, "470"))["errors"]
    assert "which branches 535, 570 drive" in error
    assert error.endswith(
        "allowed: none of the catalog's branches (470) drives every GPU of the host; "
        "add one that does to catalog/stacks.yml."
    )


def test_a_branch_without_data_is_refused_with_the_command_to_generate_it(check, gpu_ids):
    branches = {**branches_of(gpu_ids, "470"), "550": {"version": "550.144.03"}}
    (error,) = check("rtx3090x4", "550", branches)["errors"]
    assert error.startswith('stack_driver_branch: "550" has no list of the GPUs it drives in catalog/gpu_ids.yml')
    assert "add 550 to BRANCHES in catalog/tools/gpu_ids.py" in error
    assert "`python catalog/tools/gpu_ids.py --archive`" in error
    assert "testbed.gpu_ids" not in error and "testbed/gpu_ids.py" not in error


def test_the_runfile_510_is_not_checked_against_535s_list(check):
    result = check("rtx4090", "510", method="runfile")
    assert result["errors"] == []
    (warning,) = result["warnings"]
    assert "GPUs not checked" in warning and "transitional package for branch 535" in warning


def test_a_branch_outside_the_catalog(check):
    (error,) = check("rtx3090x4", "999")["errors"]
    assert error == 'stack_driver_branch: "999" is not in the catalog; allowed: 570, 535, 525, 510, 470 (or "auto").'


# --- no GPU -----------------------------------------------------------------------------------


def test_no_gpu_is_not_this_checks_refusal(check):
    result = check("none", "470")
    assert result["errors"] == [] and result["gpus"] == []
    assert "nothing to check" in result["reason"]


def test_stack_no_gpu_skips_the_check(check):
    result = check("rtx4090", "470", no_gpu=True)
    assert result["errors"] == []
    assert result["reason"] == "stack_no_gpu: true: the GPU check is skipped"
    assert check("none", "470", no_gpu=True)["errors"] == []


# --- auto -------------------------------------------------------------------------------------


def test_auto_picks_the_newest_branch_that_drives_every_gpu(check, gpu_ids):
    branches = branches_of(gpu_ids, "470", "535", "570")
    for machine in ("rtx3090x4", "rtx4090", "h100", "a100", "mixed"):
        result = check(machine, "auto", branches)
        assert (result["branch"], result["errors"]) == ("570", []), machine
    reason = check("mixed", "auto", branches)["reason"]
    assert reason.startswith('stack_driver_branch: auto chose "570" for gpu01: the newest catalog branch')
    assert "10de:2204 (NVIDIA GeForce RTX 3090), 10de:2684 (NVIDIA GeForce RTX 4090)" in reason


def test_auto_skips_a_newer_branch_that_lacks_a_gpu(check, gpu_ids):
    branches = branches_of(gpu_ids, "470", "535")
    assert check("rtx3090x4", "auto", branches_of(gpu_ids, "470"))["branch"] == "470"
    result = check("rtx4090", "auto", branches)
    assert result["branch"] == "535"
    # A catalog whose newest branch drops a GPU: auto falls back and says why.
    only_old = {"470": branches["470"], "999": {"version": "999.1"}}
    result = check("rtx3090x4", "auto", only_old)
    assert result["branch"] == "470"
    assert "newer ones do not fit: 999: no list for branch 999 in catalog/gpu_ids.yml" in result["reason"]


def test_auto_meets_the_cuda_minimum(check, gpu_ids, catalog):
    # CUDA 11.6 needs 510.39.01: 470 is out even for a 3090.
    result = check("rtx3090x4", "auto", branches_of(gpu_ids, "470", "535"), minimum="510.39.01")
    assert result["branch"] == "535"
    # The real catalog with the distro method: 570 is the newest with focal packages.
    result = check("rtx3090x4", "auto", minimum="510.39.01")
    assert result["branch"] == "570"
    assert "meets the stack's CUDA minimum driver 510.39.01 (driver 570.133.07)" in result["reason"]
    # auto never picks a branch whose GPU list is unknown for the method (the runfile 510: focal's 510
    # packages are transitional), and says so.
    only = {b: catalog["driver"][b] for b in ("470", "510")}
    (error,) = check("rtx3090x4", "auto", only, minimum="510.39.01", method="runfile")["errors"]
    assert "510: nvidia-driver-510" in error and "no package lists what the runfile method's 510 driver drives" in error


def test_auto_refuses_when_nothing_fits(check, gpu_ids):
    (error,) = check("rtx4090", "auto", branches_of(gpu_ids, "470"))["errors"]
    assert error.startswith('stack_driver_branch: "auto" found no catalog branch')
    assert "10de:2684 (NVIDIA GeForce RTX 4090)" in error and "470: does not drive 10de:2684" in error
    (error,) = check("rtx3090x4", "auto", branches_of(gpu_ids, "470"), minimum="510.39.01")["errors"]
    assert "470: driver 470.256.02 is below the stack's CUDA minimum 510.39.01" in error


def test_auto_without_gpus_picks_the_newest_branch_that_meets_cuda(check, gpu_ids):
    branches = branches_of(gpu_ids, "470", "535", "570")
    for kwargs in ({}, {"no_gpu": True}):
        result = check("none", "auto", branches, **kwargs)
        assert (result["branch"], result["errors"]) == ("570", [])
    assert "GPUs not considered" in check("rtx4090", "auto", branches, no_gpu=True)["reason"]


def test_filter_plugin_entry_point():
    module = load_module("gpu_support_entry", ROOT / "roles" / "stack" / "filter_plugins" / "gpu_support.py")
    assert module.FilterModule().filters()["stack_gpu_support"] is module.gpu_support
