"""NVSwitch hosts and NVIDIA's fabric manager (issue 15, NVSwitch systems): what host_check.py reads of
apt (`apt-cache policy`) and how it picks the fabric manager version that equals the driver's, the regex
the nvidia_driver role applies to the same answer (roles/nvidia_driver/tasks/fabricmanager.yml), and the
catalog's `fabricmanager` entries. The real packages (focal's 470 installs, focal's 535 is refused) run in
tests/integration/test_fabricmanager.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import yaml

from tests.conftest import ROOT, load_module

GPU_CHECK = ROOT / "roles" / "stack" / "files" / "host_check.py"
FM_TASKS = ROOT / "roles" / "nvidia_driver" / "tasks" / "fabricmanager.yml"

# `LC_ALL=C apt-cache policy` answers, as focal (Ubuntu's archive) and NVIDIA's CUDA repository give them.
FOCAL_FM_535 = """\
nvidia-fabricmanager-535:
  Installed: (none)
  Candidate: 535.247.01-0ubuntu0.20.04.1
  Version table:
     535.247.01-0ubuntu0.20.04.1 500
        500 http://archive.ubuntu.com/ubuntu focal-updates/multiverse amd64 Packages
        500 http://security.ubuntu.com/ubuntu focal-security/multiverse amd64 Packages
"""
FOCAL_COMPUTE_535 = """\
libnvidia-compute-535:
  Installed: (none)
  Candidate: 535.230.02-0ubuntu0.20.04.1
  Version table:
     535.230.02-0ubuntu0.20.04.1 500
        500 http://archive.ubuntu.com/ubuntu focal-updates/restricted amd64 Packages
        500 http://security.ubuntu.com/ubuntu focal-security/restricted amd64 Packages
"""
FOCAL_FM_470_INSTALLED = """\
nvidia-fabricmanager-470:
  Installed: 470.256.02-0ubuntu0.20.04.1
  Candidate: 470.256.02-0ubuntu0.20.04.1
  Version table:
 *** 470.256.02-0ubuntu0.20.04.1 500
        500 http://archive.ubuntu.com/ubuntu focal-updates/multiverse amd64 Packages
        100 /var/lib/dpkg/status
     470.57.02-0ubuntu1 500
        500 http://archive.ubuntu.com/ubuntu focal/multiverse amd64 Packages
"""
FOCAL_COMPUTE_470_INSTALLED = """\
libnvidia-compute-470:
  Installed: 470.256.02-0ubuntu0.20.04.1
  Candidate: 470.256.02-0ubuntu0.20.04.1
  Version table:
 *** 470.256.02-0ubuntu0.20.04.1 500
        500 http://archive.ubuntu.com/ubuntu focal-updates/restricted amd64 Packages
        100 /var/lib/dpkg/status
"""
# NVIDIA's repository numbers its fabric manager -1 and its Ubuntu-style driver packages -0ubuntu1, and
# keeps every release; with Ubuntu's archive also in the sources apt lists both.
NVIDIA_FM_535 = """\
nvidia-fabricmanager-535:
  Installed: (none)
  Candidate: 535.247.01-1
  Version table:
     535.247.01-1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  Packages
     535.247.01-0ubuntu0.20.04.1 500
        500 http://archive.ubuntu.com/ubuntu focal-updates/multiverse amd64 Packages
     535.230.02-1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  Packages
     535.183.06-1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  Packages
"""
NVIDIA_COMPUTE_535_INSTALLED = """\
libnvidia-compute-535:
  Installed: 535.230.02-0ubuntu1
  Candidate: 535.247.01-0ubuntu1
  Version table:
     535.247.01-0ubuntu1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  Packages
 *** 535.230.02-0ubuntu1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2004/x86_64  Packages
        100 /var/lib/dpkg/status
     535.230.02-0ubuntu0.20.04.1 500
        500 http://archive.ubuntu.com/ubuntu focal-updates/restricted amd64 Packages
"""
UNKNOWN = ""  # apt-cache policy of a package apt does not know: nothing on stdout, exit status 0


@pytest.fixture(scope="module")
def host_check():
    return load_module("host_check", GPU_CHECK)


def test_upstream_drops_epoch_and_debian_revision(host_check):
    assert host_check.upstream("535.230.02-0ubuntu0.20.04.1") == "535.230.02"
    assert host_check.upstream("535.247.01-1") == "535.247.01"
    assert host_check.upstream("1:470.256.02-0ubuntu1") == "470.256.02"
    assert host_check.upstream("470.256.02") == "470.256.02"
    assert host_check.upstream("") == ""


def test_policy_of_a_package_apt_has_but_not_installed(host_check):
    assert host_check.parse_policy(FOCAL_FM_535) == {
        "installed": "",
        "candidate": "535.247.01-0ubuntu0.20.04.1",
        "versions": ["535.247.01-0ubuntu0.20.04.1"],
    }


def test_policy_of_an_installed_package_lists_every_version_once(host_check):
    assert host_check.parse_policy(FOCAL_FM_470_INSTALLED) == {
        "installed": "470.256.02-0ubuntu0.20.04.1",
        "candidate": "470.256.02-0ubuntu0.20.04.1",
        "versions": ["470.256.02-0ubuntu0.20.04.1", "470.57.02-0ubuntu1"],
    }


def test_policy_of_an_unknown_package(host_check):
    assert host_check.parse_policy(UNKNOWN) == {"installed": "", "candidate": "", "versions": []}


def test_focal_535_has_no_fabric_manager_at_the_drivers_version(host_check):
    found = host_check.fabricmanager(
        host_check.parse_policy(FOCAL_FM_535), host_check.parse_policy(FOCAL_COMPUTE_535), "libnvidia-compute-535"
    )
    assert found["match"] == ""
    assert (found["driver_upstream"], found["upstreams"], found["driver_installed"]) == (
        "535.230.02",
        ["535.247.01"],
        False,
    )


def test_focal_470_matches(host_check):
    found = host_check.fabricmanager(
        host_check.parse_policy(FOCAL_FM_470_INSTALLED), host_check.parse_policy(FOCAL_COMPUTE_470_INSTALLED)
    )
    assert found["match"] == "470.256.02-0ubuntu0.20.04.1"
    assert found["driver_installed"] is True


def test_nvidia_repository_matches_the_installed_driver_across_debian_revisions(host_check):
    """The installed driver (535.230.02, held) wins over apt's newer candidate; NVIDIA's -1 package of the
    same upstream version is the one to install."""
    found = host_check.fabricmanager(
        host_check.parse_policy(NVIDIA_FM_535), host_check.parse_policy(NVIDIA_COMPUTE_535_INSTALLED)
    )
    assert found["driver"] == "535.230.02-0ubuntu1"
    assert found["match"] == "535.230.02-1"


def test_an_installed_fabric_manager_at_the_drivers_version_is_kept(host_check):
    """An installed fabric manager of the same upstream version is kept, whatever newer revision apt has."""
    fm = host_check.parse_policy(FOCAL_FM_470_INSTALLED)
    fm["versions"].insert(0, "470.256.02-0ubuntu0.20.04.2")
    driver = host_check.parse_policy(FOCAL_COMPUTE_470_INSTALLED)
    assert host_check.fabricmanager(fm, driver)["match"] == "470.256.02-0ubuntu0.20.04.1"


def test_no_driver_version_no_match(host_check):
    found = host_check.fabricmanager(host_check.parse_policy(FOCAL_FM_535), host_check.parse_policy(UNKNOWN))
    assert (found["driver"], found["match"]) == ("", "")


@pytest.fixture
def stand_in_apt(tmp_path):
    """An `apt-cache` on PATH that answers `policy PACKAGE` from the answers above (and logs its
    arguments and locale): host_check.py as the preflight runs it, without a Debian host."""
    answers = {
        "nvidia-fabricmanager-535": FOCAL_FM_535,
        "libnvidia-compute-535": FOCAL_COMPUTE_535,
        "nvidia-fabricmanager-470": FOCAL_FM_470_INSTALLED,
        "libnvidia-compute-470": FOCAL_COMPUTE_470_INSTALLED,
    }
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    script = tmp_path / "bin" / "apt-cache"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import json, os, sys
            with open({str(tmp_path / "log")!r}, "a") as log:
                log.write(" ".join(sys.argv[1:]) + " LC_ALL=" + os.environ.get("LC_ALL", "") + "\\n")
            assert sys.argv[1] == "policy"
            sys.stdout.write(json.load(open({str(tmp_path / "answers.json")!r})).get(sys.argv[2], ""))
            """
        )
    )
    script.chmod(0o755)
    return tmp_path


def test_host_check_reads_each_pair_from_apt(tmp_path, stand_in_apt):
    """The preflight's call: every fabric manager of the method's branches with its driver package."""
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    hgx = [(f"0000:{bus:02x}:00.0", "0x20b0", "0x030200") for bus in range(0x07, 0x0F)]  # 8x A100 SXM4
    hgx += [(f"0000:{bus:02x}:00.0", "0x1af1", "0x068000") for bus in range(0x80, 0x86)]  # 6 NVSwitches
    for slot, device, klass in hgx:
        (devices / slot).mkdir(parents=True)
        for name, value in (("vendor", "0x10de"), ("device", device), ("class", klass)):
            (devices / slot / name).write_text(value + "\n")
    result = subprocess.run(
        [
            sys.executable,
            str(GPU_CHECK),
            "--sysfs-root",
            str(tmp_path / "sys"),
            "--fabricmanager",
            "nvidia-fabricmanager-535=libnvidia-compute-535",
            "--fabricmanager",
            "nvidia-fabricmanager-470=libnvidia-compute-470",
            "--apt",
            "cuda-drivers-535",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PATH": f"{stand_in_apt / 'bin'}{os.pathsep}{os.environ['PATH']}", "LC_ALL": "de_DE.UTF-8"},
    )
    found = json.loads(result.stdout)
    assert [g["id"] for g in found["gpus"]] == ["10de:20b0"] * 8
    assert [s["id"] for s in found["nvswitches"]] == ["10de:1af1"] * 6
    assert found["fabricmanager"]["nvidia-fabricmanager-535"]["match"] == ""
    assert found["fabricmanager"]["nvidia-fabricmanager-535"]["driver_package"] == "libnvidia-compute-535"
    assert found["fabricmanager"]["nvidia-fabricmanager-470"]["match"] == "470.256.02-0ubuntu0.20.04.1"
    assert found["apt"] == {"cuda-drivers-535": {"installed": "", "candidate": "", "versions": []}}
    # apt's English answer whatever the host's locale ("Installed:", not "Installiert:").
    assert set(re.findall(r"LC_ALL=(\S*)", (stand_in_apt / "log").read_text())) == {"C"}


def test_host_check_without_apt_options_is_unchanged(tmp_path):
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--sysfs-root", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == {"gpus": [], "nvswitches": []}


def test_host_check_without_apt_cache(tmp_path):
    """A host without apt (the preflight refuses its OS anyway): no versions, no crash."""
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--sysfs-root", str(tmp_path), "--fabricmanager", "a=b"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert json.loads(result.stdout)["fabricmanager"]["a"]["match"] == ""


# --- the nvidia_driver role reads the same answer with a regex of its own --------------------------


def _role_vars() -> dict:
    tasks = yaml.safe_load(FM_TASKS.read_text())
    return next(
        t["vars"] for t in tasks if t.get("name") == "Choose the fabric manager version that equals the driver's"
    )


@pytest.mark.parametrize(
    "answer", [FOCAL_FM_535, FOCAL_FM_470_INSTALLED, NVIDIA_FM_535, NVIDIA_COMPUTE_535_INSTALLED, UNKNOWN]
)
def test_the_roles_version_table_regex_agrees_with_host_check(host_check, answer):
    pattern = _role_vars()["__nvidia_driver_fm_table_regex"]
    table = re.findall(pattern, answer, re.MULTILINE)
    # The role reads the same versions, in apt's order (the installed one may appear twice there: it
    # comes first anyway).
    assert list(dict.fromkeys(table)) == host_check.parse_policy(answer)["versions"]


# --- the catalog ------------------------------------------------------------------------------------


def test_catalog_fabric_managers(catalog):
    """Every `fabricmanager` names the branch's nvidia-fabricmanager-<branch> and a driver package of the
    branch that every method installs (libnvidia-compute-<branch>: also with precompiled modules)."""
    seen = []
    for branch, entry in catalog["driver"].items():
        assert "fabricmanager" not in entry.get("runfile", {}), f"{branch}: the runfile has no fabric manager"
        for method in ("distro", "cuda_repo"):
            fm = entry.get(method, {}).get("fabricmanager")
            if fm is None:
                continue
            seen.append((branch, method))
            assert fm == {"package": f"nvidia-fabricmanager-{branch}", "version_of": f"libnvidia-compute-{branch}"}
            if method == "distro":
                assert fm["version_of"] in entry["distro"]["packages"]
    # focal has one for each of its branches (470 at its driver's version; 535 and 570 at others, which the
    # preflight refuses on NVSwitch hosts); NVIDIA's repository for every branch.
    assert [b for b, m in seen if m == "distro"] == [b for b, e in catalog["driver"].items() if "distro" in e]
    assert [b for b, m in seen if m == "cuda_repo"] == list(catalog["driver"])


# --- the preflight's decisions (the stack_fabricmanager_plan/_check filters host.yml applies) ---------------

NVSWITCHES = [{"id": "10de:22a3", "slot": f"0000:{bus:02x}:00.0"} for bus in (0x18, 0x19, 0x1A, 0x1B)]
H100S = {"gpus": [{"id": "10de:2330", "slot": f"0000:{bus:02x}:00.0"} for bus in range(0x10, 0x18)]}


@pytest.fixture(scope="module")
def gpu_support():
    return load_module("gpu_support", ROOT / "roles" / "stack" / "filter_plugins" / "gpu_support.py")


@pytest.fixture(scope="module")
def gpu_ids() -> dict:
    return yaml.safe_load((ROOT / "catalog" / "gpu_ids.yml").read_text())


def _driver(branch: str, method: str = "distro") -> dict:
    packages = [f"cuda-drivers-{branch}"] if method == "cuda_repo" else [f"nvidia-dkms-{branch}"]
    return {"branch": branch, "method": method, "packages": packages, "minimum": "455.23"}


def _focal_scan(host_check) -> dict:
    """host_check.py's answer on a focal host with Ubuntu's archive: 470 matches, 535 does not, 570's fabric
    manager is unknown to apt."""
    policy = host_check.parse_policy
    return {
        "fabricmanager": {
            "nvidia-fabricmanager-470": host_check.fabricmanager(
                policy(FOCAL_FM_470_INSTALLED), policy(FOCAL_COMPUTE_470_INSTALLED), "libnvidia-compute-470"
            ),
            "nvidia-fabricmanager-535": host_check.fabricmanager(
                policy(FOCAL_FM_535), policy(FOCAL_COMPUTE_535), "libnvidia-compute-535"
            ),
            "nvidia-fabricmanager-570": host_check.fabricmanager(
                policy(UNKNOWN), policy(UNKNOWN), "libnvidia-compute-570"
            ),
        },
        "apt": {},
    }


def test_plan_without_nvswitches_needs_nothing(gpu_support, catalog):
    plan = gpu_support.fabricmanager_plan(catalog["driver"], _driver("535"), [], "present", "h1")
    assert (plan["needed"], plan["errors"], plan["fabricmanager"]) == (False, [], {})
    check = gpu_support.fabricmanager_check(plan, {}, catalog["driver"], _driver("535"), {}, {}, "h1")
    assert (check["checked"], check["errors"]) == (False, [])


def test_plan_when_the_run_removes_the_driver_needs_nothing(gpu_support, catalog):
    plan = gpu_support.fabricmanager_plan(catalog["driver"], _driver("535", "runfile"), NVSWITCHES, "absent", "h1")
    assert (plan["needed"], plan["errors"]) == (False, [])


def test_plan_names_the_package_and_what_apt_is_asked(gpu_support, catalog):
    plan = gpu_support.fabricmanager_plan(catalog["driver"], _driver("470"), NVSWITCHES, "present", "h1")
    assert plan["needed"] and plan["errors"] == []
    assert plan["fabricmanager"] == {"package": "nvidia-fabricmanager-470", "version_of": "libnvidia-compute-470"}
    assert plan["text"] == (
        "4 NVSwitch(es) on the PCI bus (10de:22a3 at 0000:18:00.0, 0000:19:00.0, 0000:1a:00.0, 0000:1b:00.0) need "
        "NVIDIA's fabric manager at exactly the driver's version"
    )
    pairs = list(zip(plan["apt_args"][::2], plan["apt_args"][1::2]))
    assert ("--fabricmanager", "nvidia-fabricmanager-470=libnvidia-compute-470") in pairs
    assert {flag for flag, _ in pairs} == {"--fabricmanager"}  # distro: apt already knows the driver's versions
    repo = gpu_support.fabricmanager_plan(catalog["driver"], _driver("535", "cuda_repo"), NVSWITCHES, "present", "h1")
    assert ("--apt", "cuda-drivers-535") in list(zip(repo["apt_args"][::2], repo["apt_args"][1::2]))


def test_the_runfile_has_no_fabric_manager(gpu_support, catalog):
    plan = gpu_support.fabricmanager_plan(catalog["driver"], _driver("535", "runfile"), NVSWITCHES, "present", "h1")
    (error,) = plan["errors"]
    assert error.startswith("h1: 4 NVSwitch(es) on the PCI bus (10de:22a3 at 0000:18:00.0, ")
    assert "stack_driver_method: runfile installs none (NVIDIA's driver runfile has no fabric manager)" in error
    assert "Allowed: stack_driver_method: cuda_repo (NVIDIA's CUDA repository publishes" in error
    assert "; or stack_driver_method: distro (Ubuntu's packages;" in error
    assert plan["fabricmanager"] == {}


def test_focal_535_refused_naming_both_versions_and_the_branch_that_works(gpu_support, host_check, catalog, gpu_ids):
    driver = _driver("535")
    plan = gpu_support.fabricmanager_plan(catalog["driver"], driver, NVSWITCHES, "present", "h1")
    check = gpu_support.fabricmanager_check(
        plan, _focal_scan(host_check), catalog["driver"], driver, gpu_ids, {"gpus": []}, "h1", True
    )
    assert check["checked"]
    (error,) = check["errors"]
    for text in (
        '(it refuses to start at any other, and CUDA then fails with "system not yet initialized")',
        'stack_driver_branch "535" with stack_driver_method distro has none',
        "apt here has nvidia-fabricmanager-535 535.247.01 (535.247.01-0ubuntu0.20.04.1)",
        "the driver's libnvidia-compute-535 535.230.02 (535.230.02-0ubuntu0.20.04.1, apt's candidate)",
        'Allowed: stack_driver_branch "470" (nvidia-fabricmanager-470 and libnvidia-compute-470 are both 470.256.02 '
        "here); or stack_driver_method: cuda_repo (NVIDIA's CUDA repository",
    ):
        assert text in error, error


def test_a_branch_that_does_not_drive_the_gpus_is_not_offered(gpu_support, host_check, catalog, gpu_ids):
    """HGX H100: focal's 470 has a matching fabric manager but does not drive the H100."""
    driver = _driver("535")
    plan = gpu_support.fabricmanager_plan(catalog["driver"], driver, NVSWITCHES, "present", "h1")
    check = gpu_support.fabricmanager_check(
        plan, _focal_scan(host_check), catalog["driver"], driver, gpu_ids, H100S, "h1"
    )
    (error,) = check["errors"]
    assert check["working"] == []
    assert 'stack_driver_branch "470"' not in error
    assert "Allowed: stack_driver_method: cuda_repo (" in error


def test_focal_470_passes_the_preflight(gpu_support, host_check, catalog, gpu_ids):
    driver = _driver("470")
    plan = gpu_support.fabricmanager_plan(catalog["driver"], driver, NVSWITCHES, "present", "h1")
    check = gpu_support.fabricmanager_check(
        plan, _focal_scan(host_check), catalog["driver"], driver, gpu_ids, {"gpus": []}, "h1", True
    )
    assert (check["checked"], check["errors"]) == (True, [])
    assert check["found"]["match"] == "470.256.02-0ubuntu0.20.04.1"


def test_cuda_repo_is_checked_only_once_nvidias_repository_is_indexed(gpu_support, host_check, catalog, gpu_ids):
    driver = _driver("535", "cuda_repo")
    plan = gpu_support.fabricmanager_plan(catalog["driver"], driver, NVSWITCHES, "present", "h1")
    scan = {**_focal_scan(host_check), "apt": {"cuda-drivers-535": host_check.parse_policy(UNKNOWN)}}
    check = gpu_support.fabricmanager_check(plan, scan, catalog["driver"], driver, gpu_ids, {"gpus": []}, "h1", True)
    assert (check["checked"], check["errors"]) == (False, [])
