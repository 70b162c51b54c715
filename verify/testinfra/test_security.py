"""What the toolkit leaves on a host is not a hole: nothing it wrote is writable by anybody but its
owner's group-less self, NVIDIA's apt repository (when used) is trusted through a `signed-by`
keyring only, and the download cache holds nothing a user could swap.

Runs against every converged host (molecule scenarios, or `--hosts` on a real fleet).
"""

from __future__ import annotations

import pytest

# Everything the roles write as root: env scripts, modulefiles, the download cache, the toolkits
# and their libraries, TensorRT's prefix, the apt source and keyrings.
ROOT_TREES = [
    "/etc/msgpu",
    "/var/cache/msgpu",
    "/usr/local/cuda-*",
    "/usr/local/TensorRT-*",
    "/etc/modprobe.d/blacklist-nouveau.conf",
    "/etc/apt/sources.list.d",
    "/usr/share/keyrings",
    "/etc/apt/keyrings",
]


def find(host, trees: list[str], condition: str) -> list[str]:
    """Paths below the existing `trees` that match a find(1) condition (symlinks never count)."""
    script = (
        "for t in " + " ".join(trees) + '; do [ -e "$t" ] && find "$t" ! -type l \\( ' + condition + " \\) -print; "
        "done; true"
    )
    return host.run(script).stdout.split()


def test_nothing_the_roles_wrote_is_group_or_world_writable(host):
    writable = find(host, ROOT_TREES, "-perm -g+w -o -perm -o+w")
    assert writable == [], writable


def test_everything_the_roles_wrote_as_root_belongs_to_root(host):
    foreign = find(host, ROOT_TREES, "! -user root -o ! -group root")
    assert foreign == [], foreign


def test_env_scripts_exist_and_are_root_owned_0644(host):
    scripts = host.run("ls /etc/msgpu/env/*.sh").stdout.split()
    assert scripts, "no env script in /etc/msgpu/env"
    for script in scripts:
        info = host.file(script)
        assert (info.user, info.group, info.mode) == ("root", "root", 0o644), script


def test_no_key_is_trusted_globally(host):
    # A key in apt's global keyrings (apt-key add, or a file dropped into trusted.gpg.d) is valid
    # for every repository. Only the distribution's own keyring packages may put keys there.
    files = host.run("ls -d /etc/apt/trusted.gpg /etc/apt/trusted.gpg.d/* 2>/dev/null; true").stdout.split()
    for path in files:
        owner = host.run(f"dpkg -S {path}")
        assert owner.rc == 0 and owner.stdout.split(":")[0].endswith("-keyring"), (
            f"{path} is not from a distribution keyring package: {owner.stdout or owner.stderr}"
        )


def test_every_nvidia_apt_source_is_signed_by_its_own_keyring(host):
    sources = host.run(
        "grep -rhE '^[[:space:]]*deb' /etc/apt/sources.list /etc/apt/sources.list.d 2>/dev/null; true"
    ).stdout.splitlines()
    nvidia = [line for line in sources if "nvidia" in line.lower() or "cuda" in line.lower()]
    if not nvidia:
        pytest.skip("no NVIDIA apt repository on this host (install methods other than cuda_repo)")
    for line in nvidia:
        assert "signed-by=" in line, line
        keyring = line.split("signed-by=", 1)[1].split("]", 1)[0].split()[0]
        info = host.file(keyring)
        assert info.exists and info.user == "root" and info.mode == 0o644, (line, keyring)


def test_no_tls_verification_is_disabled_for_pip_or_apt(host):
    pip = host.run("cat /etc/pip.conf /root/.pip/pip.conf /root/.config/pip/pip.conf 2>/dev/null; true").stdout
    assert "trusted-host" not in pip, pip
    apt = host.run("grep -rhi 'Verify-Peer\\|Verify-Host' /etc/apt/apt.conf.d 2>/dev/null; true").stdout
    assert "false" not in apt.lower(), apt
