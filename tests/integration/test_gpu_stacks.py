"""A stack only where it can run, through the preflight on a real focal container whose PCI bus is a substituted
sysfs tree (stack_sysfs_root) per case, with real PCI IDs: each refusal names the host, the GPU and its compute
capability, the component and what works; `stack_name: auto` chooses per host (a mixed fleet gets per-host
stacks in one run); the host's fingerprint is unchanged by all of it."""

from __future__ import annotations

import pytest

from .conftest import pci_tree_script, pinned_stand_ins, refuse_together, run_playbook

ROOT_FMT = "/tmp/msgpu-sysfs-cc-{}"
# (device, class) of the GPUs of each machine, as sysfs writes them.
MACHINES = {
    "h100": [("0x2330", "0x030200")],
    "h100x2": [("0x2330", "0x030200")] * 2,
    "rtx4090": [("0x2684", "0x030000")],
    "l40s": [("0x26b9", "0x030200")],
    "k80": [("0x102d", "0x030200")],
    "a100": [("0x20b0", "0x030200")],
    "rtx3090": [("0x2204", "0x030000")] * 4,
    "t4": [("0x1eb8", "0x030200")],
    "mixed": [("0x2204", "0x030000"), ("0x2684", "0x030000")],
}


@pytest.fixture(scope="module")
def trees(focal_host):
    for machine in MACHINES:
        made = focal_host.sh(pci_tree_script(ROOT_FMT.format(machine), MACHINES[machine]))
        assert made.returncode == 0, made.stderr
    yield focal_host
    focal_host.sh("rm -rf " + " ".join(ROOT_FMT.format(m) for m in MACHINES))


def on(machine: str, **settings) -> dict:
    return {"stack_no_gpu": False, "stack_sysfs_root": ROOT_FMT.format(machine), **settings}


REFUSED = {
    "h100-default": (
        on("h100"),
        [
            "h100-default: stack ms1.5-cuda11.1 cannot run on GPU 10de:2330",
            "CC 9.0",
            "cuDNN 8.0.5 has code up to CC 8.6 and is not hardware forward compatible",
            'allowed: a stack whose code runs here: stack_name "ms2.2-cuda11.8"',
        ],
    ),
    # Two H100s: NCCL (no sm_90 in any CUDA 11 build) is loaded by multi-GPU training, so no stack runs.
    "h100x2-auto": (
        on("h100x2", stack_name="auto"),
        [
            "stack_name: auto found no catalog stack that runs on every GPU of h100x2-auto",
            "ms2.2-cuda11.8: 10de:2330",
            "multi-GPU training on this host's 2 GPUs loads it",
        ],
    ),
    "k80-default": (
        on("k80"),
        ["k80-default: stack ms1.5-cuda11.1 cannot run on GPU 10de:102d", "CC 3.7", "MindSpore 1.5.1 has in"],
    ),
    "rtx4090-tensorrt": (
        on("rtx4090", stack_driver_branch="auto", stack_tensorrt_enabled=True),
        ["10de:2684", "CC 8.9", "TensorRT 7.2.2.3 supports CC up to 8.6 and refuses newer GPUs"],
    ),
    "mixed-tensorrt": (
        on("mixed", stack_driver_branch="auto", stack_tensorrt_enabled=True),
        ["mixed-tensorrt: stack ms1.5-cuda11.1 cannot run on GPU 10de:2684", "at 0000:11:00.0"],
    ),
    # The branch refusal comes after the stack's own check: the stack runs on Ada, the branch does not drive it.
    "rtx4090-470": (on("rtx4090"), ['stack_driver_branch: "470" does not drive GPU 10de:2684', "570, 535"]),
}

PASSED = {
    "rtx3090-default": on("rtx3090"),
    "a100-default": on("a100"),
    "rtx4090-untuned": on("rtx4090", stack_driver_branch="auto"),
    "rtx3090-auto": on("rtx3090", stack_name="auto"),
    "l40s-auto": on("l40s", stack_name="auto"),
    "t4-auto": on("t4", stack_name="auto"),
    "cuda116-auto": on("a100", stack_name="auto", stack_cuda_version="11.6"),
    "mixed-auto": on("mixed", stack_name="auto", stack_driver_branch="auto"),
    # One H100: the CUDA 11.8 stack (not verified on a GPU), single-GPU only.
    "h100-auto": on("h100", stack_name="auto"),
}


@pytest.fixture(scope="module")
def runs(trees, catalog, tmp_path_factory):
    """The refusals (conftest.refuse_together), then one preflight run of every passing case as its own inventory
    host on the same container; the fingerprint before and after both."""
    from testbed import sandbox

    before = trees.fingerprint()
    folder = tmp_path_factory.mktemp("gpu-stacks")
    refused = refuse_together(trees, folder, {k: v for k, (v, _) in REFUSED.items()}, pinned_stand_ins(catalog))
    inventory = sandbox.write_inventory(
        folder / "passing.yml",
        list(PASSED),
        pinned_stand_ins(catalog),
        host_vars={name: {"ansible_host": trees.name, **settings} for name, settings in PASSED.items()},
    )
    passed = run_playbook("site.yml", inventory, args=["--tags", "preflight"])
    return refused, passed, before, trees.fingerprint()


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_stack_that_cannot_run_is_refused_naming_gpu_component_and_fix(runs, case):
    refused = runs[0]
    assert case in refused, (case, "was not refused", sorted(refused))
    expected = REFUSED[case][1]
    assert any(all(text in line for text in expected) for line in refused[case].lines), (expected, refused[case].lines)


def test_every_passing_case_passes_and_says_what_it_chose(runs):
    _, passed, _, _ = runs
    # The YAML callback folds long strings and writes an apostrophe in a single-quoted one as ''.
    output = " ".join(passed.output.replace("''", "'").split())
    assert passed.rc == 0, passed.output[-6000:]
    # Measured stacks first: ms2.0 where its branch (470) drives the GPUs; on the L40S only ms2.2's 535 does.
    assert 'stack_name: auto chose "ms2.0-cuda11.1" for rtx3090-auto' in output
    assert 'stack_name: auto chose "ms2.2-cuda11.6" for l40s-auto' in output
    assert 'stack_name: auto chose "ms2.0-cuda11.1" for t4-auto' in output
    # The other settings decide too: CUDA 11.6 is only ms2.2's.
    assert 'stack_name: auto chose "ms2.2-cuda11.6" for cuda116-auto' in output
    assert 'stack_name: auto chose "ms2.0-cuda11.1" for mixed-auto' in output
    assert 'stack_name: auto chose "ms2.2-cuda11.8" for h100-auto' in output
    assert 'h100-auto: stack "ms2.2-cuda11.8" is not verified on a GPU (verified_on_gpu: false' in output
    assert "training on this host's one GPU runs, multi-GPU and multi-host (mpirun) training cannot" in output
    # On Ada, auto keeps the verified stack and names the one built for the GPU.
    assert "'ms2.2-cuda11.8' (not verified on a GPU) carries code built for these GPUs" in output
    assert "rtx4090-untuned: GPU 10de:2684 (NVIDIA GeForce RTX 4090, CC 8.9)" in output
    assert "cuDNN 8.0.5 is built up to CC 8.6: runs on 8.9 untuned" in output
    # A mixed fleet in one run: each host shows the stack resolved for it.
    assert "ms2.0-cuda11.1: mindspore 2.0.0 (cp38)" in output
    assert "ms2.2-cuda11.6: mindspore 2.2.14 (cp38)" in output
    assert "ms2.2-cuda11.8: mindspore 2.2.14 (cp38)" in output
    assert "ms1.5-cuda11.1: mindspore-gpu 1.5.1 (cp38)" in output


def test_the_host_is_unchanged(runs):
    _, _, before, after = runs
    assert after == before
