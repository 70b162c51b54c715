"""The fixture of NVIDIA's CUDA apt repository (testbed/aptrepo.py) and the keyring check of nvidia_repo.

Runs on the controller without containers: the signatures are checked with gpgv against the
exported key, the indexes against the debs, the debs with dpkg-deb, and NCCL's library from its deb
is loaded with ctypes. The first run builds the repository (about 1.5 minutes, 6 GB of debs).
"""

from __future__ import annotations

import ctypes
import gzip
import hashlib
import json
import shutil
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from testbed import aptrepo, fixtures, sandbox

# The repository is part of the fixture mirror: these run after `./toolkit test` built it (its `fixtures` stage).
pytestmark = pytest.mark.prepared

ROOT = Path(__file__).resolve().parents[2]
KEYRING_SCRIPT = ROOT / "roles" / "nvidia_repo" / "files" / "trust_key.sh"
CATALOG = fixtures.load_catalog()


@pytest.fixture(scope="session")
def repo() -> Path:
    return fixtures.build_mirror(every=True) / aptrepo.SOURCE


@pytest.fixture(scope="session")
def keyring(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exported key, dearmored by gpg here (the role's trust_key.sh does it on the host)."""
    path = tmp_path_factory.mktemp("keyring") / "fixture.gpg"
    key = (repo / CATALOG["cuda_repo"]["key"]["file"]).read_bytes()
    path.write_bytes(subprocess.run(["gpg", "--dearmor"], input=key, capture_output=True, check=True).stdout)
    return path


def stanzas(text: str) -> list[dict[str, str]]:
    found = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if not line.startswith(" "):
                key, _, value = line.partition(": ")
                fields[key] = value
        found.append(fields)
    return found


@pytest.fixture(scope="session")
def packages(repo: Path) -> list[dict[str, str]]:
    return stanzas((repo / "Packages").read_text())


def deb_of(packages: list[dict[str, str]], name: str, version: str | None = None) -> dict[str, str]:
    matches = [p for p in packages if p["Package"] == name and version in (None, p["Version"])]
    assert matches, f"{name} {version or ''} is not in Packages"
    return matches[0]


sha256 = fixtures.sha256_file


def catalog_packages() -> set[tuple[str, str | None]]:
    """(name, version or None) of every package a cuda_repo method installs (the driver metapackages of the
    branches Ubuntu has packages of: the fixture's stand on them)."""
    wanted: set[tuple[str, str | None]] = set()
    for component in ("driver", "cuda", "cudnn", "nccl"):
        for entry in CATALOG[component].values():
            if component == "driver" and "distro" not in entry:
                continue
            for spec in entry.get("cuda_repo", {}).get("packages", []):
                name, _, version = spec.partition("=")
                wanted.add((name, version or None))
    return wanted


def test_release_and_inrelease_verify_with_gpgv(repo: Path, keyring: Path) -> None:
    inline = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo / "InRelease")], capture_output=True)
    assert inline.returncode == 0, inline.stderr.decode()
    detached = subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(repo / "Release.gpg"), str(repo / "Release")], capture_output=True
    )
    assert detached.returncode == 0, detached.stderr.decode()


def test_a_changed_release_fails_verification(repo: Path, keyring: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "Release"
    tampered.write_bytes((repo / "Release").read_bytes().replace(b"Label: NVIDIA CUDA", b"Label: NVIDIA CUDX"))
    result = subprocess.run(["gpgv", "--keyring", str(keyring), str(repo / "Release.gpg"), str(tampered)])
    assert result.returncode != 0


def test_inrelease_signs_the_release_file(repo: Path, keyring: Path, tmp_path: Path) -> None:
    signed = subprocess.run(
        ["gpgv", "--keyring", str(keyring), "--output", str(tmp_path / "out"), str(repo / "InRelease")],
        capture_output=True,
    )
    assert signed.returncode == 0, signed.stderr.decode()
    assert (tmp_path / "out").read_bytes() == (repo / "Release").read_bytes()


def test_release_hashes_match_the_indexes(repo: Path) -> None:
    release = (repo / "Release").read_text()
    assert "Label: NVIDIA CUDA" in release
    section = release.split("SHA256:\n", 1)[1]
    listed = {line.split()[2]: (line.split()[0], int(line.split()[1])) for line in section.splitlines()}
    assert set(listed) == {"Packages", "Packages.gz"}
    for name, (digest, size) in listed.items():
        data = (repo / name).read_bytes()
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (digest, size)
    assert gzip.decompress((repo / "Packages.gz").read_bytes()) == (repo / "Packages").read_bytes()


def test_packages_are_the_catalogs(packages: list[dict[str, str]]) -> None:
    present = {(p["Package"], p["Version"]) for p in packages}
    for name, version in catalog_packages():
        if version:
            assert (name, version) in present
        else:
            assert name in {n for n, _ in present}
    assert all(p["Architecture"] == "amd64" for p in packages)


def test_packages_entries_match_the_debs(repo: Path, packages: list[dict[str, str]]) -> None:
    for entry in packages:
        path = repo / entry["Filename"].removeprefix("./")
        assert path.parent == repo and path.is_file(), entry["Filename"]
        assert path.stat().st_size == int(entry["Size"]), entry["Filename"]
        assert sha256(path) == entry["SHA256"], entry["Filename"]
        control = subprocess.run(
            ["dpkg-deb", "--field", str(path), "Package", "Version"], capture_output=True, text=True, check=True
        ).stdout
        assert stanzas(control)[0] == {"Package": entry["Package"], "Version": entry["Version"]}


def sizes(repo: Path, entry: dict[str, str]) -> dict[str, int]:
    """path -> size of each regular file in the deb (dpkg-deb --contents)."""
    listing = subprocess.run(
        ["dpkg-deb", "--contents", str(repo / entry["Filename"])], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[5].removeprefix("."): int(line.split()[2]) for line in listing.splitlines() if line[0] == "-"}


def contents(repo: Path, entry: dict[str, str]) -> dict[str, str]:
    """path -> dpkg-deb's type letter and link target ("-", "l libx.so.8", "d")."""
    listing = subprocess.run(
        ["dpkg-deb", "--contents", str(repo / entry["Filename"])], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in listing.splitlines():
        fields = line.split()
        path = fields[5]
        found[path.removeprefix(".")] = fields[0][0] + (f" {fields[7]}" if fields[0][0] == "l" else "")
    return found


@pytest.mark.parametrize("version", sorted(v for v, e in CATALOG["cuda"].items() if "cuda_repo" in e))
def test_toolkit_deb_installs_under_usr_local(repo: Path, packages: list[dict[str, str]], version: str) -> None:
    entry = deb_of(packages, CATALOG["cuda"][version]["cuda_repo"]["packages"][0])
    files = contents(repo, entry)
    prefix = f"/usr/local/cuda-{version}"
    for name in ("bin/nvcc", "bin/ptxas", "version.json", "lib64/libcudart.so.11.0", "lib64/libcublas.so.11"):
        assert files.get(f"{prefix}/{name}") == "-", name
    assert files[f"{prefix}/lib64/libcudart.so"] == "l libcudart.so.11.0"
    # NVRTC under the release's own name too (libnvrtc.so.11.1 for CUDA 11.1; 11.2 and later: the library itself).
    nvrtc = fixtures.nvrtc_soname(version)
    assert files[f"{prefix}/lib64/{nvrtc}"] == ("-" if nvrtc == fixtures.NVRTC_LIBRARY else "l libnvrtc.so.11.2")
    outside = {path for path in files if not path.startswith(f"{prefix}/")}
    assert outside == {"/", "/usr/", "/usr/local/"}, "the package must not own /usr/local/cuda or anything else"


def test_library_debs_install_into_the_system_folders(repo: Path, packages: list[dict[str, str]]) -> None:
    libdir = "/usr/lib/x86_64-linux-gnu"
    for component, runtime, dev, soname, header in (
        ("cudnn", "libcudnn8", "libcudnn8-dev", "libcudnn.so.8", "cudnn.h"),
        ("nccl", "libnccl2", "libnccl-dev", "libnccl.so.2", "nccl.h"),
    ):
        for version, entry in CATALOG[component].items():
            if "cuda_repo" not in entry:
                continue
            pins = dict(p.split("=") for p in entry["cuda_repo"]["packages"])
            runtime_files = contents(repo, deb_of(packages, runtime, pins[runtime]))
            dev_entry = deb_of(packages, dev, pins[dev])
            dev_files = contents(repo, dev_entry)
            link = runtime_files[f"{libdir}/{soname}"]
            assert link.startswith("l "), (component, version)
            assert runtime_files[f"{libdir}/{link[2:]}"] == "-"
            # Built from the wheel chosen for this version (cuDNN 8.0.5's and 8.5.0's from 8.5.0, 8.9.6's from its
            # own): the library's file carries that wheel's release, and that wheel's bytes (its size; a deb built
            # from another wheel of the same package made cuDNN 8.0.5's package report 8.9.6).
            wheel = fixtures._wheel_for(CATALOG, component, version)
            assert link[2:] == f"{soname.rsplit('.', 1)[0]}.{fixtures.release_of(wheel.version)}", (component, version)
            with zipfile.ZipFile(fixtures.fetch_wheels([wheel])[wheel.file]) as archive:
                size = archive.getinfo(f"nvidia/{component}/lib/{soname}").file_size
            assert sizes(repo, deb_of(packages, runtime, pins[runtime]))[f"{libdir}/{link[2:]}"] == size, (
                component,
                version,
                wheel.file,
            )
            assert dev_files[f"/usr/include/{header}"] == "-"
            assert dev_files[f"{libdir}/{soname.rsplit('.', 1)[0]}"] == f"l {soname}"
            assert dev_entry["Depends"] == f"{runtime} (= {pins[runtime]})"


def test_driver_metapackages_depend_on_ubuntus_driver_packages(packages: list[dict[str, str]]) -> None:
    built = [b for b, e in CATALOG["driver"].items() if "distro" in e]
    assert {"470", "535", "570"} <= set(built)
    for branch in built:
        entry = CATALOG["driver"][branch]
        for name in entry.get("cuda_repo", {}).get("packages", []):
            deb = deb_of(packages, name)
            assert deb["Depends"].split(", ") == [f"nvidia-driver-{branch}", *entry["distro"]["packages"]], branch


def test_nccl_from_its_deb_reports_its_version(repo: Path, packages: list[dict[str, str]], tmp_path: Path) -> None:
    wheel = fixtures._wheel_for(CATALOG, "nccl", "2")
    entry = deb_of(packages, "libnccl2")
    subprocess.run(["dpkg-deb", "--extract", str(repo / entry["Filename"]), str(tmp_path)], check=True)
    library = ctypes.CDLL(str(tmp_path / "usr/lib/x86_64-linux-gnu/libnccl.so.2"))
    code = ctypes.c_int(0)
    assert library.ncclGetVersion(ctypes.byref(code)) == 0
    assert code.value == fixtures.nccl_reports(wheel)


def run_keyring(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(KEYRING_SCRIPT), *args], capture_output=True, text=True)


def fixture_fingerprint() -> str:
    state: dict[str, Any] = json.loads((sandbox.CACHE / aptrepo.STATE).read_text())
    return state["fingerprint"]


def test_keyring_script_trusts_only_the_expected_fingerprint(repo: Path, keyring: Path, tmp_path: Path) -> None:
    key = str(repo / CATALOG["cuda_repo"]["key"]["file"])
    dest = tmp_path / "repo.gpg"
    refused = run_keyring(key, str(dest), CATALOG["cuda_repo"]["key"]["fingerprint"])
    assert refused.returncode == 1
    assert "expected exactly the one with fingerprint EB693B3035CD5710E231E123A4B469963BF863CC" in refused.stderr
    assert not dest.exists()
    fingerprint = fixture_fingerprint()
    checked = run_keyring(key, str(dest), fingerprint, "--check")
    assert json.loads(checked.stdout)["changed"] is True
    assert not dest.exists()
    first = run_keyring(key, str(dest), fingerprint.lower())
    assert json.loads(first.stdout)["changed"] is True, first.stderr
    assert dest.read_bytes() == keyring.read_bytes()
    assert dest.stat().st_mode & 0o777 == 0o644
    assert json.loads(run_keyring(key, str(dest), fingerprint).stdout)["changed"] is False
    # The binary keyring itself is accepted as the key (the same bytes: unchanged).
    assert json.loads(run_keyring(str(keyring), str(dest), fingerprint).stdout)["changed"] is False


def test_keyring_script_refuses_a_file_with_a_second_key(repo: Path, tmp_path: Path) -> None:
    """The expected key plus another one (a key slipped in beside NVIDIA's): refused, nothing written."""
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--batch", "--quiet", "--homedir", str(home), "--passphrase", ""]
    subprocess.run([*gpg, "--quick-gen-key", "Another <a@example.invalid>", "ed25519", "sign", "never"], check=True)
    other = subprocess.run([*gpg, "--armor", "--export"], capture_output=True, check=True).stdout
    both = tmp_path / "both.pub"
    both.write_bytes((repo / CATALOG["cuda_repo"]["key"]["file"]).read_bytes() + other)
    result = run_keyring(str(both), str(tmp_path / "k.gpg"), fixture_fingerprint())
    assert result.returncode == 1, result.stdout
    assert f"holds the key(s) {fixture_fingerprint()}, " in result.stderr
    assert not (tmp_path / "k.gpg").exists()


def test_keyring_script_check_mode_without_gpg_or_key_writes_nothing(repo: Path, tmp_path: Path) -> None:
    key = str(repo / CATALOG["cuda_repo"]["key"]["file"])
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("tr", "mktemp", "rm", "sed"):  # what the script needs before it looks for gpg
        (bare / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bare)}
    dest = tmp_path / "k.gpg"
    script = ["/bin/bash", str(KEYRING_SCRIPT)]
    checked = subprocess.run(
        [*script, key, str(dest), fixture_fingerprint(), "--check"], capture_output=True, text=True, env=env
    )
    assert json.loads(checked.stdout)["changed"] is True, checked.stderr
    refused = subprocess.run([*script, key, str(dest), fixture_fingerprint()], capture_output=True, text=True, env=env)
    assert refused.returncode == 1 and "gpg is not installed" in refused.stderr
    missing = run_keyring(str(tmp_path / "nothing.pub"), str(dest), fixture_fingerprint(), "--check")
    assert json.loads(missing.stdout)["changed"] is True
    assert not dest.exists()


def test_keyring_script_refuses_a_damaged_key(repo: Path, tmp_path: Path) -> None:
    armored = (repo / CATALOG["cuda_repo"]["key"]["file"]).read_text().splitlines()
    body = next(i for i, line in enumerate(armored) if line and not line.startswith("-") and ":" not in line)
    armored[body] = ("B" if armored[body][0] != "B" else "C") + armored[body][1:]
    damaged = tmp_path / "damaged.pub"
    damaged.write_text("\n".join(armored) + "\n")
    result = run_keyring(str(damaged), str(tmp_path / "k.gpg"), fixture_fingerprint())
    assert result.returncode == 1
    assert not (tmp_path / "k.gpg").exists()


def test_fingerprint_is_gpgs(keyring: Path) -> None:
    listing = subprocess.run(
        ["gpg", "--with-colons", "--show-keys", str(keyring)], capture_output=True, text=True, check=True
    ).stdout
    fingerprints = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    assert fingerprints[0] == fixture_fingerprint()


def test_inventory_vars_point_at_the_repo_and_its_key(repo: Path) -> None:
    found = aptrepo.inventory_vars(repo.parent, "http://127.0.0.1:1234/")
    assert found["stack_sources"] == {"nvidia_cuda_repo": "http://127.0.0.1:1234/nvidia_cuda_repo"}
    assert found["nvidia_repo_key_fingerprint"] == fixture_fingerprint()
    merged = fixtures.inventory_vars(repo.parent, "http://127.0.0.1:1234")
    assert merged["stack_sources"]["nvidia_cuda_repo"] == "http://127.0.0.1:1234/nvidia_cuda_repo"
    assert "nvidia_developer" in merged["stack_sources"]


def test_warm_build_rewrites_nothing(repo: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in repo.iterdir()}
    started = time.monotonic()
    aptrepo.build(sandbox.CACHE, repo.parent, CATALOG, force=False)
    assert time.monotonic() - started < 5
    assert {p.name: p.stat().st_mtime_ns for p in repo.iterdir()} == before
