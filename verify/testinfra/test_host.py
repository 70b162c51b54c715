"""The host itself: a platform the catalog supports, and an interpreter with a MindSpore wheel."""

from __future__ import annotations

from conftest import CATALOG


def test_platform_is_supported(platform):
    assert platform in CATALOG["platforms"]


def test_architecture_has_wheels(host, platform):
    assert host.system_info.arch in CATALOG["platforms"][platform]["architectures"]


def test_python_has_a_mindspore_wheel(host, stack, python_path):
    tag = host.check_output(f"{python_path} -c 'import sys; print(\"cp%d%d\" % sys.version_info[:2])'")
    assert tag in stack["python_tags"]


def test_python_is_the_platforms(host, platform, python_path):
    version = host.check_output(f"{python_path} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'")
    assert version == CATALOG["platforms"][platform]["python"]
