"""Generate catalog/gpu_ids.yml: the PCI device IDs each NVIDIA driver branch drives, from Ubuntu's real packages.

Ubuntu's `nvidia-driver-<branch>` packages carry, in their `Modaliases:` control field, the PCI IDs
of every GPU the driver binds to (`nvidia(pci:v000010DEd00002204sv*sd*bc03sc*i*, ...)`; ubuntu-drivers
matches hardware against the same field). This script starts one Ubuntu 20.04 sandbox container,
runs `apt-get update`, reads the candidate version of each package with `apt-cache policy` and
`apt-cache show <package>=<version>`, and writes the device IDs of each branch with the package and
exact version they came from. Branches that focal only carries as transitional packages (510, 515,
525: `nvidia-driver-510` is a "Transitional package for nvidia-driver-535") are recorded as such,
with the branch they install instead and no list of their own.

GPU names: the packages' own list, NVIDIA's "supported chips" appendix of the README
(/usr/share/doc/nvidia-driver-<branch>/html/supportedchips.html in each real branch's .deb, fetched
with `apt-get download`; 570 ships no supported-gpus.json, every branch ships this page); focal's
pci.ids (2020-03) predates the RTX 3090, so it is not used. Names are kept only for IDs
that some branch drives; the newest branch's name wins.

    python -m testbed.gpu_ids                   # regenerate catalog/gpu_ids.yml
    python -m testbed.gpu_ids --output FILE     # write elsewhere (to compare)
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from testbed import sandbox

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "catalog" / "gpu_ids.yml"
CONTAINER = "msgpu-gen-gpuids"
BRANCHES = ["470", "510", "515", "525", "535", "570"]
MODALIAS_RE = re.compile(r"pci:v000010DEd0000([0-9A-Fa-f]{4})sv")
SUITE_RE = re.compile(r"^\s+\d+\s+\S+\s+(focal[\w-]*)/(\w+)\s")
CHIP_ROW_RE = re.compile(r'<tr id="devid([0-9A-Fa-f]{4})([^"]*)">\s*<td>([^<]*)</td>')
TRANSITIONAL_RE = re.compile(r"^nvidia-driver-(\d+)$")
WRAP = 110


def log(message: str) -> None:
    print(f"[gpu_ids] {message}", file=sys.stderr, flush=True)


def sh(command: str) -> str:
    """Run `command` with sh in the container; its stdout."""
    result = subprocess.run(["docker", "exec", CONTAINER, "sh", "-c", command], text=True, capture_output=True)
    if result.returncode != 0:
        raise sandbox.SandboxError(f"in {CONTAINER}: {command}\n{(result.stderr or result.stdout).strip()[-2000:]}")
    return result.stdout


def parse_stanza(text: str) -> dict[str, str]:
    """One apt-cache show stanza as {field: value} (continuation lines after a newline)."""
    fields: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith((" ", "\t")) and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def candidate(package: str) -> tuple[str, list[str]]:
    """The version apt would install and the archive suites that carry it."""
    version, suites, current = "", [], ""
    for line in sh(f"apt-cache policy {package}").splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
        elif line[:5] in (" *** ", "     ") and line[5:6].strip():  # a version line of the table
            current = line[5:].split()[0]
        elif current == version and (match := SUITE_RE.match(line)):
            suites.append(match.group(1))
    if version in ("", "(none)"):
        raise sandbox.SandboxError(f"{package}: no candidate version in focal's archive")
    return version, suites


def read_branch(branch: str) -> dict:
    package = f"nvidia-driver-{branch}"
    version, suites = candidate(package)
    stanza = parse_stanza(sh(f"apt-cache show {package}={version}"))
    record: dict = {
        "package": package,
        "version": version,
        "source": f"Ubuntu focal archive ({'/'.join(dict.fromkeys(suites))})",
    }
    ids = sorted({m.lower() for m in MODALIAS_RE.findall(stanza.get("Modaliases", ""))})
    if ids:
        record["driver_version"] = version.split("-")[0]
        record["ids"] = ids
        return record
    target = TRANSITIONAL_RE.match(stanza.get("Depends", ""))
    if not target or "transitional" not in stanza.get("Description-en", "").lower():
        raise sandbox.SandboxError(f"{package} {version}: no Modaliases and not a transitional package")
    record["transitional_to"] = target.group(1)
    record["note"] = stanza["Description-en"].splitlines()[0]
    return record


def read_names(branches: dict[str, dict]) -> tuple[dict[str, str], list[str]]:
    """GPU names from each real branch's supportedchips.html, newest branch first; only driven IDs."""
    wanted = {i for record in branches.values() for i in record.get("ids", [])}
    names: dict[str, str] = {}
    sources = []
    real = [b for b, r in branches.items() if "ids" in r]
    for branch in sorted(real, key=int, reverse=True):
        record = branches[branch]
        package, version = record["package"], record["version"]
        page = sh(
            f"cd /tmp && apt-get download -qq {package}={version} >/dev/null && "
            f"dpkg-deb --fsys-tarfile {package}_*.deb | tar -xO ./usr/share/doc/{package}/html/supportedchips.html"
        )
        sources.append(f"{package} {version}")
        own: dict[str, str] = {}
        for devid, board, name in CHIP_ROW_RE.findall(page):
            devid = devid.lower()
            # A row with a subsystem suffix names one board of the chip; the plain row names the chip.
            if devid in wanted and (not board or devid not in own):
                own[devid] = html.unescape(name).strip()
        for devid, name in own.items():
            names.setdefault(devid, name)
    return dict(sorted(names.items())), sources


def flow_list(items: list[str], indent: int) -> list[str]:
    """A YAML flow sequence of quoted strings, wrapped to WRAP columns."""
    pad = " " * indent
    lines, line = [], ""
    for item in items:
        token = json.dumps(item) + ","
        if line and len(pad) + len(line) + 1 + len(token) > WRAP:
            lines.append(pad + line)
            line = token
        else:
            line = f"{line} {token}" if line else token
    if line:
        lines.append(pad + line.rstrip(","))
    return ["[", *lines, " " * (indent - 2) + "]"] if lines else ["[]"]


def render(branches: dict[str, dict], names: dict[str, str], name_sources: list[str]) -> str:
    out = [
        "---",
        "# GENERATED by `python -m testbed.gpu_ids` (testbed/gpu_ids.py): do not edit by hand, run it again.",
        "#",
        "# The PCI device IDs (vendor 10de) each NVIDIA driver branch drives, read from the `Modaliases:`",
        "# field of Ubuntu focal's nvidia-driver-<branch> package (the candidate version apt installs),",
        "# with the package and exact version each list came from. A branch focal only carries as a",
        "# transitional package has `transitional_to`: installing it installs that branch, whose list",
        "# applies. `names`: GPU names from the packages' own supportedchips.html (newest branch first).",
        "# Used by the `stack` role's GPU preflight (roles/stack/filter_plugins/gpu_support.py).",
        "gpu_ids_format: 1",
        "branches:",
    ]
    for branch, record in branches.items():
        out.append(f"  {json.dumps(branch)}:")
        for key in ("package", "version", "driver_version", "source", "transitional_to", "note"):
            if key in record:
                out.append(f"    {key}: {json.dumps(record[key])}")
        if "ids" in record:
            out.append(f"    count: {len(record['ids'])}")
            first, *rest = flow_list(record["ids"], 6)
            out.append(f"    ids: {first}")
            out.extend(rest)
    out.append("names_from:")
    out.extend(f"  - {json.dumps(source)}" for source in name_sources)
    out.append("names:")
    out.extend(f"  {json.dumps(devid)}: {json.dumps(name)}" for devid, name in names.items())
    return "\n".join(out) + "\n"


def generate(output: Path) -> Path:
    started = time.monotonic()
    sandbox.ensure_docker()
    sandbox.start_host(CONTAINER, "focal")
    try:
        log("apt-get update in an Ubuntu 20.04 container")
        sh("apt-get update -qq")
        branches = {b: read_branch(b) for b in BRANCHES}
        for branch, record in branches.items():
            target = record.get("transitional_to")
            if target and "ids" not in branches.get(target, {}):
                raise sandbox.SandboxError(f"nvidia-driver-{branch} installs branch {target}, which has no list here")
        names, name_sources = read_names(branches)
    finally:
        sandbox.stop_host(CONTAINER)
    output.write_text(render(branches, names, name_sources))
    for branch, record in branches.items():
        what = f"{len(record['ids'])} IDs" if "ids" in record else f"transitional to {record['transitional_to']}"
        log(f"{branch}: {record['package']} {record['version']}: {what}")
    log(f"wrote {output} ({output.stat().st_size} bytes) in {time.monotonic() - started:.0f} s")
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"file to write (default {OUTPUT})")
    args = parser.parse_args(argv)
    try:
        generate(args.output)
    except sandbox.SandboxError as exc:
        print(f"gpu_ids: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
