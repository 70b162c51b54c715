"""A signed fixture of NVIDIA's CUDA apt repository, built from the real NVIDIA binaries of the mirror.

NVIDIA's repository (`deb [signed-by=KEYRING] <sources.nvidia_cuda_repo> /`, a flat repository with
Packages(.gz), Release, Release.gpg and InRelease, signed by the key `3bf863cc.pub`) cannot be
reached from the build machines. This module builds one that follows the same layout and contract
under `<mirror root>/nvidia_cuda_repo/`, with exactly the package names and versions that
catalog/stacks.yml names for the `cuda_repo` methods:

- `cuda-drivers-<branch>`: a metapackage depending, like NVIDIA's, on `nvidia-driver-<branch>`, and
  on the catalog's `driver.<branch>.distro.packages`: Ubuntu's real driver packages, so DKMS builds
  the real kernel module (branches Ubuntu has no packages of, 510 and 525, have no fixture);
- `cuda-toolkit-<major>-<minor>`: the CUDA toolkit tree under `/usr/local/cuda-<major>.<minor>`, the
  same real NVIDIA binaries (and nvcc stub) as the runfile fixtures (testbed/fixtures.py);
- `libcudnn<major>`/`-dev`, `libnccl2`/`libnccl-dev`: the real libraries and headers of NVIDIA's
  wheels under /usr/lib/x86_64-linux-gnu and /usr/include, as NVIDIA's debs install them.

The repository is signed by a throwaway key generated once and kept in `<cache>/aptrepo-gnupg`
(so its fingerprint is stable across builds); `inventory_vars()` tells the roles to trust that
key's fingerprint instead of NVIDIA's. Debs carry an uncompressed data.tar (building and
unpacking 1 GB toolkits stays fast) and are rebuilt only when what they are built from changes.
testbed/FIXTURES.md says what is real and what is not.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import io
import json
import subprocess
import sys
import tarfile
import time
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable

from testbed import fixtures

SOURCE = "nvidia_cuda_repo"
ARCH = "amd64"
LIB_DIR = "usr/lib/x86_64-linux-gnu"
STATE = "aptrepo-state.json"
KEY_UID = "msgpu test fixture: stand-in for NVIDIA's CUDA repository key <fixture@msgpu.invalid>"
MAINTAINER = "msgpu test fixtures <fixture@msgpu.invalid>"
# Fixed, so Packages and Release only change when a package does (apt refuses a Date in the future).
RELEASE_DATE = "Mon, 12 Oct 2020 00:00:00 UTC"
FIXTURE_DESCRIPTION = (
    " TEST FIXTURE built by testbed/aptrepo.py (testbed/FIXTURES.md), standing in for the package\n"
    " of this name in NVIDIA's CUDA repository, which cannot be reached from the build machines."
)
# What the debs are built from besides their specs: this module and the fixtures.py code it reuses.
BUILDER_HASH = hashlib.sha256(
    "\n".join(
        [
            Path(__file__).read_text(),
            *(
                inspect.getsource(obj)
                for obj in (
                    fixtures.toolkit_members,
                    fixtures.versioned_library,
                    fixtures.version_json,
                    fixtures.wheel_files,
                    fixtures._tarinfo,
                    fixtures._directories,
                )
            ),
            repr((fixtures.TOOLKIT_TREES, fixtures.TOOLKIT_LIBRARIES, fixtures.NVCC_STUB, fixtures.FIXED_MTIME)),
        ]
    ).encode()
).hexdigest()


def log(message: str) -> None:
    fixtures.log(f"aptrepo: {message}")


# --- the packages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deb:
    """One binary package: its control fields and how to get its files."""

    name: str
    version: str
    description: str
    depends: tuple[str, ...] = ()
    wheels: tuple[fixtures.Wheel, ...] = ()
    # (wheel files by package name) -> members, names relative to / without a leading "./"
    members: Callable[[dict[str, Path]], list[fixtures.Member]] | None = None
    section: str = "multiverse/devel"

    @property
    def file(self) -> str:
        return f"{self.name}_{self.version.replace(':', '%3a')}_{ARCH}.deb"

    def key(self) -> str:
        payload = {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "depends": self.depends,
            "wheels": [w.sha256 for w in self.wheels],
            "builder": BUILDER_HASH,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def split_package(spec: str) -> tuple[str, str]:
    """'libcudnn8=8.0.5.39-1+cuda11.1' -> ('libcudnn8', '8.0.5.39-1+cuda11.1')."""
    name, _, version = spec.partition("=")
    if not version:
        raise fixtures.FixtureError(f"catalog/stacks.yml: cuda_repo package '{spec}' has no '=<version>'")
    return name, version


def _toolkit_fixture(catalog: dict[str, Any], version: str) -> fixtures.Fixture:
    """The runfile fixture of that CUDA version: its toolkit, nvcc stub and version.json are the deb's."""
    for fixture in fixtures.plan(catalog):
        if fixture.kind == "cuda_runfile" and fixture.version == version:
            return fixture
    raise fixtures.FixtureError(
        f"catalog/stacks.yml: CUDA {version} has a cuda_repo entry but no runfile to build from"
    )


def toolkit_deb_members(fixture: fixtures.Fixture, wheels: dict[str, Path]) -> list[fixtures.Member]:
    prefix = f"usr/local/cuda-{fixture.version}/"
    stub = fixtures._fill(fixtures.NVCC_STUB, {"FULL": fixture.full_version, "VERSION": fixture.version})
    members = [replace(m, name=prefix + m.name) for m in fixtures.toolkit_members(wheels)]
    members.append(fixtures.text_member(prefix + "bin/nvcc", stub, 0o755))
    members.append(fixtures.text_member(prefix + "version.json", fixtures.version_json(fixture)))
    nvrtc = fixtures.nvrtc_soname(fixture.version)
    if nvrtc != fixtures.NVRTC_LIBRARY:  # the release's own NVRTC name (testbed/fixtures.py: nvrtc_soname)
        members.append(fixtures.symlink(prefix + "lib64/" + nvrtc, fixtures.NVRTC_LIBRARY))
    return members


def library_deb_members(
    component: str, package: str, wheel_path: Path, wheel: fixtures.Wheel, dev: bool
) -> list[fixtures.Member]:
    """Runtime package: lib*.so.X.Y.Z + lib*.so.MAJOR; -dev: the headers and the lib*.so links."""
    members: list[fixtures.Member] = []
    for name in fixtures.wheel_files(wheel_path, f"nvidia/{component}/lib/"):
        real, soname, dev_link = fixtures.versioned_library(
            wheel_path, name, fixtures.release_of(wheel.version), LIB_DIR
        )
        members += [dev_link] if dev else [real, soname]
    if dev:
        members += [
            fixtures.from_wheel(f"usr/include/{Path(n).name}", wheel_path, n)
            for n in fixtures.wheel_files(wheel_path, f"nvidia/{component}/include/")
            if n.endswith(".h")
        ]
    note = fixtures.FIXTURE_NOTE.format(
        file="NVIDIA's deb of this name", wheel=wheel.file, reports=_reports(component, wheel)
    )
    members.append(
        fixtures.text_member(
            f"usr/share/doc/{package}/copyright",
            note + "\n" + fixtures.wheel_text(wheel_path, "License.txt"),
        )
    )
    return members


def _reports(component: str, wheel: fixtures.Wheel) -> int:
    return fixtures.cudnn_reports(wheel) if component == "cudnn" else fixtures.nccl_reports(wheel)


def plan(catalog: dict[str, Any]) -> list[Deb]:
    """Every package the catalog's cuda_repo methods name, at the catalog's versions."""
    debs: list[Deb] = []
    for branch, entry in catalog.get("driver", {}).items():
        if "distro" not in entry:  # no Ubuntu packages of the branch for the fixture metapackage to stand on
            continue
        for package in entry.get("cuda_repo", {}).get("packages", []):
            debs.append(
                Deb(
                    name=package,
                    version=f"{entry['version']}-1",
                    description=f"CUDA driver metapackage for branch {branch}\n{FIXTURE_DESCRIPTION}",
                    # NVIDIA's metapackage depends on nvidia-driver-<branch> (here: Ubuntu's).
                    depends=(f"nvidia-driver-{branch}", *entry["distro"]["packages"]),
                    members=lambda _w, p=package: [
                        fixtures.text_member(f"usr/share/doc/{p}/README.fixture", FIXTURE_DESCRIPTION + "\n")
                    ],
                    section="multiverse/metapackages",
                )
            )
    for version, entry in catalog.get("cuda", {}).items():
        for package in entry.get("cuda_repo", {}).get("packages", []):
            fixture = _toolkit_fixture(catalog, str(version))
            debs.append(
                Deb(
                    name=package,
                    version=f"{entry['full_version']}-1",
                    description=f"CUDA Toolkit {version}\n{FIXTURE_DESCRIPTION}",
                    wheels=fixture.wheels,
                    members=lambda w, f=fixture: toolkit_deb_members(f, w),
                )
            )
    for component in ("cudnn", "nccl"):
        for version, entry in catalog.get(component, {}).items():
            specs = [split_package(p) for p in entry.get("cuda_repo", {}).get("packages", [])]
            wheel = fixtures._wheel_for(catalog, component, str(version))
            runtime = [n for n, _ in specs if not n.endswith("-dev")]
            for name, deb_version in specs:
                dev = name.endswith("-dev")
                debs.append(
                    Deb(
                        name=name,
                        version=deb_version,
                        description=f"NVIDIA {component} {'development files' if dev else 'runtime library'}\n"
                        f"{FIXTURE_DESCRIPTION}",
                        depends=tuple(f"{r} (= {deb_version})" for r in runtime) if dev else (),
                        wheels=(wheel,),
                        members=lambda w, c=component, n=name, wh=wheel, d=dev: library_deb_members(
                            c, n, w[wh.file], wh, d
                        ),
                        section="multiverse/libdevel" if dev else "multiverse/libs",
                    )
                )
    files = [d.file for d in debs]
    if len(set(files)) != len(files):
        raise fixtures.FixtureError(f"catalog/stacks.yml names a cuda_repo package twice: {sorted(files)}")
    return debs


# --- writing debs ------------------------------------------------------------------------------


def _ar_header(name: str, size: int) -> bytes:
    header = f"{name + '/':<16}{fixtures.FIXED_MTIME:<12}{0:<6}{0:<6}{'100644':<8}{size:<10}`\n"
    assert len(header) == 60, header
    return header.encode()


def _member_size(member: fixtures.Member, zips: dict[Path, zipfile.ZipFile]) -> int:
    if member.link:
        return 0
    if member.data is not None:
        return len(member.data)
    assert member.wheel is not None
    return zips[member.wheel].getinfo(member.wheel_member).file_size


def _write_data_tar(
    out: BinaryIO, members: list[fixtures.Member], zips: dict[Path, zipfile.ZipFile], zeros: dict | None = None
) -> None:
    """An uncompressed, reproducible data.tar with './'-prefixed names, as dpkg-deb writes them (`zeros`:
    the wheel members' stand-ins by name, when only the size is wanted)."""
    entries: list[tuple[str, fixtures.Member | None]] = [(d, None) for d in fixtures._directories(members)]
    entries += [(m.name, m) for m in members]
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT, copybufsize=fixtures.COPY_BUFFER) as tar:
        tar.addfile(fixtures._tarinfo("./", tarfile.DIRTYPE, 0o755))
        for name, member in sorted(entries, key=lambda entry: entry[0]):
            path = f"./{name}"
            if member is None:
                tar.addfile(fixtures._tarinfo(path + "/", tarfile.DIRTYPE, 0o755))
            elif member.link:
                tar.addfile(fixtures._tarinfo(path, tarfile.SYMTYPE, 0o777, link=member.link))
            elif member.data is not None:
                info = fixtures._tarinfo(path, tarfile.REGTYPE, member.mode, len(member.data))
                tar.addfile(info, io.BytesIO(member.data))
            else:
                assert member.wheel is not None
                info = zips[member.wheel].getinfo(member.wheel_member)
                tarinfo = fixtures._tarinfo(path, tarfile.REGTYPE, member.mode, info.file_size)
                if zeros is not None:
                    tar.addfile(tarinfo, zeros[member.name])
                    continue
                with zips[member.wheel].open(info) as data:
                    tar.addfile(tarinfo, data)


def control_text(deb: Deb, installed_kib: int) -> str:
    fields = [
        ("Package", deb.name),
        ("Version", deb.version),
        ("Architecture", ARCH),
        ("Maintainer", MAINTAINER),
        ("Installed-Size", str(installed_kib)),
        ("Depends", ", ".join(deb.depends)),
        ("Section", deb.section),
        ("Priority", "optional"),
        ("Description", deb.description),
    ]
    return "".join(f"{key}: {value}\n" for key, value in fields if value)


class _DebWriter:
    """Where a deb's bytes go: md5 and sha256 of them (for Packages), their count (tarfile asks for the
    position), and a file, or nothing when only the index entry is wanted."""

    def __init__(self, out: BinaryIO | None, hashed: bool = True, start: int = 0) -> None:
        self.out = out
        self.digests = {"MD5sum": hashlib.md5(), "SHA256": hashlib.sha256()} if hashed else {}
        self.size = start

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.out is not None:
            self.out.write(data)
        for digest in self.digests.values():
            digest.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        if self.out is not None:
            self.out.flush()


class _Zeros:
    """A file of `size` zero bytes, for measuring a tar member without reading it."""

    _BLOCK = bytes(fixtures.COPY_BUFFER)

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        self.left -= size
        return self._BLOCK[:size] if size <= len(self._BLOCK) else bytes(size)


def _data_tar_size(members: list[fixtures.Member], zips: dict[Path, zipfile.ZipFile], offset: int) -> int:
    """The size data.tar will have when written at `offset` of the deb (tarfile pads its end to a record
    counted from there): written once with zeros for the files' bytes, which are not read."""
    counter = _DebWriter(None, hashed=False, start=offset)
    zeros = {
        m.name: _Zeros(_member_size(m, zips)) for m in members if m.wheel is not None and not m.link and m.data is None
    }
    _write_data_tar(counter, members, zips, zeros)  # type: ignore[arg-type]
    return counter.size - offset


def write_deb(out: BinaryIO | None, deb: Deb, wheel_paths: dict[str, Path]) -> tuple[str, int, dict[str, str]]:
    """ar(debian-binary, control.tar.gz, data.tar) into `out` (or nowhere: only its index entry is wanted);
    returns the control text, the deb's size and its md5 and sha256."""
    assert deb.members is not None
    members = deb.members(wheel_paths)
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise fixtures.FixtureError(f"{deb.file}: duplicate members")
    with ExitStack() as stack:
        zips = {w: stack.enter_context(zipfile.ZipFile(w)) for w in {m.wheel for m in members if m.wheel}}
        installed = sum((_member_size(m, zips) + 1023) // 1024 for m in members) + 4
        control = control_text(deb, installed)
        control_tar = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=control_tar, mtime=0) as stream, tarfile.open(
            fileobj=stream, mode="w", format=tarfile.GNU_FORMAT
        ) as tar:
            tar.addfile(fixtures._tarinfo("./", tarfile.DIRTYPE, 0o755))
            data = control.encode()
            tar.addfile(fixtures._tarinfo("./control", tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        writer = _DebWriter(out)
        writer.write(b"!<arch>\n")
        for name, blob in (("debian-binary", b"2.0\n"), ("control.tar.gz", control_tar.getvalue())):
            writer.write(_ar_header(name, len(blob)) + blob + (b"\n" if len(blob) % 2 else b""))
        # The archive is written front to back (it may go nowhere but the digests): data.tar's size first.
        size = _data_tar_size(members, zips, writer.tell() + 60)
        writer.write(_ar_header("data.tar", size))
        start = writer.tell()
        _write_data_tar(writer, members, zips)  # type: ignore[arg-type]
        if writer.tell() - start != size:
            raise fixtures.FixtureError(f"{deb.file}: data.tar took {writer.tell() - start} bytes, not {size}")
        if size % 2:
            writer.write(b"\n")
    return control, writer.size, {name: digest.hexdigest() for name, digest in writer.digests.items()}


# --- the signing key ---------------------------------------------------------------------------


def _gpg(home: Path, *args: str, data: bytes | None = None) -> bytes:
    result = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--quiet", "--no-tty", *args],
        input=data,
        capture_output=True,
    )
    if result.returncode != 0:
        raise fixtures.FixtureError(f"gpg {' '.join(args)} failed: {result.stderr.decode(errors='replace')[-1500:]}")
    return result.stdout


def signing_key(cache: Path) -> tuple[Path, str]:
    """The fixture repository's key: generated once, kept in <cache>/aptrepo-gnupg. (home, fingerprint)."""
    home = cache / "aptrepo-gnupg"
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    listing = _gpg(home, "--with-colons", "--list-secret-keys").decode()
    if "fpr:" not in listing:
        started = time.monotonic()
        _gpg(home, "--passphrase", "", "--quick-generate-key", KEY_UID, "rsa3072", "sign", "never")
        log(f"generated the fixture signing key in {time.monotonic() - started:.0f} s")
        listing = _gpg(home, "--with-colons", "--list-secret-keys").decode()
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    return home, fingerprint


# --- the repository ----------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


def _key_file(catalog: dict[str, Any]) -> str:
    return str(catalog["cuda_repo"]["key"]["file"])


def build(cache: Path, root: Path, catalog: dict[str, Any], force: bool, wanted: set[str] | None = None) -> None:
    """Build (or reuse) the repository under <root>/nvidia_cuda_repo; see the module docstring. Packages
    lists every deb the catalog calls for; the files of those in `wanted` (by `name` or `name=version`;
    every one when None) are written, the others' only while up to date from an earlier build, so the index,
    and with it Release and its signatures, stays the same whichever hosts a run serves."""
    started = time.monotonic()
    repo = root / SOURCE
    repo.mkdir(parents=True, exist_ok=True)
    state_path = cache / STATE
    old: dict[str, Any] = {} if force or not state_path.is_file() else json.loads(state_path.read_text())
    debs = plan(catalog)
    home, fingerprint = signing_key(cache)
    key_path = repo / _key_file(catalog)
    armored = _gpg(home, "--armor", "--export", fingerprint)
    if not key_path.is_file() or key_path.read_bytes() != armored:
        _write_atomic(key_path, armored)
    known = {d.file: old["debs"][d.file] for d in debs if old.get("debs", {}).get(d.file, {}).get("key") == d.key()}
    on_disk = {name for name, entry in known.items() if _on_disk(repo / name, entry)}
    to_write = [d for d in debs if d.file not in on_disk and (wanted is None or _wanted(d, wanted))]
    to_index = [d for d in debs if d.file not in known and d not in to_write]
    entries = dict(known)
    if to_write or to_index:
        wheels = sorted({w for d in to_write + to_index for w in d.wheels}, key=lambda w: w.file)
        paths = fixtures.fetch_wheels(wheels, cache)
        # By file: two wheels of one package (cuDNN 8.5.0's and 8.9.6's) each build their own debs; by package
        # for the toolkit's wheels (one version each), which toolkit_members looks up by package.
        by_package = {w.package: paths[w.file] for w in wheels} | {w.file: paths[w.file] for w in wheels}
        for deb in to_write + to_index:
            entries[deb.file] = _build_deb(repo, deb, by_package, write=deb in to_write, known=known.get(deb.file))
    current = on_disk | {d.file for d in to_write}
    for path in repo.glob("*.deb"):
        if path.name not in current:
            path.unlink(missing_ok=True)  # a package the catalog dropped, or a stale file of one not written
    packages = "\n".join(entries[d.file]["stanza"] for d in debs)
    if (
        to_write
        or to_index
        or old.get("packages") != packages
        or old.get("fingerprint") != fingerprint
        or not (repo / "InRelease").is_file()
    ):
        _write_indexes(repo, home, fingerprint, packages)
    new_state = {"fingerprint": fingerprint, "packages": packages, "debs": entries}
    if new_state != old:
        _write_atomic(state_path, (json.dumps(new_state, indent=2) + "\n").encode())
    log(
        f"{len(debs)} packages ({len(on_disk) + len(to_write)} on disk), {len(to_write)} written, "
        f"{len(to_index)} indexed only, in {time.monotonic() - started:.1f} s"
    )


def _wanted(deb: Deb, wanted: set[str]) -> bool:
    return deb.name in wanted or f"{deb.name}={deb.version}" in wanted


def _on_disk(path: Path, entry: dict[str, Any]) -> bool:
    return path.is_file() and path.stat().st_size == entry.get("size")


def _build_deb(
    repo: Path, deb: Deb, wheel_paths: dict[str, Path], write: bool, known: dict[str, Any] | None
) -> dict[str, Any]:
    """The deb's state entry (key, size, Packages stanza, hashes); `write`: its file too. A deb the index
    already lists (`known`) must come out byte for byte as listed."""
    started = time.monotonic()
    dest = repo / deb.file
    partial = dest.with_name(dest.name + ".partial")
    try:
        with ExitStack() as stack:
            out = stack.enter_context(open(partial, "wb")) if write else None
            control, size, hashes = write_deb(out, deb, wheel_paths)
        if known is not None and (known["size"], known["SHA256"]) != (size, hashes["SHA256"]):
            raise fixtures.FixtureError(f"{deb.file}: rebuilt with sha256 {hashes['SHA256']}, listed {known['SHA256']}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if write:
        partial.replace(dest)
    stanza = control + f"Filename: ./{deb.file}\nSize: {size}\n" + "".join(f"{k}: {v}\n" for k, v in hashes.items())
    what = "built" if write else "indexed (file not written)"
    log(f"{what} {deb.file} ({fixtures.megabytes(size)}) in {time.monotonic() - started:.0f} s")
    return {"key": deb.key(), "size": size, "stanza": stanza, **hashes}


def release_text(files: dict[str, bytes]) -> str:
    lines = [
        "Origin: NVIDIA",
        "Label: NVIDIA CUDA",
        "Architecture: x86_64",
        f"Date: {RELEASE_DATE}",
        "Description: TEST FIXTURE standing in for NVIDIA's CUDA repository (testbed/aptrepo.py)",
    ]
    for field, algorithm in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        lines.append(f"{field}:")
        lines += [f" {algorithm(data).hexdigest()} {len(data):>16} {name}" for name, data in files.items()]
    return "\n".join(lines) + "\n"


def _write_indexes(repo: Path, home: Path, fingerprint: str, packages: str) -> None:
    """Packages, Packages.gz, then Release and its signatures (InRelease last)."""
    plain = packages.encode()
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as stream:
        stream.write(plain)
    files = {"Packages": plain, "Packages.gz": buffer.getvalue()}
    for name, data in files.items():
        _write_atomic(repo / name, data)
    release = release_text(files).encode()
    _write_atomic(repo / "Release", release)
    sign = ("--local-user", fingerprint, "--digest-algo", "SHA256")
    _write_atomic(repo / "Release.gpg", _gpg(home, *sign, "--armor", "--detach-sign", data=release))
    _write_atomic(repo / "InRelease", _gpg(home, *sign, "--clearsign", data=release))


def inventory_vars(root: Path, base_url: str) -> dict[str, Any]:
    """The fixture repository as the roles' source, and its key's fingerprint as the trusted one."""
    state_path = root.parent / STATE
    if not (root / SOURCE / "InRelease").is_file() or not state_path.is_file():
        return {}
    state = json.loads(state_path.read_text())
    return {
        "stack_sources": {SOURCE: f"{base_url.rstrip('/')}/{SOURCE}"},
        "nvidia_repo_key_fingerprint": state["fingerprint"],
    }


def main() -> int:
    root = fixtures.build_mirror(every=True)
    print(json.dumps(inventory_vars(root, "http://127.0.0.1:PORT"), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
