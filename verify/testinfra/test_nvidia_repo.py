"""NVIDIA's CUDA apt repository (role nvidia_repo) and what the `cuda_repo` methods installed from it.

Only hosts where at least one component (driver, CUDA, cuDNN, NCCL) uses the cuda_repo method have
the repository; elsewhere these tests are skipped. The source must be trusted through its own
keyring (`signed-by`), never through apt-key's global keyring; the keyring must hold the key with
the expected fingerprint (the inventory's nvidia_repo_key_fingerprint, else the catalog's); every
package must be installed at the catalog's version, from the repository, and held.
"""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import CATALOG

COMPONENTS = ("driver", "cuda", "cudnn", "nccl")
LIST_FILE = "/etc/apt/sources.list.d/msgpu-nvidia-cuda.list"
KEYRING = "/usr/share/keyrings/msgpu-nvidia-cuda.gpg"
PREFERENCES = "/etc/apt/preferences.d/msgpu-nvidia-cuda"

# The v4 fingerprint of the keyring's first (primary) key, computed on the host (no gnupg needed).
FINGERPRINT_PY = r"""
import hashlib, sys
data = open(sys.argv[1], "rb").read()
first = data[0]
if first & 0x40:
    octet = data[1]
    if octet < 192:
        length, at = octet, 2
    elif octet < 224:
        length, at = ((octet - 192) << 8) + data[2] + 192, 3
    else:
        length, at = int.from_bytes(data[2:6], "big"), 6
    tag = first & 0x3F
else:
    size = 1 << (first & 3)
    length, at, tag = int.from_bytes(data[1:1 + size], "big"), 1 + size, (first >> 2) & 0x0F
assert tag == 6, "the keyring does not start with a public key packet"
body = data[at:at + length]
print(hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper())
"""


@pytest.fixture(scope="module")
def repo_components(stack) -> list[str]:
    used = [c for c in COMPONENTS if stack[c]["method"] == "cuda_repo"]
    if not used:
        pytest.skip("no component uses the cuda_repo method on this host")
    return used


@pytest.fixture(scope="module")
def repo_url(stack, repo_components) -> str:
    return stack["sources"][CATALOG["cuda_repo"]["source"]].rstrip("/")


@pytest.fixture(scope="module")
def pinned_packages(stack, repo_components) -> list[tuple[str, str]]:
    """(name, version or "") of every package the stack's cuda_repo methods install."""
    found = []
    for component in repo_components:
        if component == "driver":
            specs = stack["driver"]["packages"]
        elif component == "cuda":
            specs = [p for t in stack["cuda"]["toolkits"] for p in t["artifact"]["packages"]]
        else:
            specs = stack[component]["artifact"]["packages"]
        found += [(s.partition("=")[0], s.partition("=")[2]) for s in specs]
    return found


def test_source_line_is_signed_by_its_own_keyring(host, repo_url):
    lines = [
        line for line in host.file(LIST_FILE).content_string.splitlines() if line.strip() and not line.startswith("#")
    ]
    assert lines == [f"deb [signed-by={KEYRING}] {repo_url}/ /"]


def test_every_source_of_the_repository_has_signed_by(host, repo_url):
    cmd = host.run(f"grep -rhF -- {shlex.quote(repo_url)} /etc/apt/sources.list /etc/apt/sources.list.d")
    assert cmd.rc == 0, "the repository is not an apt source"
    for line in cmd.stdout.splitlines():
        if not line.lstrip().startswith("#"):
            assert f"[signed-by={KEYRING}]" in line, line


@pytest.mark.parametrize("path", [KEYRING, LIST_FILE, PREFERENCES])
def test_apt_files_are_root_owned_0644(host, path, repo_components):
    item = host.file(path)
    assert item.is_file
    assert (item.user, item.group, item.mode) == ("root", "root", 0o644)


def test_keyring_holds_the_expected_key(host, host_vars, repo_components):
    expected = str(host_vars.get("nvidia_repo_key_fingerprint") or CATALOG["cuda_repo"]["key"]["fingerprint"])
    cmd = host.run(f"python3 -c {shlex.quote(FINGERPRINT_PY)} {KEYRING}")
    assert cmd.rc == 0, cmd.stderr
    assert cmd.stdout.strip() == expected.replace(" ", "").upper()


def test_apt_keys_global_keyring_was_not_used(host, repo_components):
    """No key in /etc/apt/trusted.gpg(.d) for the repository: apt-key would trust it for every source."""
    assert not host.file("/etc/apt/trusted.gpg").exists
    listing = host.check_output("ls -1 /etc/apt/trusted.gpg.d")
    assert not re.search(r"cuda|nvidia|msgpu", listing, re.IGNORECASE), listing
    keyring = host.file(KEYRING).content
    for path in listing.split():
        assert host.file(f"/etc/apt/trusted.gpg.d/{path}").content != keyring


def test_repository_is_pinned_like_nvidias(host, host_vars, repo_url):
    """NVIDIA's cuda-repository-pin-600: the repository's packages win over same-named ones."""
    priority = int(host_vars.get("nvidia_repo_pin_priority", 600))
    text = host.file(PREFERENCES).content_string
    assert re.search(r"^Pin: release l=NVIDIA CUDA$", text, re.MULTILINE)
    policy = host.check_output("apt-cache policy")
    assert re.search(rf"^\s*{priority} {re.escape(repo_url)}\s+Packages$", policy, re.MULTILINE), policy


def test_packages_are_installed_from_the_repository_at_the_catalogs_versions(host, repo_url, pinned_packages):
    for name, version in pinned_packages:
        status, installed = host.check_output(
            f"dpkg-query --show --showformat='${{db:Status-Abbrev}}|${{Version}}' {shlex.quote(name)}"
        ).split("|")
        # Status-Abbrev: selection (i install, h hold), state (i installed), error flag (blank).
        assert status[1:] == "i ", (name, status)
        if version:
            assert installed == version, name
        madison = host.check_output(f"apt-cache madison {shlex.quote(name)}")
        rows = [[field.strip() for field in line.split("|")] for line in madison.splitlines()]
        sources = [row[2] for row in rows if row[1] == installed]
        assert any(source.startswith(repo_url) for source in sources), (name, madison)


def test_driver_and_library_packages_are_held(host, stack, pinned_packages):
    held = set(host.check_output("apt-mark showhold").split())
    for name, _ in pinned_packages:
        if not name.startswith("cuda-toolkit-"):
            assert name in held, name
    if stack["driver"]["method"] == "cuda_repo":
        for name in CATALOG["driver"][stack["driver"]["branch"]]["distro"]["packages"]:
            assert name in held, name


def test_a_second_cuda_version_can_be_switched_to(host, stack, repo_components):
    """A login shell that sourced cuda-<second>.sh gets that toolkit's nvcc, not the default's."""
    others = [t for t in stack["cuda"]["toolkits"] if t["version"] != stack["cuda"]["version"]]
    if "cuda" not in repo_components or not others:
        pytest.skip("CUDA is not installed from the repository with a second toolkit here")
    for toolkit in others:
        script = f". /etc/msgpu/env/cuda-{toolkit['version']}.sh && command -v nvcc && nvcc --version"
        cmd = host.run(f"env -i HOME=/root TERM=dumb bash -lc {shlex.quote(script)}")
        assert cmd.rc == 0, cmd.stderr
        assert cmd.stdout.splitlines()[0] == f"/usr/local/cuda-{toolkit['version']}/bin/nvcc"
        assert f"release {toolkit['version']}, V{toolkit['full_version']}" in cmd.stdout
        owner = host.check_output(f"dpkg-query --search /usr/local/cuda-{toolkit['version']}/bin/nvcc")
        assert owner.split(":")[0] in toolkit["artifact"]["packages"]
