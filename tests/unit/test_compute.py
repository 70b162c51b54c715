"""compute.py, the one rule for "can this stack's code run on a GPU of compute capability X" (the preflight's
filter plugin, the judge and the doctor all call it): parsing, one component on one CC, a stack on a host's GPUs."""

from __future__ import annotations

import pytest
from msgpu_verify import compute

# As the preflight publishes them (stack_resolved.gpu_code): measured GPU code, and a vendor's documented range.
MINDSPORE_151 = {
    "name": "MindSpore",
    "version": "1.5.1",
    "code": {"libraries": {"mindspore/lib/libmindspore_gpu.so": {"sass": [], "ptx": ["5.3"]}}},
}
CUDNN_805 = {
    "name": "cuDNN",
    "version": "8.0.5",
    "code": {"min": "3.5", "max": "8.6", "above_max": "same_major", "source": "NVIDIA cuDNN 8.0.5 support matrix"},
}
H100 = {"id": "10de:2330", "name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "slot": "0000:17:00.0"}
RTX4090 = {"id": "10de:2684", "name": "NVIDIA GeForce RTX 4090", "cc": "8.9", "slot": "0000:01:00.0"}
RTX3090 = {"id": "10de:2204", "name": "NVIDIA GeForce RTX 3090", "cc": "8.6", "slot": "0000:02:00.0"}


def library(sass=(), ptx=()) -> dict:
    return {"libraries": {"lib/libx.so": {"sass": list(sass), "ptx": list(ptx)}}}


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("8.6", (8, 6)),
        (" 8.9 ", (8, 9)),
        ("sm_86", (8, 6)),
        ("compute_90", (9, 0)),
        ("86", (8, 6)),
        (86, (8, 6)),
        (8.6, (8, 6)),
        ("10.0", (10, 0)),
        ("100", (10, 0)),
        ("120", (12, 0)),
        ("sm_120", (12, 0)),
        ("8", (8, 0)),
        ("3.7", (3, 7)),
        (None, None),
        (True, None),
        ("", None),
        ("junk", None),
        ("sm_90a", (9, 0)),
        ("9.0a", (9, 0)),
        ("8.6.1", None),
    ],
)
def test_cc_tuple(value, parsed):
    assert compute.cc_tuple(value) == parsed


def test_cc_text():
    assert compute.cc_text("sm_86") == "8.6"
    assert compute.cc_text("100") == "10.0"
    assert compute.cc_text("junk") == "junk"


# --- fit: one component on one compute capability -----------------------------------------------------------------


def test_a_cubin_runs_natively_on_the_same_major_with_a_higher_minor():
    assert compute.fit(library(sass=["8.6"]), "8.6") == (compute.NATIVE, "")
    assert compute.fit(library(sass=["8.6"]), "8.9") == (compute.NATIVE, "")
    assert compute.fit(library(sass=["8.0"]), "8.6")[0] == compute.NATIVE


def test_a_cubin_never_runs_on_a_lower_minor_or_another_major():
    outcome, why = compute.fit(library(sass=["8.6"]), "8.0")
    assert outcome == compute.NONE
    outcome, why = compute.fit(library(sass=["8.6"]), "9.0")
    assert outcome == compute.NONE
    assert "libx.so" in why and "no code that runs on CC 9.0 (SASS 8.6; PTX none)" in why
    assert compute.fit(library(sass=["7.5"]), "8.6")[0] == compute.NONE  # older major: no
    assert compute.fit(library(sass=["9.0"]), "8.9")[0] == compute.NONE  # newer major: no


def test_ptx_is_jit_compiled_for_any_gpu_at_or_above_its_target():
    outcome, why = compute.fit(library(sass=["8.6"], ptx=["8.6"]), "9.0")
    assert outcome == compute.JIT
    assert "libx.so" in why and "no cubin for CC 9.x, only PTX the driver must JIT at first start" in why
    assert why.endswith("(SASS 8.6; PTX 8.6)")
    assert compute.fit(library(ptx=["9.0"]), "9.0")[0] == compute.JIT
    assert compute.fit(library(ptx=["9.0"]), "8.9")[0] == compute.NONE  # PTX newer than the GPU: never
    assert compute.fit(library(sass=["8.6"], ptx=["8.6"]), "8.9")[0] == compute.NATIVE  # a cubin wins over PTX


def test_mindspore_151_carries_ptx_53_only():
    code = MINDSPORE_151["code"]
    assert compute.fit(code, "8.6")[0] == compute.JIT
    assert compute.fit(code, "5.3")[0] == compute.JIT
    outcome, why = compute.fit(code, "5.2")
    assert outcome == compute.NONE and "libmindspore_gpu.so" in why and "no code that runs on CC 5.2" in why


def test_the_worst_library_counts():
    code = {
        "libraries": {
            "a/liba.so": {"sass": ["8.6", "9.0"], "ptx": []},
            "b/libb.so": {"sass": ["8.6"], "ptx": ["8.6"]},
            "c/libc.so": {"sass": ["8.6"], "ptx": []},
        }
    }
    outcome, why = compute.fit(code, "9.0")
    assert outcome == compute.NONE and "libc.so" in why and "liba.so" not in why
    assert compute.fit(code, "8.9")[0] == compute.NATIVE


def test_cudnn_805_cited_range_with_same_major_above_its_max():
    code = CUDNN_805["code"]
    assert compute.fit(code, "8.6") == (compute.NATIVE, "")
    assert compute.fit(code, "3.7") == (compute.NATIVE, "")  # min 3.5: a K80 is inside
    assert compute.fit(code, "3.5") == (compute.NATIVE, "")
    outcome, why = compute.fit(code, "8.9")  # Ada: same major as 8.6, runs untuned
    assert outcome == compute.OUTSIDE
    assert why == (
        "is built up to CC 8.6: runs on 8.9 untuned, outside its support matrix (NVIDIA cuDNN 8.0.5 support matrix)"
    )
    outcome, why = compute.fit(code, "9.0")  # Hopper: another major, not hardware forward compatible
    assert outcome == compute.NONE
    assert "has code up to CC 8.6 and is not hardware forward compatible, so nothing of it runs on CC 9.x" in why
    outcome, why = compute.fit(code, "3.0")
    assert outcome == compute.NONE and why == "supports CC 3.5 and newer (NVIDIA cuDNN 8.0.5 support matrix)"


@pytest.mark.parametrize(
    ("above_max", "cc", "outcome"),
    [
        ("jit", "9.0", compute.JIT),  # another major: through PTX JIT
        ("jit", "8.9", compute.OUTSIDE),  # the same major: the newest cubins, outside the matrix
        ("same_major", "8.9", compute.OUTSIDE),
        ("same_major", "9.0", compute.NONE),
        ("none", "8.9", compute.NONE),
        ("none", "9.0", compute.NONE),
        (None, "8.9", compute.NONE),  # unsaid: refuses newer GPUs
        ("jit", "8.6", compute.NATIVE),
        ("none", "5.0", compute.NATIVE),
    ],
)
def test_above_max(above_max, cc, outcome):
    code = {"min": "5.0", "max": "8.6"}
    if above_max is not None:
        code["above_max"] = above_max
    assert compute.fit(code, cc)[0] == outcome


def test_measured_code_and_the_cited_range_together_the_worse_counts():
    code = dict(library(sass=["8.0", "9.0"]), min="5.0", max="8.6", above_max="none")
    assert compute.fit(code, "9.0")[0] == compute.NONE  # the cubin is there, the vendor refuses 9.0
    code = dict(library(ptx=["5.0"]), min="5.0", max="9.0")
    assert compute.fit(code, "8.6")[0] == compute.JIT  # inside the range, but PTX only


def test_an_unknown_cc_or_no_record_is_unknown():
    assert compute.fit(CUDNN_805["code"], None) == (compute.UNKNOWN, "the GPU's compute capability is not known")
    assert compute.fit(CUDNN_805["code"], "junk")[0] == compute.UNKNOWN
    assert compute.fit({}, "9.0")[0] == compute.UNKNOWN  # the catalog says nothing about it: never "native"
    assert compute.fit(None, "9.0")[0] == compute.UNKNOWN


def test_code_cited_from_build_flags_where_no_wheel_was_read():
    code = {"sass": ["7.0", "8.0"], "ptx": ["8.0"], "label": "its CUDA kernels"}
    assert compute.fit(code, "8.6")[0] == compute.NATIVE
    outcome, why = compute.fit(code, "9.0")
    assert outcome == compute.JIT and "its CUDA kernels" in why
    assert compute.fit(code, "6.1")[0] == compute.NONE


def test_judge_names_the_component_and_its_version():
    verdict = compute.judge([MINDSPORE_151, CUDNN_805], "9.0")
    assert verdict["outcome"] == compute.NONE
    assert [p[0] for p in verdict["problems"]] == [compute.JIT, compute.NONE]
    assert verdict["problems"][0][1].startswith("MindSpore 1.5.1 ")
    assert "libmindspore_gpu.so" in verdict["problems"][0][1] and "no cubin for CC 9.x" in verdict["problems"][0][1]
    assert verdict["problems"][1][1].startswith("cuDNN 8.0.5 has code up to CC 8.6")
    assert compute.judge([CUDNN_805], "8.6") == {"outcome": compute.NATIVE, "problems": []}
    assert compute.judge([], "9.0") == {"outcome": compute.NATIVE, "problems": []}


# --- check: a stack on a host's GPUs ------------------------------------------------------------------------------


def test_check_an_error_names_host_gpu_component_and_what_works():
    result = compute.check(
        [MINDSPORE_151, CUDNN_805], [H100], host="gpu7", stack="ms1.5-cuda11.1", works="stack ms2.2-cuda11.8"
    )
    assert result["runs"] is False
    assert result["errors"] == [
        "gpu7: stack ms1.5-cuda11.1 cannot run on GPU 10de:2330 (NVIDIA H100 80GB HBM3, CC 9.0) at 0000:17:00.0: "
        "cuDNN 8.0.5 has code up to CC 8.6 and is not hardware forward compatible, so nothing of it runs on CC 9.x "
        "(NVIDIA cuDNN 8.0.5 support matrix); allowed: stack ms2.2-cuda11.8."
    ]
    # MindSpore's PTX-only library on the same GPU is a warning beside the error, not a second error.
    assert len(result["warnings"]) == 1
    warning = result["warnings"][0]
    assert warning.startswith("gpu7: GPU 10de:2330 (NVIDIA H100 80GB HBM3, CC 9.0) at 0000:17:00.0: MindSpore 1.5.1 ")
    assert "libmindspore_gpu.so" in warning and "(SASS none; PTX 5.3)" in warning
    assert warning.endswith("(slow first start, then cached).")
    assert result["gpus"][0]["outcome"] == compute.NONE


def test_check_outside_the_matrix_and_jit_are_warnings():
    result = compute.check([MINDSPORE_151, CUDNN_805], [RTX4090], host="gpu2", stack="ms1.5")
    assert result["runs"] is True and result["errors"] == []
    assert len(result["warnings"]) == 2
    jit, outside = result["warnings"]
    assert "MindSpore 1.5.1 " in jit and "libmindspore_gpu.so" in jit and "no cubin for CC 8.x" in jit
    assert jit.endswith("(slow first start, then cached).")
    assert outside == (
        "gpu2: GPU 10de:2684 (NVIDIA GeForce RTX 4090, CC 8.9) at 0000:01:00.0: cuDNN 8.0.5 is built up to CC 8.6: "
        "runs on 8.9 untuned, outside its support matrix (NVIDIA cuDNN 8.0.5 support matrix); not verified by NVIDIA "
        "for this GPU."
    )


def test_check_without_works_and_host_says_this_host():
    result = compute.check([CUDNN_805], [H100], stack="s")
    assert result["errors"][0].startswith("this host: stack s cannot run on GPU 10de:2330")
    assert "; allowed:" not in result["errors"][0] and result["errors"][0].endswith("support matrix).")


def test_identical_gpus_are_grouped_with_their_slots():
    gpus = [dict(H100, slot=f"0000:{bus}:00.0") for bus in ("17", "2a", "3d")] + [RTX3090]
    result = compute.check([CUDNN_805], gpus, host="gpu9", stack="s")
    assert [(g["id"], g["slots"]) for g in result["gpus"]] == [
        ("10de:2330", ["0000:17:00.0", "0000:2a:00.0", "0000:3d:00.0"]),
        ("10de:2204", ["0000:02:00.0"]),
    ]
    assert len(result["errors"]) == 1  # one line for the three H100s, none for the RTX 3090
    assert (
        "GPU 10de:2330 (NVIDIA H100 80GB HBM3, CC 9.0) at 0000:17:00.0, 0000:2a:00.0, 0000:3d:00.0: "
        in (result["errors"][0])
    )
    assert result["gpus"][1]["outcome"] == compute.NATIVE


def test_same_id_different_cc_stays_apart_and_slotless_gpus_have_no_at():
    gpus = [{"id": "10de:1234", "name": "X", "cc": "8.6"}, {"id": "10de:1234", "name": "X", "cc": "9.0"}]
    result = compute.check([CUDNN_805], gpus, host="h", stack="s")
    assert len(result["gpus"]) == 2
    assert result["errors"] == [
        "h: stack s cannot run on GPU 10de:1234 (X, CC 9.0): cuDNN 8.0.5 has code up to CC 8.6 and is not hardware "
        "forward compatible, so nothing of it runs on CC 9.x (NVIDIA cuDNN 8.0.5 support matrix)."
    ]


def test_an_unknown_cc_is_a_warning_never_an_error():
    result = compute.check(
        [MINDSPORE_151, CUDNN_805], [{"id": "10de:9999", "name": "", "cc": None}], host="h", stack="s"
    )
    assert result["runs"] is True and result["errors"] == []
    assert len(result["warnings"]) == 1
    assert result["warnings"][0].startswith("h: GPU 10de:9999 (CC unknown): not checked against stack s")
    assert "the compute capability the driver reports" in result["warnings"][0]
    assert result["gpus"][0]["outcome"] == compute.UNKNOWN
    # A component the catalog has no record of: a warning too, the others still judged.
    result = compute.check([{"name": "TensorRT", "version": "7.2.2", "code": {}}, CUDNN_805], [H100], host="h")
    assert result["runs"] is False and len(result["errors"]) == 1 and "cuDNN 8.0.5" in result["errors"][0]
    assert any("TensorRT 7.2.2" in w for w in result["warnings"])


def test_no_gpus_and_no_components():
    assert compute.check([CUDNN_805], [], host="h") == {"errors": [], "warnings": [], "runs": True, "gpus": []}
    result = compute.check([], [H100], host="h")
    assert result["runs"] is True and result["errors"] == [] and result["warnings"] == []


def test_gpu_label():
    assert compute.gpu_label(H100) == "10de:2330 (NVIDIA H100 80GB HBM3, CC 9.0)"
    assert compute.gpu_label({"cc": "sm_86"}) == "GPU (CC 8.6)"
    assert compute.gpu_label({"id": "10de:1", "name": "", "cc": None}) == "10de:1 (CC unknown)"


def test_the_probe_ptx_target_is_the_probes_own():
    from msgpu_verify import gpu_probe

    assert f".target sm_{compute.PROBE_PTX.replace('.', '')}".encode() in gpu_probe.PTX


# --- NCCL: loaded by multi-GPU training only -------------------------------------------------------------------

NCCL_2143 = {
    "name": "NCCL",
    "version": "2.14.3",
    "code": {"libraries": {"nvidia/nccl/lib/libnccl.so.2": {"sass": ["3.5", "7.0", "8.0"], "ptx": []}}},
    "multi_gpu_only": True,
}


def test_a_multi_gpu_only_component_that_cannot_run_is_single_on_a_one_gpu_host():
    assert compute.judge([NCCL_2143], "9.0")["outcome"] == compute.NONE  # host size not known: no exception
    verdict = compute.judge([NCCL_2143], "9.0", gpu_count=1)
    assert verdict["outcome"] == compute.SINGLE
    ((_outcome, why),) = verdict["problems"]
    assert why.startswith("NCCL 2.14.3 has in libnccl.so.2 no code that runs on CC 9.0")
    assert why.endswith(
        ": training on this host's one GPU runs, multi-GPU and multi-host (mpirun) training cannot; a host with "
        "several such GPUs is refused"
    )
    verdict = compute.judge([NCCL_2143], "9.0", gpu_count=4)
    assert verdict["outcome"] == compute.NONE
    assert verdict["problems"][0][1].endswith(
        "(multi-GPU training on this host's 4 GPUs loads it; a host with one such GPU would run)"
    )
    # The flag only matters where the component cannot run: on Ada, NCCL's sm_80 cubin runs.
    assert compute.judge([NCCL_2143], "8.9", gpu_count=4)["outcome"] == compute.NATIVE
    # Without the flag the same code on one GPU is still an error.
    plain = {k: v for k, v in NCCL_2143.items() if k != "multi_gpu_only"}
    assert compute.judge([plain], "9.0", gpu_count=1)["outcome"] == compute.NONE


def test_check_one_hopper_gpu_with_nccl_is_a_warning_several_an_error():
    result = compute.check([NCCL_2143], [H100], host="gpu3", stack="ms2.2-cuda11.8")
    assert result["runs"] is True and result["errors"] == []
    (warning,) = result["warnings"]
    assert warning.startswith("gpu3: GPU 10de:2330 (NVIDIA H100 80GB HBM3, CC 9.0) at 0000:17:00.0: NCCL 2.14.3 ")
    assert warning.endswith("a host with several such GPUs is refused.")
    result = compute.check([NCCL_2143], [H100, dict(H100, slot="0000:2a:00.0")], host="gpu3", stack="s")
    assert result["runs"] is False and result["warnings"] == []
    assert "at 0000:17:00.0, 0000:2a:00.0: NCCL 2.14.3 has in libnccl.so.2 no code" in result["errors"][0]
    # Another GPU beside one H100 also makes it a multi-GPU host.
    result = compute.check([NCCL_2143], [H100, RTX3090], host="gpu3", stack="s")
    assert result["runs"] is False and "this host's 2 GPUs loads it" in result["errors"][0]
