"""The "host unchanged" fingerprint: a text that describes a host's state, taken before and after a
run that must change nothing, and compared.

It sees state, not just modification times: a file is listed when its change time (ctime: set by the
kernel on every content, mode, owner, link or xattr change, and never settable back, so an
mtime-preserving rewrite or a tar/`unarchive` re-extraction still shows) or its mtime is newer than a
marker file touched when the host started, with its type, mode, owner, size, a sha256 of its content
(files up to HASH_CAP; bigger ones: size, mtime and ctime), a hash of its xattrs (ACLs, capabilities),
a link's target, a directory's entry names. Besides: the dpkg package states, the users and groups
(password fields and the shadow files only as hashes), the enabled/masked systemd units (symlinks
under /etc/systemd/system: readable without systemd running), and new files over LARGE in /tmp and
/run. Sorted and free of timestamps (but a big file's), so two fingerprints of an untouched host are
equal.

A file changed after the marker and changed again (to the same state) between two fingerprints is not
told apart; a file changed for the first time since the marker appears, even if it was changed back.

SOURCE is one Python program (3.8: the focal hosts' python3) run as
`python3 -I -B -c SOURCE ROOT MARKER [options]`; script() wraps it in a bash command line for
`docker exec HOST bash -c`. ROOT is / on a host, a temporary tree in the unit tests.
"""

from __future__ import annotations

import shlex

MIB = 1024 * 1024
HASH_CAP = 64 * MIB  # files up to this are hashed; bigger ones: size, mtime and ctime
LARGE = 1 * MIB  # new files over this in the WATCH_LARGE trees are listed

# Not walked, relative to the root. Each with its reason: a toolkit change there is not wanted to show,
# or it is not the host's state.
PRUNE = (
    "/proc",  # the kernel's, not files
    "/sys",  # the kernel's
    "/dev",  # devices and /dev/shm (a tmpfs): the kernel's and docker's
    "/tmp",  # scratch space, changed by any program (a heredoc, a module's temp file): WATCH_LARGE instead
    "/run",  # runtime state (pids, locks, sockets): WATCH_LARGE instead
    "/root/.ansible",  # Ansible's remote_tmp: its connection writes module files there on every task
    "/root/.ansible_async",  # Ansible's job status files of async tasks: its bookkeeping, not the host's
)
# Not walked wherever they are: Python's bytecode cache, written by any interpreter that imports a
# module without one (Ansible's modules run the host's python3).
PRUNE_NAMES = ("__pycache__",)
# Pruned from the walk, watched only for new files over LARGE (a download or an unpacked archive
# left behind fills a disk as surely as one anywhere else).
WATCH_LARGE = ("/tmp", "/run")

SOURCE = r'''
import argparse, hashlib, os, shutil, stat, subprocess, sys

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("marker")
p.add_argument("--prune", action="append", default=[])
p.add_argument("--prune-name", action="append", default=[])
p.add_argument("--watch-large", action="append", default=[])
p.add_argument("--hash-cap", type=int, required=True)
p.add_argument("--large", type=int, required=True)
a = p.parse_args()

ROOT = os.path.abspath(a.root)
MARKER = os.path.abspath(a.marker)
SINCE = os.lstat(MARKER).st_mtime_ns
out = []


def shown(path):
    """The path as on the host (relative to the root), on one line."""
    rel = "/" + os.path.relpath(path, ROOT) if path != ROOT else "/"
    text = os.fsencode(rel).decode("ascii", "backslashreplace")
    return text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "\\x20")


def under_root(path):
    return os.path.normpath(os.path.join(ROOT, path.lstrip("/")))


PRUNED = {under_root(x) for x in a.prune} | {MARKER}
NAMES = set(a.prune_name)
# A pruned path's ancestors are always listed, with their entries less the pruned ones: what the
# pruned trees do to them (created once, by Ansible's first connection; on overlayfs, a write below
# copies every ancestor up and gives it a new ctime) must not make them appear.


def ancestors(path):
    found = set()
    while path != ROOT and os.path.commonpath([ROOT, path]) == ROOT:
        path = os.path.dirname(path)
        found.add(path)
    return found


ALWAYS = {ROOT}.union(*(ancestors(x) for x in PRUNED))


def sha(data):
    return hashlib.sha256(data).hexdigest()


def file_sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def xattrs(path):
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        return "-"
    if not names:
        return "-"
    h = hashlib.sha256()
    for name in names:
        try:
            value = os.getxattr(path, name, follow_symlinks=False)
        except OSError:
            value = b"?"
        h.update(os.fsencode(name) + b"\0" + value + b"\0")
    return h.hexdigest()[:16]


def newer(st):
    return max(st.st_mtime_ns, st.st_ctime_ns) > SINCE


def line(path, st, entries=None):
    mode = st.st_mode
    kind = {stat.S_IFREG: "f", stat.S_IFDIR: "d", stat.S_IFLNK: "l", stat.S_IFIFO: "p", stat.S_IFSOCK: "s",
            stat.S_IFCHR: "c", stat.S_IFBLK: "b"}.get(stat.S_IFMT(mode), "?")
    fields = [shown(path), kind, "%04o" % stat.S_IMODE(mode), "%d:%d" % (st.st_uid, st.st_gid)]
    if kind == "f":
        fields.append("size=%d" % st.st_size)
        if st.st_size <= a.hash_cap:
            try:
                fields.append("sha256=" + file_sha(path))
            except OSError as e:
                fields.append("unreadable=" + e.__class__.__name__)
        else:
            fields.append("mtime=%d ctime=%d" % (st.st_mtime_ns, st.st_ctime_ns))
    elif kind == "l":
        fields.append("-> " + os.fsencode(os.readlink(path)).decode("ascii", "backslashreplace"))
    elif kind in "cb":
        fields.append("dev=%d,%d" % (os.major(st.st_rdev), os.minor(st.st_rdev)))
    elif kind == "d":
        fields.append("entries=" + (entries if entries is not None else "other-filesystem"))
    fields.append("xattr=" + xattrs(path))
    return " ".join(fields)


def walk(top, visit, pruned=PRUNED, names=NAMES):
    """Depth first under `top`, not into other file systems nor pruned paths: visit(path, st, entries)
    for every entry (entries: a hash of a directory's entry names, None for other entries)."""
    top_st = os.lstat(top)
    stack = [(top, top_st)]
    while stack:
        d, st = stack.pop()
        try:
            children = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            visit(d, st, None)
            continue
        kept = []
        for e in children:
            if e.path in pruned or e.name in names:
                continue
            kept.append(e.name)
            try:
                cst = os.lstat(e.path)
            except OSError:  # gone meanwhile
                continue
            if stat.S_ISDIR(cst.st_mode) and cst.st_dev == top_st.st_dev:
                stack.append((e.path, cst))
            else:
                visit(e.path, cst, None)
        visit(d, st, sha("\0".join(kept).encode("utf-8", "surrogateescape"))[:16])


def changed(path, st, entries):
    if path in ALWAYS or newer(st):
        changes.append(line(path, st, entries))


def read_lines(rel):
    try:
        with open(under_root(rel), "rb") as f:
            return f.read().decode("utf-8", "backslashreplace").splitlines()
    except OSError:
        return None


# (1) package states
out.append("# packages (dpkg-query)")
if ROOT != "/":
    out.append("skipped: the root is not /")
elif not shutil.which("dpkg-query"):
    out.append("skipped: no dpkg-query")
else:
    listing = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n"],
                             stdout=subprocess.PIPE, check=True).stdout.decode("utf-8", "backslashreplace")
    out += sorted("pkg " + x for x in listing.splitlines())

# (2) users and groups; password fields and shadow entries only as hashes
out.append("# users and groups")
for rel, secret_field in (("/etc/passwd", 1), ("/etc/group", 1), ("/etc/shadow", 1), ("/etc/gshadow", 1)):
    rows = read_lines(rel)
    if rows is None:
        out.append("%s absent" % rel)
        continue
    shadow = "shadow" in rel
    for row in sorted(rows):
        fields = row.split(":")
        if shadow:  # the name, and a hash of the rest
            out.append("%s %s %s" % (rel, fields[0], sha(":".join(fields[1:]).encode())[:16]))
            continue
        if len(fields) > secret_field and fields[secret_field] not in ("x", "*", "!", ""):
            fields[secret_field] = "sha256:" + sha(fields[secret_field].encode())[:16]
        out.append("%s %s" % (rel, ":".join(fields)))

# (3) enabled and masked systemd units: the symlinks under /etc/systemd/system
out.append("# systemd unit links (/etc/systemd/system)")
units = under_root("/etc/systemd/system")
links = []
if os.path.isdir(units):
    for d, dirs, files in os.walk(units):
        for name in dirs + files:
            path = os.path.join(d, name)
            if os.path.islink(path):
                links.append("unit %s -> %s" % (shown(path), os.readlink(path)))
out += sorted(links)

# (4) everything changed since the marker, the pruned trees aside
out.append("# changed since the marker")
changes = []
walk(ROOT, changed)
out += sorted(changes)

# (5) new large files in the scratch trees
out.append("# new files over %d bytes in %s" % (a.large, " ".join(a.watch_large)))
large = []


def big(path, st, entries):
    if stat.S_ISREG(st.st_mode) and st.st_size > a.large and newer(st):
        large.append("%s size=%d" % (shown(path), st.st_size))


for top in a.watch_large:
    top = under_root(top)
    if os.path.isdir(top) and not os.path.islink(top):
        walk(top, big, pruned=set(), names=set())
out += sorted(large)

sys.stdout.write("\n".join(out) + "\n")
'''


def script(
    marker: str = "/msgpu-marker",
    root: str = "/",
    prune: tuple[str, ...] = PRUNE,
    prune_names: tuple[str, ...] = PRUNE_NAMES,
    watch_large: tuple[str, ...] = WATCH_LARGE,
    hash_cap: int = HASH_CAP,
    large: int = LARGE,
    python: str = "python3",
) -> str:
    """A bash command line that prints the fingerprint of `root` since `marker` (no temporary file:
    the program travels as an argument)."""
    args = [python, "-I", "-B", "-c", SOURCE, root, marker, "--hash-cap", str(hash_cap), "--large", str(large)]
    args += [f"--prune={p}" for p in prune]
    args += [f"--prune-name={n}" for n in prune_names]
    args += [f"--watch-large={w}" for w in watch_large]
    return "set -e; exec " + " ".join(shlex.quote(x) for x in args)
