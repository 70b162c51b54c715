"""Several reads of the host in one call (roles/host_utils/tasks/read.yml): a role's accounts, markers, interpreters.

Run as `python3 -c SOURCE PROBES` (the stack role passes this file's text), standard library only, on the
host's python3 (Ubuntu 20.04: 3.8). PROBES is a JSON list; each probe has a `key` (its name in the answer)
and one of:

    {"key": "owner", "account": "msgpu"}           -> {"exists": true, "home": "/home/msgpu", "shell": "/bin/bash"}
    {"key": "marker", "file": "~msgpu/venv/.m"}    -> {"path": "/home/msgpu/venv/.m", "exists": true, "text": "..."}
    {"key": "python", "exists": "~msgpu/venv/bin/python"}
                                                   -> {"path": "/home/msgpu/venv/bin/python", "exists": true}
    {"key": "tag", "run": ["/usr/bin/python3", "-c", "..."], "user": "msgpu", "env": {"A": "1"},
     "if_exists": "~msgpu/venv/bin/python"}        -> {"rc": 0, "stdout": "...", "stdout_lines": [...], "stderr": "..."}
    {"key": "kernels", "glob": "/boot/vmlinuz-*"}  -> {"paths": ["/boot/vmlinuz-5.4.0-216-generic"]}  (sorted)

A path (and an argument of `run` or `if_exists`) that starts with `~name` is the home of the account `name`
(os.path.expanduser); an account that does not exist leaves it as it is (so it is not found). `run` runs the
program without a shell, as `user` when given (its uid, gid, groups and HOME, as `become_user` would), with
`env` added to the environment; a program that does not exist gives rc 127 and the error in stderr, a user
that does not exist or an `if_exists` path that does not exist gives {"rc": null, "skipped": why}. A `run`
answer has the shape of a registered command result (rc, stdout, stdout_lines, stderr), so filters written
for one take it. `exists` follows links (a venv's bin/python is a link to the system interpreter). A `file`
is read as text (UTF-8, errors replaced), at most 1 MiB. Prints one JSON object: each probe's key and its
answer. Reads only; changes nothing (what `run` runs is the caller's to choose: a read).
"""

import glob
import json
import os
import pwd
import subprocess
import sys

LIMIT = 1 << 20


def _path(value):
    return os.path.expanduser(value) if value.startswith("~") else value


def _account(name):
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return {"exists": False, "home": "", "shell": ""}
    return {"exists": True, "home": entry.pw_dir, "shell": entry.pw_shell}


def _file(path):
    try:
        with open(path, "rb") as handle:
            return {"path": path, "exists": True, "text": handle.read(LIMIT).decode("utf-8", "replace")}
    except FileNotFoundError:
        return {"path": path, "exists": False, "text": None}
    except OSError as exc:
        return {"path": path, "exists": os.path.lexists(path), "text": None, "error": str(exc)}


def _as_user(entry):
    def switch():
        os.setgroups(os.getgrouplist(entry.pw_name, entry.pw_gid))
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    return switch


def _run(probe):
    required = probe.get("if_exists")
    if required and not os.path.exists(_path(required)):
        return {"rc": None, "skipped": f"{_path(required)} does not exist"}
    argv = [_path(arg) for arg in probe["run"]]
    env = dict(os.environ)
    env.update({name: str(value) for name, value in (probe.get("env") or {}).items()})
    switch = None
    if probe.get("user"):
        try:
            entry = pwd.getpwnam(probe["user"])
        except KeyError:
            return {"rc": None, "skipped": f"no account {probe['user']}"}
        if entry.pw_uid != os.getuid():
            switch = _as_user(entry)
        env.update({"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name})
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            cwd="/",
            preexec_fn=switch,
            check=False,
        )
    except OSError as exc:  # not there, not executable
        return {"rc": 127, "stdout": "", "stdout_lines": [], "stderr": f"{argv[0]}: {exc.strerror}"}
    stdout = done.stdout.decode("utf-8", "replace")
    return {
        "rc": done.returncode,
        "stdout": stdout,
        "stdout_lines": stdout.splitlines(),
        "stderr": done.stderr.decode("utf-8", "replace"),
    }


def read(probe):
    if "account" in probe:
        return _account(probe["account"])
    if "file" in probe:
        return _file(_path(probe["file"]))
    if "exists" in probe:
        path = _path(probe["exists"])
        return {"path": path, "exists": os.path.exists(path)}
    if "run" in probe:
        return _run(probe)
    if "glob" in probe:
        return {"paths": sorted(glob.glob(_path(probe["glob"])))}
    raise ValueError(f"probe {probe.get('key')!r}: none of account, file, exists, run, glob")


def main(argv):
    probes = json.loads(argv[1])
    print(json.dumps({probe["key"]: read(probe) for probe in probes}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
