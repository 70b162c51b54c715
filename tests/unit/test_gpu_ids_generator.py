"""catalog/tools/gpu_ids.py: catalog/gpu_ids.yml is what its offline mode renders from the file's own
branches and names plus the pinned pci.ids extract, and each PCI ID's compute capability comes from
the chip code pci.ids gives it, never typed."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, load_module

TOOL = ROOT / "catalog" / "tools" / "gpu_ids.py"
DATA = ROOT / "catalog" / "gpu_ids.yml"
EXTRACT = ROOT / "catalog" / "upstream" / "pci.ids-10de"


@pytest.fixture(scope="module")
def tool():
    return load_module("gpu_ids_tool", TOOL)


@pytest.fixture(scope="module")
def data() -> dict:
    return yaml.safe_load(DATA.read_text())


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_default_mode_reproduces_the_file_byte_for_byte(tmp_path):
    output = tmp_path / "gpu_ids.yml"
    result = run_tool("--output", str(output))
    assert result.returncode == 0, result.stderr
    assert output.read_bytes() == DATA.read_bytes()


def test_render_reproduces_the_file(tool):
    assert tool.offline() == DATA.read_text()


def test_check_passes_on_the_file_and_fails_on_a_changed_one(tmp_path):
    assert run_tool("--check").returncode == 0
    changed = tmp_path / "gpu_ids.yml"
    line = '"2204": {chip: "GA102", cc: "8.6"}'
    changed.write_text(DATA.read_text().replace(line, line.replace("8.6", "8.7")))
    result = run_tool("--check", "--output", str(changed))
    assert result.returncode == 1
    assert "would change: 1 line(s) removed, 1 added" in result.stderr
    assert '+  "2204": {chip: "GA102", cc: "8.6"}' in result.stderr


def test_the_extract_is_the_pinned_one(tool, data):
    digest = hashlib.sha256(EXTRACT.read_bytes()).hexdigest()
    assert digest == tool.EXTRACT_SHA256 == data["compute_from"]["pci_ids"]["extract_sha256"]
    pinned = data["compute_from"]["pci_ids"]
    assert pinned["repository"] == "pciutils/pciids" and pinned["extract"] == "catalog/upstream/pci.ids-10de"
    assert {k: pinned[k] for k in ("commit", "date", "sha256")} == {
        k: tool.PCI_IDS[k] for k in ("commit", "date", "sha256")
    }
    head = EXTRACT.read_text().split("\n10de  NVIDIA Corporation\n", 1)[0]
    assert pinned["commit"] in head and pinned["sha256"] in head
    assert "GNU General Public License" in head and "3-clause BSD License" in head  # pci.ids' licence, quoted


def test_a_changed_extract_is_refused(tool, tmp_path):
    extract = tmp_path / "pci.ids-10de"
    extract.write_bytes(EXTRACT.read_bytes().replace(b"GA102 [GeForce RTX 3090]", b"GA100 [GeForce RTX 3090]"))
    with pytest.raises(tool.GpuIdsError, match=r"sha256 \w+, but EXTRACT_SHA256 .* was changed"):
        tool.read_extract(extract)


def test_every_id_has_a_compute_entry(data):
    ids = {i for record in data["branches"].values() for i in record.get("ids", [])} | set(data["names"])
    assert list(data["compute"]) == sorted(ids)
    for devid, entry in data["compute"].items():
        if entry["cc"] is None:
            assert entry["why"], devid
        else:
            assert set(entry) == {"chip", "cc"} and entry["chip"], devid


@pytest.mark.parametrize(
    ("devid", "chip", "cc"),
    [
        ("2204", "GA102", "8.6"),  # GeForce RTX 3090
        ("2330", "GH100", "9.0"),  # H100 SXM5 80GB
        ("2684", "AD102", "8.9"),  # GeForce RTX 4090
        ("26b9", "AD102", "8.9"),  # L40S (pci.ids: AD102GL)
        ("102d", "GK210", "3.7"),  # Tesla K80 (GK210GL)
        ("20b0", "GA100", "8.0"),  # A100 SXM4 40GB
        ("1eb8", "TU104", "7.5"),  # Tesla T4 (TU104GL)
        ("1023", "GK110B", "3.5"),  # Tesla K40m (GK110BGL): a respin keeps its B and its chip's CC
        ("2b85", "GB202", "12.0"),  # GeForce RTX 5090
        ("2901", "GB100", "10.0"),  # B200
    ],
)
def test_spot_checks(data, devid, chip, cc):
    assert data["compute"][devid] == {"chip": chip, "cc": cc}


@pytest.mark.parametrize(
    ("name", "chip"),
    [
        ("GA102 [GeForce RTX 3090]", "GA102"),
        ("AD102GL [L40S]", "AD102"),
        ("GK110BGL [Tesla K40m]", "GK110B"),
        ("GK208BM [GeForce 920M]", "GK208B"),
        ("GM108GLM [Quadro K620M / Quadro M500M]", "GM108"),
        ("GA107BM / GN20-P0-R-K2 [GeForce RTX 3050 6GB Laptop GPU]", "GA107B"),
        ("GK20A [Tegra K1]", "GK20A"),
        ("GM20B [Tegra X1]", "GM20B"),
        ("GP10B [Tegra X2]", "GP10B"),
        ("GV10B [Xavier]", "GV10B"),
        ("GA10B [Orin]", "GA10B"),
        ("NV44A [GeForce 6200]", None),
        ("[GeForce Something]", None),
        ("CK804 ISA Bridge", None),
    ],
)
def test_chip_codes(tool, name, chip):
    assert tool.chip_of(name) == chip


def test_respins_and_soc_parts_have_their_own_cc(tool):
    assert tool.cc_of("GK110B") == tool.cc_of("GK110") == "3.5"
    assert tool.cc_of("GP104B") == "6.1"
    assert (tool.cc_of("GK20A"), tool.cc_of("GM20B"), tool.cc_of("GP10B")) == ("3.2", "5.3", "6.2")
    assert (tool.cc_of("GV10B"), tool.cc_of("GA10B")) == ("7.2", "8.7")
    assert tool.cc_of("GB10B") is None  # an SoC's letter is part of its name: no fallback to a base chip


def test_no_cc_is_guessed(tool):
    devices = {"aaaa": "GB10B [Jetson AGX Thor]", "bbbb": "[Unknown NVIDIA device]", "cccc": "GA102 [X]"}
    entries = tool.compute({"aaaa", "bbbb", "cccc", "dddd"}, devices)
    short = tool.PCI_IDS["commit"][:7]
    assert entries == {
        "aaaa": {"chip": "GB10B", "cc": None, "why": "chip GB10B not in CHIP_CC"},
        "bbbb": {"chip": None, "cc": None, "why": f"its pci.ids entry at {short} gives no chip code"},
        "cccc": {"chip": "GA102", "cc": "8.6"},
        "dddd": {"chip": None, "cc": None, "why": f"not in pci.ids at {short}"},
    }
    assert tool.flow_mapping(entries["dddd"]) == f'{{chip: null, cc: null, why: "not in pci.ids at {short}"}}'


def test_a_changed_chip_table_changes_the_output(tool, monkeypatch):
    monkeypatch.setitem(tool.CHIP_CC, "GA102", "9.9")
    text = tool.offline()
    assert text != DATA.read_text()
    assert '  "2204": {chip: "GA102", cc: "9.9"}\n' in text
    monkeypatch.delitem(tool.CHIP_CC, "GH100")
    assert '  "2330": {chip: "GH100", cc: null, why: "chip GH100 not in CHIP_CC"}\n' in tool.offline()


def test_lines_fit_yamllint():
    assert all(len(line) <= 120 for line in DATA.read_text().splitlines())


def test_the_default_mode_imports_no_testbed_module():
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('gpu_ids_tool', {str(TOOL)!r})\n"
        "tool = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(tool)\n"
        "tool.offline()\n"
        "print(sorted(m for m in sys.modules if m == 'testbed' or m.startswith('testbed.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
