"""Which of a role's own small files, folders and links on this host are not as wanted (host_utils: tasks/paths.yml).

Run as `python3 -c SOURCE WANTED` (the host_utils role passes this file's text), standard library only, on the
host's python3 (Ubuntu 20.04: 3.8). WANTED is a JSON list of entries, as the `host_utils_paths_wanted` filter
makes them:

    {"path": "/etc/x", "state": "file", "sha1": "...", "owner": "root", "group": "root", "mode": "0644"}
    {"path": "/etc/d", "state": "directory", "owner": "root", "mode": "0755"}
    {"path": "/usr/local/cuda", "state": "link", "src": "/usr/local/cuda-11.1"}
    {"path": "/etc/old", "state": "absent"}

owner, group and mode are checked only where given (as Ansible's file module sets only what it is given).
Prints a JSON object: the path of each entry that is not as wanted, with the reason. Reads only; changes
nothing. A mode it cannot compare (a symbolic one such as "u+rwx") counts as different, so the role's own
task decides.
"""

import grp
import hashlib
import json
import os
import pwd
import stat
import sys


def _sha1(path):
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def _name(getter, number):
    try:
        return getter(number)[0]
    except KeyError:
        return str(number)


def _attributes(entry, info):
    """Why the owner, group or mode differ, or ''."""
    owner = entry.get("owner")
    if owner is not None and str(owner) not in (_name(pwd.getpwuid, info.st_uid), str(info.st_uid)):
        return f"owner is {_name(pwd.getpwuid, info.st_uid)}"
    group = entry.get("group")
    if group is not None and str(group) not in (_name(grp.getgrgid, info.st_gid), str(info.st_gid)):
        return f"group is {_name(grp.getgrgid, info.st_gid)}"
    mode = entry.get("mode")
    if mode is not None:
        try:
            wanted = int(str(mode), 8)
        except ValueError:
            return f"mode {mode} is not octal"
        if stat.S_IMODE(info.st_mode) != wanted:
            return f"mode is {stat.S_IMODE(info.st_mode):04o}"
    return ""


def differs(entry):
    """Why `entry` is not as wanted on this host, or '' when it is."""
    path, state = entry["path"], entry["state"]
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "" if state == "absent" else "missing"
    except OSError as exc:
        return f"unreadable: {exc}"
    if state == "absent":
        return "present"
    if state == "link":
        if not stat.S_ISLNK(info.st_mode):
            return "not a link"
        target = os.readlink(path)
        return "" if target == entry["src"] else f"points at {target}"
    if state == "directory":
        try:
            info = os.stat(path)  # as the file module, a link to a folder is that folder
        except OSError:
            return "a dangling link"
        if not stat.S_ISDIR(info.st_mode):
            return "not a folder"
        return _attributes(entry, info)
    if state == "file":
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        if _sha1(path) != entry["sha1"]:
            return "content differs"
        return _attributes(entry, info)
    return f"unknown state {state}"


def main(argv):
    wanted = json.loads(argv[1])
    print(json.dumps({entry["path"]: why for entry in wanted for why in [differs(entry)] if why}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
