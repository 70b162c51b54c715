"""The catalog resolver: what preflight accepts and what it refuses, with which message."""

from __future__ import annotations

import re

import pytest

from tests.conftest import RESOLVER_REFUSALS


def errors_for(stack_catalog, catalog, pinned, **settings) -> list[str]:
    return stack_catalog.resolve_stack(catalog, {"artifact_checksums": pinned, **settings})["errors"]


@pytest.fixture
def resolve(stack_catalog, catalog, pinned):
    """Resolve settings with every unpinned download given a checksum."""

    def run(**settings):
        return stack_catalog.resolve_stack(catalog, {"artifact_checksums": pinned, **settings})

    return run


@pytest.mark.parametrize("name", ["ms1.5-cuda11.1", "ms1.10-cuda11.1", "ms2.2-cuda11.6"])
def test_every_stack_resolves_with_its_defaults(resolve, name):
    result = resolve(name=name)
    assert result["errors"] == []
    assert result["stack"]["name"] == name


def test_default_stack_is_the_seeds(resolve):
    stack = resolve()["stack"]
    assert stack["mindspore"]["package"] == "mindspore-gpu"
    assert stack["mindspore"]["version"].startswith("1.5.")
    assert (stack["cuda"]["version"], stack["cudnn"]["version"], stack["nccl"]["version"]) == ("11.1", "8.0.5", "2.8.4")
    assert stack["driver"]["branch"] == "470"
    assert stack["driver"]["minimum"] == "450.80.02"
    assert set(stack["mindspore"]["pins"]) == {"numpy<1.24", "pillow<10"}
    assert "cp38" in stack["python_tags"]


def test_seed_stack_accepts_the_vendor_cp38_build(resolve, catalog):
    stack = resolve(mindspore_version="1.5.0")["stack"]
    wheel = stack["mindspore"]["wheels"]["cp38"]
    assert wheel["url"].startswith(catalog["sources"]["mindspore_release"])
    assert wheel["url"].endswith("mindspore_gpu-1.5.0-cp38-cp38-linux_x86_64.whl")


def test_mirror_override_rewrites_urls(resolve):
    stack = resolve(name="ms2.2-cuda11.6", sources={"mindspore_release": "http://127.0.0.1:8080/ms/"})["stack"]
    assert stack["mindspore"]["wheels"]["cp38"]["url"] == (
        "http://127.0.0.1:8080/ms/2.2.14/MindSpore/unified/x86_64/mindspore-2.2.14-cp38-cp38-linux_x86_64.whl"
    )


def test_pypi_artifacts_carry_requirement_and_checksum(resolve):
    stack = resolve(cudnn_version="8.5.0", cudnn_method="wheel", nccl_version="2.14.3", nccl_method="wheel")["stack"]
    assert stack["cudnn"]["artifact"]["requirement"] == "nvidia-cudnn-cu11==8.5.0.96"
    assert re.fullmatch(r"[0-9a-f]{64}", stack["cudnn"]["artifact"]["sha256"])
    assert stack["nccl"]["artifact"]["requirement"] == "nvidia-nccl-cu11==2.14.3"


def test_checksum_override_is_applied(resolve, pinned):
    digest = "cd" * 32
    checksums = {**pinned, "cudnn-11.1-linux-x64-v8.0.5.39.tgz": f"sha256:{digest.upper()}"}
    stack = resolve(artifact_checksums=checksums)["stack"]
    assert stack["cudnn"]["artifact"]["sha256"] == digest


def test_unpinned_download_is_refused(stack_catalog, catalog):
    errors = stack_catalog.resolve_stack(catalog, {})["errors"]
    assert any(e.startswith("stack_artifact_checksums.cuda_11.1.0_455.23.05_linux.run: ") for e in errors), errors
    assert all("stack_local_artifacts" in e for e in errors)


def test_local_artifact_needs_no_checksum(stack_catalog, catalog, pinned, tmp_path):
    tarball = tmp_path / "cudnn-11.1-linux-x64-v8.0.5.39.tgz"
    tarball.write_bytes(b"x")
    checksums = {k: v for k, v in pinned.items() if k != tarball.name}
    result = stack_catalog.resolve_stack(
        catalog, {"artifact_checksums": checksums, "local_artifacts": {tarball.name: str(tarball)}}
    )
    assert result["errors"] == []
    assert result["stack"]["cudnn"]["artifact"]["local_path"] == str(tarball)


@pytest.mark.parametrize(("settings", "variable", "allowed"), RESOLVER_REFUSALS)
def test_refusals_name_the_variable_and_what_is_allowed(stack_catalog, catalog, pinned, settings, variable, allowed):
    errors = errors_for(stack_catalog, catalog, pinned, **settings)
    matching = [e for e in errors if e.startswith(f"{variable}: ")]
    assert matching, f"no error for {variable} in {errors}"
    assert any(allowed in e for e in matching), matching


def test_version_key_orders_driver_versions(stack_catalog):
    key = stack_catalog.version_key
    assert key("450.80.02") < key("470.86") < key("510.39.01")
    assert key("2.8.4") > key("2.7.8")
