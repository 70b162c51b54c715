"""The "host unchanged" fingerprint (testbed/fingerprint.py) on a temporary tree: equal twice when nothing
changed, and different after each change that a modification time does not show (a chmod, a chown, an
mtime-preserving rewrite, an xattr) and after a large file left in /tmp."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import fingerprint

# Past the file system's timestamp granularity (the kernel's coarse clock ticks every few ms).
TICK = 0.05


def take(root: Path, marker: Path) -> str:
    script = fingerprint.script(marker=str(marker), root=str(root), python=sys.executable)
    result = subprocess.run(["bash", "-c", script], text=True, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A small root file system, then the marker (as a container's start touches it)."""
    root = tmp_path / "root"
    for folder in ("etc/systemd/system/multi-user.target.wants", "usr/bin", "opt/app", "tmp", "run", "root"):
        (root / folder).mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\nmsgpu:x:1000:1000::/home/msgpu:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\nmsgpu:x:1000:\n")
    (root / "etc/shadow").write_text("root:$6$salt$secrethash:19000:0:99999:7:::\n")
    (root / "etc/app.conf").write_text("setting = 1\n")
    (root / "usr/bin/tool").write_text("#!/bin/sh\necho tool\n")
    (root / "usr/bin/tool").chmod(0o755)
    (root / "opt/app/data.bin").write_bytes(b"A" * 4096)
    (root / "etc/systemd/system/app.service").write_text("[Service]\nExecStart=/usr/bin/tool\n")
    marker = tmp_path / "marker"
    time.sleep(TICK)
    marker.touch()
    time.sleep(TICK)
    return root, marker


def changed_lines(before: str, after: str) -> set[str]:
    return set(before.splitlines()) ^ set(after.splitlines())


def test_the_program_runs_on_the_focal_hosts_python():
    ast.parse(fingerprint.SOURCE, feature_version=(3, 8))


def test_an_untouched_tree_gives_the_same_fingerprint_twice(tree):
    root, marker = tree
    first = take(root, marker)
    # Reading changes no ctime (atime aside): the fingerprint itself is no change.
    assert take(root, marker) == first
    assert "skipped: the root is not /" in first
    assert "/opt/app/data.bin" not in first, "files untouched since the marker are not listed"


def test_chmod_is_seen(tree):
    root, marker = tree
    before = take(root, marker)
    os.chmod(root / "usr/bin/tool", 0o4755)
    diff = changed_lines(before, take(root, marker))
    assert any(line.startswith("/usr/bin/tool f 4755 ") for line in diff), diff


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_chown_is_seen(tree):
    root, marker = tree
    before = take(root, marker)
    os.chown(root / "etc/app.conf", 1000, 1000)
    diff = changed_lines(before, take(root, marker))
    assert any(line.startswith("/etc/app.conf f 0644 1000:1000 ") for line in diff), diff


def test_an_mtime_preserving_rewrite_is_seen(tree):
    """What tar and `unarchive` do: new bytes, the old modification time restored."""
    root, marker = tree
    data = root / "opt/app/data.bin"
    old = data.stat()
    before = take(root, marker)
    data.write_bytes(b"B" * 4096)  # the same size
    os.utime(data, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert data.stat().st_mtime_ns == old.st_mtime_ns
    after = take(root, marker)
    assert after != before
    assert any(line.startswith("/opt/app/data.bin f 0644 ") for line in changed_lines(before, after))


def test_a_second_rewrite_of_a_listed_file_is_seen_by_its_content(tree):
    root, marker = tree
    conf = root / "etc/app.conf"
    conf.write_text("setting = 2\n")
    before = take(root, marker)
    assert "/etc/app.conf f" in before
    old = conf.stat()
    conf.write_text("setting = 3\n")
    os.utime(conf, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert take(root, marker) != before


def test_an_xattr_is_seen(tree):
    root, marker = tree
    target = root / "etc/app.conf"
    before = take(root, marker)
    try:
        os.setxattr(target, "user.msgpu", b"1")
    except OSError as error:
        pytest.skip(f"this file system takes no user xattr: {error}")
    diff = changed_lines(before, take(root, marker))
    assert any(line.startswith("/etc/app.conf ") and "xattr=-" not in line for line in diff), diff


def test_a_large_file_left_in_tmp_is_seen_and_a_small_one_is_not(tree):
    root, marker = tree
    before = take(root, marker)
    (root / "tmp/small").write_bytes(b"x" * 1024)
    (root / "run/small").write_bytes(b"x" * 1024)
    assert take(root, marker) == before, "small scratch files are no change"
    (root / "tmp/download.tar").write_bytes(b"x" * (fingerprint.LARGE + 1))
    assert changed_lines(before, take(root, marker)) == {f"/tmp/download.tar size={fingerprint.LARGE + 1}"}


def test_a_deleted_file_is_seen(tree):
    root, marker = tree
    before = take(root, marker)
    (root / "opt/app/data.bin").unlink()
    diff = changed_lines(before, take(root, marker))
    assert any(line.startswith("/opt/app d ") for line in diff), diff


def test_a_removal_from_a_listed_folder_is_seen_by_its_entries(tree):
    root, marker = tree
    (root / "opt/app/new.txt").write_text("new\n")
    before = take(root, marker)
    assert "/opt/app d " in before
    (root / "opt/app/data.bin").unlink()
    assert take(root, marker) != before


def test_users_units_and_secrets(tree):
    root, marker = tree
    before = take(root, marker)
    assert "/etc/passwd msgpu:x:1000:1000::/home/msgpu:/bin/bash" in before
    assert "secrethash" not in before, "a password hash is printed only as a hash of it"
    wants = root / "etc/systemd/system/multi-user.target.wants/app.service"
    wants.symlink_to("/etc/systemd/system/app.service")
    after = take(root, marker)
    assert "unit /etc/systemd/system/multi-user.target.wants/app.service -> /etc/systemd/system/app.service" in after
    (root / "etc/shadow").write_text("root:$6$salt$otherhash:19000:0:99999:7:::\n")
    new_password = take(root, marker)
    assert new_password != after and "otherhash" not in new_password


def test_the_pruned_trees_are_not_walked_but_their_parent_stays_put(tree):
    """Ansible's connection creates /root/.ansible on its first task: that is not a change of /root."""
    root, marker = tree
    before = take(root, marker)
    assert "/root d " in before
    (root / "root/.ansible/tmp").mkdir(parents=True)
    (root / "root/.ansible/tmp/module.py").write_text("x\n")
    pycache = root / "usr/bin/__pycache__"
    assert take(root, marker) == before
    pycache.mkdir()  # its parent's ctime changes: the parent appears, its entries as before
    after = take(root, marker)
    assert "__pycache__" not in after
    assert [line.split()[0] for line in changed_lines(before, after)] == ["/usr/bin"]


def test_a_big_file_is_not_hashed_but_a_rewrite_still_shows(tree):
    root, marker = tree
    data = root / "opt/app/data.bin"
    data.write_bytes(b"C" * 4096)
    script = fingerprint.script(marker=str(marker), root=str(root), python=sys.executable, hash_cap=1024)
    first = subprocess.run(["bash", "-c", script], text=True, capture_output=True, check=True).stdout
    line = next(line for line in first.splitlines() if line.startswith("/opt/app/data.bin "))
    assert "sha256=" not in line and " ctime=" in line
    old = data.stat()
    time.sleep(TICK)
    data.write_bytes(b"D" * 4096)
    os.utime(data, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert subprocess.run(["bash", "-c", script], text=True, capture_output=True, check=True).stdout != first
