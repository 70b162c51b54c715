"""systemd units as systemd merges them (the unit file, then its drop-ins), read from any file tree: what
the persistence rule reads for nvidia-persistenced (and verify/testinfra/test_nvidia_driver.py on a host)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .core import Host, read_text

# Where systemd looks for a system unit and its drop-in folders (<unit>.d/*.conf), most important first.
SYSTEMD_UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/lib/systemd/system",
    "/usr/lib/systemd/system",
)


@dataclass
class Unit:
    """A systemd unit as systemd merges it: its unit file, then its drop-ins in systemd's order."""

    name: str
    path: Optional[str]
    dropins: List[str]
    settings: Dict[str, Dict[str, List[str]]]

    @property
    def sources(self) -> List[str]:
        return ([self.path] if self.path else []) + self.dropins

    def values(self, section: str, key: str) -> List[str]:
        return list(self.settings.get(section, {}).get(key, []))

    def value(self, section: str, key: str) -> Optional[str]:
        values = self.values(section, key)
        return values[-1] if values else None


def unit_assignments(text: str) -> List[Tuple[str, str, str]]:
    """(section, key, value) of a unit file or drop-in, in order (systemd.syntax(7)): blank lines and
    comments (# or ;) skipped, a line ending in a backslash continued on the next one."""
    found: List[Tuple[str, str, str]] = []
    section = ""
    pending = ""  # a continued line so far, its backslashes replaced by spaces
    for raw in [*text.splitlines(), ""]:
        line = raw.strip()
        if pending and line[:1] in ("#", ";"):
            continue  # a comment inside a continued line
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, sep, value = line.partition("=")
        if sep:
            found.append((section, key.strip(), value.strip()))
    return found


def merge_unit(texts: Sequence[str]) -> Dict[str, Dict[str, List[str]]]:
    """section -> setting -> values after reading ``texts`` in order (the unit file, then each drop-in), as
    systemd does: an assignment adds to the setting's list, an empty one (``ExecStart=``) resets it; a
    single-valued setting (StopWhenUnneeded) is the list's last value."""
    settings: Dict[str, Dict[str, List[str]]] = {}
    for text in texts:
        for section, key, value in unit_assignments(text):
            values = settings.setdefault(section, {}).setdefault(key, [])
            if value:
                values.append(value)
            else:
                values.clear()
    return settings


def load_unit(
    name: str,
    list_dir: Callable[[str], Iterable[str]],
    read: Callable[[str], Optional[str]],
    dirs: Sequence[str] = SYSTEMD_UNIT_DIRS,
) -> Unit:
    """The unit ``name`` as systemd loads it, through ``list_dir`` (a folder's entry names, none when it is
    missing) and ``read`` (a file's text, None when it is missing), so that it works on any file tree:
    the unit file of the first folder of ``dirs`` that has one, then every ``<folder>/<name>.d/*.conf`` of
    all folders sorted by file name, a file name in a more important folder hiding it in the others."""
    path: Optional[str] = None
    text: Optional[str] = None
    for folder in dirs:
        text = read(f"{folder}/{name}")
        if text is not None:
            path = f"{folder}/{name}"
            break
    chosen: Dict[str, str] = {}
    for folder in dirs:
        for entry in list_dir(f"{folder}/{name}.d"):
            if entry.endswith(".conf"):
                chosen.setdefault(entry, f"{folder}/{name}.d/{entry}")
    dropins = [chosen[entry] for entry in sorted(chosen)]
    texts = ([text] if text is not None else []) + [read(dropin) or "" for dropin in dropins]
    return Unit(name, path, dropins, merge_unit(texts))


def host_unit(host: Host, name: str) -> Unit:
    """``name`` as systemd would load it from the host's files (no running systemd needed)."""

    def list_dir(folder: str) -> List[str]:
        try:
            return sorted(os.listdir(host.path(folder)))
        except OSError:
            return []

    def read(path: str) -> Optional[str]:
        target = host.path(path)
        if not os.path.lexists(str(target)):
            return None
        return read_text(target) or ""  # a unit masked by a link to /dev/null reads as empty

    return load_unit(name, list_dir, read)


def exec_argv(value: str) -> List[str]:
    """An Exec*= command line as a list (systemd's quoting), without its prefixes (-, @, :, +, !)."""
    try:
        argv = shlex.split(value)
    except ValueError:
        argv = value.split()
    while argv and argv[0][:1] in ("-", "@", ":", "+", "!"):
        argv[0] = argv[0][1:]
        if not argv[0]:
            argv = argv[1:]
    return argv


def unit_bool(value: Optional[str], default: bool = False) -> bool:
    """A systemd boolean (1, yes, true, on / 0, no, false, off)."""
    if value is None or not value.strip():
        return default
    return value.strip().lower() in ("1", "yes", "y", "true", "t", "on")
