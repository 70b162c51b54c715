"""The fixtures that stand in for NVIDIA's downloads (testbed/fixtures.py) and the loopback mirror.

Runs on the controller, without containers or a GPU: the fixtures' real NVIDIA binaries are
loaded with ctypes and asked for their version, the runfile is run into a temporary folder, and the
mirror is fetched from over HTTP. The first run downloads about 1.1 GB of wheels from PyPI and
builds the mirror (a minute or two); later runs reuse both.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import driver_fixture, fixtures, mirror, scenarios
from tests.conftest import unpinned_files

# Most of these tests read the fixture mirror: they run after `./toolkit test` built it (its `fixtures` stage).
pytestmark = pytest.mark.prepared

ELF_MAGIC = b"\x7fELF"
CATALOG = fixtures.load_catalog()
CUDNN_TARBALLS = sorted(e["tarball"]["file"] for e in CATALOG["cudnn"].values() if "tarball" in e)
NCCL_TARBALLS = sorted(e["tarball"]["file"] for e in CATALOG["nccl"].values() if "tarball" in e)
TENSORRT_TARBALLS = sorted(e["tarball"]["file"] for e in CATALOG["tensorrt"].values() if "tarball" in e)


# --- shared state --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mirror_root() -> Path:
    return fixtures.build_mirror(every=True)


@pytest.fixture(scope="session")
def manifest(mirror_root: Path) -> dict[str, dict[str, Any]]:
    return fixtures.read_manifest(mirror_root)


@pytest.fixture(scope="session")
def seed_cuda(catalog: dict) -> dict[str, str]:
    """The default stack's CUDA toolkit: version, full version and runfile name from the catalog."""
    version = catalog["stacks"][catalog["default_stack"]]["cuda"]
    entry = catalog["cuda"][version]
    return {"version": version, "full_version": entry["full_version"], "file": entry["runfile"]["file"]}


def fixture_path(root: Path, entry: dict[str, Any]) -> Path:
    return root / entry["source"] / entry["path"]


def of_kind(manifest: dict[str, dict[str, Any]], kind: str) -> list[str]:
    return sorted(name for name, entry in manifest.items() if entry["kind"] == kind)


def run_runfile(runfile: Path, *args: str, log: Path, tmpdir: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_FIXTURE_LOG=str(log))
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(["sh", str(runfile), *args], env=env, text=True, capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def cuda_install(tmp_path_factory, mirror_root, manifest, seed_cuda) -> dict[str, Any]:
    """The seed stack's runfile fixture, run the way the cuda role runs it, into a temporary folder."""
    work = tmp_path_factory.mktemp("cuda")
    prefix, log = work / f"cuda-{seed_cuda['version']}", work / "cuda-installer.log"
    runfile = fixture_path(mirror_root, manifest[seed_cuda["file"]])
    result = run_runfile(
        runfile, "--silent", "--toolkit", f"--toolkitpath={prefix}", "--no-man-page", "--override", log=log
    )
    assert result.returncode == 0, result.stderr
    return {"prefix": prefix, "log": log, "runfile": runfile, "result": result}


PROBE = """
import ctypes, sys
kind, library, *preload = sys.argv[1:]
for path in preload:
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(library)
if kind == "cudnn":
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    print(lib.cudnnGetVersion())
elif kind == "tensorrt":
    lib.getInferLibVersion.restype = ctypes.c_int32
    print(lib.getInferLibVersion())
else:
    version = ctypes.c_int()
    assert lib.ncclGetVersion(ctypes.byref(version)) == 0
    print(version.value)
"""


def probe_version(kind: str, library: Path, preload: list[Path]) -> int:
    """Load a real library in a child process (a failed load aborts) and ask it for its version."""
    cmd = [sys.executable, "-c", PROBE, kind, str(library), *map(str, preload)]
    result = subprocess.run(cmd, text=True, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def read_tarball(path: Path, dest: Path, wanted) -> dict[str, tarfile.TarInfo]:
    """One streaming pass: every member's header, and the members `wanted(name)` extracted to dest."""
    members = {}
    with tarfile.open(path, "r|*") as tar:
        for member in tar:
            members[member.name] = member
            if wanted(member.name):
                tar.extract(member, dest, filter="data")
    return members


def assert_reproducible_headers(members: dict[str, tarfile.TarInfo]) -> None:
    assert list(members) == sorted(members)
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, fixtures.FIXED_MTIME)}


# --- the manifest --------------------------------------------------------------------------------


def test_manifest_covers_every_runfile_and_tarball_of_the_catalog(catalog, mirror_root, manifest):
    expected = {entry["runfile"]["file"] for entry in catalog["cuda"].values() if "runfile" in entry}
    for component in ("cudnn", "nccl", "tensorrt"):
        expected |= {entry["tarball"]["file"] for entry in catalog[component].values() if "tarball" in entry}
    assert set(manifest) == expected
    pinned_wheels = {w.file for w in fixtures.catalog_wheels(catalog).values()}
    for name, entry in manifest.items():
        path = fixture_path(mirror_root, entry)
        assert path.name == name
        assert path.stat().st_size == entry["size"], name
        assert len(entry["sha256"]) == 64
        assert entry["built_from"] and set(entry["built_from"]) <= pinned_wheels, name


def test_inventory_vars_point_the_resolver_at_the_mirror(stack_catalog, catalog, pinned, mirror_root, manifest):
    variables = fixtures.inventory_vars(mirror_root, "http://127.0.0.1:8123")
    assert variables["stack_sources"] == {
        "nvidia_developer": "http://127.0.0.1:8123/nvidia_developer",
        "nvidia_driver": "http://127.0.0.1:8123/nvidia_driver",
        "nvidia_cuda_repo": "http://127.0.0.1:8123/nvidia_cuda_repo",
    }
    # The fixtures of the extra builders (the driver runfile) are pinned too; the apt repository is
    # trusted through its key instead.
    assert variables["stack_artifact_checksums"] == {
        **{name: e["sha256"] for name, e in manifest.items()},
        **{name: e["sha256"] for name, e in driver_fixture.read_manifest(mirror_root).items()},
    }
    assert len(variables["nvidia_repo_key_fingerprint"]) == 40
    settings = {
        "sources": variables["stack_sources"],
        "artifact_checksums": {**pinned, **variables["stack_artifact_checksums"]},
    }
    resolved = stack_catalog.resolve_stack(catalog, settings)
    assert resolved["errors"] == []
    toolkit = resolved["stack"]["cuda"]["toolkits"][0]["artifact"]
    assert toolkit["url"] == f"http://127.0.0.1:8123/{toolkit['source']}/{manifest[toolkit['file']]['path']}"
    assert toolkit["sha256"] == manifest[toolkit["file"]]["sha256"]


def test_testbed_catalog_gives_the_fixture_toolkits_size_and_changes_nothing_else(
    mirror_root, manifest, tmp_path, monkeypatch, stack_catalog
):
    monkeypatch.setattr(scenarios, "TESTBED_CATALOG", tmp_path / "catalog" / "stacks.yml")
    written = yaml.safe_load(scenarios.testbed_catalog(mirror_root).read_text())
    runfile = max(e["size"] for e in manifest.values() if e["kind"] == "cuda_runfile")
    fixture_mb = scenarios.FIXTURE_UNPACKED_PER_BYTE * runfile // 2**20 + 1
    assert 1000 < fixture_mb < 4000  # the fixture toolkit, not NVIDIA's 8-9 GB
    assert {v: e["disk_mb"] for v, e in written["cuda"].items()} == {v: fixture_mb for v in CATALOG["cuda"]}
    # Everything else is the catalog's own: put the real figures back and the two are equal.
    for version, entry in written["cuda"].items():
        entry["disk_mb"] = CATALOG["cuda"][version]["disk_mb"]
    assert written == CATALOG
    # The resolver counts the smaller figure for the default stack's parts, and nothing else moves.
    settings = {"artifact_checksums": {n: "ab" * 32 for n in unpinned_files(CATALOG)}}
    real = stack_catalog.resolve_stack(CATALOG, settings)["stack"]
    bed = stack_catalog.resolve_stack(yaml.safe_load(scenarios.TESTBED_CATALOG.read_text()), settings)["stack"]
    assert bed["disk_mb"] == real["disk_mb"] - CATALOG["cuda"][real["cuda"]["version"]]["disk_mb"] + fixture_mb
    assert {k: v for k, v in bed.items() if k not in ("disk", "disk_mb")} == {
        k: v for k, v in real.items() if k not in ("disk", "disk_mb")
    }


# --- the CUDA runfile ----------------------------------------------------------------------------


def test_runfile_installs_real_libraries_and_headers(cuda_install):
    prefix = cuda_install["prefix"]
    for library in ("libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libnvrtc.so.11.2"):
        assert (prefix / "lib64" / library).read_bytes()[:4] == ELF_MAGIC, library
    assert os.readlink(prefix / "lib64" / "libcudart.so") == "libcudart.so.11.0"
    assert os.readlink(prefix / "lib64" / "libcublas.so") == "libcublas.so.11"
    assert (prefix / "nvvm" / "lib64" / "libnvvm.so").read_bytes()[:4] == ELF_MAGIC
    for header in ("cuda_runtime.h", "cublas_v2.h", "nvrtc.h", "crt/host_defines.h"):
        assert (prefix / "include" / header).is_file(), header
    assert os.access(prefix / "bin" / "cuda-uninstaller", os.X_OK)


def test_runfile_carries_nvrtc_under_its_releases_own_name(cuda_install, seed_cuda):
    # NVIDIA's CUDA 11.1 names NVRTC libnvrtc.so.11.1 (11.2 and later: libnvrtc.so.11.2, the wheels' build).
    name = fixtures.nvrtc_soname(seed_cuda["version"])
    assert name == "libnvrtc.so.11.1"  # the seed's CUDA 11.1
    assert os.readlink(cuda_install["prefix"] / "lib64" / name) == "libnvrtc.so.11.2"
    assert (cuda_install["prefix"] / "lib64" / name).read_bytes()[:4] == ELF_MAGIC


@pytest.mark.parametrize(
    ("version", "name"),
    [
        ("11.0", "libnvrtc.so.11.0"),
        ("11.1", "libnvrtc.so.11.1"),
        ("11.2", "libnvrtc.so.11.2"),
        ("11.8", "libnvrtc.so.11.2"),
    ],
)
def test_nvrtc_soname_per_release(version, name):
    assert fixtures.nvrtc_soname(version) == name
    assert (fixtures.nvrtc_link_script(version) == "") == (name == fixtures.NVRTC_LIBRARY)


def test_runfile_writes_version_json_with_provenance(cuda_install, seed_cuda):
    document = json.loads((cuda_install["prefix"] / "version.json").read_text())
    assert document["cuda"] == {"name": "CUDA SDK", "version": seed_cuda["full_version"]}
    assert {w["package"] for w in document["fixture"]["built_from"]} == set(fixtures.CUDA_TOOLKIT_WHEELS)


def test_runfile_nvcc_stub_answers_version_in_nvidia_format(cuda_install, seed_cuda):
    nvcc = cuda_install["prefix"] / "bin" / "nvcc"
    result = subprocess.run([str(nvcc), "--version"], text=True, capture_output=True)
    assert result.returncode == 0
    assert result.stdout.startswith("nvcc: NVIDIA (R) Cuda compiler driver\n")
    assert f"Cuda compilation tools, release {seed_cuda['version']}, V{seed_cuda['full_version']}" in result.stdout
    refused = subprocess.run([str(nvcc), "-c", "kernel.cu"], text=True, capture_output=True)
    assert refused.returncode == 1
    assert "fixture nvcc: only --version is supported" in refused.stderr


def test_runfile_ptxas_is_nvidias_real_assembler(cuda_install):
    ptxas = cuda_install["prefix"] / "bin" / "ptxas"
    assert ptxas.read_bytes()[:4] == ELF_MAGIC
    result = subprocess.run([str(ptxas), "--version"], text=True, capture_output=True)
    assert result.returncode == 0
    assert "Cuda compilation tools" in result.stdout


def test_runfile_appends_to_the_installer_log(cuda_install, seed_cuda):
    lines = cuda_install["log"].read_text().splitlines()
    installed = f"[INFO]: CUDA {seed_cuda['full_version']} runfile fixture: installed the toolkit into "
    assert f"{installed}{cuda_install['prefix']}" in lines


def test_runfile_rerun_over_an_existing_toolkit_succeeds(cuda_install):
    prefix = cuda_install["prefix"]
    args = ("--silent", "--toolkit", f"--toolkitpath={prefix}", "--no-man-page", "--override")
    result = run_runfile(cuda_install["runfile"], *args, log=cuda_install["log"])
    assert result.returncode == 0, result.stderr
    assert (prefix / "lib64" / "libcudart.so.11.0").read_bytes()[:4] == ELF_MAGIC
    assert os.readlink(prefix / "lib64" / "libcublasLt.so") == "libcublasLt.so.11"


def test_runfile_uses_tmpdir_and_its_uninstaller_removes_the_toolkit(tmp_path, mirror_root, manifest, seed_cuda):
    prefix, scratch, log = tmp_path / "toolkit", tmp_path / "scratch", tmp_path / "installer.log"
    scratch.mkdir()
    runfile = fixture_path(mirror_root, manifest[seed_cuda["file"]])
    result = run_runfile(runfile, "--silent", "--toolkit", f"--toolkitpath={prefix}", f"--tmpdir={scratch}", log=log)
    assert result.returncode == 0, result.stderr
    assert list(scratch.iterdir()) == []  # extracted there, then cleaned up
    assert (prefix / "bin" / "nvcc").is_file()
    uninstall = subprocess.run([str(prefix / "bin" / "cuda-uninstaller"), "--silent"], capture_output=True, text=True)
    assert uninstall.returncode == 0, uninstall.stderr
    assert not prefix.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--silent", "--driver", "--toolkit"], "this fixture carries no driver"),
        (["--toolkit"], "--silent is required"),
        (["--silent", "--toolkit", "--samples"], "unknown option(s): --samples"),
        (["--silent"], "nothing to install: pass --toolkit"),
        (["--silent", "--toolkit", "--toolkitpath=relative/dir"], "must be an absolute path"),
    ],
)
def test_runfile_refuses_what_it_cannot_do(tmp_path, mirror_root, manifest, seed_cuda, args, message):
    runfile = fixture_path(mirror_root, manifest[seed_cuda["file"]])
    if not any(a.startswith("--toolkitpath=") for a in args):
        args = [*args, f"--toolkitpath={tmp_path / 'toolkit'}"]
    result = run_runfile(runfile, *args, log=tmp_path / "installer.log")
    assert result.returncode == 1
    assert message in result.stderr
    logged = (tmp_path / "installer.log").read_text()
    assert logged.startswith("[ERROR]: ") and message in logged
    assert not (tmp_path / "toolkit").exists()


# --- cuDNN and NCCL tarballs ---------------------------------------------------------------------


def cudnn_layout(name: str) -> tuple[str, str]:
    """(top folder, library folder) of NVIDIA's old (.tgz) and newer (-archive.tar.xz) layouts."""
    if name.endswith("-archive.tar.xz"):
        return name[: -len(".tar.xz")], "lib"
    return "cuda", "lib64"


@pytest.mark.parametrize("name", CUDNN_TARBALLS)
def test_cudnn_tarball_has_nvidias_layout_and_reports_its_real_version(
    name, tmp_path, mirror_root, manifest, cuda_install
):
    entry = manifest[name]
    top, lib = cudnn_layout(name)
    wanted = ("libcudnn.so", "libcudnn_ops_infer.so", "cudnn_version.h")
    members = read_tarball(fixture_path(mirror_root, entry), tmp_path, lambda n: any(w in Path(n).name for w in wanted))
    assert_reproducible_headers(members)
    real = f"libcudnn.so.{fixtures.release_of(entry['real_version'])}"
    assert members[f"{top}/include/cudnn.h"].isfile()
    assert members[f"{top}/{lib}/libcudnn.so.8"].linkname == real
    assert members[f"{top}/{lib}/libcudnn.so"].linkname == "libcudnn.so.8"
    assert members[f"{top}/{lib}/{real}"].isfile()
    licence = "NVIDIA_SLA_cuDNN_Support.txt" if top == "cuda" else "LICENSE"
    assert members[f"{top}/{licence}"].isfile()
    cublas = [cuda_install["prefix"] / "lib64" / n for n in ("libcublasLt.so.11", "libcublas.so.11")]
    version = probe_version("cudnn", tmp_path / top / lib / "libcudnn.so.8", cublas)
    assert version == entry["reports_version"]
    header = (tmp_path / top / "include" / "cudnn_version.h").read_text()
    major, minor = version // 1000, version % 1000 // 100
    assert f"#define CUDNN_MAJOR {major}" in header and f"#define CUDNN_MINOR {minor}" in header


def test_cudnn_fixtures_cover_both_layouts():
    assert {cudnn_layout(n)[0] == "cuda" for n in CUDNN_TARBALLS} == {True, False}


@pytest.mark.parametrize("name", NCCL_TARBALLS)
def test_nccl_tarball_has_nvidias_layout_and_reports_its_real_version(name, tmp_path, mirror_root, manifest):
    entry = manifest[name]
    top = name[: -len(".txz")]
    members = read_tarball(fixture_path(mirror_root, entry), tmp_path, lambda n: "/lib/" in n)
    assert_reproducible_headers(members)
    real = f"libnccl.so.{entry['real_version']}"
    assert members[f"{top}/include/nccl.h"].isfile()
    assert members[f"{top}/LICENSE.txt"].isfile()
    assert members[f"{top}/lib/libnccl.so.2"].linkname == real
    assert members[f"{top}/lib/libnccl.so"].linkname == "libnccl.so.2"
    assert probe_version("nccl", tmp_path / top / "lib" / "libnccl.so.2", []) == entry["reports_version"]


# --- the TensorRT tarball ------------------------------------------------------------------------


def wheel_record_is_valid(data: bytes) -> dict[str, bytes]:
    """A wheel's files, after checking every RECORD line's sha256 and size (what pip checks)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    record = next(name for name in files if name.endswith(".dist-info/RECORD"))
    for line in files[record].decode().splitlines():
        path, digest, size = line.rsplit(",", 2)
        if path == record:
            continue
        expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (expected, len(files[path])), path
    return files


@pytest.mark.parametrize("name", TENSORRT_TARBALLS)
def test_tensorrt_tarball_has_nvidias_layout_and_reports_its_real_version(name, tmp_path, mirror_root, manifest):
    entry = manifest[name]
    top = f"TensorRT-{entry['catalog_version']}"
    members = read_tarball(
        fixture_path(mirror_root, entry), tmp_path, lambda n: "/lib/libnvinfer.so" in n or n.endswith((".whl", ".txt"))
    )
    assert_reproducible_headers(members)
    release = fixtures.release_of(entry["real_version"])
    major = release.split(".")[0]
    for library in ("libnvinfer", "libnvinfer_plugin", "libnvonnxparser", "libnvparsers"):
        assert members[f"{top}/lib/{library}.so.{release}"].isfile(), library
        assert members[f"{top}/lib/{library}.so.{major}"].linkname == f"{library}.so.{release}"
        assert members[f"{top}/lib/{library}.so"].linkname == f"{library}.so.{major}"
    assert members[f"{top}/lib/libnvinfer_builder_resource.so.{release}"].isfile()
    assert (tmp_path / top / "doc" / "TensorRT-SLA.txt").read_text().startswith("TEST FIXTURE")
    library = tmp_path / top / "lib" / f"libnvinfer.so.{major}"
    assert probe_version("tensorrt", library, []) == entry["reports_version"]
    tag = fixtures.fixture_python_tag(CATALOG)
    for pattern in CATALOG["tensorrt"][entry["catalog_version"]]["tarball"]["python_wheels"]:
        wheel = tmp_path / top / pattern.replace("{tag}", tag)
        dist, version = wheel.name.split("-")[:2]
        files = wheel_record_is_valid(wheel.read_bytes())
        assert f"Version: {version}\n" in files[f"{dist}-{version}.dist-info/METADATA"].decode()
        if dist == "tensorrt":
            assert files["tensorrt/tensorrt.so"].startswith(ELF_MAGIC)
            assert f'__version__ = "{entry["real_version"]}"' in files["tensorrt/__init__.py"].decode()
        else:
            assert "TEST FIXTURE" in files[f"{dist}/__init__.py"].decode()


# --- the mirror ----------------------------------------------------------------------------------


def test_mirror_serves_fixtures_with_their_manifest_checksum_and_counts_requests(mirror_root, manifest):
    name = min(manifest, key=lambda n: manifest[n]["size"])
    entry = manifest[name]
    relative = f"{entry['source']}/{entry['path']}"
    with mirror.serving(mirror_root) as served:
        assert served.base_url.startswith("http://127.0.0.1:")
        digest = hashlib.sha256()
        with urllib.request.urlopen(served.url(relative), timeout=60) as response:
            for block in iter(lambda: response.read(1 << 20), b""):
                digest.update(block)
        assert digest.hexdigest() == entry["sha256"]
        assert served.fetches(relative) == 1
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(served.url("nvidia_developer/no/such/file.run"), timeout=10)
        assert missing.value.code == 404
        assert served.counts == {f"/{relative}": 1, "/nvidia_developer/no/such/file.run": 1}


def test_mirror_refuses_writes(mirror_root):
    with mirror.serving(mirror_root) as served:
        request = urllib.request.Request(served.url("manifest.json"), data=b"{}", method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 501
    assert json.loads((mirror_root / "manifest.json").read_text())


# --- caching and reproducibility -----------------------------------------------------------------


def test_rebuild_is_a_fast_no_op(mirror_root, manifest):
    before = {n: fixture_path(mirror_root, e).stat().st_mtime_ns for n, e in manifest.items()}
    started = time.monotonic()
    assert fixtures.build_mirror(every=True) == mirror_root
    assert time.monotonic() - started < 10
    assert fixtures.read_manifest(mirror_root) == manifest
    assert {n: fixture_path(mirror_root, e).stat().st_mtime_ns for n, e in manifest.items()} == before


@pytest.fixture(scope="session")
def runtime_wheel(catalog, mirror_root) -> tuple[fixtures.Wheel, Path]:
    """The smallest wheel of the catalog (the CUDA runtime, under 1 MB) and its cached file (fetched again where
    `./toolkit test` deleted the builder's wheels after its prepare step: fixtures.drop_wheels)."""
    wheel = fixtures.catalog_wheels(catalog)["nvidia-cuda-runtime-cu11"]
    return wheel, fixtures.fetch_wheels([wheel], mirror_root.parent)[wheel.file]


@pytest.mark.parametrize("compression", ["gz", "xz"])
def test_tarballs_are_byte_for_byte_reproducible(tmp_path, runtime_wheel, compression):
    _, wheel_path = runtime_wheel
    members = [fixtures.from_wheel(f"top/{n}", wheel_path, n) for n in fixtures.wheel_files(wheel_path, "nvidia/")] + [
        fixtures.symlink("top/link", "nvidia/cuda_runtime/lib/libcudart.so.11.0")
    ]
    first = fixtures.write_tarball(tmp_path / "a", list(reversed(members)), compression)
    second = fixtures.write_tarball(tmp_path / "b", members, compression)
    assert first == second == fixtures.sha256_file(tmp_path / "a")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    with tarfile.open(tmp_path / "a", f"r:{compression}") as tar:
        assert tar.getmember("top/link").linkname == "nvidia/cuda_runtime/lib/libcudart.so.11.0"
        assert tar.getmember("top/nvidia").isdir()


def test_stored_xz_is_read_by_xz_and_lzma(tmp_path):
    data = os.urandom(200_001) + bytes(70_000)
    out = io.BytesIO()
    writer = fixtures.StoredXzWriter(out)
    for start in range(0, len(data), 30_000):
        writer.write(data[start : start + 30_000])
    writer.close()
    assert lzma.decompress(out.getvalue()) == data
    result = subprocess.run(["xz", "--decompress", "--stdout"], input=out.getvalue(), capture_output=True)
    assert result.returncode == 0 and result.stdout == data


def test_cached_wheel_with_the_right_checksum_is_not_downloaded_again(runtime_wheel, monkeypatch):
    wheel, path = runtime_wheel
    mtime = path.stat().st_mtime_ns

    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip was run: {args}")

    monkeypatch.setattr(fixtures.subprocess, "run", no_pip)
    assert fixtures.fetch_wheels([wheel], path.parent.parent) == {wheel.file: path}
    assert path.stat().st_mtime_ns == mtime


def test_damaged_cached_wheel_is_downloaded_again(tmp_path, runtime_wheel):
    wheel, _ = runtime_wheel
    damaged = tmp_path / "wheels" / wheel.file
    damaged.parent.mkdir()
    damaged.write_bytes(b"not a wheel")
    paths = fixtures.fetch_wheels([wheel], tmp_path)
    assert fixtures.sha256_file(paths[wheel.file]) == wheel.sha256


def test_wheel_with_another_checksum_is_refused_and_deleted(tmp_path, runtime_wheel):
    wheel, _ = runtime_wheel
    wrong = fixtures.Wheel(wheel.package, wheel.version, wheel.file, "0" * 64)
    with pytest.raises(fixtures.FixtureError, match=r"does not match catalog/stacks\.yml"):
        fixtures.fetch_wheels([wrong], tmp_path)
    assert not (tmp_path / "wheels" / wheel.file).exists()


def test_cache_duplicates_become_hard_links_and_nothing_else_changes(tmp_path: Path, monkeypatch) -> None:
    """The test bed's disk upkeep (scenarios.link_cache_duplicates): a controller-cache file identical to
    a same-named mirror file shares its blocks afterwards; a same-named file with other bytes, a file
    without a twin and a small file stay separate copies; a second pass frees nothing more."""
    monkeypatch.setattr(scenarios, "LINK_MIN_BYTES", 1024)
    monkeypatch.setattr(scenarios, "_LINKED", set())
    mirror_root, cache = tmp_path / "mirror" / "nvidia_developer" / "x", tmp_path / "cache"
    mirror_root.mkdir(parents=True)
    cache.mkdir()
    body = os.urandom(4096)
    for name, data in {"same.run": body, "other.tgz": body, "small.txz": b"tiny"}.items():
        (mirror_root / name).write_bytes(data)
    (cache / "same.run").write_bytes(body)
    (cache / "other.tgz").write_bytes(body[:-1] + bytes([body[-1] ^ 1]))  # one bit differs
    (cache / "alone.whl").write_bytes(body)
    (cache / "small.txz").write_bytes(b"tiny")
    freed = scenarios.link_cache_duplicates(cache, (tmp_path / "mirror",))
    assert freed == 4096
    assert (cache / "same.run").stat().st_ino == (mirror_root / "same.run").stat().st_ino
    assert (cache / "same.run").read_bytes() == body
    for name in ("other.tgz", "small.txz"):
        assert (cache / name).stat().st_ino != (mirror_root / name).stat().st_ino, name
    assert (cache / "alone.whl").stat().st_nlink == 1
    # No partial link is left; .lock is the filler's lock file (artifact_cache.locked), taken for the swap.
    assert sorted(p.name for p in cache.iterdir()) == [".lock", "alone.whl", "other.tgz", "same.run", "small.txz"]
    assert scenarios.link_cache_duplicates(cache, (tmp_path / "mirror",)) == 0


def test_a_linked_cache_file_keeps_its_sha256_memo_and_a_held_lock_is_waited_for(tmp_path: Path, monkeypatch) -> None:
    """link_cache_duplicates swaps a cache file for a hard link only under the artifact cache filler's lock
    (held by a filler: the file is left for the next pass), and moves the filler's sha256 memo entry to the
    link's inode and mtime, so the next cache lookup takes the sha256 from the memo instead of reading the
    file again (the memo's digest here is a marker no file has: returned only from the memo)."""
    monkeypatch.setattr(scenarios, "LINK_MIN_BYTES", 1024)
    monkeypatch.setattr(scenarios, "_LINKED", set())
    artifact_cache = scenarios.artifact_cache
    mirror_root, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror_root.mkdir()
    cache.mkdir()
    body = os.urandom(4096)
    (mirror_root / "same.run").write_bytes(body)
    (cache / "same.run").write_bytes(body)
    os.utime(cache / "same.run", ns=(1, 10**18))  # another mtime than the mirror's file
    before = (cache / "same.run").stat()
    marker = "f" * 64
    artifact_cache.save_memo(cache, {"same.run": [before.st_size, before.st_mtime_ns, before.st_ino, marker]})

    with open(cache / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert scenarios.link_cache_duplicates(cache, (mirror_root,)) == 0
    assert (cache / "same.run").stat().st_ino == before.st_ino, "linked while the filler held the lock"

    assert scenarios.link_cache_duplicates(cache, (mirror_root,)) == 4096
    after = (cache / "same.run").stat()
    assert after.st_ino == (mirror_root / "same.run").stat().st_ino != before.st_ino
    assert after.st_mtime_ns != before.st_mtime_ns
    memo = artifact_cache.load_memo(cache)
    assert memo["same.run"] == [after.st_size, after.st_mtime_ns, after.st_ino, marker]
    assert artifact_cache.cached_sha256(cache / "same.run", "same.run", memo) == marker
