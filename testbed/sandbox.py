"""Sandbox hosts: real Ubuntu 20.04 (and Debian 11) root file systems in Docker containers.

No image registry is reachable, so the base image is built with debootstrap from the
distribution's archive and imported into Docker. The Ubuntu archive keyring comes from the
Ubuntu pool, pinned by sha256 (Debian ships no Ubuntu keyring). The image is cached by content:
the recipe below, the keyring and the host's extra CA certificates (an intercepting proxy's CA
must be trusted inside the container for pip and apt over HTTPS).

Used by the toolkit's tasks (cli/local.py: `./toolkit sandbox up`, `./toolkit provision`), by molecule
(through the MSGPU_SANDBOX_IMAGE environment variable) and by the integration tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from testbed import fixtures
from testbed.files import CACHE, ROOT, locked, sha256_file

LABEL = "msgpu.sandbox=1"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")


@dataclass(frozen=True)
class Distro:
    """How to debootstrap one base image."""

    name: str
    suite: str
    mirror: str
    components: str
    sources: str
    include: tuple[str, ...]
    keyring_url: str = ""
    keyring_sha256: str = ""
    keyring_member: str = ""
    host_keyring: str = ""


UBUNTU_ARCHIVE = os.environ.get("MSGPU_UBUNTU_ARCHIVE", "http://archive.ubuntu.com/ubuntu")
DEBIAN_ARCHIVE = os.environ.get("MSGPU_DEBIAN_ARCHIVE", "http://deb.debian.org/debian")

DISTROS = {
    # The product's target: what a fresh Ubuntu Server 20.04 has that matters here (python3,
    # python3-apt for Ansible's apt module, pciutils, kmod, sudo) and nothing more.
    "focal": Distro(
        name="ubuntu-20.04",
        suite="focal",
        mirror=UBUNTU_ARCHIVE,
        components="main,universe",
        sources=(
            f"deb {UBUNTU_ARCHIVE} focal main restricted universe multiverse\n"
            f"deb {UBUNTU_ARCHIVE} focal-updates main restricted universe multiverse\n"
            f"deb {UBUNTU_ARCHIVE} focal-security main restricted universe multiverse\n"
        ),
        # python2.7-minimal: a real interpreter with no MindSpore wheel, for preflight tests.
        # ccache: the test bed's compiler cache for repeated DKMS builds (COMPILER_CACHE below).
        include=(
            "python3",
            "python3-apt",
            "ca-certificates",
            "pciutils",
            "kmod",
            "sudo",
            "python2.7-minimal",
            "ccache",
        ),
        keyring_url=f"{UBUNTU_ARCHIVE}/pool/main/u/ubuntu-keyring/ubuntu-keyring_2020.02.11.4_all.deb",
        keyring_sha256="2684fae16e90a9ff3cb4dc08a8af5bd9973d38763b60e5f458dea0b403a39788",
        keyring_member="./usr/share/keyrings/ubuntu-archive-keyring.gpg",
    ),
    # An OS the toolkit does not support, to prove preflight refuses it.
    "bullseye": Distro(
        name="debian-11",
        suite="bullseye",
        mirror=DEBIAN_ARCHIVE,
        components="main",
        sources=f"deb {DEBIAN_ARCHIVE} bullseye main\n",
        include=("python3", "python3-apt", "ca-certificates"),
        host_keyring="/usr/share/keyrings/debian-archive-keyring.gpg",
    ),
}

# Bump when the build steps in build_image() change, so cached images are rebuilt.
RECIPE_VERSION = 4

# The test bed's compiler cache. One suite run builds the same NVIDIA kernel module for the same kernel
# with DKMS several times (each molecule scenario, the runfile fixture, the fabric manager test): every
# build is real (DKMS runs the module's own make, links and installs the .ko), and a container started
# with a compiler cache (start_host(..., compiler_cache=True), the molecule scenarios' platforms) gets
# identical compiler calls answered by ccache from the shared COMPILER_CACHE folder mounted at /ccache.
# gcc-9 (Ubuntu 20.04's compiler, which DKMS and the kernel's make reach as cc, gcc or gcc-9) is
# diverted in the image, before any host installs it, to gcc-9.real behind a wrapper that calls ccache
# only when /ccache is mounted, and the real compiler otherwise. Nothing of this is part of the product.
# The molecule scenarios' platforms mount this same folder (molecule/*/molecule.yml: `volumes`).
COMPILER_CACHE = ROOT / ".cache" / "ccache"
COMPILER_WRAPPER = r"""#!/bin/sh
# Test bed only (testbed/sandbox.py): gcc-9 through ccache when the compiler cache is mounted.
[ -d /ccache ] && [ -x /usr/bin/ccache ] || exec /usr/bin/gcc-9.real "$@"
export CCACHE_DIR=/ccache
# NVIDIA's conftest.sh probes the kernel with about 200 compiles per module build, each of a new
# conftest<PID>.c whose PID is in the arguments too (KBUILD_BASENAME), so ccache never finds one
# again; and about half fail by design, which ccache does not keep. Probes are remembered here,
# keyed by the arguments and the probe's source with the PID taken out, and the build's
# conftest/headers.h: a known probe gives the same exit status, output and files (its object file,
# named for the new PID) without compiling.
probe=""
for arg in "$@"; do
    case "$arg" in conftest[0-9]*.c) probe="$arg" ;; esac
done
pid=${probe#conftest}
pid=${pid%.c}
case "$pid" in "" | *[!0-9]*) probe="" ;; esac
[ -n "$probe" ] && [ -f "$probe" ] || exec /usr/bin/ccache /usr/bin/gcc-9.real "$@"
key=$({ printf '%s\n' "$@"; cat "$probe" conftest/headers.h 2>/dev/null; } | sed "s/conftest[0-9][0-9]*/conftest/g" \
    | sha256sum | cut -c1-64)
known=/ccache/conftest-probes/$key
if [ -f "$known/status" ]; then
    for file in "$known"/conftest*; do
        [ -f "$file" ] && cp "$file" "conftest$pid${file##*/conftest}"
    done
    cat "$known/stdout"
    cat "$known/stderr" >&2
    exit "$(cat "$known/status")"
fi
mkdir -p /ccache/conftest-probes
work=$(mktemp -d /ccache/conftest-probes/.new.XXXXXX) || exec /usr/bin/ccache /usr/bin/gcc-9.real "$@"
/usr/bin/ccache /usr/bin/gcc-9.real "$@" >"$work/stdout" 2>"$work/stderr"
status=$?
cat "$work/stdout"
cat "$work/stderr" >&2
for file in "conftest$pid" "conftest$pid".*; do
    [ -f "$file" ] && [ "$file" != "$probe" ] && cp "$file" "$work/conftest${file#conftest$pid}"
done
echo "$status" >"$work/status"
mv -T "$work" "$known" 2>/dev/null || rm -rf "$work"
exit "$status"
"""
# Kernel module builds: the same tree at the same path in every container; DKMS's conftest files are new.
COMPILER_CACHE_CONF = (
    "max_size = 4G\nhash_dir = false\nsloppiness = time_macros,include_file_mtime,include_file_ctime\n"
)

# Docker images keep services from starting (no init system); a real host runs them.
POLICY_RC_D = "#!/bin/sh\nexit 101\n"


class SandboxError(RuntimeError):
    """A clear, user-facing failure of the test bed."""


def log(message: str) -> None:
    print(f"[sandbox] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], check: bool = True, capture: bool = False, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, text=True, capture_output=capture, **kwargs)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()[-2000:] if capture else ""
        raise SandboxError(f"command failed ({result.returncode}): {' '.join(cmd)}\n{detail}")
    return result


def _apt_install(packages: list[str]) -> None:
    if os.geteuid() != 0:
        raise SandboxError(f"{', '.join(packages)} missing; install them (sudo apt-get install {' '.join(packages)})")
    log(f"installing {' '.join(packages)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *packages], env=env)


def docker_ready() -> bool:
    return shutil.which("docker") is not None and run(["docker", "info"], check=False, capture=True).returncode == 0


def ensure_docker(timeout: float = 90.0) -> None:
    """Make a Docker engine answer: install docker.io and start dockerd when needed."""
    if docker_ready():
        return
    if shutil.which("dockerd") is None:
        _apt_install(["docker.io"])
        if docker_ready():
            return
    CACHE.mkdir(parents=True, exist_ok=True)
    log_file = CACHE / "dockerd.log"
    log(f"starting dockerd (log: {log_file})")
    with open(log_file, "ab") as out:
        subprocess.Popen(["dockerd"], stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker_ready():
            return
        time.sleep(1)
    raise SandboxError(f"dockerd did not answer within {timeout:.0f} s; see {log_file}")


def _host_ca_files() -> list[Path]:
    return sorted(HOST_CA_DIR.glob("*.crt")) if HOST_CA_DIR.is_dir() else []


def image_key(distro: Distro) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(distro.__dict__, sort_keys=True).encode())
    digest.update(f"{RECIPE_VERSION}{POLICY_RC_D}{COMPILER_WRAPPER}".encode())
    for ca in _host_ca_files():
        digest.update(ca.read_bytes())
    return digest.hexdigest()[:16]


def image_tag(flavour: str = "focal") -> str:
    return f"msgpu-sandbox:{flavour}-{image_key(DISTROS[flavour])}"


def _fetch_keyring(distro: Distro, workdir: Path) -> Path:
    if distro.host_keyring:
        if not Path(distro.host_keyring).is_file():
            _apt_install(["debian-archive-keyring"])
        return Path(distro.host_keyring)
    deb = CACHE / "downloads" / Path(distro.keyring_url).name
    deb.parent.mkdir(parents=True, exist_ok=True)
    if not deb.is_file() or sha256_file(deb) != distro.keyring_sha256:
        log(f"fetching {distro.keyring_url}")
        partial = deb.with_suffix(".partial")
        with urllib.request.urlopen(distro.keyring_url, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
        got = sha256_file(partial)
        if got != distro.keyring_sha256:
            partial.unlink()
            raise SandboxError(f"{deb.name}: sha256 {got} does not match the pinned {distro.keyring_sha256}")
        partial.rename(deb)
    unpacked = workdir / "keyring"
    run(["dpkg-deb", "-x", str(deb), str(unpacked)])
    return unpacked / distro.keyring_member


def build_image(flavour: str = "focal") -> str:
    """Return the tag of the sandbox image, building it (or importing it from the cache) if needed."""
    distro = DISTROS[flavour]
    tag = image_tag(flavour)
    ensure_docker()
    with locked(CACHE / "images" / f"{flavour}.lock"):
        return _build_image(distro, flavour, tag)


def _build_image(distro: Distro, flavour: str, tag: str) -> str:
    if run(["docker", "image", "inspect", tag], check=False, capture=True).returncode == 0:
        return tag
    tarball = CACHE / "images" / f"{flavour}-{image_key(distro)}.tar"
    if not tarball.is_file():
        if shutil.which("debootstrap") is None:
            _apt_install(["debootstrap"])
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="msgpu-rootfs-") as tmp:
            work = Path(tmp)
            keyring = _fetch_keyring(distro, work)
            rootfs = work / "rootfs"
            log(f"debootstrap {distro.suite} from {distro.mirror} (about 30 s)")
            started = time.monotonic()
            run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--components={distro.components}",
                    f"--include={','.join(distro.include)}",
                    f"--keyring={keyring}",
                    distro.suite,
                    str(rootfs),
                    distro.mirror,
                ],
                capture=True,
            )
            log(f"debootstrap done in {time.monotonic() - started:.0f} s")
            (rootfs / "etc/apt/sources.list").write_text(distro.sources)
            policy = rootfs / "usr/sbin/policy-rc.d"
            policy.write_text(POLICY_RC_D)
            policy.chmod(0o755)
            if "ccache" in distro.include:
                # gcc-9 is not installed yet: the diversion makes its package unpack to gcc-9.real.
                run(
                    [
                        "chroot",
                        str(rootfs),
                        "dpkg-divert",
                        "--local",
                        "--rename",
                        "--divert",
                        "/usr/bin/gcc-9.real",
                        "--add",
                        "/usr/bin/gcc-9",
                    ],
                    capture=True,
                )
                wrapper = rootfs / "usr/bin/gcc-9"
                wrapper.write_text(COMPILER_WRAPPER)
                wrapper.chmod(0o755)
            for ca in _host_ca_files():
                shutil.copy(ca, rootfs / "usr/local/share/ca-certificates" / ca.name)
            run(["chroot", str(rootfs), "update-ca-certificates"], capture=True)
            shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
            # debootstrap's package lists cover only its own components; stale lists would make
            # apt's cache_valid_time skip the update a real host would need for the full sources.
            shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
            (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
            # ...and an empty list folder must look old, as on a host that never ran apt update.
            for stale in (rootfs / "var/lib/apt/lists/partial", rootfs / "var/lib/apt/lists"):
                os.utime(stale, (0, 0))
            (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
            partial = tarball.with_suffix(".partial")
            with tarfile.open(partial, "w") as tar:
                tar.add(rootfs, arcname=".")
            partial.rename(tarball)
    log(f"importing {tarball.name} as {tag}")
    with open(tarball, "rb") as data:
        run(
            ["docker", "import", "--change", 'CMD ["sleep", "infinity"]', "--change", "ENV LANG=C.UTF-8", "-", tag],
            stdin=data,
            capture=True,
        )
    return tag


def compiler_cache_dir() -> Path:
    """The compiler cache's folder on this machine, with its settings (see COMPILER_CACHE)."""
    COMPILER_CACHE.mkdir(parents=True, exist_ok=True)
    (COMPILER_CACHE / "ccache.conf").write_text(COMPILER_CACHE_CONF)
    return COMPILER_CACHE


def remembered_probes() -> int:
    """How many of NVIDIA's conftest probes the compiler wrapper remembers (COMPILER_WRAPPER)."""
    return len(list((COMPILER_CACHE / "conftest-probes").glob("*/status")))


def compiler_cache_stats(flavour: str = "focal") -> str:
    """ccache's own statistics of the shared cache (hits, misses, size), or "" when it was never used."""
    if not (COMPILER_CACHE / "ccache.conf").is_file() or not docker_ready():
        return ""
    mount = f"{COMPILER_CACHE}:/ccache"
    result = run(
        ["docker", "run", "--rm", "-v", mount, "-e", "CCACHE_DIR=/ccache", image_tag(flavour), "ccache", "-s"],
        check=False,
        capture=True,
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def start_host(name: str, flavour: str = "focal", network: str = "host", compiler_cache: bool = False) -> str:
    """(Re)create a sandbox container called `name`; returns its name.

    By default the container shares the machine's network namespace, so the fixture mirror
    that tests serve on 127.0.0.1 (testbed/mirror.py) is on the host's loopback too.
    `compiler_cache`: mount the test bed's compiler cache (COMPILER_CACHE) for its DKMS builds.
    """
    tag = build_image(flavour)
    stop_host(name)
    cmd = ["docker", "run", "-d", "--name", name, "--hostname", name, "--label", LABEL, "--network", network]
    if compiler_cache:
        cmd += ["-v", f"{compiler_cache_dir()}:/ccache"]
    run([*cmd, tag], capture=True)
    return name


def rebase_host(name: str, tag: str) -> str:
    """Commit the container `name` as the image `tag` and recreate `name` from it with the same name,
    hostname, labels, network, mounts and command: the same files, now in a shared image layer. Throwaway
    copies started from `tag` (tests/system/test_doctor.py breaks one per test) then cost only what they
    change, where a commit next to the running container held every installed file twice (7-9 GB for the
    default stack's host, the suite's disk peak). Returns `tag`; remove it after the container."""
    found = run(["docker", "inspect", name], capture=True, check=False)
    if found.returncode != 0:
        raise SandboxError(f"rebase: no container called {name}: {found.stderr.strip()}")
    info = json.loads(found.stdout)[0]
    config, host = info["Config"], info["HostConfig"]
    cmd = ["docker", "run", "-d", "--name", name, "--hostname", config.get("Hostname") or name]
    labels = sorted((config.get("Labels") or {}).items())
    cmd += [item for key, value in labels for item in ("--label", f"{key}={value}")]
    cmd += ["--network", host.get("NetworkMode") or "default"]
    cmd += [item for bind in host.get("Binds") or [] for item in ("-v", bind)]
    cmd += ["--privileged"] if host.get("Privileged") else []
    started = time.monotonic()
    run(["docker", "commit", name, tag], capture=True)  # keeps the command, environment and user
    run(["docker", "rm", "-f", name], capture=True)
    run([*cmd, tag], capture=True)
    log(f"{name} now runs from its committed image {tag} ({time.monotonic() - started:.0f} s)")
    return tag


def stop_host(name: str) -> None:
    if shutil.which("docker") and docker_ready():
        run(["docker", "rm", "-f", name], check=False, capture=True)


def host_running(name: str) -> bool:
    result = run(["docker", "inspect", "-f", "{{.State.Running}}", name], check=False, capture=True)
    return result.returncode == 0 and result.stdout.strip() == "true"


def write_inventory(
    path: Path,
    hosts: list[str],
    group_vars: dict | None = None,
    host_vars: dict[str, dict] | None = None,
    down: Iterable[str] = (),
) -> Path:
    """An Ansible inventory that reaches the containers through the docker connection (`host_vars`:
    settings of single hosts, over the group's), with the test bed's catalog (fixtures.testbed_catalog).

    `down`: hosts whose container a test stopped or never started (a powered-off server). They get no
    pipelining: with it, the docker connection plugin reports the missing container as a failed task,
    where SSH - the real fleets' connection - and the plugin without pipelining say unreachable."""
    off = set(down)
    inventory = {
        "all": {
            "children": {
                "gpu_servers": {
                    "hosts": {
                        h: {**({"ansible_pipelining": False} if h in off else {}), **(host_vars or {}).get(h, {})}
                        for h in hosts
                    },
                    "vars": {
                        "ansible_connection": "community.docker.docker",
                        "ansible_python_interpreter": "/usr/bin/python3",
                        # Sandbox containers have no GPU on purpose.
                        "stack_no_gpu": True,
                        # The catalog with the fixture CUDA toolkit's size (fixtures.testbed_catalog).
                        "stack_catalog_file": str(fixtures.testbed_catalog()),
                        **(group_vars or {}),
                    },
                }
            }
        }
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(inventory, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m testbed.sandbox rebase NAME TAG` (the suite's step before the system tests)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "rebase":
        print("usage: python -m testbed.sandbox rebase CONTAINER IMAGE_TAG", file=sys.stderr)
        return 2
    try:
        rebase_host(args[1], args[2])
    except SandboxError as exc:
        print(f"rebase: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
