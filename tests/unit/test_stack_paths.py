"""A role's own files, folders and links with one read (roles/host_utils/tasks/paths.yml): the `host_utils_paths_wanted`
filter turns the role's entries into what roles/host_utils/files/paths_state.py compares, the probe (run as the role
runs it: `python3 -c SOURCE WANTED`) names each path that is not as wanted and why, and `host_utils_paths_todo`
picks the entries to write. Real files in a temporary folder; this test runs as any user, so ownership is
checked against the files' actual owner."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module

PROBE = ROOT / "roles" / "host_utils" / "files" / "paths_state.py"
host_utils_paths = load_module(
    "host_utils_paths", ROOT / "roles" / "host_utils" / "filter_plugins" / "host_utils_paths.py"
)

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def _probe(entries: list[dict]) -> dict[str, str]:
    wanted = json.dumps(host_utils_paths.paths_wanted(entries))
    done = subprocess.run([sys.executable, "-c", PROBE.read_text(), wanted], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "env"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    script = folder / "cuda-11.1.sh"
    script.write_text("export CUDA_HOME=/usr/local/cuda-11.1\n")
    script.chmod(0o644)
    toolkit = tmp_path / "cuda-11.1"
    toolkit.mkdir()
    link = tmp_path / "cuda"
    link.symlink_to(toolkit)
    return {"folder": folder, "script": script, "toolkit": toolkit, "link": link, "root": tmp_path}


def _as_wanted(tree: dict[str, Path]) -> list[dict]:
    return [
        {"path": str(tree["folder"]), "state": "directory", "owner": ME, "group": MY_GROUP, "mode": "0755"},
        {
            "path": str(tree["script"]),
            "state": "file",
            "content": "export CUDA_HOME=/usr/local/cuda-11.1\n",
            "owner": ME,
            "mode": "0644",
        },
        {"path": str(tree["link"]), "state": "link", "src": str(tree["toolkit"])},
        {"path": str(tree["root"] / "profile.sh"), "state": "absent"},
    ]


def test_everything_in_place_is_reported_as_nothing(tree):
    assert _probe(_as_wanted(tree)) == {}


def test_each_difference_is_named_with_its_reason(tree):
    entries = _as_wanted(tree)
    tree["script"].write_text("export CUDA_HOME=/elsewhere\n")
    tree["folder"].chmod(0o700)
    tree["link"].unlink()
    tree["link"].symlink_to(tree["root"])
    (tree["root"] / "profile.sh").write_text("left over\n")
    entries.append({"path": str(tree["root"] / "modulefiles"), "state": "directory", "mode": "0755"})
    entries.append({"path": str(tree["toolkit"]), "state": "file", "content": ""})
    assert _probe(entries) == {
        str(tree["folder"]): "mode is 0700",
        str(tree["script"]): "content differs",
        str(tree["link"]): f"points at {tree['root']}",
        str(tree["root"] / "profile.sh"): "present",
        str(tree["root"] / "modulefiles"): "missing",
        str(tree["toolkit"]): "not a regular file",
    }


def test_owner_group_and_symbolic_modes_count_as_different(tree):
    entries = [
        {"path": str(tree["script"]), "state": "file", "content": tree["script"].read_text(), "owner": "no-such-user"},
        {"path": str(tree["folder"]), "state": "directory", "group": "no-such-group"},
        {"path": str(tree["toolkit"]), "state": "directory", "mode": "u+rwx"},
    ]
    assert _probe(entries) == {
        str(tree["script"]): f"owner is {ME}",
        str(tree["folder"]): f"group is {MY_GROUP}",
        str(tree["toolkit"]): "mode u+rwx is not octal",
    }


def test_a_link_to_a_folder_is_that_folder_and_a_file_in_place_of_a_link_is_not_a_link(tree):
    entries = [
        {"path": str(tree["link"]), "state": "directory"},
        {"path": str(tree["script"]), "state": "link", "src": str(tree["toolkit"])},
    ]
    assert _probe(entries) == {str(tree["script"]): "not a link"}


def test_the_sha1_is_of_the_bytes_copy_writes_and_only_given_attributes_are_passed():
    """The sha1 is `printf 'π\\n' | sha1sum` (the UTF-8 bytes); an empty owner is not passed."""
    wanted = host_utils_paths.paths_wanted(
        [{"path": "/etc/msgpu/env/x.sh", "state": "file", "content": "π\n", "mode": "0644", "owner": ""}]
    )
    assert wanted == [
        {
            "path": "/etc/msgpu/env/x.sh",
            "state": "file",
            "mode": "0644",
            "sha1": "44f5593ad4939ec9200474192a1fdbd48fcd62b1",
        }
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"state": "file", "content": ""}, "needs a path"),
        ({"path": "/x", "state": "fifo"}, "state 'fifo' is not one of file, directory, link, absent"),
        ({"path": "/x", "state": "file"}, "/x: a file needs its content"),
        ({"path": "/x", "state": "link"}, "/x: a link needs its src"),
    ],
)
def test_a_malformed_entry_is_refused_with_the_path_and_what_is_missing(entry, message):
    with pytest.raises(ValueError, match=message):
        host_utils_paths.paths_wanted([entry])


def test_todo_picks_the_reported_entries_of_a_kind_from_the_registered_read():
    entries = [
        {"path": "/a", "state": "directory"},
        {"path": "/b", "state": "file", "content": "b"},
        {"path": "/c", "state": "file", "content": "c"},
    ]
    read = {"stdout": json.dumps({"/a": "missing", "/c": "content differs"}), "rc": 0}
    assert host_utils_paths.paths_todo(entries, read, "file") == [entries[2]]
    assert host_utils_paths.paths_todo(entries, read) == [entries[0], entries[2]]
    assert host_utils_paths.paths_todo(entries, {}, "directory") == []


def test_absent_entries_remove_what_is_there_in_order_each_path_once(tmp_path: Path) -> None:
    """`host_utils_paths_absent` (a role's uninstall): one removal entry per path, in the given order (markers
    first), duplicates and empty paths left out; the probe names only the paths that exist (a file, a folder,
    a dangling link), so a second uninstall has nothing to do."""
    marker, folder, link = tmp_path / ".msgpu-installed", tmp_path / "prefix", tmp_path / "dangling"
    marker.write_text("sha256\n")
    folder.mkdir()
    (folder / "lib").mkdir()
    link.symlink_to(tmp_path / "nowhere")
    gone = tmp_path / "never-there"
    entries = host_utils_paths.paths_absent([str(marker), folder, "", None, str(folder), link, gone])
    assert entries == [
        {"path": str(marker), "state": "absent"},
        {"path": str(folder), "state": "absent"},
        {"path": str(link), "state": "absent"},
        {"path": str(gone), "state": "absent"},
    ]
    found = _probe(entries)
    assert sorted(found) == sorted([str(marker), str(folder), str(link)]), found
    assert [e["path"] for e in host_utils_paths.paths_todo(entries, found, "absent")] == [
        str(marker),
        str(folder),
        str(link),
    ]
