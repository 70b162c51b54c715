"""A stack only where it can run: the `stack_for_gpus` filter (roles/stack/filter_plugins/gpu_support.py) with the
real catalog (stacks.yml, the measured gpu_code.yml, the generated gpu_ids.yml) on substituted sysfs trees read by
host_check.py, as the preflight runs it; `stack_name: auto` in the resolver; docs/gpus.md generated from them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, load_module
from tests.unit.test_gpu_support import HOST_BRIDGE, gpu, scan

MACHINES = {
    "h100": [HOST_BRIDGE, *gpu(0x19, "0x2330", "0x030200")],
    "h100x8": [HOST_BRIDGE, *(f for bus in range(0x19, 0x21) for f in gpu(bus, "0x2330", "0x030200"))],
    "rtx4090": [HOST_BRIDGE, *gpu(0x01, "0x2684")],
    "l40s": [HOST_BRIDGE, *gpu(0x01, "0x26b9", "0x030200")],
    "k80": [HOST_BRIDGE, *gpu(0x04, "0x102d", "0x030200")],
    "a100": [HOST_BRIDGE, *gpu(0x07, "0x20b0", "0x030200")],
    "rtx3090x4": [HOST_BRIDGE, *(f for bus in (0x01, 0x21, 0x41, 0x61) for f in gpu(bus, "0x2204"))],
    "t4": [HOST_BRIDGE, *gpu(0x3B, "0x1eb8", "0x030200")],
    "mixed": [HOST_BRIDGE, *gpu(0x01, "0x2204"), *gpu(0x41, "0x2684")],
}
SETTINGS = {"name": ""}


@pytest.fixture(scope="module")
def data():
    catalog = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
    catalog["gpu_code"] = yaml.safe_load((ROOT / "catalog" / "gpu_code.yml").read_text())
    gpu_ids = yaml.safe_load((ROOT / "catalog" / "gpu_ids.yml").read_text())
    return catalog, gpu_ids


@pytest.fixture(scope="module")
def plugin():
    return load_module("gpu_support_stacks", ROOT / "roles" / "stack" / "filter_plugins" / "gpu_support.py")


@pytest.fixture
def run(tmp_path, data, plugin, monkeypatch):
    import tests.unit.test_gpu_support as base

    monkeypatch.setattr(base, "MACHINES", {**base.MACHINES, **MACHINES})
    catalog, gpu_ids = data

    def go(machine: str, current: str = "ms1.5-cuda11.1", no_gpu: bool = False, tag: str = "cp38", **settings):
        found = scan(tmp_path / machine, machine)
        return plugin.stack_for_gpus(gpu_ids, catalog, {**SETTINGS, **settings}, found, "gpu01", no_gpu, current, tag)

    return go


def test_every_catalog_stack_has_code_data_for_each_component(data, stack_catalog):
    catalog, _ = data
    for name in catalog["stacks"]:
        stack = stack_catalog.resolve_stack(catalog, {"name": name, "tensorrt_enabled": True})["stack"]
        names = [c["name"] for c in stack["gpu_code"]]
        # The NCCL a MindSpore wheel bundles (measured in 1.10.0 and 2.0.0) is a component of its own: like the
        # catalog's NCCL, only multi-GPU training loads it.
        bundled = ["NCCL bundled with MindSpore"] if catalog["stacks"][name]["mindspore"] in ("1.10.0", "2.0.0") else []
        assert names == ["MindSpore", *bundled, "CUDA", "cuDNN", "NCCL", "TensorRT"], name
        assert [c["name"] for c in stack["gpu_code"] if c.get("multi_gpu_only")] == [*bundled, "NCCL"], name
        for component in stack["gpu_code"]:
            code = component["code"]
            assert code.get("libraries") or code.get("max") or code.get("sass"), (name, component)


def test_the_seeds_rtx3090_box_runs_the_default_stack(run):
    result = run("rtx3090x4")
    assert result["errors"] == []
    assert "4x 10de:2204 (NVIDIA GeForce RTX 3090, CC 8.6)" in result["reason"]


def test_a100_runs_the_default_stack(run):
    assert run("a100")["errors"] == []


def test_h100_is_refused_with_the_component_and_the_one_stack_that_runs_on_one_gpu(run):
    (error,) = run("h100")["errors"]
    assert error.startswith("gpu01: stack ms1.5-cuda11.1 cannot run on GPU 10de:2330 (NVIDIA H100 80GB HBM3, CC 9.0)")
    assert "cuDNN 8.0.5 has code up to CC 8.6 and is not hardware forward compatible" in error
    assert error.endswith('allowed: a stack whose code runs here: stack_name "ms2.2-cuda11.8" (or "auto").')
    # Eight of them: NCCL (no sm_90 in any CUDA 11 build) is loaded by multi-GPU training: nothing runs.
    (error,) = run("h100x8")["errors"]
    assert "allowed: none: no catalog stack runs on this GPU" in error
    assert "ms2.2-cuda11.6: " in error and "cuDNN 8.5.0" in error
    assert (
        "ms2.2-cuda11.8: 10de:2330 (NVIDIA H100 80GB HBM3, CC 9.0): NCCL 2.14.3 has in libnccl.so.2 no code that runs "
        "on CC 9.0 (SASS 3.5, 5.0, 6.0, 6.1, 7.0, 8.0; PTX none) (multi-GPU training on this host's 8 GPUs loads it; "
        "a host with one such GPU would run)" in error
    )


def test_hopper_runs_the_unverified_cuda118_stack_on_one_gpu_with_its_warnings(run):
    result = run("h100", name="ms2.2-cuda11.8")
    assert result["errors"] == [] and result["name"] == "ms2.2-cuda11.8"
    text = "\n".join(result["warnings"])
    # MindSpore 2.2.14's kernels: compute_86 PTX, JIT-compiled on 9.0; NCCL: one GPU only; the stack: unverified.
    assert "MindSpore 2.2.14 has in its kernels no cubin for CC 9.x, only PTX the driver must JIT" in text
    assert (
        "NCCL 2.14.3 has in libnccl.so.2 no code that runs on CC 9.0 (SASS 3.5, 5.0, 6.0, 6.1, 7.0, 8.0; PTX none): "
        "training on this host's one GPU runs, multi-GPU and multi-host (mpirun) training cannot" in text
    )
    assert 'stack "ms2.2-cuda11.8" is not verified on a GPU (verified_on_gpu: false' in text
    assert "cuDNN" not in text  # cuDNN 8.9.6 carries sm_90 (measured)


def test_ada_has_native_code_only_in_the_cuda118_stack(run):
    for machine in ("rtx4090", "l40s"):
        result = run(machine, name="ms2.2-cuda11.8")
        assert result["errors"] == [], machine
        (warning,) = result["warnings"]
        assert "is not verified on a GPU" in warning
        # TensorRT 8.4 neither supports CUDA 11.8 nor runs on Ada: the resolver refuses it first.
        (error,) = run(machine, name="ms2.2-cuda11.8", tensorrt_enabled=True)["errors"]
        assert "TensorRT 8.4.1.5 supports CC up to 8.6 and refuses newer GPUs" in error


def test_k80_is_refused_for_mindspores_own_kernels(run):
    (error,) = run("k80")["errors"]
    assert "10de:102d" in error and "CC 3.7" in error
    assert "MindSpore 1.5.1 has in " in error and "no code that runs on CC 3.7" in error
    assert "no catalog stack runs on this GPU" in error


def test_ada_runs_untuned_with_warnings_and_tensorrt_is_refused(run):
    for machine, devid in (("rtx4090", "2684"), ("l40s", "26b9")):
        result = run(machine)
        assert result["errors"] == [], machine
        text = " ".join(result["warnings"])
        assert f"10de:{devid}" in text and "CC 8.9" in text
        assert "cuDNN 8.0.5 is built up to CC 8.6: runs on 8.9 untuned, outside its support matrix" in text
        (error,) = run(machine, tensorrt_enabled=True)["errors"]
        assert "TensorRT 7.2.2.3 supports CC up to 8.6 and refuses newer GPUs" in error


def test_a_mixed_box_names_only_the_gpu_that_cannot_run_it(run):
    (error,) = run("mixed", tensorrt_enabled=True)["errors"]
    assert "10de:2684" in error and "10de:2204" not in error
    assert "at 0000:41:00.0" in error


def test_auto_chooses_the_newest_measured_verified_stack_that_runs_and_whose_branch_drives_the_gpus(run):
    # mindspore 2.2.14's wheel could not be read (only its build flags): the measured 2.0.0 comes first.
    result = run("rtx3090x4", name="auto")
    assert result["auto"] and result["errors"] == []
    assert result["name"] == "ms2.0-cuda11.1"
    assert result["reason"].startswith('stack_name: auto chose "ms2.0-cuda11.1" for gpu01')


MS2214_CP38 = "mindspore-2.2.14-cp38-cp38-linux_x86_64.whl"


def test_auto_takes_the_other_settings_and_the_wheels_checksum_into_account(run):
    # Only the CUDA 11.6 stack accepts CUDA 11.6; its vendor wheel has no public checksum.
    (error,) = run("rtx3090x4", name="auto", cuda_version="11.6")["errors"]
    assert "ms2.0-cuda11.1: the other stack_* settings do not fit it (stack_cuda_version" in error
    assert f"ms2.2-cuda11.6: no checksum for {MS2214_CP38} for cp38" in error
    result = run("rtx3090x4", name="auto", cuda_version="11.6", artifact_checksums={MS2214_CP38: "ab" * 32})
    assert result["errors"] == [] and result["name"] == "ms2.2-cuda11.6"
    # Without a wheel for the host's Python at all.
    (error,) = run("rtx3090x4", name="auto", tag="cp311")["errors"]
    assert "no MindSpore wheel for cp311" in error


def test_auto_respects_a_fixed_driver_branch(run):
    result = run("rtx4090", name="auto", driver_branch="470")
    (error,) = result["errors"]
    assert error.startswith("stack_name: auto found no catalog stack that runs on every GPU of gpu01")
    assert 'driver: stack_driver_branch: "470" does not drive GPU 10de:2684' in error


def test_auto_on_hopper_and_kepler_finds_nothing(run):
    for machine in ("h100", "k80", "h100x8"):
        (error,) = run(machine, name="auto")["errors"]
        assert "stack_name: auto found no catalog stack" in error, machine
    # The CUDA 11.8 stack's vendor wheel has no public checksum: with one given, one H100 gets it, eight do not.
    result = run("h100", name="auto", artifact_checksums={MS2214_CP38: "ab" * 32})
    assert result["errors"] == [] and result["name"] == "ms2.2-cuda11.8"
    assert any("is not verified on a GPU" in w for w in result["warnings"])
    (error,) = run("h100x8", name="auto", artifact_checksums={MS2214_CP38: "ab" * 32})["errors"]
    assert "ms2.2-cuda11.8: 10de:2330" in error and "multi-GPU training on this host's 8 GPUs loads it" in error


def test_auto_prefers_a_verified_stack_on_ada_and_names_the_unverified_one_built_for_it(run):
    result = run("rtx4090", name="auto", artifact_checksums={MS2214_CP38: "ab" * 32})
    assert result["errors"] == [] and result["name"] == "ms2.2-cuda11.6"
    assert any("runs on 8.9 untuned, outside its support matrix" in w for w in result["warnings"])
    assert result["reason"].endswith(
        "; 'ms2.2-cuda11.8' (not verified on a GPU) carries code built for these GPUs: "
        'stack_name "ms2.2-cuda11.8" chooses it'
    )


def test_auto_on_a_mixed_box_picks_one_stack_for_both(run):
    result = run("mixed", name="auto", tensorrt_enabled=True)
    # TensorRT stops at SM 8.6 in every stack: nothing runs on the RTX 4090 with it.
    assert result["errors"] and "10de:2684" in result["errors"][0]
    # ms2.0's own branch (470) does not drive the RTX 4090, nor do those of ms1.10 and ms1.5; 2.2's 535 does.
    result = run("mixed", name="auto", artifact_checksums={MS2214_CP38: "ab" * 32})
    assert result["errors"] == [] and result["name"] == "ms2.2-cuda11.6"
    assert 'ms2.0-cuda11.1: driver: stack_driver_branch: "470" does not drive GPU 10de:2684' in result["reason"]
    result = run("mixed", name="auto", driver_branch="auto")
    assert result["errors"] == [] and result["name"] == "ms2.0-cuda11.1"


def test_t4_gets_a_stack(run):
    result = run("t4", name="auto")
    assert result["errors"] == [] and result["name"]


def test_no_gpu_keeps_the_stand_in(run):
    result = run("h100", name="auto", no_gpu=True, current="ms2.2-cuda11.6")
    assert result["name"] == "ms2.2-cuda11.6" and result["errors"] == []
    assert "stack_no_gpu: true" in result["reason"]
    assert run("h100", no_gpu=True)["errors"] == []


def test_resolver_accepts_auto_with_a_stand_in(data, stack_catalog):
    catalog, _ = data
    result = stack_catalog.resolve_stack(catalog, {"name": "auto"})
    assert result["errors"] == []
    assert result["stack"]["requested_name"] == "auto"
    assert result["stack"]["name"] == stack_catalog.stack_order(catalog)[0]
    result = stack_catalog.resolve_stack(catalog, {"name": "auto", "cuda_version": "11.6"})
    assert result["stack"]["name"] == "ms2.2-cuda11.6"
    result = stack_catalog.resolve_stack(catalog, {"name": "auto", "cuda_version": "9.9"})
    assert result["errors"][0].startswith("stack_name: 'auto' found no catalog stack that the other stack_* settings")


def test_docs_gpu_table_is_generated_from_the_catalog():
    result = subprocess.run(
        [sys.executable, str(ROOT / "catalog" / "tools" / "gpu_table.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    text = (ROOT / "docs" / "gpus.md").read_text()
    assert "| 9.0 |" in text and "| **no** (cuDNN 8.0.5) |" in text
    # One H100 per host: only the unverified CUDA 11.8 stack, without multi-GPU training (its NCCL has no sm_90).
    assert "one GPU per host (NCCL 2.14.3); JIT only (MindSpore 2.2.14) |" in text
    assert "not offered (TensorRT 8.4.1.5 does not support CUDA 11.8)" in text
