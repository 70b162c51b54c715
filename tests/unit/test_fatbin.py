"""verify/msgpu_verify/fatbin.py (the CUDA fat binary reader) and catalog/gpu_code.yml (what it measured).

(a) Hand-built ELF64 shared objects, written here byte by byte with struct: a `.nv_fatbin` section holding a
cubin for sm_86, PTX for compute_80 and a compressed cubin for sm_90; a library without GPU code; fatbins
elsewhere (`__nv_relfatbin`, `.rodata`); truncated and garbled containers (a partial result and a clear error,
never a crash); wheels (zips) of such libraries.
(b) A real pinned wheel, mindspore-gpu 1.5.1 for cp38, where the test bed's caches hold it (sha256 checked
against catalog/stacks.yml first): read again, it must give catalog/gpu_code.yml's record.
(c) catalog/gpu_code.yml pins each wheel with catalog/stacks.yml's sha256, and the generator renders its shape.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import json
import os
import struct
import threading
import zipfile
from pathlib import Path

import pytest
import yaml
from msgpu_verify import fatbin

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "catalog" / "stacks.yml"
GPU_CODE = ROOT / "catalog" / "gpu_code.yml"
TOOL = ROOT / "catalog" / "tools" / "gpu_code.py"

PTX, ELF = 1, 2
FLAGS_64BIT_LINUX = 0x11
FLAG_LZ4 = 0x2000


# --- building blocks: fatbin entries and containers, ELF64 files -------------------------------------------


def entry(kind: int, arch: int, payload: bytes, compressed: bool = False, header_size: int = 64) -> bytes:
    """One fatbin entry: its header (kind, version 0x0101, header size, padded payload size, payload size,
    PTX ISA / code version, arch, flags, uncompressed size) and its payload padded to 8 bytes."""
    padded = len(payload) + (-len(payload)) % 8
    major, minor = (7, 1) if kind == PTX else (1, 7)
    flags = FLAGS_64BIT_LINUX | (FLAG_LZ4 if compressed else 0)
    uncompressed = 4 * len(payload) if compressed else 0
    header = struct.pack(
        "<HHIQIIHHIIIQQQ",
        kind,
        0x0101,
        header_size,
        padded,
        len(payload),
        0,
        minor,
        major,
        arch,
        0,
        0,
        flags,
        0,
        uncompressed,
    )
    return header + b"\0" * (header_size - len(header)) + payload + b"\0" * (padded - len(payload))


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def cubin(arch: int) -> bytes:
    """Enough of a cubin to look like one: ELF magic, EM_CUDA, EF_CUDA_SM in e_flags."""
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    struct.pack_into("<H", header, 18, 190)
    struct.pack_into("<I", header, 48, arch)
    return bytes(header) + b"\x00" * 37


def ptx(arch: int) -> bytes:
    return f".version 7.1\n.target sm_{arch}\n.address_size 64\n\0".encode()


def elf(sections: list[tuple[str, bytes]]) -> bytes:
    """An ELF64 little-endian shared object with these sections (PROGBITS, 8-byte aligned) and .shstrtab."""
    names = [".shstrtab"] + [name for name, _ in sections]
    strtab = b"\0"
    name_at = {}
    for name in names:
        name_at[name] = len(strtab)
        strtab += name.encode() + b"\0"
    body = bytearray(64)
    placed = []
    for name, data in [(".shstrtab", strtab), *sections]:
        body += b"\0" * ((-len(body)) % 8)
        placed.append((name, len(body), len(data), 3 if name == ".shstrtab" else 1))
        body += data
    body += b"\0" * ((-len(body)) % 8)
    shoff = len(body)
    body += bytes(64)  # section 0: SHT_NULL
    for name, offset, size, kind in placed:
        body += struct.pack("<IIQQQQIIQQ", name_at[name], kind, 2, 0, offset, size, 0, 0, 8, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(placed) + 1, 1)
    body[:64] = header
    return bytes(body)


TEXT = (".text", b"\x55\x48\x89\xe5\x5d\xc3" * 20)
THREE = container(
    entry(ELF, 86, cubin(86)),
    entry(PTX, 80, ptx(80)),
    entry(ELF, 90, b"LZ4 block of a cubin" * 5, compressed=True),
)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# --- (a) hand-built libraries -------------------------------------------------------------------------------


def test_a_library_with_sass_86_ptx_80_and_a_compressed_sass_90(tmp_path):
    library = write(tmp_path, "libgpu.so", elf([TEXT, (".nv_fatbin", THREE)]))
    assert fatbin.read_library(library) == {
        "sass": ["8.6", "9.0"],
        "ptx": ["8.0"],
        "entries": 3,
        "compressed": 1,
        "errors": [],
    }
    listed = [(e.kind_name, e.cc, e.compressed, e.section) for e in fatbin.scan_file(library).entries]
    assert listed == [
        ("sass", "8.6", False, ".nv_fatbin"),
        ("ptx", "8.0", False, ".nv_fatbin"),
        ("sass", "9.0", True, ".nv_fatbin"),
    ]


def test_a_library_without_gpu_code_has_empty_lists(tmp_path):
    library = write(tmp_path, "libplain.so", elf([TEXT, (".rodata", b"hello\0" * 100)]))
    assert fatbin.read_library(library) == {"sass": [], "ptx": [], "entries": 0, "compressed": 0, "errors": []}


def test_architectures_are_unique_and_sorted_by_number_not_text(tmp_path):
    section = container(*(entry(ELF, arch, cubin(arch)) for arch in (90, 100, 53, 86, 53, 120)))
    section += b"\0" * 8 + container(entry(PTX, 100, ptx(100)), entry(PTX, 53, ptx(53)))  # two containers, padded
    result = fatbin.read_library(write(tmp_path, "lib.so", elf([(".nv_fatbin", section)])))
    assert result["sass"] == ["5.3", "8.6", "9.0", "10.0", "12.0"] and result["ptx"] == ["5.3", "10.0"]
    assert result["entries"] == 8 and result["errors"] == []


def test_larger_entry_headers_are_skipped_by_their_own_size(tmp_path):
    section = container(entry(ELF, 75, cubin(75), header_size=112), entry(PTX, 75, ptx(75), header_size=72))
    result = fatbin.read_library(write(tmp_path, "lib.so", elf([(".nv_fatbin", section)])))
    assert (result["sass"], result["ptx"], result["errors"]) == (["7.5"], ["7.5"], [])


def test_the_executable_fatbin_wins_over_the_relocatable_one_as_in_cuobjdump(tmp_path):
    """The runtime loads .nv_fatbin; __nv_relfatbin (nvlink's input) counts only when there is no .nv_fatbin,
    or with everything=True (cuobjdump -all). NCCL 2.14.3's PTX is in __nv_relfatbin only."""
    executable = (".nv_fatbin", container(entry(ELF, 80, cubin(80))))
    relocatable = ("__nv_relfatbin", container(entry(ELF, 80, cubin(80)), entry(PTX, 80, ptx(80))))
    both = write(tmp_path, "both.so", elf([relocatable, executable]))
    assert (fatbin.read_library(both)["sass"], fatbin.read_library(both)["ptx"]) == (["8.0"], [])
    assert fatbin.summarize(fatbin.scan_file(both, everything=True))["ptx"] == ["8.0"]
    only_relocatable = write(tmp_path, "rel.so", elf([relocatable]))
    assert fatbin.read_library(only_relocatable)["ptx"] == ["8.0"]


def test_fatbins_embedded_as_data_are_found_and_false_magics_ignored(tmp_path):
    """TensorRT's libraries keep fatbins in .rodata/.data and load them themselves (libnvinfer_builder_resource
    has no fatbin section at all); the magic alone, with garbage after it, is not a container."""
    fake = struct.pack("<IHHQ", 0xBA55ED50, 7, 99, 2**40) + b"garbage!" * 4
    rodata = b"x" * 13 + fake + b"y" * 5 + THREE + b"z" * 11
    result = fatbin.read_library(write(tmp_path, "libdata.so", elf([TEXT, (".rodata", rodata)])))
    assert (result["sass"], result["ptx"], result["compressed"], result["errors"]) == (["8.6", "9.0"], ["8.0"], 1, [])
    beside = elf([(".nv_fatbin", container(entry(ELF, 70, cubin(70)))), (".data", b"\0" * 3 + THREE)])
    assert fatbin.read_library(write(tmp_path, "libboth.so", beside))["sass"] == ["7.0", "8.6", "9.0"]


def test_a_raw_fatbin_file_is_read_whole(tmp_path):
    assert fatbin.read_library(write(tmp_path, "kernels.fatbin", THREE))["sass"] == ["8.6", "9.0"]


def test_a_truncated_container_gives_the_entries_before_the_cut_and_says_so(tmp_path):
    cut = THREE[: len(THREE) - 40]  # the compressed sm_90 cubin loses its end
    result = fatbin.read_library(write(tmp_path, "lib.so", elf([(".nv_fatbin", cut)])))
    assert result["sass"] == ["8.6"] and result["ptx"] == ["8.0"]
    assert "declares" in result["errors"][0] and "(sass 9.0, " in result["errors"][1], result["errors"]


def test_garbled_entries_and_headers_are_reported_not_raised(tmp_path):
    zero_header = bytearray(THREE)
    struct.pack_into("<I", zero_header, 16 + 4, 0)  # the first entry's header size
    result = fatbin.read_library(write(tmp_path, "zero.so", elf([(".nv_fatbin", bytes(zero_header))])))
    assert result["entries"] == 0 and "header size of 0 bytes" in result["errors"][0]

    huge_payload = bytearray(THREE)
    first = len(entry(ELF, 86, cubin(86)))
    struct.pack_into("<Q", huge_payload, 16 + first + 8, 2**50)  # the PTX entry's padded payload size
    result = fatbin.read_library(write(tmp_path, "huge.so", elf([(".nv_fatbin", bytes(huge_payload))])))
    assert result["sass"] == ["8.6"] and result["ptx"] == []
    assert "entry 1 at 0x" in result["errors"][0] and "(ptx 8.0, " in result["errors"][0], result["errors"]

    bad_version = bytearray(THREE)
    struct.pack_into("<H", bad_version, 4, 9)
    result = fatbin.read_library(write(tmp_path, "version.so", elf([(".nv_fatbin", bytes(bad_version))])))
    assert result["entries"] == 0 and "version 9" in result["errors"][0]

    junk = write(tmp_path, "junk.so", elf([(".nv_fatbin", b"\x01" * 64 + THREE)]))
    result = fatbin.read_library(junk)
    assert result["sass"] == ["8.6", "9.0"] and "are not a container" in result["errors"][0]


def test_a_truncated_elf_file_is_scanned_whole(tmp_path):
    """The section table is at the end of the file: cut off, the sections are unknown, the file is scanned."""
    whole = elf([TEXT, (".nv_fatbin", THREE)])
    result = fatbin.read_library(write(tmp_path, "cut.so", whole[: len(whole) - 100]))
    assert result["sass"] == ["8.6", "9.0"] and "section table" in result["errors"][0]


@pytest.mark.parametrize("data", [b"", b"\x7fELF", b"not a library at all\n" * 50, bytes(range(256)) * 64])
def test_files_without_fatbins_give_empty_results(tmp_path, data):
    result = fatbin.read_library(write(tmp_path, "x.so", data))
    assert (result["sass"], result["ptx"], result["entries"]) == ([], [], 0)


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(fatbin.FatbinError, match=r"nothing-here\.so"):
        fatbin.read_library(tmp_path / "nothing-here.so")


def test_library_names():
    yes = ["a/libx.so", "libcudnn.so.8", "libnvinfer_builder_resource.so.8.4.1", "_c.cpython-38-x86_64-linux-gnu.so"]
    no = ["a/libx.so.txt", "x.py", "libx.so.8.a", "lib/", "so", "libx.so.", "x.sox"]
    assert all(fatbin.is_library(name) for name in yes)
    assert not any(fatbin.is_library(name) for name in no)


def test_read_wheel_lists_the_libraries_with_gpu_code(tmp_path, monkeypatch):
    monkeypatch.setattr(fatbin, "IN_MEMORY_BYTES", 1024)  # the larger member goes through a temporary file
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/lib/libgpu.so.1", elf([(".nv_fatbin", THREE)]))
        archive.writestr("pkg/lib/libplain.so", elf([TEXT]))
        archive.writestr(
            "pkg/_ext.cpython-38-x86_64-linux-gnu.so", elf([(".nv_fatbin", container(entry(PTX, 53, ptx(53))))])
        )
        archive.writestr("pkg/kernels.bin", THREE)  # not a shared library: not read
        archive.writestr("pkg/lib/", b"")
    found = fatbin.read_wheel(wheel)
    assert sorted(found) == ["pkg/_ext.cpython-38-x86_64-linux-gnu.so", "pkg/lib/libgpu.so.1"]
    assert found["pkg/lib/libgpu.so.1"]["sass"] == ["8.6", "9.0"]
    assert found["pkg/_ext.cpython-38-x86_64-linux-gnu.so"]["ptx"] == ["5.3"]
    assert list(fatbin.read_wheel(wheel, prefix_filter="pkg/lib/")) == ["pkg/lib/libgpu.so.1"]
    every = dict(fatbin.wheel_libraries(wheel))
    assert sorted(every) == sorted([*found, "pkg/lib/libplain.so"])
    assert every["pkg/lib/libplain.so"]["entries"] == 0
    assert not list(tmp_path.glob("msgpu-fatbin-*"))


def test_a_file_that_is_not_a_wheel_is_a_clear_error(tmp_path):
    with pytest.raises(fatbin.FatbinError, match="not a readable wheel"):
        fatbin.read_wheel(write(tmp_path, "broken.whl", b"PK\x03\x04 cut"))


def test_the_command_line_prints_json(tmp_path, capsys):
    library = write(tmp_path, "libgpu.so", elf([(".nv_fatbin", THREE)]))
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("w/libgpu.so", elf([(".nv_fatbin", THREE)]))
    assert fatbin.main([str(library), str(wheel), "--entries"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document[str(library)]["sass"] == ["8.6", "9.0"]
    assert [e["arch"] for e in document[str(library)]["entry_list"]] == ["8.6", "8.0", "9.0"]
    assert document[str(wheel)]["w/libgpu.so"]["ptx"] == ["8.0"]
    assert fatbin.main([str(tmp_path / "missing.so")]) == 1
    assert "missing.so" in capsys.readouterr().err


# --- (b) a real pinned wheel ----------------------------------------------------------------------------------


def cached_wheel(name: str) -> list[Path]:
    """Where the test bed's caches keep a pinned wheel (MSGPU_CACHE: the unit stages run in a copy of the tree,
    the cache stays the checkout's): the controller's artifact cache, which every molecule scenario that
    installs MindSpore fills (testbed/scenarios.py ARTIFACT_CACHE), catalog/tools/gpu_code.py's downloads, and
    testbed/run_check_texts.py's."""
    cache = Path(os.environ.get("MSGPU_CACHE") or ROOT / ".cache")
    return [cache / "artifact-cache" / name, cache / "gpu_code" / name, cache / "run_check" / "wheels" / name]


@pytest.mark.prepared
def test_the_real_mindspore_1_5_1_wheel_gives_the_recorded_gpu_code(stack_catalog):
    catalog = yaml.safe_load(CATALOG.read_text())
    pin = catalog["mindspore"]["1.5.1"]["wheels"]["cp38"]
    places = cached_wheel(pin["file"])
    found = [path for path in places if path.is_file()]
    if not found:
        pytest.skip(
            f"{pin['file']} is in none of {', '.join(map(str, places))} (`python catalog/tools/gpu_code.py` "
            "or a molecule default run puts it there)"
        )
    wheel = found[0]
    assert stack_catalog.file_sha256(str(wheel)) == pin["sha256"], f"{wheel}: not the wheel catalog/stacks.yml pins"
    record = yaml.safe_load(GPU_CODE.read_text())["mindspore"]["1.5.1"]
    assert record["wheel"] == wheel.name
    read = dict(fatbin.wheel_libraries(wheel))
    assert all(not result["errors"] for result in read.values())
    measured = {name: {"sass": r["sass"], "ptx": r["ptx"]} for name, r in read.items() if fatbin.has_gpu_code(r)}
    assert measured == record["libraries"]
    assert len(read) - len(measured) == record["libraries_without_gpu_code"]


# --- (c) catalog/gpu_code.yml and its generator -------------------------------------------------------------


def load_tool():
    spec = importlib.util.spec_from_file_location("msgpu_gpu_code_tool", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_code_pins_each_wheel_with_the_catalogs_sha256():
    tool = load_tool()
    recorded = yaml.safe_load(GPU_CODE.read_text())
    assert recorded["gpu_code_format"] == tool.FORMAT
    pinned = tool.pinned_wheels(yaml.safe_load(CATALOG.read_text()))
    listed = [(c, v) for c in recorded if c != "gpu_code_format" for v in recorded[c]]
    assert listed == [(w["component"], w["version"]) for w in pinned]
    for wheel in pinned:
        record = recorded[wheel["component"]][wheel["version"]]
        assert (record["wheel"], record["sha256"]) == (wheel["file"], wheel["sha256"]), wheel
        assert record["measured"].startswith("catalog/tools/gpu_code.py with verify/msgpu_verify/fatbin.py, ")
        assert isinstance(record["libraries_without_gpu_code"], int)
        for name, code in record["libraries"].items():
            assert set(code) == {"sass", "ptx"} and code["sass"] + code["ptx"], name
            for values in code.values():
                assert values == sorted(set(values), key=fatbin.cc_key), (name, values)


def test_the_generator_renders_the_committed_shape_and_keeps_its_date(tmp_path):
    tool = load_tool()
    wheel = {"component": "tensorrt", "version": "8.4.1.5", "file": "x.whl", "sha256": "ab" * 32}
    long_sass = ["3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6"]
    record = {
        "libraries": {
            "tensorrt/libnvinfer.so.8": {"sass": long_sass, "ptx": ["8.6"]},
            "t/liba.so": {"sass": ["8.0"], "ptx": []},
        },
        "libraries_without_gpu_code": 3,
    }
    text = tool.render([(wheel, record)], "2026-12-07")
    assert text.startswith("---\n# GENERATED by `python catalog/tools/gpu_code.py` on 2026-12-07")
    assert max(len(line) for line in text.splitlines()) <= 120
    assert '      "t/liba.so": {sass: ["8.0"], ptx: []}' in text.splitlines()
    data = yaml.safe_load(text)
    assert data["tensorrt"]["8.4.1.5"] == {
        "wheel": "x.whl",
        "sha256": "ab" * 32,
        "measured": "catalog/tools/gpu_code.py with verify/msgpu_verify/fatbin.py, 2026-12-07",
        **record,
    }
    output = write(tmp_path, "gpu_code.yml", text.encode())
    assert tool.recorded_date(output) == "2026-12-07" and tool.recorded_date(tmp_path / "none.yml") is None
    assert tool.check(output, text) == 0 and tool.check(output, text.replace("2026", "2027")) == 1


def test_the_generator_refuses_a_wheel_whose_sha256_is_not_the_pin(tmp_path):
    """The wheels come through the controller's artifact cache from a PEP 503 index (here one on loopback): a
    download with another sha256 is refused and not kept; a cached copy with another one is fetched again; a
    verified cached copy is not fetched at all."""
    tool = load_tool()
    index = tmp_path / "index"
    (index / "p").mkdir(parents=True)
    name = "p-1-py3-none-any.whl"
    (index / "p" / name).write_bytes(b"tampered")
    (index / "p" / "index.html").write_text(f'<a href="{name}">{name}</a>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cache = tmp_path / "cache"
        wheel = {"component": "nccl", "package": "p", "file": name, "sha256": "0" * 64}
        with pytest.raises(tool.GpuCodeError, match=name):
            tool.fetch(wheel, cache, url)
        assert not (cache / name).exists()
        good = dict(wheel, sha256=hashlib.sha256(b"tampered").hexdigest())
        (cache / name).write_bytes(b"stale")
        assert tool.fetch(good, cache, url).read_bytes() == b"tampered"  # fetched again, then verified
        (index / "p" / name).unlink()  # from now on, a fetch would fail
        assert tool.fetch(good, cache, url).name == name
    finally:
        server.shutdown()
        server.server_close()
