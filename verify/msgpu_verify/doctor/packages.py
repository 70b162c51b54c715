"""The python-packages rule: the MindSpore venv's distributions against the stack's pins, and MindSpore packages
side by side."""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .core import Finding, Host, read_text
from .versions import normalize, satisfies, split_requirement

MINDSPORE_DISTRIBUTIONS = ("mindspore", "mindspore-gpu", "mindspore-cpu", "mindspore-ascend", "mindspore-dev")


def installed_distributions(site_dirs: Sequence[Path]) -> Dict[str, List[Tuple[str, str]]]:
    """normalized name -> [(version, metadata folder)] for every *.dist-info / *.egg-info found."""
    found: Dict[str, List[Tuple[str, str]]] = {}
    for site in site_dirs:
        for meta in sorted(list(site.glob("*.dist-info")) + list(site.glob("*.egg-info"))):
            text = read_text(meta / "METADATA") or read_text(meta / "PKG-INFO") or ""
            name = re.search(r"^Name:\s*(\S+)", text, re.MULTILINE)
            version = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
            if name and version:
                found.setdefault(normalize(name.group(1)), []).append((version.group(1), str(meta)))
    return found


def rule_python_packages(host: Host, env: Dict[str, str]) -> List[Finding]:
    ms = host.expect.get("mindspore") or {}
    venv = env.get("VIRTUAL_ENV") or ms.get("venv") or ""
    if not venv:
        return []
    sites = [Path(p) for p in sorted(glob.glob(str(host.path(venv)) + "/lib/python*/site-packages"))]
    if not sites:
        return [
            Finding(
                "venv-missing",
                "error",
                f"The MindSpore virtualenv {venv} has no site-packages",
                [f"{venv}/lib/python*/site-packages: not found"],
                "Run `./toolkit provision` (role mindspore builds the virtualenv).",
            )
        ]
    dists = installed_distributions(sites)
    findings: List[Finding] = []
    for pin in ms.get("pins") or []:
        name, spec = split_requirement(pin)
        for version, where in dists.get(name, []):
            if not satisfies(version, spec):
                findings.append(
                    Finding(
                        f"pin-violated:{name}",
                        "error",
                        f"{name} {version} is installed, but {ms.get('package', 'MindSpore')} "
                        f"{ms.get('version', '')} needs {pin}",
                        [f"{host.shown(Path(where))}: {name} {version}", f"catalog pin: {pin}"],
                        f"Reinstall within the pin: `{venv}/bin/pip install -c {venv}/msgpu-constraints.txt "
                        f"'{pin}'` (the env file exports PIP_CONSTRAINT so later installs keep it), or rerun "
                        "`./toolkit provision`.",
                    )
                )
    products = [(n, v, w) for n in MINDSPORE_DISTRIBUTIONS for v, w in dists.get(n, [])]
    if len(products) > 1:
        findings.append(
            Finding(
                "mindspore-packages-conflict",
                "error",
                "More than one MindSpore package is installed; they overwrite each other's `mindspore` folder",
                [f"{host.shown(Path(w))}: {n} {v}" for n, v, w in products],
                f"Keep only {ms.get('package', 'the stack package')}: `{venv}/bin/pip uninstall -y "
                + " ".join(n for n, _, _ in products)
                + "`, then `./toolkit provision` to reinstall the stack's wheel.",
            )
        )
    elif not products and ms.get("package"):
        findings.append(
            Finding(
                "mindspore-not-installed",
                "error",
                f"{ms['package']} is not installed in {venv}",
                [f"no mindspore*.dist-info in {', '.join(host.shown(s) for s in sites)}"],
                "Run `./toolkit provision` (role mindspore).",
            )
        )
    return findings
