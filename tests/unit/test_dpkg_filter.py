"""The `host_utils_dpkg_installed` filter (roles/host_utils/filter_plugins/host_utils_dpkg.py), which every role
that reads dpkg's state before calling apt uses: fed by this machine's real dpkg-query with each showformat the roles
use (read from their task files), and with the states an interrupted install leaves."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT, load_module

PLUGIN = ROOT / "roles" / "host_utils" / "filter_plugins" / "host_utils_dpkg.py"
FILTER = load_module("host_utils_dpkg", PLUGIN).dpkg_installed
USERS = [
    "roles/nvidia_driver/tasks/present.yml",
    "roles/nvidia_driver/tasks/absent.yml",
    "roles/nvidia_driver/tasks/other_branches.yml",
    "roles/nvidia_driver/tasks/module_source.yml",
    "roles/nvidia_driver/tasks/install_runfile.yml",
    "roles/cuda/tasks/cuda_repo.yml",
    "roles/cuda_library/tasks/cuda_repo.yml",
]
FORMAT = re.compile(r"--showformat=(\$\{db:Status-Status\} \$\{Package\}(?:=\$\{Version\})?)(?:\\\\n|\\n)")


def _formats() -> set[str]:
    found = set()
    for path in USERS:
        text = (ROOT / path).read_text()
        assert "host_utils_dpkg_installed" in text, f"{path} no longer reads dpkg through the filter"
        for fmt in FORMAT.findall(text):
            # YAML: a double-quoted "\\n" and a folded scalar's "\n" are both the two characters dpkg reads.
            found.add(fmt + "\\n")
    return found


def test_every_user_has_a_format_the_filter_reads():
    assert _formats() == {"${db:Status-Status} ${Package}\\n", "${db:Status-Status} ${Package}=${Version}\\n"}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg on this machine")
@pytest.mark.parametrize("fmt", sorted(_formats()))
def test_real_dpkg_query_output_gives_the_installed_packages(fmt):
    query = subprocess.run(
        ["dpkg-query", "--show", f"--showformat={fmt}", "dpkg", "msgpu-no-such-package"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert query.returncode == 1, query  # an unknown package: rc 1, no line for it
    installed = FILTER({"rc": 1, "stdout_lines": query.stdout.splitlines()})
    version = subprocess.run(
        ["dpkg-query", "--show", "--showformat=${Version}", "dpkg"], capture_output=True, text=True, check=True
    ).stdout
    assert installed == (["dpkg"] if "Version" not in fmt else [f"dpkg={version}"])


def test_only_installed_counts():
    lines = [
        "installed nvidia-dkms-470",
        "half-installed libnvidia-compute-470",
        "unpacked nvidia-utils-470",
        "half-configured nvidia-kernel-common-470",
        "config-files nvidia-dkms-535",
        "not-installed cuda-drivers-535",
        "installed libcudnn8=8.0.5.39-1+cuda11.1",
        "",
    ]
    assert FILTER({"stdout_lines": lines}) == ["nvidia-dkms-470", "libcudnn8=8.0.5.39-1+cuda11.1"]
    assert FILTER(lines) == FILTER({"stdout_lines": lines})


def test_a_skipped_read_gives_nothing():
    assert FILTER({"skipped": True, "changed": False}) == []
    assert FILTER(None) == []


def test_ansible_loads_it_as_a_filter():
    module = load_module("host_utils_dpkg_entry", PLUGIN)
    assert module.FilterModule().filters()["host_utils_dpkg_installed"] is module.dpkg_installed
    # The file name is unique among the roles' filter plugins (ansible-core 2.15.5+ mixes up same-named ones).
    names = [p.name for p in ROOT.glob("roles/*/filter_plugins/*.py")]
    assert len(names) == len(set(names)), names
