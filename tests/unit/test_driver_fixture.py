"""The driver runfile fixture (testbed/driver_fixture.py): its runfile format and command-line
contract, checked on a runfile built from small stand-in packages (fast, no root, no download), and
the payload of the real fixture when the mirror holds it.

Installing (the DKMS build) needs root and kernel headers: molecule/runfile does that on a real
Ubuntu 20.04 container.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from testbed import driver_fixture, fixtures

VERSION = "470.86"
NAME = f"NVIDIA-Linux-x86_64-{VERSION}"


class FakePackages:
    """Stand-ins for the Ubuntu packages: every file the builder asks for, with a small body."""

    def read(self, package: str, name: str) -> bytes:
        return f"{package}:{name}\n".encode()

    def tree(self, package: str, prefix: str) -> list[tarfile.TarInfo]:
        names = {"nvidia-kernel-source-470": ["Kbuild", "Makefile", "nvidia/nv.c"], "nvidia-dkms-470": ["dkms.conf"]}
        return [tarfile.TarInfo(f"./{prefix}{name}") for name in names[package]]


@pytest.fixture(scope="module")
def runfile(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("driver")
    path = work / f"{NAME}.run"
    members = driver_fixture.payload_members(FakePackages(), VERSION)  # type: ignore[arg-type]
    driver_fixture.write_runfile(path, VERSION, members, work)
    return path


def run(runfile: Path, *args: str, log: Path | None = None) -> subprocess.CompletedProcess:
    extra = [f"--log-file-name={log}"] if log else []
    return subprocess.run(["sh", str(runfile), *extra, *args], text=True, capture_output=True, timeout=60)


def test_payload_has_nvidias_layout(runfile):
    listing = run(runfile, "--list")
    assert listing.returncode == 0, listing.stderr
    names = set(listing.stdout.split())
    for name in (
        f"libcuda.so.{driver_fixture.REAL_VERSION}",
        f"libnvidia-ml.so.{driver_fixture.REAL_VERSION}",
        "nvidia-smi",
        "nvidia-persistenced",
        "nvidia-installer",
        "kernel/dkms.conf",
        "kernel/nvidia/nv.c",
        "nvidia-persistenced-init.tar.bz2",
    ):
        assert f"{NAME}/{name}" in names, name


def test_payload_is_checked_before_use(runfile, tmp_path):
    assert run(runfile, "--check").returncode == 0
    corrupt = tmp_path / runfile.name
    data = bytearray(runfile.read_bytes())
    data[-100] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    result = run(corrupt, "--check")
    assert result.returncode == 1
    assert "is corrupt" in result.stderr


def test_extract_only_unpacks_the_installer(runfile, tmp_path):
    result = run(runfile, "--extract-only", f"--target={tmp_path}")
    assert result.returncode == 0, result.stderr
    installer = tmp_path / NAME / "nvidia-installer"
    assert installer.stat().st_mode & 0o111
    provenance = json.loads((tmp_path / NAME / ".fixture.json").read_text())
    assert provenance["driver_version"] == driver_fixture.REAL_VERSION
    assert {p["package"] for p in provenance["built_from"]} == {d.package for d in driver_fixture.DEBS}


def test_version_and_info_say_what_is_inside(runfile):
    version = run(runfile, "--version")
    assert version.returncode == 0
    assert f"version {driver_fixture.REAL_VERSION}" in version.stdout
    info = run(runfile, "--info")
    assert f"{VERSION} (test fixture: {driver_fixture.REAL_VERSION})" in info.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--silent", "--dkms", "--frobnicate"], "unknown option(s): --frobnicate"),
        (["--silent", "--dkms", "-k"], "-k needs a kernel name"),
    ],
)
def test_refuses_unknown_options(runfile, tmp_path, args, message):
    log = tmp_path / "installer.log"
    result = run(runfile, *args, log=log)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Usage: sh" in result.stderr
    assert f"ERROR: {message}" in log.read_text()


def test_uninstall_without_an_install_fails_clearly(tmp_path):
    """The installed nvidia-installer (no payload next to it) can only uninstall, and says so."""
    text = driver_fixture._fill(driver_fixture.INSTALLER, VERSION)
    installer = tmp_path / "nvidia-installer"
    installer.write_text(text)
    log = tmp_path / "installer.log"
    result = subprocess.run(
        ["sh", str(installer), "--silent", "--dkms", f"--log-file-name={log}"], text=True, capture_output=True
    )
    assert result.returncode == 1
    # As root: no payload next to it; otherwise the root check comes first.
    assert "no driver package next to" in result.stderr or "must be run as root" in result.stderr


def test_header_offset_points_at_the_payload(runfile):
    data = runfile.read_bytes()
    header = data.split(b"\nskip=", 1)[1]
    start = int(header.split(b"\n", 1)[0])
    with tarfile.open(fileobj=io.BytesIO(data[start - 1 :]), mode="r:gz") as tar:
        assert f"{NAME}/nvidia-installer" in tar.getnames()


def test_payload_is_reproducible(tmp_path):
    members = driver_fixture.payload_members(FakePackages(), VERSION)  # type: ignore[arg-type]
    first = driver_fixture.write_runfile(tmp_path / "a.run", VERSION, members, tmp_path)
    second = driver_fixture.write_runfile(tmp_path / "b.run", VERSION, members, tmp_path)
    assert first == second == fixtures.sha256_file(tmp_path / "a.run")


def test_only_the_default_branch_release_is_built(catalog):
    artifacts = driver_fixture.runfiles(catalog)
    stack = catalog["stacks"][catalog["default_stack"]]
    entry = catalog["driver"][stack["driver_branch"]]
    assert [a["file"] for a in artifacts] == [entry["runfile"][entry["version"]]["file"]]


def test_debs_are_pinned_by_sha256():
    for deb in driver_fixture.DEBS:
        assert len(deb.sha256) == 64 and deb.version.startswith(driver_fixture.REAL_VERSION), deb
        assert deb.package.endswith(f"-{driver_fixture.BRANCH}")


@pytest.mark.prepared
def test_real_fixture_carries_nvidias_binaries_and_module_sources(catalog):
    """The runfile fixture of the mirror (built, or reused from the cache, by build_mirror)."""
    root = fixtures.build_mirror()
    manifest = driver_fixture.read_manifest(root)
    (artifact,) = driver_fixture.runfiles(catalog)
    entry = manifest[artifact["file"]]
    runfile = root / entry["source"] / entry["path"]
    assert fixtures.sha256_file(runfile) == entry["sha256"]
    assert (
        fixtures.inventory_vars(root, "http://127.0.0.1:1")["stack_artifact_checksums"][runfile.name] == entry["sha256"]
    )
    top = f"NVIDIA-Linux-x86_64-{artifact['version']}"
    data = runfile.read_bytes()
    start = int(data.split(b"\nskip=", 1)[1].split(b"\n", 1)[0])
    with tarfile.open(fileobj=io.BytesIO(data[start - 1 :]), mode="r:gz") as tar:
        libcuda = tar.extractfile(f"{top}/libcuda.so.{driver_fixture.REAL_VERSION}")
        assert libcuda is not None and libcuda.read(4) == b"\x7fELF"
        dkms_conf = tar.extractfile(f"{top}/kernel/dkms.conf")
        assert dkms_conf is not None
        conf = dkms_conf.read().decode()
        assert f'PACKAGE_VERSION="{driver_fixture.REAL_VERSION}"' in conf and 'AUTOINSTALL="yes"' in conf
        assert f"{top}/kernel/nvidia/nv.c" in tar.getnames()


def test_the_fixture_debs_are_test_bed_data_of_a_branch_the_catalog_offers():
    """The packages the runfile fixture is built from live beside it (testbed/driver_fixture_debs.yml), not in
    the catalog operators' runs read; their branch is one the catalog offers, with the fixture's release."""
    catalog = fixtures.load_catalog()
    assert "driver_fixture_debs" not in catalog
    assert driver_fixture.BRANCH in catalog["driver"], sorted(catalog["driver"])
    assert driver_fixture.REAL_VERSION.startswith(driver_fixture.BRANCH + ".")
    assert all(len(deb.sha256) == 64 for deb in driver_fixture.DEBS) and len(driver_fixture.DEBS) == 5
