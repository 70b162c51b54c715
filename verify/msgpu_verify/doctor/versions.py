"""Version numbers and PEP 440 specifiers without pre-release subtleties (the driver's minimum, NCCL's plugin
folders, the venv's pins), and distribution names as pip normalizes them."""

from __future__ import annotations

import re
from typing import List, Tuple


def version_key(version: str) -> Tuple[int, ...]:
    """Numeric parts of a version, '470.82.01' -> (470, 82, 1); text after the digits is ignored."""
    parts: List[int] = []
    for part in re.split(r"[.+-]", str(version)):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        parts.append(int(digits.group(0)))
    return tuple(parts)


def _compare(left: Tuple[int, ...], right: Tuple[int, ...]) -> int:
    width = max(len(left), len(right))
    a = left + (0,) * (width - len(left))
    b = right + (0,) * (width - len(right))
    return (a > b) - (a < b)


def satisfies(version: str, specifier: str) -> bool:
    """``specifier`` like '<1.24' or '>=1.17,<1.24' (PEP 440 operators without pre-release subtleties)."""
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        match = re.match(r"(===|==|!=|<=|>=|~=|<|>)\s*(.+)", clause)
        if not match:
            continue
        op, wanted = match.groups()
        if op in ("==", "===", "!=") and wanted.endswith(".*"):
            same = version_key(version)[: len(version_key(wanted[:-2]))] == version_key(wanted[:-2])
            if same != (op != "!="):
                return False
            continue
        cmp = _compare(version_key(version), version_key(wanted))
        if op == "~=":
            prefix = version_key(wanted)[:-1]
            ok = cmp >= 0 and version_key(version)[: len(prefix)] == prefix
        else:
            ok = {"<": cmp < 0, "<=": cmp <= 0, ">": cmp > 0, ">=": cmp >= 0, "==": cmp == 0, "===": cmp == 0}.get(
                op, cmp != 0
            )
        if not ok:
            return False
    return True


def split_requirement(requirement: str) -> Tuple[str, str]:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", requirement)
    if not match:
        return requirement.strip(), ""
    return normalize(match.group(1)), match.group(2).split(";")[0].strip()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
