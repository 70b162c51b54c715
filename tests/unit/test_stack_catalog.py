"""The catalog resolver: what preflight accepts and what it refuses, with which message."""

from __future__ import annotations

import re

import pytest

from tests.conftest import RESOLVER_REFUSALS, ROOT, load_module

# The cache's filters (what a run fetches), owned by the artifacts role.
CACHE_FILTERS = load_module("artifacts_cache", ROOT / "roles" / "artifacts" / "filter_plugins" / "artifacts_cache.py")


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
    assert (stack["cuda"]["version"], stack["cudnn"]["version"]) == ("11.1", "8.0.5")
    # NCCL: the PyPI wheel, the one NCCL file with a public checksum (the seed's 2.8.4 tarball has none).
    assert (stack["nccl"]["version"], stack["nccl"]["method"]) == ("2.14.3", "wheel")
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
    """A file no public source pins (the catalog says why) is refused until the user gives its sha256 or a copy;
    the message gives the command that computes the sum."""
    # The seed's NCCL tarball (the default stack's default is NCCL's PyPI wheel, pinned by PyPI).
    errors = stack_catalog.resolve_stack(catalog, {"nccl_method": "tarball", "nccl_version": "2.8.4"})["errors"]
    nccl = catalog["nccl"]["2.8.4"]["tarball"]
    assert nccl["sha256"] is None and nccl["no_public_checksum"], nccl
    refusal = [e for e in errors if e.startswith(f"stack_artifact_checksums.{nccl['file']}: ")]
    assert refusal and "sha256sum" in refusal[0], errors
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
    (house,) = CACHE_FILTERS.cache_wheelhouses([stack], ["cp38"], ["serving"])
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
    (house,) = CACHE_FILTERS.cache_wheelhouses([stack], ["cp38"], ["mindspore", "serving"])
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
    assert list(parts) == ["CUDA 11.1", "cuDNN 8.0.5", "NCCL 2.14.3"]
    assert parts["CUDA 11.1"]["path"] == "cuda-11.1/.msgpu-installed"
    assert parts["cuDNN 8.0.5"]["path"] == "cuda-11.1/.msgpu-cudnn"
    assert parts["NCCL 2.14.3"]["path"] == "cuda-11.1/.msgpu-nccl"
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


def test_cudnn_and_nccl_wheels_count_under_the_prefix_tensorrt_wheels_do_not(resolve, catalog):
    """The cuda_library role unpacks NVIDIA's cuDNN/NCCL wheels under the CUDA prefix (with the same
    marker as a tarball); TensorRT's wheel goes into the MindSpore virtualenv."""
    stack = resolve(
        cudnn_version="8.5.0",
        cudnn_method="wheel",
        tensorrt_enabled=True,
        tensorrt_method="wheel",
        tensorrt_version="8.4.1.5",
    )["stack"]
    parts = {p["name"]: p for p in stack["disk"]}
    assert list(parts) == ["CUDA 11.1", "cuDNN 8.5.0", "NCCL 2.14.3"]
    assert parts["cuDNN 8.5.0"]["path"] == "cuda-11.1/.msgpu-cudnn"
    assert stack["disk_mb"] == 8000 + catalog["cudnn"]["8.5.0"]["disk_mb"] + catalog["nccl"]["2.14.3"]["disk_mb"]


# --- issue 14: versions are strings, no duplicates, nothing the configuration would ignore ------
QUOTE = "allowed: a version in quotes; write"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"cuda_version": 11.1},  # `stack_cuda_version: 11.10` unquoted: YAML's float 11.1
            "stack_cuda_version: 11.1 is a number (YAML reads 11.10 as 11.1); allowed: a version in quotes; "
            'write stack_cuda_version: "11.1" (or "11.10", whichever you meant)',
        ),
        (
            {"driver_branch": 470},
            f'stack_driver_branch: 470 is a number; {QUOTE} stack_driver_branch: "470"',
        ),
        (
            {"driver_method": "runfile", "driver_version": 470.86},
            "stack_driver_version: 470.86 is a number (YAML reads 470.860 as 470.86); "
            f'{QUOTE} stack_driver_version: "470.86" (or "470.860", whichever you meant)',
        ),
        (
            {"cuda_extra_versions": [11.4]},
            f"stack_cuda_extra_versions: 11.4 is a number (YAML reads 11.40 as 11.4); {QUOTE} "
            'stack_cuda_extra_versions: ["11.4"]',
        ),
        (
            {"cuda_extra_versions": [11.4, 11.6], "driver_branch": "510"},
            f"stack_cuda_extra_versions: 11.4, 11.6 are numbers (YAML reads 11.40 as 11.4); {QUOTE} "
            'stack_cuda_extra_versions: ["11.4", "11.6"]',
        ),
        (
            {"tensorrt_enabled": True, "tensorrt_version": 8},
            f'stack_tensorrt_version: 8 is a number; {QUOTE} stack_tensorrt_version: "8"',
        ),
    ],
)
def test_a_version_written_as_a_number_is_refused_with_the_line_to_write(resolve, settings, message):
    assert message in resolve(**settings)["errors"]


@pytest.mark.parametrize(
    "variable", ["mindspore_version", "cuda_version", "cudnn_version", "nccl_version", "driver_branch"]
)
@pytest.mark.parametrize("number", [0, 1, 11.1, 8.0])
def test_every_version_setting_refuses_numbers(resolve, variable, number):
    errors = resolve(**{variable: number})["errors"]
    assert any(e.startswith(f"stack_{variable}: {number} is a number") for e in errors), errors


def test_the_unquoted_11_10_no_longer_installs_cuda_11_1_without_a_word(resolve):
    result = resolve(cuda_version=11.1)
    (error,) = result["errors"]
    assert error.startswith("stack_cuda_version: 11.1 is a number")
    quoted = resolve(cuda_version="11.1")
    assert quoted["errors"] == [] and quoted["stack"]["cuda"]["version"] == "11.1"


def test_booleans_are_not_numbers_and_get_the_catalog_message(resolve):
    errors = resolve(cuda_version=True)["errors"]
    assert errors[0] == "stack_cuda_version: 'True' is not in the catalog; allowed: 11.1, 11.4, 11.6, 11.8"
    assert not [e for e in errors if "is a number" in e]


def test_a_cuda_listed_twice_is_refused_and_fetched_once(resolve):
    result = resolve(cuda_extra_versions=["11.4", "11.4"])
    assert result["errors"] == [
        'stack_cuda_extra_versions: "11.4" is listed more than once; allowed: each version once; '
        'write stack_cuda_extra_versions: ["11.4"]'
    ]
    assert [t["version"] for t in result["stack"]["cuda"]["toolkits"]] == ["11.1", "11.4"]
    runfiles = [d["file"] for d in result["stack"]["artifact_cache"]["downloads"] if d["component"] == "cuda"]
    assert len(runfiles) == len(set(runfiles)) == 2


def test_a_number_and_its_quoted_twin_are_one_version_listed_twice(resolve):
    errors = resolve(cuda_extra_versions=[11.4, "11.4"])["errors"]
    assert [e.split(":")[0] for e in errors] == ["stack_cuda_extra_versions"] * 2
    assert "is a number" in errors[0] and '"11.4" is listed more than once' in errors[1]
    assert all(e.endswith('write stack_cuda_extra_versions: ["11.4"]') for e in errors)


def test_an_unknown_extra_cuda_listed_twice_is_named_once(resolve):
    errors = resolve(cuda_extra_versions=["12.4", "12.4"])["errors"]
    assert errors.count("stack_cuda_extra_versions: '12.4' is not in the catalog; allowed: 11.1, 11.4, 11.6, 11.8") == 1


def test_the_stacks_own_cuda_among_the_extras_is_accepted_with_a_warning(resolve):
    """Not refused: an inventory-wide list may name the CUDA that one host's stack has anyway."""
    result = resolve(cuda_extra_versions=["11.1", "11.4"])
    assert result["errors"] == []
    assert [t["version"] for t in result["stack"]["cuda"]["toolkits"]] == ["11.1", "11.4"]
    assert result["warnings"] == [
        "stack_cuda_extra_versions: 11.1 is the stack's own CUDA (stack_cuda_version), installed anyway; "
        "the entry changes nothing"
    ]


def test_extra_versions_that_are_not_a_list_say_what_to_write(resolve):
    errors = resolve(cuda_extra_versions="11.6")["errors"]
    assert (
        "stack_cuda_extra_versions: must be a list, got 11.6; allowed: CUDA versions in quotes; "
        'write stack_cuda_extra_versions: ["11.6"]'
    ) in errors


@pytest.mark.parametrize("method", ["distro", "cuda_repo"])
def test_an_exact_driver_release_with_a_package_method_is_refused(resolve, method):
    result = resolve(driver_method=method, driver_version="470.86")
    assert result["errors"] == [
        f"stack_driver_version: '470.86' is ignored by the driver method '{method}' (it installs branch "
        "470's packages); allowed: '' (the default), or stack_driver_method: runfile"
    ]
    # The summary shows the branch's release, not the ignored one.
    assert result["stack"]["driver"]["version"] == "470.86"
    below = resolve(driver_method=method, driver_version="440.33")["errors"]
    assert [e.split(":")[0] for e in below] == ["stack_driver_version"]  # one message, not a minimum too


def test_an_exact_driver_release_is_the_runfile_methods(resolve):
    result = resolve(driver_method="runfile", driver_version="470.86")
    assert result["errors"] == []
    assert result["stack"]["driver"]["artifact"]["file"] == "NVIDIA-Linux-x86_64-470.86.run"


def test_a_bad_driver_method_is_not_also_called_ignoring_the_release(resolve):
    errors = resolve(driver_method="rpm", driver_version="470.86")["errors"]
    assert [e.split(":")[0] for e in errors] == ["stack_driver_method"]


@pytest.mark.parametrize(("variable", "value"), [("tensorrt_version", "8.4.1.5"), ("tensorrt_method", "wheel")])
def test_a_tensorrt_setting_with_tensorrt_off_is_refused(resolve, variable, value):
    assert resolve(**{variable: value})["errors"] == [
        f"stack_{variable}: '{value}' is ignored: TensorRT is off (stack_tensorrt_enabled: false); "
        "allowed: '' (the default), or stack_tensorrt_enabled: true"
    ]
    on = resolve(tensorrt_enabled=True, tensorrt_version="8.4.1.5", tensorrt_method="wheel")
    assert on["errors"] == [] and on["stack"]["tensorrt"]["method"] == "wheel"


def test_a_tensorrt_version_is_used_when_serving_turns_tensorrt_on(resolve):
    result = resolve(serving_enabled=True, tensorrt_version="7.2.2.3")
    assert result["errors"] == [] and result["stack"]["tensorrt"]["version"] == "7.2.2.3"


def test_a_bad_tensorrt_switch_is_the_only_message(resolve):
    assert resolve(tensorrt_enabled="yes", tensorrt_version="8.4.1.5")["errors"] == [
        "stack_tensorrt_enabled: 'yes' is not a boolean; allowed: true, false"
    ]


def test_an_unknown_method_names_the_empty_choice_readably(resolve):
    assert resolve(cudnn_method="conda")["errors"] == [
        "stack_cudnn_method: 'conda' is not an install method for cudnn; allowed: tarball, cuda_repo, wheel, "
        "or '' (the stack's default, tarball)"
    ]


def test_allowed_lists_never_start_with_an_empty_entry(stack_catalog):
    assert stack_catalog._allowed(["", "distro", "runfile"]) == "'' (the default), distro, runfile"
    assert stack_catalog._allowed([]) == "(none)"


def test_auto_resolves_the_newest_branch_with_the_method_until_the_host_preflight_sees_the_gpus(resolve):
    """The catalog step's provisional choice for stack_driver_branch: auto (roles/stack/tasks/host.yml then
    chooses per host from its GPUs with the same rules, filter stack_gpu_support)."""
    driver = resolve(driver_branch="auto")["stack"]["driver"]
    assert (driver["requested"], driver["branch"], driver["method"]) == ("auto", "570", "distro")
    assert driver["packages"] == [
        "nvidia-dkms-570",
        "nvidia-utils-570",
        "nvidia-compute-utils-570",
        "libnvidia-compute-570",
    ]
    runfile = resolve(driver_branch="auto", driver_method="runfile")["stack"]["driver"]
    assert (runfile["branch"], runfile["version"]) == ("570", "570.133.07")
    assert runfile["artifact"]["file"] == "NVIDIA-Linux-x86_64-570.133.07.run"
    assert resolve(driver_branch="535")["stack"]["driver"]["requested"] == "535"


def test_focals_transitional_branches_are_refused_for_the_distro_method_saying_what_they_install(resolve):
    for branch in ("510", "525"):
        (error,) = resolve(driver_branch=branch)["errors"]
        assert error.startswith(f"stack_driver_method: 'distro' is not offered for NVIDIA driver branch {branch}: ")
        assert "transitional packages that install branch 535 (535.230.02)" in error
        assert 'stack_driver_branch: "535"' in error and error.endswith("allowed for it: runfile, cuda_repo")
        assert resolve(driver_branch=branch, driver_method="runfile")["errors"] == []
    assert resolve(name="ms2.2-cuda11.6")["stack"]["driver"]["branch"] == "535"


# --- the catalog rules the resolver offers as public helpers (the test bed's scenarios use them too) ------
def test_accepted_versions_are_the_stacks_own_then_its_also_accepts(stack_catalog, catalog):
    for name, stack in catalog["stacks"].items():
        for component in ("mindspore", "cudnn", "nccl", "tensorrt"):
            accepted = stack_catalog.accepted_versions(catalog, component, name)
            assert accepted == [str(stack[component]), *map(str, stack.get("also_accepts", {}).get(component, []))]
            with_wheel = stack_catalog.accepted_versions(catalog, component, name, method="wheel")
            assert with_wheel == [v for v in accepted if "wheel" in catalog[component][v]]
    # No name: the default stack's (the seed's); NCCL's wheel is its own, the seed's tarball also accepted.
    assert stack_catalog.accepted_versions(catalog, "nccl") == ["2.14.3", "2.8.4"]
    assert stack_catalog.accepted_versions(catalog, "cudnn", method="wheel") == ["8.5.0"]


def test_cuda_versions_for_driver_are_those_whose_minimum_it_meets_oldest_first(stack_catalog, catalog):
    assert stack_catalog.cuda_versions_for_driver(catalog, "450.80.02") == ["11.1"]
    assert stack_catalog.cuda_versions_for_driver(catalog, "470.86") == ["11.1", "11.4"]
    assert stack_catalog.cuda_versions_for_driver(catalog, "418.39") == []
    # Ordered by version, not as text (11.10 after 11.4).
    cudas = {"11.10": {"minimum_driver": "520.61.05"}, "11.4": {"minimum_driver": "470.42.01"}}
    assert stack_catalog.cuda_versions_for_driver({"cuda": cudas}, "525.60.13") == ["11.4", "11.10"]


def test_the_test_beds_scenarios_resolve_without_errors(stack_catalog, catalog, pinned):
    """Each molecule scenario's stack settings (testbed/scenarios.py), over the sandbox hosts' seed NCCL."""
    from testbed import scenarios

    assert scenarios.seed_nccl() == {"stack_nccl_version": "2.8.4", "stack_nccl_method": "tarball"}
    assert scenarios.second_cuda() == ["11.4"]
    for name, settings in scenarios.SCENARIO_VARS.items():
        merged = {**scenarios.seed_nccl(), **settings}
        stack = {key.removeprefix("stack_"): value for key, value in merged.items() if key.startswith("stack_")}
        result = stack_catalog.resolve_stack(catalog, {"artifact_checksums": pinned, **stack})
        assert result["errors"] == [], (name, result["errors"])
