"""A fixture for NVIDIA's driver runfile (NVIDIA-Linux-x86_64-<version>.run), built from NVIDIA's real
470 driver files as Ubuntu publishes them.

NVIDIA's download server is unreachable from the build and CI machines; the Ubuntu archive is not.
Ubuntu's focal-updates carries NVIDIA's own 470 driver, repackaged: the kernel module sources
(nvidia-kernel-source-470, with the dkms.conf of nvidia-dkms-470) and the user-space binaries
(libnvidia-compute-470, nvidia-utils-470, nvidia-compute-utils-470). This module downloads those
.deb files with `apt-get download` inside a sandbox container (apt checks the archive's signed
indexes), checks each one against the sha256 pinned below, and packs their files into a
self-extracting runfile with the official name and the `nvidia-installer` command line the
nvidia_driver role uses (`--silent --dkms --kernel-name=K`, `--uninstall`, ...).

The runfile is written to `<mirror>/nvidia_driver/<catalog path>` for the runfile of the default
stack's driver branch. Its name says 470.86 (the seed's release); everything inside is 470.256.02
and says so. testbed/FIXTURES.md ("NVIDIA driver runfile") lists what is real and what is not.

    python -m testbed.driver_fixture            # build (or check) the runfile, print its sha256
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import lzma
import shutil
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from testbed import fixtures, sandbox

SOURCE = "nvidia_driver"
MANIFEST = "driver-manifest.json"
SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
LIBDIR = "/usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class Deb:
    """One Ubuntu package, pinned by version and by the sha256 of its .deb."""

    package: str
    version: str
    sha256: str

    @property
    def file(self) -> str:
        return f"{self.package}_{self.version}_amd64.deb"


# The driver branch these packages carry, its real release and the packages with their sha256: test-bed
# data, beside this file (testbed/driver_fixture_debs.yml), not in the catalog the operators' runs read.
_PINS = yaml.safe_load((Path(__file__).with_name("driver_fixture_debs.yml")).read_text())
BRANCH = str(_PINS["branch"])
REAL_VERSION = str(_PINS["release"])
DEBS = tuple(Deb(package, str(_PINS["ubuntu_version"]), sha256) for package, sha256 in _PINS["sha256"].items())
_COMPUTE, _UTILS, _COMPUTE_UTILS = (
    f"{name}-{BRANCH}" for name in ("libnvidia-compute", "nvidia-utils", "nvidia-compute-utils")
)

# User-space files taken from the packages: (package, path in the package, destination on the host).
# The OpenCL ICD (libnvidia-opencl, libnvidia-compiler) is left out: nothing in the stack uses it.
LIBRARIES = (
    (_COMPUTE, f"usr/lib/x86_64-linux-gnu/libcuda.so.{REAL_VERSION}"),
    (_COMPUTE, f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{REAL_VERSION}"),
    (_COMPUTE, f"usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.{REAL_VERSION}"),
    (_COMPUTE, "usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4.0.0"),
)
PROGRAMS = (
    (_UTILS, "usr/bin/nvidia-smi"),
    (_UTILS, "usr/bin/nvidia-debugdump"),
    (_COMPUTE_UTILS, "usr/bin/nvidia-persistenced"),
    (_COMPUTE_UTILS, "usr/bin/nvidia-cuda-mps-control"),
    (_COMPUTE_UTILS, "usr/bin/nvidia-cuda-mps-server"),
)
PERSISTENCED_SAMPLES = (_COMPUTE_UTILS, f"usr/share/doc/{_COMPUTE_UTILS}/nvidia-persistenced-init.tar.bz2")
LICENSE = (_COMPUTE, f"usr/share/doc/{_COMPUTE}/copyright")
KERNEL_SOURCES = (
    (f"nvidia-kernel-source-{BRANCH}", f"usr/src/nvidia-{REAL_VERSION}/"),
    (f"nvidia-dkms-{BRANCH}", f"usr/src/nvidia-{REAL_VERSION}/"),
)


def log(message: str) -> None:
    print(f"[driver fixture] {message}", file=sys.stderr, flush=True)


# --- the .deb files ----------------------------------------------------------------------------


def _verified(path: Path, deb: Deb) -> bool:
    return path.is_file() and fixtures.sha256_file(path) == deb.sha256


def fetch_debs(cache: Path = sandbox.CACHE, debs: tuple[Deb, ...] = DEBS) -> dict[str, Path]:
    """The pinned .deb files under `<cache>/debs`, downloaded with apt inside a sandbox container when
    missing; returns {package: path}. A file with another sha256 is deleted and never used."""
    dest = cache / "debs"
    dest.mkdir(parents=True, exist_ok=True)
    missing = [d for d in debs if not _verified(dest / d.file, d)]
    if missing:
        for deb in missing:
            (dest / deb.file).unlink(missing_ok=True)
        started = time.monotonic()
        image = sandbox.build_image("focal")
        name = f"msgpu-fixture-debs-{hashlib.sha256(str(dest).encode()).hexdigest()[:8]}"
        sandbox.stop_host(name)
        wanted = " ".join(f"{d.package}={d.version}" for d in missing)
        # apt verifies the archive's InRelease signature and every index and package checksum.
        script = f"set -e; apt-get update -qq; cd /out; apt-get download -qq {wanted}; chown {_owner(dest)} *.deb"
        cmd = ["docker", "run", "--rm", "--name", name, "--label", sandbox.LABEL, "--network", "host"]
        result = sandbox.run([*cmd, "-v", f"{dest}:/out", image, "sh", "-c", script], check=False, capture=True)
        if result.returncode != 0:
            raise fixtures.FixtureError(f"apt-get download {wanted} failed: {result.stderr[-2000:]}")
        for deb in missing:
            path = dest / deb.file
            if not path.is_file():
                raise fixtures.FixtureError(f"apt-get download {deb.package}={deb.version} did not produce {deb.file}")
            got = fixtures.sha256_file(path)
            if got != deb.sha256:
                path.unlink()
                raise fixtures.FixtureError(
                    f"{deb.file}: sha256 {got} does not match the pin in testbed/driver_fixture.py ({deb.sha256}); "
                    "the file was deleted"
                )
        log(f"downloaded {len(missing)} package(s) from the Ubuntu archive in {time.monotonic() - started:.0f} s")
    return {d.package: dest / d.file for d in debs}


def _owner(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_uid}:{stat.st_gid}"


def deb_data(path: Path) -> tarfile.TarFile:
    """The data.tar.* member of a .deb (an `ar` archive), opened as a tar file."""
    blob = path.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise fixtures.FixtureError(f"{path.name}: not a .deb (ar) archive")
    offset = 8
    while offset + 60 <= len(blob):
        header = blob[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = blob[offset + 60 : offset + 60 + size]
        if name.startswith("data.tar"):
            if name.endswith(".xz"):
                body = lzma.decompress(body)
            elif name.endswith(".gz"):
                body = gzip.decompress(body)
            elif name != "data.tar":
                raise fixtures.FixtureError(f"{path.name}: {name} is compressed in a way this builder cannot read")
            return tarfile.open(fileobj=io.BytesIO(body), mode="r:")
        offset += 60 + size + size % 2
    raise fixtures.FixtureError(f"{path.name}: no data.tar member")


class Packages:
    """Read access to the files of the downloaded packages."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.tars = {package: deb_data(path) for package, path in paths.items()}

    def _member(self, package: str, name: str) -> tarfile.TarInfo:
        try:
            return self.tars[package].getmember(f"./{name}")
        except KeyError:
            raise fixtures.FixtureError(f"{package}: no file {name}") from None

    def read(self, package: str, name: str) -> bytes:
        data = self.tars[package].extractfile(self._member(package, name))
        if data is None:
            raise fixtures.FixtureError(f"{package}: {name} is not a regular file")
        return data.read()

    def tree(self, package: str, prefix: str) -> list[tarfile.TarInfo]:
        """Regular files and symlinks under `prefix` (a folder, ending in /)."""
        return [
            m
            for m in self.tars[package].getmembers()
            if m.name.removeprefix("./").startswith(prefix) and (m.isfile() or m.issym())
        ]


# --- the runfile -------------------------------------------------------------------------------


def runfile_name(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}"


def payload_members(packages: Packages, version: str) -> list[fixtures.Member]:
    """The files of the runfile's payload, under NVIDIA-Linux-x86_64-<version>/ as NVIDIA's runfile
    unpacks: libraries and programs at the top, the kernel module sources in kernel/."""
    top = runfile_name(version)
    members: dict[str, fixtures.Member] = {}

    def add(name: str, data: bytes, mode: int) -> None:
        members[f"{top}/{name}"] = fixtures.Member(name=f"{top}/{name}", mode=mode, data=data)

    for package, path in LIBRARIES + PROGRAMS:
        mode = 0o755
        add(PurePosixPath(path).name, packages.read(package, path), mode)
    add("nvidia-persistenced-init.tar.bz2", packages.read(*PERSISTENCED_SAMPLES), 0o644)
    add("LICENSE", packages.read(*LICENSE), 0o644)
    for package, prefix in KERNEL_SOURCES:
        for info in packages.tree(package, prefix):
            relative = info.name.removeprefix("./").removeprefix(prefix)
            name = f"{top}/kernel/{relative}"
            if info.issym():
                members[name] = fixtures.symlink(name, info.linkname)
            else:
                members[name] = fixtures.Member(
                    name=name, mode=info.mode & 0o777, data=packages.read(package, info.name[2:])
                )
    add("nvidia-installer", _fill(INSTALLER, version).encode(), 0o755)
    add(".fixture.json", fixture_json(version), 0o644)
    return sorted(members.values(), key=lambda m: m.name)


def fixture_json(version: str) -> bytes:
    document = {
        "note": "Test fixture built by testbed/driver_fixture.py (testbed/FIXTURES.md): the file name "
        f"says {version}; the driver inside is NVIDIA's {REAL_VERSION} as Ubuntu ships it.",
        "runfile": f"{runfile_name(version)}.run",
        "driver_version": REAL_VERSION,
        "built_from": [{"package": d.package, "version": d.version, "sha256": d.sha256} for d in DEBS],
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def _fill(template: str, version: str, **extra: str) -> str:
    values = {"NAME": runfile_name(version), "VERSION": version, "REAL": REAL_VERSION, **extra}
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    return template


# nvidia-installer: NVIDIA's installer is a binary; this POSIX sh script implements the part of
# its command line the nvidia_driver role uses, with NVIDIA's option names and meanings.
INSTALLER = r"""#!/bin/sh
# nvidia-installer (TEST FIXTURE for @NAME@.run; testbed/FIXTURES.md). Installs NVIDIA's
# @REAL@ driver files taken from Ubuntu's packages; the kernel module is built with DKMS only.
set -u
VERSION=@REAL@
MODULE=nvidia
LIBDIR=/usr/lib/x86_64-linux-gnu
STATE=/var/lib/nvidia
FILES=$STATE/fixture-installed-files
log=/var/log/nvidia-installer.log
here=$(cd "$(dirname "$0")" && pwd)
silent=0
dkms=0
uninstall=0
kernel=""
tmpdir=${TMPDIR:-/tmp}
nouveau_check=1
bad=""
case ${0##*/} in nvidia-uninstall) uninstall=1 ;; esac

usage() {
    cat <<'USAGE'
nvidia-installer for @NAME@.run (test fixture: NVIDIA's @REAL@ driver files, DKMS only,
no interactive UI)
Usage: sh @NAME@.run --silent --dkms [options]
       nvidia-uninstall [--silent]
  -s, --silent              required: the fixture has no interactive UI
  -q, --no-questions, -a, --accept-license, --ui=none
                            accepted (no questions are ever asked)
  --dkms                    required: build and install the kernel module with DKMS
  -k K, --kernel-name=K     build the module for kernel K (default: the running kernel)
  --tmpdir=DIR              temporary files in DIR (default $TMPDIR or /tmp)
  --log-file-name=FILE      log to FILE (default /var/log/nvidia-installer.log)
  --no-nouveau-check        do not refuse to install while nouveau is loaded
  --skip-module-load        accepted (the fixture never loads the module)
  --uninstall               remove the driver this installer installed
  -v, --version             print the installer's (= the driver's) version
  -x, --extract-only, --list, --check, --info
                            runfile options (handled before the installer starts)
USAGE
}

logline() { printf '%s\n' "$1" >>"$log" 2>/dev/null || true; }
say() { logline "$1"; [ "$silent" = 1 ] || printf '%s\n' "$1"; }
fail() { logline "ERROR: $1"; printf 'ERROR: %s\n' "$1" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        -s | --silent) silent=1 ;;
        -q | --no-questions | -a | --accept-license | --ui=none | --skip-module-load) ;;
        --dkms) dkms=1 ;;
        --no-nouveau-check) nouveau_check=0 ;;
        -k)
            [ $# -ge 2 ] || { usage >&2; fail "-k needs a kernel name"; }
            shift
            kernel=$1
            ;;
        --kernel-name=*) kernel=${1#--kernel-name=} ;;
        --tmpdir=*) tmpdir=${1#--tmpdir=} ;;
        --log-file-name=*) log=${1#--log-file-name=} ;;
        --uninstall) uninstall=1 ;;
        -v | --version) printf 'nvidia-installer:  version %s (test fixture for @NAME@.run)\n' "$VERSION"; exit 0 ;;
        -h | --help | -A | --advanced-options) usage; exit 0 ;;
        *) bad="$bad $1" ;;
    esac
    shift
done
[ -z "$bad" ] || { usage >&2; fail "unknown option(s):$bad (the options this fixture supports are listed above)"; }
[ "$(id -u)" = 0 ] || fail "nvidia-installer must be run as root"

# Removes what $FILES lists and the DKMS module; used by --uninstall and before a new install.
remove_driver() {
    if command -v dkms >/dev/null 2>&1; then
        for version in $(dkms status -m "$MODULE" 2>/dev/null | sed -n 's|^[^,/]*[,/] *\([^,:]*\).*|\1|p' | sort -u); do
            say "Removing the DKMS module $MODULE/$version"
            dkms remove -m "$MODULE" -v "$version" --all >>"$log" 2>&1 \
                || fail "dkms remove -m $MODULE -v $version --all failed"
        done
    fi
    if [ -f "$FILES" ]; then
        while IFS= read -r file; do
            case $file in /*) rm -rf -- "$file" ;; esac
        done <"$FILES"
        rm -f -- "$FILES"
    fi
    ldconfig
}

if [ "$uninstall" = 1 ]; then
    [ -f "$FILES" ] || fail "there is no NVIDIA driver installed by nvidia-installer on this system ($FILES is missing)"
    logline "nvidia-installer: uninstalling NVIDIA $VERSION"
    remove_driver
    say "Uninstallation of existing driver: NVIDIA Accelerated Graphics Driver for Linux-x86_64 ($VERSION) is complete."
    exit 0
fi

[ -f "$here/.fixture.json" ] || fail "no driver package next to $0: run the .run file to install, or pass --uninstall"
[ "$silent" = 1 ] || { usage >&2; fail "--silent is required: this fixture has no interactive installer"; }
[ "$dkms" = 1 ] || fail "--dkms is required: this fixture builds and installs the kernel module with DKMS only"
[ -d "$tmpdir" ] || fail "--tmpdir=$tmpdir: no such directory"
kernel=${kernel:-$(uname -r)}
logline "nvidia-installer log file '$log' (test fixture for @NAME@.run)"
logline "installing NVIDIA $VERSION for kernel $kernel"
if [ "$nouveau_check" = 1 ] && grep -q '^nouveau ' /proc/modules 2>/dev/null; then
    fail "The Nouveau kernel driver is currently in use by your system. This driver is incompatible \
with the NVIDIA driver, and must be disabled before proceeding."
fi
[ -e "/lib/modules/$kernel/build/Makefile" ] || fail "Unable to find the kernel source tree for the kernel \
'$kernel'. Please make sure you have installed the kernel source files for your kernel (/lib/modules/$kernel/build)."
command -v dkms >/dev/null 2>&1 || fail "--dkms: the dkms command is not installed"
command -v make >/dev/null 2>&1 && command -v cc >/dev/null 2>&1 \
    || fail "make and a C compiler (cc) are needed to build the kernel module"

if [ -f "$FILES" ] || dkms status -m "$MODULE" 2>/dev/null | grep -q .; then
    say "Uninstalling the existing NVIDIA driver first"
    remove_driver
fi
mkdir -p "$STATE" || fail "cannot create $STATE"
: >"$FILES"
installed() { printf '%s\n' "$1" >>"$FILES"; }

src=/usr/src/$MODULE-$VERSION
rm -rf -- "$src"
installed "$src"
cp -R "$here/kernel" "$src" || fail "copying the kernel module sources to $src failed"
say "Building the kernel module for $kernel with DKMS (about a minute)"
dkms add -m "$MODULE" -v "$VERSION" >>"$log" 2>&1 || fail "dkms add -m $MODULE -v $VERSION failed (see $log)"
if ! dkms build -m "$MODULE" -v "$VERSION" -k "$kernel" >>"$log" 2>&1 \
    || ! dkms install -m "$MODULE" -v "$VERSION" -k "$kernel" >>"$log" 2>&1; then
    cat "/var/lib/dkms/$MODULE/$VERSION/build/make.log" >>"$log" 2>/dev/null
    remove_driver
    fail "Failed to install the kernel module through DKMS for kernel $kernel (the build log is in $log)"
fi

for lib in libcuda libnvidia-ml libnvidia-ptxjitcompiler; do
    install -m 0755 "$here/$lib.so.$VERSION" "$LIBDIR/$lib.so.$VERSION" || fail "installing $lib failed"
    ln -sfn "$lib.so.$VERSION" "$LIBDIR/$lib.so.1"
    ln -sfn "$lib.so.1" "$LIBDIR/$lib.so"
    installed "$LIBDIR/$lib.so.$VERSION"
    installed "$LIBDIR/$lib.so.1"
    installed "$LIBDIR/$lib.so"
done
install -m 0755 "$here/libnvidia-nvvm.so.4.0.0" "$LIBDIR/libnvidia-nvvm.so.4.0.0" \
    || fail "installing libnvidia-nvvm failed"
ln -sfn libnvidia-nvvm.so.4.0.0 "$LIBDIR/libnvidia-nvvm.so.4"
ln -sfn libnvidia-nvvm.so.4 "$LIBDIR/libnvidia-nvvm.so"
installed "$LIBDIR/libnvidia-nvvm.so.4.0.0"
installed "$LIBDIR/libnvidia-nvvm.so.4"
installed "$LIBDIR/libnvidia-nvvm.so"
for program in nvidia-smi nvidia-debugdump nvidia-persistenced nvidia-cuda-mps-control nvidia-cuda-mps-server; do
    install -m 0755 "$here/$program" "/usr/bin/$program" || fail "installing $program failed"
    installed "/usr/bin/$program"
done
samples=/usr/share/doc/NVIDIA_GLX-1.0
mkdir -p "$samples/samples"
install -m 0644 "$here/nvidia-persistenced-init.tar.bz2" "$samples/samples/nvidia-persistenced-init.tar.bz2"
install -m 0644 "$here/LICENSE" "$samples/LICENSE"
install -m 0644 "$here/.fixture.json" "$samples/fixture.json"
installed "$samples"
install -m 0755 "$0" /usr/bin/nvidia-installer || fail "installing nvidia-installer failed"
ln -sfn nvidia-installer /usr/bin/nvidia-uninstall
installed /usr/bin/nvidia-uninstall
installed /usr/bin/nvidia-installer
ldconfig || fail "ldconfig failed"
say "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $VERSION) is now complete."
exit 0
"""

# The makeself-style header: checks and unpacks the payload, then runs nvidia-installer with the
# remaining options, as NVIDIA's .run files do.
HEADER = r"""#!/bin/sh
# TEST FIXTURE standing in for NVIDIA's driver runfile @NAME@.run: NVIDIA's @REAL@ driver files
# from Ubuntu's packages (testbed/driver_fixture.py, testbed/FIXTURES.md). A shell header and a
# tar.gz payload from byte @START@ on (sha256 @PAYLOAD_SHA256@).
set -u
skip=@START@
payload_sha256=@PAYLOAD_SHA256@
tmpdir=${TMPDIR:-/tmp}
mode=install
target=""
for arg in "$@"; do
    case $arg in
        --tmpdir=*) tmpdir=${arg#--tmpdir=} ;;
        -x | --extract-only) mode=extract ;;
        --list) mode=list ;;
        --check) mode=check ;;
        --info) mode=info ;;
        --target=*) target=${arg#--target=} ;;
    esac
done
check() {
    sum=$(tail -c +$skip "$0" | sha256sum | cut -d' ' -f1)
    [ "$sum" = "$payload_sha256" ] \
        || { echo "ERROR: $0 is corrupt (payload sha256 $sum, expected $payload_sha256)" >&2; exit 1; }
}
case $mode in
    info)
        echo "Identification: NVIDIA Accelerated Graphics Driver for Linux-x86_64 @VERSION@ (test fixture: @REAL@)"
        echo "Target directory: @NAME@"
        echo "Uncompressed size: @SIZE@ bytes"
        echo "Compression: gzip"
        exit 0
        ;;
    list) tail -c +$skip "$0" | tar -tzf -; exit $? ;;
    check) check; echo "$0: payload sha256 ok"; exit 0 ;;
    extract)
        check
        tail -c +$skip "$0" | tar -xzf - -C "${target:-.}" || exit 1
        echo "Extracted into ${target:-.}/@NAME@"
        exit 0
        ;;
esac
[ -d "$tmpdir" ] || { echo "ERROR: --tmpdir=$tmpdir: no such directory" >&2; exit 1; }
check
work=$(mktemp -d "$tmpdir/makeself.XXXXXXXX") || { echo "ERROR: cannot create a directory in $tmpdir" >&2; exit 1; }
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
tail -c +$skip "$0" | tar -xzf - -C "$work" || { echo "ERROR: unpacking $0 into $work failed" >&2; exit 1; }
sh "$work/@NAME@/nvidia-installer" "$@"
exit $?
"""


def runfile_header(version: str, payload_sha256: str, size: int) -> bytes:
    """The header with the payload's byte offset (for `tail -c +N`) filled in."""
    start = 0
    while True:
        text = _fill(HEADER, version, START=str(start), PAYLOAD_SHA256=payload_sha256, SIZE=str(size))
        header = text.encode()
        if len(header) + 1 == start:
            return header
        start = len(header) + 1


def write_runfile(path: Path, version: str, members: list[fixtures.Member], work: Path) -> str:
    """Payload (reproducible tar.gz) + header; returns the runfile's sha256."""
    payload = work / f"{runfile_name(version)}.payload.tar.gz"
    payload_sha256 = fixtures.write_tarball(payload, members, "gz")
    size = sum(len(m.data or b"") for m in members)
    try:
        with open(path, "wb") as raw, open(payload, "rb") as data:
            out = fixtures.HashingWriter(raw)
            out.write(runfile_header(version, payload_sha256, size))
            shutil.copyfileobj(data, out, fixtures.COPY_BUFFER)  # type: ignore[misc]
    finally:
        payload.unlink(missing_ok=True)
    path.chmod(0o755)
    return out.digest.hexdigest()


# --- the hook for fixtures.build_mirror --------------------------------------------------------


def runfiles(catalog: dict[str, Any]) -> list[dict[str, Any]]:
    """Catalog runfile entries this fixture stands in for: the default stack's branch release, when
    that branch is the one the packages carry."""
    stack = catalog["stacks"][catalog["default_stack"]]
    branch = str(stack["driver_branch"])
    if branch != BRANCH:
        return []
    entry = catalog["driver"][branch]
    version = str(entry["version"])
    artifact = entry.get("runfile", {}).get(version)
    return [{"version": version, **artifact}] if artifact and artifact.get("source") == SOURCE else []


def build_key(artifact: dict[str, Any]) -> str:
    blob = json.dumps([artifact, [d.__dict__ for d in DEBS], SOURCE_HASH], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_manifest(root: Path) -> dict[str, dict[str, Any]]:
    path = root / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def _build_runfile(cache: Path, artifact: dict[str, Any], dest: Path) -> str:
    members = payload_members(Packages(fetch_debs(cache)), artifact["version"])
    work = cache / "mirror-work"
    work.mkdir(parents=True, exist_ok=True)
    return fixtures._timed(artifact["file"], lambda p: write_runfile(p, artifact["version"], members, work), dest)


def build(cache: Path, root: Path, catalog: dict[str, Any], force: bool, wanted: set[str] | None = None) -> None:
    """Build the driver runfile fixture(s) under root/nvidia_driver/<path>; cached by build key. Each is
    built whatever `wanted` holds (the test bed's hosts install one; 55 MB)."""
    old = {} if force else read_manifest(root)
    manifest: dict[str, dict[str, Any]] = {}
    for artifact in runfiles(catalog):
        dest = root / SOURCE / artifact["path"]
        key = build_key(artifact)
        entry = old.get(artifact["file"])
        if entry and entry.get("build_key") == key and dest.is_file() and dest.stat().st_size == entry.get("size"):
            manifest[artifact["file"]] = entry
            continue
        started = time.monotonic()
        sha256 = _build_runfile(cache, artifact, dest)
        manifest[artifact["file"]] = {
            "source": SOURCE,
            "path": artifact["path"],
            "sha256": sha256,
            "size": dest.stat().st_size,
            "kind": "driver_runfile",
            "catalog_version": artifact["version"],
            "reports_version": REAL_VERSION,
            "real_version": REAL_VERSION,
            "built_from": [d.file for d in DEBS],
            "build_key": key,
        }
        log(f"{artifact['file']}: built in {time.monotonic() - started:.0f} s")
    for name, entry in old.items():
        if name not in manifest:
            (root / entry["source"] / entry["path"]).unlink(missing_ok=True)
    if manifest != old or not (root / MANIFEST).is_file():
        root.mkdir(parents=True, exist_ok=True)
        partial = root / (MANIFEST + ".partial")
        partial.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        partial.replace(root / MANIFEST)


def inventory_vars(root: Path, base_url: str) -> dict[str, Any]:
    """Pin the runfile fixture's sha256 (stack_sources.nvidia_driver already points at the mirror)."""
    return {"stack_artifact_checksums": {name: e["sha256"] for name, e in sorted(read_manifest(root).items())}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=sandbox.CACHE, help="cache folder (default: .cache)")
    parser.add_argument("--force", action="store_true", help="rebuild the runfile")
    args = parser.parse_args(argv)
    root = args.cache / "mirror"
    try:
        build(args.cache, root, fixtures.load_catalog(), args.force)
    except fixtures.FixtureError as exc:
        print(f"driver fixture: {exc}", file=sys.stderr)
        return 1
    for name, entry in read_manifest(root).items():
        print(f"{name}: {fixtures.megabytes(entry['size'])}, sha256 {entry['sha256']}, driver {entry['real_version']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
