"""NVIDIA's CUDA repository refused on a host when it cannot be trusted (the nvidia_repo role), on a fresh
Ubuntu 20.04 container with the signed fixture repository (testbed/aptrepo.py) on the loopback mirror:

- a key with another fingerprint than the one the role expects (the catalog's: NVIDIA's 3bf863cc key,
  while the mirror serves the fixture's key): gpg reads the key, the role refuses it naming both, and no
  keyring, apt source or pin is written;
- a tampered repository: the mirror changes bytes in the signed InRelease/Release.gpg (a bad signature),
  or in the package index (it no longer matches the signed Release file): apt refuses the index, the role
  removes the source and its pin again (so the host's later `apt-get update` still works) and stops;
- in every case nothing from the repository is installed (libnccl2, the component run here). The healthy
  repository converging and a re-run changing nothing: the nvidia_repo scenario (molecule/nvidia_repo).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from testbed import aptrepo, fixtures, mirror

from .conftest import ROOT, Host, PlaybookRun, host_with_mirror, refusals, run_playbook

CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
NVIDIA_FINGERPRINT = CATALOG["cuda_repo"]["key"]["fingerprint"].replace(" ", "").upper()
KEYRING = "/usr/share/keyrings/msgpu-nvidia-cuda.gpg"
LIST = "/etc/apt/sources.list.d/msgpu-nvidia-cuda.list"
PIN = "/etc/apt/preferences.d/msgpu-nvidia-cuda"
INDEX_FILES = ("Packages", "Packages.gz")
SIGNED_FILES = ("InRelease", "Release.gpg")


class Repo:
    """The host, the mirror and the inventory of this module's runs."""

    def __init__(self, host: Host, served: mirror.Mirror, inventory: Path) -> None:
        self.host, self.served, self.inventory = host, served, inventory

    def run(self, extra_vars: dict | None = None) -> PlaybookRun:
        started = time.monotonic()
        result = run_playbook("site.yml", self.inventory, extra_vars, args=["--tags", "preflight,nccl"])
        print(f"site.yml --tags preflight,nccl {extra_vars or ''}: {time.monotonic() - started:.1f} s, rc {result.rc}")
        return result

    def corrupt(self, names: tuple[str, ...]) -> None:
        for name in names:
            self.served.inject(f"{aptrepo.SOURCE}/{name}", "corrupt")

    def nothing_from_the_repository(self) -> None:
        """No apt source or pin of the repository, no package of it installed, and apt still updates."""
        host = self.host
        assert host.sh(f"test -e {LIST} || test -e {PIN}").returncode != 0, host.sh(f"ls -l {LIST} {PIN}").stdout
        installed = host.sh("dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' 'libnccl*' 2>/dev/null").stdout
        assert [line for line in installed.splitlines() if line.split()[1:] and line.split()[1][1] == "i"] == []
        update = host.sh("LC_ALL=C apt-get update -o Acquire::Retries=0 2>&1")
        assert update.returncode == 0 and not re.search(r"^E: ", update.stdout, re.M), update.stdout[-2000:]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    settings = {
        # NCCL from NVIDIA's repository: the smallest component that needs it. The host downloads for itself
        # (no controller cache), as the role does on a real server.
        "stack_nccl_method": "cuda_repo",
        "stack_artifact_cache_dir": "",
    }
    with host_with_mirror("msgpu-it-repo", tmp_path_factory.mktemp("repo"), settings) as (host, served, inventory):
        trusted = fixtures.inventory_vars(served.root, served.base_url)["nvidia_repo_key_fingerprint"]
        assert trusted != NVIDIA_FINGERPRINT  # the mirror's key is the fixture's own
        yield Repo(host, served, inventory)


def test_a_key_with_another_fingerprint_is_refused_and_nothing_is_trusted(repo: Repo) -> None:
    """The default: NVIDIA's fingerprint from the catalog; the mirror serves the fixture's own key."""
    result = repo.run({"nvidia_repo_key_fingerprint": NVIDIA_FINGERPRINT})
    assert result.rc != 0, result.output[-3000:]
    found = " ".join(refusals(result.output))
    assert "refusing the key:" in found and f"expected exactly the one with fingerprint {NVIDIA_FINGERPRINT}" in found
    assert "Nothing was trusted. nvidia_repo_key_fingerprint" in found, found
    assert repo.host.sh(f"test -e {KEYRING}").returncode != 0
    repo.nothing_from_the_repository()


@pytest.mark.parametrize(
    ("files", "apt_says"),
    [
        (SIGNED_FILES, "E: GPG error"),  # apt: BADSIG / NODATA, the signature does not verify
        (INDEX_FILES, "Hash Sum mismatch"),
    ],
    ids=["bad-signature", "index-not-the-signed-one"],
)
def test_a_tampered_repository_is_refused_and_its_source_removed(repo: Repo, files: tuple[str, ...], apt_says: str):
    repo.corrupt(files)
    try:
        result = repo.run()
    finally:
        repo.served.heal()
    assert result.rc != 0, result.output[-3000:]
    flat = " ".join(result.output.split())
    assert "apt refused the repository's index, so nothing from it is installed" in flat, result.output[-3000:]
    assert apt_says in flat, result.output[-3000:]
    assert f"The source ({LIST}) and its pin were removed again" in flat
    assert "TASK [cuda_library : Install the library packages at the catalog's versions]" not in result.output
    repo.nothing_from_the_repository()
