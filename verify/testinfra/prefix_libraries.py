"""Checks shared by the libraries the roles copy into a CUDA prefix (cuDNN, NCCL): each role
records what it installed in <prefix>/.msgpu-<role>.files and writes <prefix>/.msgpu-<role>
(the artifact's sha256) last."""

from __future__ import annotations

import re
import shlex


def recorded_files(host, prefix: str, role: str) -> list[str]:
    manifest = host.file(f"{prefix}/.msgpu-{role}.files")
    assert manifest.is_file, f"{manifest.path} missing: the {role} role has not completed here"
    return [line for line in manifest.content_string.splitlines() if line.strip()]


def assert_symlink_chain(host, lib64: str, library: str, major: str) -> None:
    """lib<x>.so -> lib<x>.so.<major> -> lib<x>.so.<major>.<minor>.<patch>, as in NVIDIA's tarballs."""
    assert host.file(f"{lib64}/{library}.so").is_symlink
    assert host.check_output(f"readlink {shlex.quote(f'{lib64}/{library}.so')}") == f"{library}.so.{major}"
    assert host.file(f"{lib64}/{library}.so.{major}").is_symlink
    real = host.check_output(f"readlink {shlex.quote(f'{lib64}/{library}.so.{major}')}")
    assert re.fullmatch(rf"{re.escape(library)}\.so\.{major}\.\d+\.\d+", real), real
    real_file = host.file(f"{lib64}/{real}")
    assert real_file.is_file and not real_file.is_symlink


def assert_marker(host, prefix: str, role: str, pinned: str | None) -> None:
    marker = host.file(f"{prefix}/.msgpu-{role}")
    assert marker.is_file
    checksum = marker.content_string.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", checksum)
    if pinned:
        assert checksum == pinned


def assert_root_owned(host, prefix: str, recorded: list[str], library: str) -> None:
    """Every recorded file is root's and not world-writable (symlinks' own modes do not count)."""
    assert any(name.startswith("include/") for name in recorded)
    assert any(name.startswith(f"lib64/{library}.so") for name in recorded)
    paths = " ".join(shlex.quote(f"{prefix}/{name}") for name in recorded)
    listing = host.check_output(f"stat -c '%U:%G %a %F %n' -- {paths}").splitlines()
    assert len(listing) == len(recorded)
    offenders = [
        line
        for line in listing
        if not line.startswith("root:root ") or ("symbolic link" not in line and int(line.split()[1], 8) & 0o002)
    ]
    assert not offenders


def assert_not_in_linker_configuration(host, prefix: str) -> None:
    """The env scripts put the prefix on the library path; the roles must not touch ld.so.conf."""
    cmd = host.run(f"grep -rsF -- {shlex.quote(prefix)} /etc/ld.so.conf /etc/ld.so.conf.d")
    assert cmd.rc == 1, cmd.stdout
