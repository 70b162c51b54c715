"""Generate catalog/gpu_ids.yml: the PCI device IDs each NVIDIA driver branch drives, and each ID's compute capability.

Two pinned sources, nothing typed by hand:

* `branches` and `names` come from Ubuntu's `nvidia-driver-<branch>` packages (`--archive` re-reads them).
  Their `Modaliases:` control field lists the PCI IDs of every GPU the driver binds to
  (`nvidia(pci:v000010DEd00002204sv*sd*bc03sc*i*, ...)`; ubuntu-drivers matches hardware against the
  same field). `--archive` starts one Ubuntu 20.04 sandbox container (testbed.sandbox, so Docker),
  runs `apt-get update`, reads the candidate version of each package with `apt-cache policy` and
  `apt-cache show <package>=<version>`, and records the device IDs of each branch with the package and
  exact version they came from. Branches that focal only carries as transitional packages (510, 515,
  525: `nvidia-driver-510` is a "Transitional package for nvidia-driver-535") are recorded as such,
  with the branch they install instead and no list of their own. GPU names: NVIDIA's "supported chips"
  appendix of the README (/usr/share/doc/nvidia-driver-<branch>/html/supportedchips.html in each real
  branch's .deb, fetched with `apt-get download`; 570 ships no supported-gpus.json, every branch ships
  this page), kept only for IDs that some branch drives; the newest branch's name wins.
* `compute` (chip and CUDA compute capability of every ID above) comes from NVIDIA's vendor block of
  pci.ids, cut from pciutils/pciids at the commit in PCI_IDS and kept as catalog/upstream/pci.ids-10de
  (its sha256 is EXTRACT_SHA256: a changed extract is refused): each device line starts with the chip
  code (`2204  GA102 [GeForce RTX 3090]`), which CHIP_CC maps to the compute capability.

The default mode is offline: it reads `branches`, `names_from` and `names` from catalog/gpu_ids.yml as
they are, adds `compute` from the extract, and writes the whole file again (the same bytes when nothing
changed).

    python catalog/tools/gpu_ids.py                   # re-render catalog/gpu_ids.yml (offline)
    python catalog/tools/gpu_ids.py --check           # exit 1, with a diff summary, if it would change
    python catalog/tools/gpu_ids.py --output FILE     # write elsewhere (to compare)
    python catalog/tools/gpu_ids.py --archive         # re-read Ubuntu focal's packages (Docker)
    python catalog/tools/gpu_ids.py --pin DIR         # cut a new extract from a pciutils/pciids clone
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import html
import json
import re
import subprocess
import sys
import time
from pathlib import Path

try:
    import yaml
except ImportError:  # pragma: no cover - the toolkit's .venv has it (requirements.txt)
    sys.exit("gpu_ids: needs PyYAML: run it with the toolkit's Python (.venv/bin/python catalog/tools/gpu_ids.py)")

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "catalog" / "gpu_ids.yml"
EXTRACT = ROOT / "catalog" / "upstream" / "pci.ids-10de"
COMMAND = "python catalog/tools/gpu_ids.py"

# The pinned pci.ids: https://github.com/pciutils/pciids at this commit (its committer date), the sha256
# of the whole pci.ids there, and the sha256 of the extract committed here (NVIDIA's block with a header).
# `--pin DIR` cuts a new extract and prints the values to put here.
PCI_IDS = {
    "repository": "pciutils/pciids",
    "commit": "c1c12547d626ebf05fd0223144ad87fab5e95d06",
    "date": "2026-08-22T03:15:04+02:00",
    "sha256": "7c0995c42c9891846f3e427921826cbc2a09de6c135472922b6c6d04004c95ad",
}
EXTRACT_SHA256 = "814b5008ffa5acb15fd781cb7dc9519a89d3af037294f4e758903cfb9a10d113"
VENDOR_LINE = "10de  NVIDIA Corporation"

# Chip -> CUDA compute capability. Sources: NVIDIA's CUDA GPUs list (https://developer.nvidia.com/cuda-gpus,
# older boards on https://developer.nvidia.com/cuda-legacy-gpus) and the compute-capability table of the
# CUDA C++ Programming Guide (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#compute-capabilities).
# NVIDIA lists boards, not chips: each entry names the boards of that chip checked on those lists (pci.ids
# names the board beside the chip). Checked 2026-08 with the lists as stored by the search tool (corpus docs:
# cuda-gpus and cuda-legacy-gpus pages).
CHIP_CC = {
    # Kepler. GK110B/GK208B (and pci.ids' GK180, the K40c) are respins: see REVISION_RE.
    "GK104": "3.0",  # GeForce GTX 680/770, Tesla K10, Quadro K5000/K4200: 3.0
    "GK106": "3.0",  # GeForce GTX 660/650 Ti, Quadro K4000: 3.0
    "GK107": "3.0",  # GeForce GT 640/740, Quadro K2000/K600/K420: 3.0
    "GK110": "3.5",  # GeForce GTX 780/780 Ti/TITAN/TITAN Black/TITAN Z, Tesla K20, Quadro K6000/K5200: 3.5
    "GK180": "3.5",  # Tesla K40c (pci.ids: GK180GL): Tesla K40: 3.5
    "GK208": "3.5",  # GeForce GT 730/710, GeForce 920M, Quadro K610M/K510M: 3.5
    "GK20A": "3.2",  # Tegra K1 (Jetson TK1): 3.2 (Programming Guide; no PCI ID of it is driven here)
    "GK210": "3.7",  # Tesla K80: 3.7
    # Maxwell
    "GM107": "5.0",  # GeForce GTX 750 Ti/750, Quadro K2200/K620, NVS 810: 5.0
    "GM108": "5.0",  # GeForce 940M/930M/840M/830M, Quadro K620M/M500M: 5.0
    "GM200": "5.2",  # GeForce GTX TITAN X/980 Ti, Quadro M6000: 5.2
    "GM204": "5.2",  # GeForce GTX 980/970/980M, Tesla M60, Quadro M5000/M4000: 5.2
    "GM206": "5.2",  # GeForce GTX 960/950/965M, Quadro M2000: 5.2
    "GM20B": "5.3",  # Tegra X1 (Jetson Nano, TX1): 5.3
    # Pascal
    "GP100": "6.0",  # Tesla P100, Quadro GP100: 6.0
    "GP102": "6.1",  # TITAN Xp, TITAN X (Pascal), GTX 1080 Ti, Tesla P40, Quadro P6000: 6.1
    "GP104": "6.1",  # GeForce GTX 1080/1070, Tesla P4, Quadro P5000/P4000: 6.1
    "GP106": "6.1",  # GeForce GTX 1060, Quadro P2000/P2200: 6.1
    "GP107": "6.1",  # GeForce GTX 1050, Quadro P1000/P600/P400: 6.1
    "GP108": "6.1",  # GeForce GT 1030 and MX150 (GP108M), Quadro P500/P520: 6.1
    "GP10B": "6.2",  # Tegra X2 (Jetson TX2): 6.2
    # Volta
    "GV100": "7.0",  # NVIDIA V100, TITAN V, Quadro GV100: 7.0
    "GV10B": "7.2",  # Xavier (Jetson AGX Xavier, Xavier NX): 7.2
    # Turing
    "TU102": "7.5",  # TITAN RTX, GeForce RTX 2080 Ti, Quadro RTX 8000/6000: 7.5
    "TU104": "7.5",  # GeForce RTX 2080/2070 SUPER, Tesla T4, Quadro RTX 5000/4000: 7.5
    "TU106": "7.5",  # GeForce RTX 2070/2060: 7.5
    "TU116": "7.5",  # GeForce GTX 1660 Ti/1660: 7.5
    "TU117": "7.5",  # GeForce GTX 1650, T1000/T600/T400: 7.5
    # Ampere
    "GA100": "8.0",  # NVIDIA A100, A30: 8.0
    "GA102": "8.6",  # GeForce RTX 3090/3080, RTX A6000/A5000, A40, A10: 8.6
    "GA103": "8.6",  # GeForce RTX 3080 Ti Laptop, RTX A5500 Laptop (GeForce RTX 30 series, RTX A-series): 8.6
    "GA104": "8.6",  # GeForce RTX 3070/3060 Ti, RTX A4000: 8.6
    "GA106": "8.6",  # GeForce RTX 3060, RTX A2000: 8.6
    "GA107": "8.6",  # GeForce RTX 3050, NVIDIA A2, RTX A1000: 8.6
    "GA10B": "8.7",  # Orin (Jetson AGX Orin, Orin NX, Orin Nano): 8.7
    # Ada Lovelace
    "AD102": "8.9",  # GeForce RTX 4090, L40/L40S, RTX 6000 Ada: 8.9
    "AD103": "8.9",  # GeForce RTX 4080, RTX 5000 Ada Laptop: 8.9
    "AD104": "8.9",  # GeForce RTX 4070 Ti/4070, NVIDIA L4, RTX 4000 Ada: 8.9
    "AD106": "8.9",  # GeForce RTX 4060 Ti: 8.9
    "AD107": "8.9",  # GeForce RTX 4060/4050, RTX 2000 Ada: 8.9
    # Hopper
    "GH100": "9.0",  # NVIDIA H100, H200, GH200: 9.0
    # Blackwell. Left out, as NVIDIA's lists name no board of theirs: GB102 (pci.ids: B100), GB10B (Jetson
    # Thor: listed as 11.0 today, 10.1 before CUDA 13), GB20B and GB10 (pci.ids' names for DGX Spark's GB10,
    # 12.1), GB112, GB120. An ID of one of them gets `cc: null`.
    "GB100": "10.0",  # NVIDIA B200, GB200: 10.0
    "GB110": "10.3",  # NVIDIA B300, GB300 (pci.ids: GB110 [B300 SXM6 AC], [GB300]): 10.3
    "GB202": "12.0",  # GeForce RTX 5090, RTX PRO 6000 Blackwell: 12.0
    "GB203": "12.0",  # GeForce RTX 5080/5070 Ti: 12.0
    "GB205": "12.0",  # GeForce RTX 5070: 12.0
    "GB206": "12.0",  # GeForce RTX 5060 Ti/5060: 12.0
    "GB207": "12.0",  # GeForce RTX 5050: 12.0
}
CHIPS_CITED = "CHIP_CC in catalog/tools/gpu_ids.py: developer.nvidia.com/cuda-gpus, CUDA C++ Programming Guide"

# The chip code that starts a pci.ids device name: architecture letters, then a three-digit chip with an
# optional respin letter B (GK110B, GK208B, and pci.ids' GP104BM, TU106BM, GA107BM: B + M) or a two-digit
# SoC part whose letter belongs to its name (GK20A, GM20B, GP10B, GV10B, GA10B); then the board suffix
# dropped here: GL (professional), GLM (professional mobile), M (mobile).
CHIP_RE = re.compile(r"^(?P<chip>(?:GF|GK|GM|GP|GV|TU|GA|AD|GH|GB)(?:\d{3}B?|\d{2}[A-Z]?))(?:GLM|GL|M)?$")
# A respin of a three-digit chip has the chip's compute capability (GK110B -> GK110).
REVISION_RE = re.compile(r"^(?P<base>[A-Z]{2}\d{3})B$")
DEVICE_RE = re.compile(r"^\t([0-9a-f]{4})  (.+)$")

# --archive: the Ubuntu packages (what `python -m testbed.gpu_ids` did before).
CONTAINER = "msgpu-gen-gpuids"
BRANCHES = ["470", "510", "515", "525", "535", "570"]
MODALIAS_RE = re.compile(r"pci:v000010DEd0000([0-9A-Fa-f]{4})sv")
SUITE_RE = re.compile(r"^\s+\d+\s+\S+\s+(focal[\w-]*)/(\w+)\s")
CHIP_ROW_RE = re.compile(r'<tr id="devid([0-9A-Fa-f]{4})([^"]*)">\s*<td>([^<]*)</td>')
TRANSITIONAL_RE = re.compile(r"^nvidia-driver-(\d+)$")
WRAP = 110


class GpuIdsError(RuntimeError):
    """A refusal, said to the maintainer as it is."""


def log(message: str) -> None:
    print(f"[gpu_ids] {message}", file=sys.stderr, flush=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- pci.ids: the pinned extract ---------------------------------------------------------------------


def read_extract(path: Path = EXTRACT) -> dict[str, str]:
    """{device id: pci.ids name} of NVIDIA's block, refused unless its sha256 is EXTRACT_SHA256."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GpuIdsError(f"{path}: {exc.strerror}; it is the pinned pci.ids extract (`{COMMAND} --pin DIR`)") from exc
    found = sha256(data)
    if found != EXTRACT_SHA256:
        raise GpuIdsError(
            f"{path}: sha256 {found}, but EXTRACT_SHA256 in catalog/tools/gpu_ids.py is {EXTRACT_SHA256}: the "
            f"pinned pci.ids extract was changed. Restore it (git checkout), or re-pin it from a pciutils/pciids "
            f"clone with `{COMMAND} --pin DIR` and put the values it prints in the tool."
        )
    lines = [line for line in data.decode("utf-8").splitlines() if line and not line.startswith("#")]
    if not lines or lines[0] != VENDOR_LINE:
        raise GpuIdsError(f"{path}: does not start with the vendor line {VENDOR_LINE!r}")
    devices = {}
    for line in lines[1:]:
        match = DEVICE_RE.match(line)
        if match:
            devices[match.group(1)] = match.group(2)
        elif not line.startswith("\t\t"):
            raise GpuIdsError(f"{path}: not a device or subsystem line of vendor 10de: {line!r}")
    return devices


def cut_extract(text: str, commit: str, date: str) -> str:
    """The extract committed as catalog/upstream/pci.ids-10de: a header naming where it came from, then
    NVIDIA's vendor block exactly as in pci.ids (from its vendor line up to the next vendor line)."""
    lines = text.splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    notice = "\n".join(header)
    if "GNU General Public License" not in notice or "3-clause BSD License" not in notice:
        raise GpuIdsError("pci.ids: its header no longer states the GPL-2.0-or-later / BSD-3-Clause licence; read it")
    try:
        start = lines.index(VENDOR_LINE)
    except ValueError as exc:
        raise GpuIdsError(f"pci.ids: no line {VENDOR_LINE!r}") from exc
    end = start + 1
    while end < len(lines) and not re.match(r"^[0-9a-f]{4}  ", lines[end]):
        end += 1
    repository = PCI_IDS["repository"]
    about = [
        f"# NVIDIA's vendor block (10de) of pci.ids, unchanged, cut by `{COMMAND} --pin DIR`.",
        f"# Repository: https://github.com/{repository} (file pci.ids)",
        f"# Commit: {commit} (committed {date})",
        f"# sha256 of the whole pci.ids at that commit: {sha256(text.encode())}",
        "# Licence: GPL-2.0-or-later OR BSD-3-Clause. pci.ids' own header, verbatim:",
    ]
    return "\n".join([*about, *header, *lines[start:end]]) + "\n"


def pin(clone: Path, output: Path) -> None:
    """Cut a new extract from a pciutils/pciids git directory (its HEAD) and print the constants to set."""

    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(clone), *args], capture_output=True)
        if result.returncode != 0:
            raise GpuIdsError(f"git -C {clone} {' '.join(args)}: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout.decode("utf-8")  # bytes as they are: no newline translation

    commit, date = git("log", "-1", "--format=%H %cI").split()
    text = git("show", "HEAD:pci.ids")
    extract = cut_extract(text, commit, date)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(extract.encode())
    log(f"wrote {output} ({len(extract)} bytes); set in catalog/tools/gpu_ids.py:")
    print(f'    "commit": "{commit}",\n    "date": "{date}",\n    "sha256": "{sha256(text.encode())}",')
    print(f'EXTRACT_SHA256 = "{sha256(extract.encode())}"')


# --- compute capability -------------------------------------------------------------------------------


def chip_of(name: str) -> str | None:
    """The chip code a pci.ids device name starts with, board suffix dropped ('GK110BGL [...]' -> 'GK110B')."""
    match = CHIP_RE.match(name.split(" ", 1)[0])
    return match.group("chip") if match else None


def cc_of(chip: str) -> str | None:
    if chip in CHIP_CC:
        return CHIP_CC[chip]
    respin = REVISION_RE.match(chip)
    return CHIP_CC.get(respin.group("base")) if respin else None


def compute(ids: set[str], devices: dict[str, str]) -> dict[str, dict]:
    """{id: {chip, cc[, why]}} for every id, sorted; `cc: null` with the reason where there is none."""
    short = PCI_IDS["commit"][:7]
    entries: dict[str, dict] = {}
    for devid in sorted(ids):
        name = devices.get(devid)
        chip = chip_of(name) if name is not None else None
        cc = cc_of(chip) if chip else None
        entry: dict = {"chip": chip, "cc": cc}
        if name is None:
            entry["why"] = f"not in pci.ids at {short}"
        elif chip is None:
            entry["why"] = f"its pci.ids entry at {short} gives no chip code"
        elif cc is None:
            entry["why"] = f"chip {chip} not in CHIP_CC"
        entries[devid] = entry
    return entries


# --- the file -----------------------------------------------------------------------------------------


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


def flow_mapping(entry: dict) -> str:
    return "{" + ", ".join(f"{key}: {json.dumps(value)}" for key, value in entry.items()) + "}"


def render(branches: dict[str, dict], names: dict[str, str], name_sources: list[str], devices: dict[str, str]) -> str:
    out = [
        "---",
        f"# GENERATED by `{COMMAND}` (`--archive` re-reads the packages): do not edit by hand, run it again.",
        "#",
        "# The PCI device IDs (vendor 10de) each NVIDIA driver branch drives, read from the `Modaliases:`",
        "# field of Ubuntu focal's nvidia-driver-<branch> package (the candidate version apt installs),",
        "# with the package and exact version each list came from. A branch focal only carries as a",
        "# transitional package has `transitional_to`: installing it installs that branch, whose list",
        "# applies. `names`: GPU names from the packages' own supportedchips.html (newest branch first).",
        "# Used by the `stack` role's GPU preflight (roles/stack/filter_plugins/gpu_support.py).",
        "# `compute`: the chip and CUDA compute capability (cc) of every ID above, derived, never typed: the",
        "# chip code pci.ids gives the device (NVIDIA's block of pci.ids, pinned in `compute_from` and kept as",
        "# catalog/upstream/pci.ids-10de; suffixes GL, GLM, M dropped, a respin's B kept) through CHIP_CC in",
        "# catalog/tools/gpu_ids.py (from NVIDIA's CUDA GPUs list and the CUDA C++ Programming Guide). An ID",
        "# pci.ids lacks, or gives no chip or a chip CHIP_CC lacks, has `cc: null` and a `why`.",
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
    ids = {i for record in branches.values() for i in record.get("ids", [])} | set(names)
    out.append("compute_from:")
    out.append("  pci_ids:")
    for key, value in PCI_IDS.items():
        out.append(f"    {key}: {json.dumps(value)}")
    out.append(f"    extract: {json.dumps(EXTRACT.relative_to(ROOT).as_posix())}")
    out.append(f"    extract_sha256: {json.dumps(EXTRACT_SHA256)}")
    out.append(f"  chips: {json.dumps(CHIPS_CITED)}")
    out.append("compute:")
    out.extend(f"  {json.dumps(devid)}: {flow_mapping(entry)}" for devid, entry in compute(ids, devices).items())
    return "\n".join(out) + "\n"


def offline(source: Path = OUTPUT) -> str:
    """The default mode: the file's own branches and names, `compute` from the pinned extract."""
    try:
        data = yaml.safe_load(source.read_text())
    except OSError as exc:
        raise GpuIdsError(f"{source}: {exc.strerror}; `{COMMAND} --archive` generates it from the packages") from exc
    if not isinstance(data, dict) or data.get("gpu_ids_format") != 1:
        raise GpuIdsError(f"{source}: not a gpu_ids file of format 1")
    return render(data["branches"], data["names"], data["names_from"], read_extract())


# --- --archive: Ubuntu focal's packages (Docker) ------------------------------------------------------


def _sandbox():
    """testbed.sandbox, imported only for --archive: the default mode runs without the test bed."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from testbed import sandbox

    return sandbox


def sh(command: str) -> str:
    """Run `command` with sh in the container; its stdout."""
    result = subprocess.run(["docker", "exec", CONTAINER, "sh", "-c", command], text=True, capture_output=True)
    if result.returncode != 0:
        raise GpuIdsError(f"in {CONTAINER}: {command}\n{(result.stderr or result.stdout).strip()[-2000:]}")
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
        raise GpuIdsError(f"{package}: no candidate version in focal's archive")
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
        raise GpuIdsError(f"{package} {version}: no Modaliases and not a transitional package")
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


def archive() -> str:
    """The --archive mode: branches and names re-read from Ubuntu focal's packages in a container."""
    devices = read_extract()  # refuse a changed extract before starting anything
    sandbox = _sandbox()
    started = time.monotonic()
    try:
        sandbox.ensure_docker()
        sandbox.start_host(CONTAINER, "focal")
        try:
            log("apt-get update in an Ubuntu 20.04 container")
            sh("apt-get update -qq")
            branches = {b: read_branch(b) for b in BRANCHES}
            for branch, record in branches.items():
                target = record.get("transitional_to")
                if target and "ids" not in branches.get(target, {}):
                    raise GpuIdsError(f"nvidia-driver-{branch} installs branch {target}, which has no list here")
            names, name_sources = read_names(branches)
        finally:
            sandbox.stop_host(CONTAINER)
    except sandbox.SandboxError as exc:
        raise GpuIdsError(str(exc)) from exc
    for branch, record in branches.items():
        what = f"{len(record['ids'])} IDs" if "ids" in record else f"transitional to {record['transitional_to']}"
        log(f"{branch}: {record['package']} {record['version']}: {what}")
    log(f"read the packages in {time.monotonic() - started:.0f} s")
    return render(branches, names, name_sources, devices)


# --- command line -------------------------------------------------------------------------------------


def check(output: Path, text: str) -> int:
    """0 if `output` holds `text`; else 1, with a summary of the difference on stderr."""
    current = output.read_text() if output.exists() else ""
    if current == text:
        log(f"{output} is up to date")
        return 0
    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), str(output), "generated", lineterm=""))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    print(f"gpu_ids: {output} would change: {removed} line(s) removed, {added} added; run `{COMMAND}`", file=sys.stderr)
    for line in diff[:40]:
        print(line, file=sys.stderr)
    if len(diff) > 40:
        print(f"... ({len(diff) - 40} more diff lines)", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"file to write or check (default {OUTPUT})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file would change")
    parser.add_argument("--archive", action="store_true", help="re-read Ubuntu focal's packages (Docker)")
    parser.add_argument("--pin", type=Path, metavar="DIR", help="cut a new extract from a pciutils/pciids clone")
    args = parser.parse_args(argv)
    try:
        if args.pin:
            pin(args.pin, EXTRACT)
            return 0
        text = archive() if args.archive else offline()
        if args.check:
            return check(args.output, text)
        args.output.write_text(text)
        log(f"wrote {args.output} ({len(text)} bytes)")
    except GpuIdsError as exc:
        print(f"gpu_ids: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
