"""Several reads of a host in one call (roles/host_utils/files/host_read.py, through roles/host_utils/tasks/read.yml):
run as the role runs it (`python3 -c SOURCE PROBES`) on real files, accounts and programs of this machine.
The roles decide from its answers whether to install (markers), where a virtualenv is (an owner's home),
and which release is there (a program run as the owner), so each kind of probe is checked for the answer
it gives when the thing is there and when it is not."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROBE = ROOT / "roles" / "host_utils" / "files" / "host_read.py"
ME = pwd.getpwuid(os.getuid())
NOBODY = "msgpu-no-such-account"


def _read(probes: list[dict]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.read_text(), json.dumps(probes)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_account_of_an_existing_and_a_missing_user():
    found = _read([{"key": "me", "account": ME.pw_name}, {"key": "none", "account": NOBODY}])
    assert found["me"] == {"exists": True, "home": ME.pw_dir, "shell": ME.pw_shell}
    assert found["none"] == {"exists": False, "home": "", "shell": ""}


def test_file_text_and_a_missing_file(tmp_path: Path):
    marker = tmp_path / ".msgpu-installed"
    marker.write_text("wheel-sha256=ab constraints-sha256=cd\n")
    found = _read([{"key": "marker", "file": str(marker)}, {"key": "gone", "file": str(tmp_path / "nothing")}])
    assert found["marker"] == {"path": str(marker), "exists": True, "text": "wheel-sha256=ab constraints-sha256=cd\n"}
    assert found["gone"] == {"path": str(tmp_path / "nothing"), "exists": False, "text": None}


def test_a_path_under_an_accounts_home_is_expanded_and_a_missing_accounts_is_not():
    found = _read(
        [
            {"key": "mine", "exists": f"~{ME.pw_name}/no-such-venv/bin/python"},
            {"key": "theirs", "file": f"~{NOBODY}/venvs/x/.msgpu-installed"},
        ]
    )
    assert found["mine"] == {"path": f"{ME.pw_dir.rstrip('/')}/no-such-venv/bin/python", "exists": False}
    assert found["theirs"]["path"] == f"~{NOBODY}/venvs/x/.msgpu-installed"
    assert found["theirs"]["exists"] is False


def test_exists_follows_links(tmp_path: Path):
    target = tmp_path / "python3.8"
    target.write_text("")
    (tmp_path / "python").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    found = _read(
        [
            {"key": "link", "exists": str(tmp_path / "python")},
            {"key": "dangling", "exists": str(tmp_path / "dangling")},
            {"key": "folder", "exists": str(tmp_path)},
        ]
    )
    assert [found[key]["exists"] for key in ("link", "dangling", "folder")] == [True, False, True]


def test_glob_is_sorted_and_empty_when_nothing_matches(tmp_path: Path):
    for kernel in ("5.4.0-99-generic", "5.4.0-216-generic", "5.15.0-1-generic"):
        (tmp_path / kernel / "build").mkdir(parents=True)
        (tmp_path / kernel / "build" / "Makefile").write_text("")
    (tmp_path / "5.4.0-1-generic").mkdir()  # a kernel without headers
    found = _read(
        [
            {"key": "headers", "glob": str(tmp_path / "*" / "build" / "Makefile")},
            {"key": "none", "glob": str(tmp_path / "vmlinuz-*")},
        ]
    )
    assert found["headers"]["paths"] == sorted(
        str(tmp_path / kernel / "build" / "Makefile")
        for kernel in ("5.4.0-99-generic", "5.4.0-216-generic", "5.15.0-1-generic")
    )
    assert found["none"] == {"paths": []}


def test_run_gives_a_command_results_shape_with_its_environment():
    found = _read(
        [
            {
                "key": "tag",
                "run": [
                    sys.executable,
                    "-c",
                    "import os, sys; print('cp%d%d' % sys.version_info[:2]); print(os.environ['X'])",
                ],
                "env": {"X": "1"},
            },
            {"key": "fails", "run": [sys.executable, "-c", "import sys; sys.stderr.write('no'); sys.exit(3)"]},
        ]
    )
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert found["tag"] == {"rc": 0, "stdout": f"{tag}\n1\n", "stdout_lines": [tag, "1"], "stderr": ""}
    assert found["fails"]["rc"] == 3
    assert found["fails"]["stderr"] == "no"


def test_run_of_a_missing_program_and_the_skips(tmp_path: Path):
    found = _read(
        [
            {"key": "missing", "run": ["/opt/python3.9/bin/python3", "-c", "pass"]},
            {"key": "no_venv", "run": ["true"], "if_exists": str(tmp_path / "venv" / "bin" / "python")},
            {"key": "no_user", "run": ["true"], "user": NOBODY},
        ]
    )
    assert found["missing"]["rc"] == 127
    assert "/opt/python3.9/bin/python3" in found["missing"]["stderr"]
    assert found["no_venv"] == {"rc": None, "skipped": f"{tmp_path / 'venv' / 'bin' / 'python'} does not exist"}
    assert found["no_user"] == {"rc": None, "skipped": f"no account {NOBODY}"}


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another account needs root (CI runs as root)")
def test_run_as_another_user_gets_its_ids_and_home():
    other = pwd.getpwnam("nobody")
    found = _read([{"key": "who", "run": ["sh", "-c", 'id -u; id -g; echo "$HOME"'], "user": "nobody"}])
    assert found["who"]["stdout_lines"] == [str(other.pw_uid), str(other.pw_gid), other.pw_dir]


def test_an_unknown_probe_is_an_error_naming_it():
    done = subprocess.run(
        [sys.executable, "-c", PROBE.read_text(), json.dumps([{"key": "odd", "stat": "/"}])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "probe 'odd': none of account, file, exists, run, glob" in done.stderr
