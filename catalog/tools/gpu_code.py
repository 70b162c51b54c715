"""Write catalog/gpu_code.yml: which GPU architectures the catalog's pinned wheels really carry code for.

For each wheel the catalog pins on PyPI (WHEEL_PINS: MindSpore's GPU wheels, NVIDIA's NCCL, cuDNN and TensorRT
wheels), the file the
catalog pins is fetched from the pip index once into .cache/gpu_code/ by the controller's artifact cache code
(roles/artifacts/files/artifact_cache.py; hundreds of MB each, about 3 GB in all), checked against
catalog/stacks.yml's sha256 (a download with another one is never kept), and every
shared library in it is read with verify/msgpu_verify/fatbin.py: the SASS (cubin) and PTX architectures of the
CUDA fat binaries the library hands to the driver. Libraries without GPU code are counted, not listed.

The file is rendered from the measurement alone: re-running with the wheels in the cache writes the same bytes.
Its one date (`measured`) comes from --date, which defaults to the date already in the file.

    python catalog/tools/gpu_code.py                    # download what is missing, measure, write the file
    python catalog/tools/gpu_code.py --check            # write nothing; exit 1 if the file would change
    python catalog/tools/gpu_code.py --date 2026-12-07  # the measurement date to record
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

try:
    import yaml
except ImportError:  # pragma: no cover - the toolkit's .venv has it (requirements.txt)
    sys.exit("gpu_code: needs PyYAML: run it with the toolkit's Python (.venv/bin/python catalog/tools/gpu_code.py)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "verify"))
from msgpu_verify import fatbin  # noqa: E402 - verify/ is put on the path just above

CATALOG = ROOT / "catalog" / "stacks.yml"
ARTIFACT_CACHE = ROOT / "roles" / "artifacts" / "files" / "artifact_cache.py"
OUTPUT = ROOT / "catalog" / "gpu_code.yml"
CACHE = ROOT / ".cache" / "gpu_code"
COMMAND = "python catalog/tools/gpu_code.py"
READER = "verify/msgpu_verify/fatbin.py"
FORMAT = 1
# Where a component's pinned wheel for the hosts' Python (cp38, Ubuntu 20.04) sits under catalog[component][version]:
# every catalog version with a PyPI wheel pinned there is measured (the versions live in the catalog only).
WHEEL_PINS = (
    ("mindspore", ("wheels", "cp38")),
    ("nccl", ("wheel",)),
    ("cudnn", ("wheel",)),
    ("tensorrt", ("wheel", "files", "cp38")),
)
MEASURED_RE = re.compile(r'^\s*measured: ".*, (\d{4}-\d{2}-\d{2})"\s*$', re.MULTILINE)
LINE_MAX = 120


class GpuCodeError(RuntimeError):
    """A clear, user-facing failure (a download, a checksum, an unreadable library)."""


def log(message: str) -> None:
    print(f"[gpu_code] {message}", file=sys.stderr, flush=True)


def pinned_wheels(catalog: dict[str, Any]) -> list[dict[str, str]]:
    """Every wheel of WHEEL_PINS that the catalog pins on PyPI: component, version key, package, pip version, file,
    sha256 (a vendor's wheel without a public sha256, or a version without a wheel, is not measured)."""
    found = []
    for component, where in WHEEL_PINS:
        for version, entry in (catalog.get(component) or {}).items():
            spec = entry
            for key in where:
                spec = (spec or {}).get(key)
            if not spec or not spec.get("sha256") or (entry.get("wheels") and spec.get("source") != "pypi"):
                continue
            # MindSpore: `package` beside `wheels`, the version is the key; NVIDIA's: `package`, `version` in `wheel`.
            holder = entry if component == "mindspore" else entry["wheel"]
            found.append(
                {
                    "component": component,
                    "version": str(version),
                    "package": str(holder["package"]),
                    "pip_version": str(holder.get("version", version)),
                    "file": str(spec["file"]),
                    "sha256": str(spec["sha256"]),
                }
            )
    if not found:
        raise GpuCodeError("catalog/stacks.yml pins no wheel on PyPI to measure")
    return found


def _artifact_cache() -> Any:
    """The controller's artifact cache (roles/artifacts/files/artifact_cache.py): the one way this project fetches a
    pinned file, here a wheel from a pip index, checked by sha256 before it is kept."""
    if "msgpu_artifact_cache" not in sys.modules:
        spec = importlib.util.spec_from_file_location("msgpu_artifact_cache", ARTIFACT_CACHE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["msgpu_artifact_cache"] = module
        spec.loader.exec_module(module)
    return sys.modules["msgpu_artifact_cache"]


def fetch(wheel: dict[str, str], cache: Path, index_url: str) -> Path:
    """The pinned wheel in the cache, fetched from the pip index when it is missing or its bytes are not the pin's
    (the artifact cache checks a cached copy's sha256 and never keeps a download with another one)."""
    tool = _artifact_cache()
    cache.mkdir(parents=True, exist_ok=True)
    entry = {
        "component": wheel["component"],
        "file": wheel["file"],
        "dest": wheel["file"],
        "sha256": wheel["sha256"],
        "index_url": index_url,
        "package": wheel["package"],
    }
    result = tool.fill([entry], cache, offline=False, retries=2, delay=5.0, timeout=120.0)
    if not result["ok"]:
        raise GpuCodeError(tool.explain(result, False))
    return cache / wheel["file"]


def measure(wheel: dict[str, str], path: Path) -> dict[str, Any]:
    """The record of one wheel: its GPU libraries' SASS and PTX, and how many libraries have no GPU code."""
    started = time.monotonic()
    libraries: dict[str, dict[str, list[str]]] = {}
    without = 0
    for name, result in fatbin.wheel_libraries(path):
        if result["errors"]:
            problems = "; ".join(result["errors"][:3])
            raise GpuCodeError(f"{wheel['file']}: {name}: its fat binaries could not be read whole: {problems}")
        if fatbin.has_gpu_code(result):
            libraries[name] = {"sass": result["sass"], "ptx": result["ptx"]}
        else:
            without += 1
    log(
        f"{wheel['file']}: {len(libraries)} libraries with GPU code, {without} without "
        f"({time.monotonic() - started:.1f} s)"
    )
    return {"libraries": dict(sorted(libraries.items())), "libraries_without_gpu_code": without}


def _quoted(text: str) -> str:
    return json.dumps(text)


def _ccs(values: list[str]) -> str:
    return "[" + ", ".join(_quoted(v) for v in values) + "]"


def render(records: list[tuple[dict[str, str], dict[str, Any]]], date: str) -> str:
    measured = f"{COMMAND.split(' ', 1)[1]} with {READER}, {date}"
    lines = [
        "---",
        f"# GENERATED by `{COMMAND}` on {date}: do not edit by hand, run it again",
        "# (`--check` exits 1 when this file is not what the wheels hold).",
        f"# Measured with {READER}: what the GPU libraries of the catalog's pinned wheels really",
        "# carry. For each shared library with CUDA fat binaries: the architectures of its SASS (cubins for sm_XY,",
        '# written "X.Y") and of its PTX (compute_XY, which the driver JIT-compiles for newer GPUs), from the',
        "# executable fatbin the CUDA runtime loads (.nv_fatbin, as cuobjdump lists it) and the fatbins a library",
        "# keeps as data (TensorRT's). Each wheel was fetched from PyPI (roles/artifacts/files/artifact_cache.py) and",
        "# checked against catalog/stacks.yml's sha256, repeated here; component and version keys are the catalog's.",
        f"gpu_code_format: {FORMAT}",
    ]
    component = None
    for wheel, record in records:
        if wheel["component"] != component:
            component = wheel["component"]
            lines.append(f"{component}:")
        lines += [
            f"  {_quoted(wheel['version'])}:",
            f"    wheel: {wheel['file']}",
            f"    sha256: {_quoted(wheel['sha256'])}",
            f"    measured: {_quoted(measured)}",
        ]
        if record["libraries"]:
            lines.append("    libraries:")
            for name, code in record["libraries"].items():
                flow = f"      {_quoted(name)}: {{sass: {_ccs(code['sass'])}, ptx: {_ccs(code['ptx'])}}}"
                if len(flow) <= LINE_MAX:
                    lines.append(flow)
                else:
                    lines += [f"      {_quoted(name)}:", f"        sass: {_ccs(code['sass'])}"]
                    lines.append(f"        ptx: {_ccs(code['ptx'])}")
        else:
            lines.append("    libraries: {}")
        lines += [
            "    # libraries without GPU code are not listed; count them:",
            f"    libraries_without_gpu_code: {record['libraries_without_gpu_code']}",
        ]
    text = "\n".join(lines) + "\n"
    too_long = [line for line in text.splitlines() if len(line) > LINE_MAX]
    if too_long:
        raise GpuCodeError(f"a rendered line is longer than {LINE_MAX} characters: {too_long[0][:80]}...")
    return text


def recorded_date(path: Path) -> str | None:
    """The measurement date the file already records (its first `measured:`), if any."""
    if not path.is_file():
        return None
    match = MEASURED_RE.search(path.read_text())
    return match.group(1) if match else None


def valid_date(text: str) -> str:
    try:
        datetime.date.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a date like 2026-12-07") from exc
    return text


def check(path: Path, text: str) -> int:
    old = path.read_text() if path.is_file() else ""
    if old == text:
        log(f"{path} is up to date")
        return 0
    diff = difflib.unified_diff(old.splitlines(), text.splitlines(), str(path), "measured", lineterm="", n=1)
    print("\n".join(list(diff)[:80]), file=sys.stderr)
    log(f"{path} would change: run `{COMMAND}`")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file would change")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"file to write or check (default {OUTPUT})")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"where the wheels are kept (default {CACHE})")
    parser.add_argument(
        "--index-url",
        default=os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple",
        help="the PEP 503 index to fetch the wheels from (default: $PIP_INDEX_URL, else PyPI)",
    )
    parser.add_argument(
        "--date",
        type=valid_date,
        help="the measurement date to record (default: the one already in the file, else today, UTC)",
    )
    args = parser.parse_args(argv)
    date = args.date or recorded_date(args.output) or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    started = time.monotonic()
    try:
        wheels = pinned_wheels(yaml.safe_load(CATALOG.read_text()))
        records = []
        for wheel in wheels:
            records.append((wheel, measure(wheel, fetch(wheel, args.cache, args.index_url))))
        text = render(records, date)
    except (GpuCodeError, fatbin.FatbinError) as exc:
        print(f"gpu_code: {exc}", file=sys.stderr)
        return 1
    log(f"measured {len(records)} wheels in {time.monotonic() - started:.0f} s")
    if args.check:
        return check(args.output, text)
    args.output.write_text(text)
    log(f"wrote {args.output} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
