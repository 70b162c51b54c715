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


@pytest.mark.parametrize("name", ["ms1.5-cuda11.1", "ms1.10-cuda11.1", "ms2.0-cuda11.1", "ms2.2-cuda11.6"])
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


# --- MindSpore Serving -------------------------------------------------------------------------
def test_serving_is_off_by_default_and_changes_nothing(resolve):
    stack = resolve()["stack"]
    assert stack["serving"]["enabled"] is False
    assert stack["serving"]["available"] is True and stack["serving"]["version"] == "1.5.0"
    assert stack["tensorrt"]["enabled"] is False
    assert not [d for d in stack["artifact_cache"]["downloads"] if d["component"] == "serving"]


def test_serving_on_the_seed_stack_comes_from_the_vendor_and_brings_tensorrt(resolve, catalog):
    result = resolve(serving_enabled=True)
    assert result["errors"] == []
    stack = result["stack"]
    serving = stack["serving"]
    assert (serving["enabled"], serving["version"], serving["package"]) == (True, "1.5.0", "mindspore-serving")
    wheel = serving["wheels"]["cp38"]
    assert wheel["url"] == (
        catalog["sources"]["mindspore_release"]
        + "/1.5.0/Serving/x86_64/mindspore_serving-1.5.0-cp38-cp38-linux_x86_64.whl"
    )
    # The vendor publishes no checksum: the user's (here the test's pin) is what the host preflight needs.
    assert catalog["serving"]["1.5.0"]["wheels"]["cp38"]["sha256"] is None
    # Serving's GPU inference needs TensorRT: enabling Serving enables the stack's TensorRT 7.2.2.3.
    assert stack["tensorrt"]["enabled"] is True and stack["tensorrt"]["required_by_serving"] is True
    assert stack["tensorrt"]["version"] == "7.2.2.3"


def test_serving_2_0_comes_from_pypi_with_its_pins(resolve, stack_catalog):
    stack = resolve(name="ms2.0-cuda11.1", serving_enabled=True, artifact_cache_dir="/srv/cache")["stack"]
    serving = stack["serving"]
    assert serving["version"] == "2.0.2" and serving["pins"] == ["protobuf<=3.20.3", "numpy<1.24"]
    wheel = serving["wheels"]["cp38"]
    assert wheel["source"] == "pypi" and wheel["requirement"] == "mindspore-serving==2.0.2"
    assert wheel["local_path"] == "/srv/cache/mindspore_serving-2.0.2-cp38-cp38-manylinux1_x86_64.whl"
    downloads = [d for d in stack["artifact_cache"]["downloads"] if d["component"] == "serving"]
    assert {d["python_tag"] for d in downloads} == {"cp37", "cp38", "cp39"}
    # The wheelhouse holds Serving's dependencies too; the two big wheels are cached on their own.
    (house,) = stack_catalog.cache_wheelhouses([stack], ["cp38"], ["serving"])
    assert house["requirements"] == [
        "mindspore==2.0.0",
        "pillow<10",
        "mindspore-serving==2.0.2",
        "protobuf<=3.20.3",
        "numpy<1.24",
    ]
    assert house["exclude"] == [
        "mindspore-2.0.0-cp38-cp38-manylinux1_x86_64.whl",
        "mindspore_serving-2.0.2-cp38-cp38-manylinux1_x86_64.whl",
    ]


def test_vendor_serving_wheelhouse_uses_the_catalogs_dependency_list(resolve, stack_catalog, catalog):
    stack = resolve(serving_enabled=True, artifact_cache_dir="/srv/cache")["stack"]
    (house,) = stack_catalog.cache_wheelhouses([stack], ["cp38"], ["mindspore", "serving"])
    assert "mindspore-serving==1.5.0" not in house["requirements"]  # not on PyPI
    assert (
        house["requirements"][-len(catalog["serving"]["1.5.0"]["dependencies"]) :]
        == (catalog["serving"]["1.5.0"]["dependencies"])
    )


@pytest.mark.parametrize("name", ["ms1.10-cuda11.1", "ms2.2-cuda11.6"])
def test_serving_on_a_stack_without_serving_is_refused_by_name(resolve, name):
    result = resolve(name=name, serving_enabled=True)
    (error,) = [e for e in result["errors"] if e.startswith("stack_serving_enabled")]
    assert f"'{name}' has no MindSpore Serving release" in error
    assert "ms1.5-cuda11.1, ms2.0-cuda11.1" in error
    assert result["stack"]["serving"]["enabled"] is False


def test_serving_that_does_not_serve_the_chosen_mindspore_is_refused(resolve):
    # ms1.5's Serving 1.5.0 serves MindSpore 1.5.x; an override outside that is refused.
    result = resolve(name="ms2.0-cuda11.1", serving_enabled=True, mindspore_version="2.2.14", cuda_version="11.6")
    errors = [e for e in result["errors"] if e.startswith("stack_serving_enabled")]
    assert errors and "serves MindSpore 2.0.0, not 2.2.14" in errors[0]


def test_serving_enabled_must_be_a_boolean(resolve):
    errors = resolve(serving_enabled="yes please")["errors"]
    assert "stack_serving_enabled: 'yes please' is not a boolean; allowed: true, false" in errors


def test_disk_parts_name_what_goes_under_the_prefix_and_how_to_tell_it_is_there(resolve):
    stack = resolve()["stack"]
    parts = {p["name"]: p for p in stack["disk"]}
    assert list(parts) == ["CUDA 11.1", "cuDNN 8.0.5", "NCCL 2.8.4"]
    assert parts["CUDA 11.1"]["path"] == "cuda-11.1/.msgpu-installed"
    assert parts["cuDNN 8.0.5"]["path"] == "cuda-11.1/.msgpu-cudnn"
    assert parts["NCCL 2.8.4"]["path"] == "cuda-11.1/.msgpu-nccl"
    assert stack["disk_mb"] == sum(p["mb"] for p in stack["disk"]) == 8000 + 2500 + 300


def test_disk_parts_follow_the_install_method(resolve):
    stack = resolve(
        cuda_method="cuda_repo", cudnn_method="cuda_repo", tensorrt_enabled=True, cuda_extra_versions=["11.4"]
    )["stack"]
    parts = {p["name"]: p for p in stack["disk"]}
    assert parts["CUDA 11.1"] == {"name": "CUDA 11.1", "mb": 8000, "path": "", "packages": ["cuda-toolkit-11-1"]}
    assert parts["CUDA 11.4"]["packages"] == ["cuda-toolkit-11-4"]
    # Debian packages are found by name; the catalog's "=<version>" pins are not part of it.
    assert parts["cuDNN 8.0.5"]["packages"] == ["libcudnn8", "libcudnn8-dev"]
    assert parts["TensorRT 7.2.2.3"]["path"] == "TensorRT-7.2.2.3/.msgpu-installed"


def test_wheels_go_into_the_virtualenv_and_are_not_counted_under_the_prefix(resolve):
    stack = resolve(cudnn_version="8.5.0", cudnn_method="wheel", nccl_version="2.14.3", nccl_method="wheel")["stack"]
    assert [p["name"] for p in stack["disk"]] == ["CUDA 11.1"]
    assert stack["disk_mb"] == 8000
