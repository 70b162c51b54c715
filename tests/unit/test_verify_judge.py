"""The run_check judge: every verdict with REAL child processes running fake MindSpore packages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, pid_alive
from tests.unit.test_gpu_probe import RTX3090

VERIFY = ROOT / "verify"
FAKES = Path(__file__).resolve().parent / "fake_mindspore"

from msgpu_verify import judge  # noqa: E402
from msgpu_verify._proc import RESULT_MARKER, run_child  # noqa: E402

from testbed import run_check_texts  # noqa: E402

# The driver probe the judge runs on a GPU (gpu_probe.py) reads these: every test chooses its driver libraries,
# none loads the machine's own (default: none at all, NO_DRIVER).
NO_LIBCUDA = "/nonexistent/libcuda.so.1"
DRIVER_VARIABLES = ("MSGPU_LIBCUDA", "MSGPU_LIBNVML", "STUB_CUDA_INIT_RESULT", "STUB_CUDA_DEVICES", "STUB_CUDA_KERNEL")


def fake_env(variant: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DRIVER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES / variant), str(FAKES), str(VERIFY)])
    env.update(MSGPU_LIBCUDA=NO_LIBCUDA, MSGPU_LIBNVML="/nonexistent/libnvidia-ml.so.1")
    env.update(extra)
    return env


def run_judge(variant: str, *args: str, timeout: float = 20.0, **extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "msgpu_verify", "judge", "--python", sys.executable, *args]
    return subprocess.run(command, env=fake_env(variant, **extra), capture_output=True, text=True, timeout=timeout)


def judged(variant: str, device: str = "CPU", timeout_s: float = 20.0, **expected: str) -> dict:
    return judge.judge(sys.executable, device, timeout_s, expected, env=fake_env(variant))


def test_ok_on_cpu():
    document = judged("ok")
    assert document["verdict"] == "OK", document
    assert document["got"]["mul"] == [4.0, 10.0, 18.0]
    assert document["run_check"]["said_ok"] is True
    assert document["mindspore_version"] == "1.5.1"
    assert document["returncode"] == 0
    assert document["library"] is None


def test_hang_is_killed_with_its_whole_process_group(tmp_path):
    pidfile = tmp_path / "pids"
    env = fake_env("hang", MSGPU_FAKE_PIDFILE=str(pidfile))
    start = time.monotonic()
    document = judge.judge(sys.executable, "GPU", 2.0, {}, env=env)
    elapsed = time.monotonic() - start
    assert document["verdict"] == "HANG", document
    assert document["timed_out"] is True
    assert elapsed < 2.0 + 5.0
    assert "import" in document["explanation"]
    probe_pid, grandchild_pid = (int(p) for p in pidfile.read_text().split())
    assert not pid_alive(probe_pid)
    assert not pid_alive(grandchild_pid)


def test_missing_library_names_it():
    document = judged("missing_lib", "GPU")
    assert document["verdict"] == "LIBRARY_MISSING", document
    assert document["library"] == "libcudnn.so.7"
    assert "libcudnn.so.7" in document["explanation"]
    assert document["hint"]


def test_no_gpu_from_the_real_run_check_text():
    document = judged("nogpu", "GPU")
    assert document["verdict"] == "NO_GPU", document
    assert document["run_check"]["said_ok"] is False
    assert "MindSpore running check failed." in document["run_check"]["output"]
    # The C++ (fd 2) lines are captured inside run_check's output, in order.
    assert "cudaGetDeviceCount failed, ret[100]" in document["run_check"]["output"]


def test_no_gpu_fake_still_works_on_cpu():
    assert judged("nogpu", "CPU")["verdict"] == "OK"


def test_wrong_product_is_failed():
    document = judged("wrong")
    assert document["verdict"] == "FAILED", document
    assert "[4.0, 10.0, 19.0]" in document["explanation"]


def test_version_mismatch_on_mindspore_version():
    document = judged("ok", mindspore="1.10.0")
    assert document["verdict"] == "VERSION_MISMATCH", document
    assert "1.5.1" in document["explanation"] and "1.10.0" in document["explanation"]
    assert document["expected"] == {"mindspore": "1.10.0"}


def test_version_mismatch_wins_over_no_gpu():
    document = judged("nogpu", "GPU", mindspore="2.2.14")
    assert document["verdict"] == "VERSION_MISMATCH"


def test_hang_at_exit_after_the_work_is_ok():
    # The fake leaves a non-daemon thread that never ends: a plain interpreter exit would hang forever.
    start = time.monotonic()
    document = judged("exit_hang", timeout_s=10.0)
    assert document["verdict"] == "OK", document
    assert time.monotonic() - start < 10.0


def test_exit_codes_and_accept(tmp_path):
    out = tmp_path / "judge.json"
    result = run_judge("nogpu", "--device", "GPU", "--json", str(out))
    assert result.returncode == 1
    assert "NO_GPU" in result.stdout
    assert '"verdict": "NO_GPU"' in out.read_text()
    accepted = run_judge("nogpu", "--device", "GPU", "--accept", "NO_GPU")
    assert accepted.returncode == 0
    assert run_judge("ok", "--device", "CPU").returncode == 0
    assert run_judge("wrong", "--device", "CPU", "--accept", "NO_GPU").returncode == 1


def probe_output(result: str, before: str = "") -> str:
    return before + RESULT_MARKER + " " + result + "\n"


def test_classify_cuda_and_cudnn_mismatch_from_loaded_libraries():
    result = (
        '{"imported": true, "mindspore_version": "1.5.1", "mul_ok": true, "mul": [4.0, 10.0, 18.0],'
        ' "loaded_libraries": [{"name": "libcudart", "file": "libcudart.so.10.1", "version": "10.1"},'
        ' {"name": "libcudnn", "file": "libcudnn.so.7", "version": "7.6.5"}]}'
    )
    text = "@@MSGPU_VERIFY_STAGE@@ begin run_check\nMindSpore has been installed successfully!\n"
    text += "@@MSGPU_VERIFY_STAGE@@ end run_check\n"
    verdict = judge.classify(probe_output(result, text), 0, False, {"cuda": "11.1", "cudnn_major": "8"})
    assert verdict["verdict"] == "VERSION_MISMATCH"
    assert "10.1" in verdict["explanation"] and "7.6.5" in verdict["explanation"]
    assert judge.classify(probe_output(result, text), 0, False, {"cuda": "10.1"})["verdict"] == "OK"


def test_classify_old_driver_is_version_mismatch():
    result = (
        '{"imported": true, "mindspore_version": "1.5.1", "mul_ok": false,'
        ' "errors": {"mul": {"type": "RuntimeError", "message": "x"}}}'
    )
    text = "[ERROR] cudaGetDeviceCount failed, ret[35], CUDA driver version is insufficient for CUDA runtime version\n"
    verdict = judge.classify(probe_output(result, text), 0, False, {}, "GPU")
    assert verdict["verdict"] == "VERSION_MISMATCH"
    assert "driver" in verdict["explanation"]


def test_classify_import_error_names_the_library():
    result = (
        '{"imported": false, "errors": {"import": {"type": "ImportError", "message": '
        '"libcurand.so.10: cannot open shared object file: No such file or directory"}}}'
    )
    verdict = judge.classify(probe_output(result), 0, False)
    assert verdict["verdict"] == "LIBRARY_MISSING"
    assert verdict["library"] == "libcurand.so.10"


@pytest.mark.parametrize(
    ("output", "returncode", "timed_out", "verdict"),
    [
        ("@@MSGPU_VERIFY_STAGE@@ begin run_check\n", None, True, "HANG"),
        ("Segmentation fault\n", -11, False, "FAILED"),
        ("libnccl.so.2: cannot open shared object file\n", 1, False, "LIBRARY_MISSING"),
    ],
)
def test_classify_without_a_result(output, returncode, timed_out, verdict):
    assert judge.classify(output, returncode, timed_out)["verdict"] == verdict


def test_run_child_kills_a_group_that_ignores_sigterm():
    code = "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)"
    start = time.monotonic()
    child = run_child([sys.executable, "-c", code], timeout_s=1.0)
    assert child.timed_out is True
    assert "up" in child.output
    assert time.monotonic() - start < 1.0 + 5.0
    assert not pid_alive(child.pgid)


def test_missing_python_is_failed_not_a_crash(tmp_path):
    document = judge.judge(str(tmp_path / "no-python"), "CPU", 5.0, {})
    assert document["verdict"] == "FAILED"
    assert "no-python" in document["explanation"]
    assert judge.exit_code(document, ["NO_GPU"]) == 1


# --- run_check's real texts, per release (tests/unit/data/run_check_texts.json, from the wheels) -------------------

TEXTS_FILE = Path(__file__).resolve().parent / "data" / "run_check_texts.json"
TEXTS = json.loads(TEXTS_FILE.read_text())
RELEASES = TEXTS["releases"]
READ = sorted((v for v, r in RELEASES.items() if r.get("wheel")), key=run_check_texts._version_key)


def render(template: str, version: str, device: str, error: str = "") -> str:
    """A print template of the wheel, as that release prints it on ``device`` (KeyError: a new kind of template)."""
    values = {"ms.__version__": version, "ms.get_context('device_target')": device, "str(e)": error}
    return re.sub(r"\{([^{}]+)\}", lambda match: values[match.group(1)], template)


def run_check_output(lines: list, version: str = "1.5.1", mul_ok: bool = True) -> str:
    """The probe's output around run_check's printed ``lines``, with a passing or failing independent product."""
    result = {"imported": True, "mindspore_version": version, "mul_ok": mul_ok, "mul": [4.0, 10.0, 18.0]}
    text = f"{judge.STAGE_MARKER} begin run_check\n" + "".join(line + "\n" for line in lines)
    text += f"{judge.STAGE_MARKER} end run_check\n"
    return probe_output(json.dumps(result), text)


def test_every_catalog_release_has_its_texts_or_says_why(catalog):
    for version, entry in catalog["mindspore"].items():
        record = RELEASES[str(version)]
        assert record["catalog"] is True and record["package"] == entry["package"]
        if record.get("wheel"):
            # The wheel read is the catalog's own file where the catalog pins it (sha256 from PyPI's index).
            pinned = [w for w in (entry.get("wheels") or {}).values() if w.get("file") == record["wheel"]]
            for wheel in pinned:
                assert wheel["sha256"] in (None, record["sha256"]), version
            continue
        # Not on PyPI (2.2.14): the nearest releases on either side were read, and they agree on every text.
        assert record["not_on_pypi"]
        below, above = record["bracketed_by"]
        assert run_check_texts._version_key(below) < run_check_texts._version_key(str(version))
        assert run_check_texts._version_key(str(version)) < run_check_texts._version_key(above)
        assert {k: RELEASES[below]["run_check"][k] for k in ("success", "failure")} == {
            k: RELEASES[above]["run_check"][k] for k in ("success", "failure")
        }


@pytest.mark.parametrize("version", READ)
@pytest.mark.parametrize("device", ["GPU", "CPU"])
def test_the_real_success_text_is_ok(version, device):
    texts = RELEASES[version]["run_check"]
    lines = [render(texts["prints"][0], version, device), render(texts["success"], version, device)]
    verdict = judge.classify(run_check_output(lines, version), 0, False, {}, device)
    assert verdict["verdict"] == "OK", (lines, verdict)
    said = judge.run_check_said("\n".join(lines), device)
    assert said["said_ok"] and said["on_device"]
    assert said["platform"] == (device if "get_context" in texts["success"] else None)


@pytest.mark.parametrize("version", READ)
def test_the_real_failure_text_is_failed(version):
    texts = RELEASES[version]["run_check"]
    error = "Op Error: Failed to set current device id | Error Number: 0"
    lines = [render(texts["prints"][0], version, "GPU")] + [render(t, version, "GPU", error) for t in texts["failure"]]
    assert error in lines  # the exception's own text is printed after the failure line
    verdict = judge.classify(run_check_output(lines, version), 0, False, {}, "GPU")
    assert verdict["verdict"] == "FAILED" and "run_check() did not report success" in verdict["explanation"]
    assert judge.run_check_said("\n".join(lines), "GPU")["said_ok"] is False


@pytest.mark.parametrize("version", [v for v in READ if "get_context" in RELEASES[v]["run_check"]["success"]])
def test_a_2x_success_on_another_platform_is_not_a_gpu_success(version):
    texts = RELEASES[version]["run_check"]
    lines = [render(texts["success"], version, "CPU")]
    verdict = judge.classify(run_check_output(lines, version), 0, False, {}, "GPU")
    assert verdict["verdict"] == "FAILED"
    assert "passed on platform [CPU], not on GPU" in verdict["explanation"]


def test_the_versions_read_cover_both_forms_of_the_success_text():
    # 1.x says "installed successfully", 2.x "installed on platform [<device>] successfully": the judge must know both.
    forms = {RELEASES[v]["run_check"]["success"] for v in READ}
    assert any("{ms.get_context('device_target')}" in form for form in forms), forms
    assert any("installed successfully" in form for form in forms), forms
    assert {t for v in READ for t in RELEASES[v]["run_check"]["failure"]} == {
        "MindSpore running check failed.",
        "{str(e)}",
    }


def test_ok_with_the_2x_fake_on_gpu_and_cpu():
    for device in ("GPU", "CPU"):
        document = judged("ok2", device)
        assert document["verdict"] == "OK", document
        assert document["mindspore_version"] == "2.0.0"
        assert document["run_check"]["said_ok"] is True and document["run_check"]["platform"] == device
        assert f"installed on platform [{device}] successfully!" in document["run_check"]["output"]


def test_2x_without_its_gpu_plugin_names_the_library_the_stacks_cuda_needs():
    # mindspore 2.0.0 on a host without CUDA (real text): set_context(device_target="GPU") raises, run_check and the
    # product then pass on the CPU. That must not be OK, and of the plugins' errors the stack CUDA's one counts.
    document = judged("noplugin2", "GPU", cuda="11.1")
    assert document["verdict"] == "LIBRARY_MISSING", document
    assert document["library"] == "libcublas.so.11"
    assert "libmindspore_gpu.so.11.1" in document["explanation"]
    assert document["run_check"]["platform"] == "CPU"
    older = judge.judge(sys.executable, "GPU", 20.0, {"cuda": "10.1"}, env=fake_env("noplugin2"))
    assert (older["library"], "libmindspore_gpu.so.10.1" in older["explanation"]) == ("libcublas.so.10", True)
    assert judged("noplugin2", "CPU")["verdict"] == "OK"


def test_a_context_error_without_a_library_name_is_failed_not_ok():
    result = {
        "imported": True,
        "mindspore_version": "2.0.0",
        "mul_ok": True,
        "mul": [4.0, 10.0, 18.0],
        "errors": {"context": {"type": "RuntimeError", "message": "Unsupported device target GPU."}},
    }
    lines = [
        "The result of multiplication calculation is correct, MindSpore has been installed on platform [CPU] "
        "successfully!"
    ]
    text = f"{judge.STAGE_MARKER} begin run_check\n{lines[0]}\n{judge.STAGE_MARKER} end run_check\n"
    verdict = judge.classify(probe_output(json.dumps(result), text), 0, False, {}, "GPU")
    assert verdict["verdict"] == "FAILED"
    assert (
        "set_context(device_target='GPU') raised RuntimeError: Unsupported device target GPU." in verdict["explanation"]
    )


# --- the driver probe (gpu_probe.py in its own child): explains the verdict, never changes it ---------------------


@pytest.fixture()
def stub_driver(stub_cuda) -> dict:
    """The stand-in libcuda / libnvidia-ml (tests/unit/conftest.py) for the probe's child, as its environment."""
    return {"MSGPU_LIBCUDA": stub_cuda["cuda"], "MSGPU_LIBNVML": stub_cuda["nvml"]}


def test_no_gpu_while_the_driver_runs_a_kernel_says_the_gpu_works(stub_driver):
    env = fake_env("nogpu", STUB_CUDA_DEVICES=",".join([RTX3090] * 4), **stub_driver)
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=env)
    assert document["verdict"] == "NO_GPU", document  # unchanged: the probe only explains
    assert document["hint"] == judge.HINTS["NO_GPU"]
    probe = document["driver_probe"]
    assert probe["state"] == "ran" and probe["verdict"] == "OK", probe
    assert probe["device_count"] == 4 and probe["devices"] == ["NVIDIA GeForce RTX 3090"] * 4
    assert probe["cuda_driver_version"] == "11.4" and probe["driver_version"] == "470.256.02"
    assert probe["seconds"] >= 0 and probe["summary"] == "OK (4 x NVIDIA GeForce RTX 3090)"
    assert document["explanation"].startswith("MindSpore and its libraries load, but there is no usable GPU")
    assert (
        "The driver runs a CUDA kernel on every GPU (4 x NVIDIA GeForce RTX 3090) without MindSpore: the GPU works; "
        "the fault is in MindSpore or its CUDA libraries." in document["explanation"]
    )


def test_no_gpu_and_a_driver_without_devices_agree(stub_driver):
    env = fake_env("nogpu", STUB_CUDA_INIT_RESULT="100", STUB_CUDA_DEVICES=RTX3090, **stub_driver)
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=env)
    assert document["verdict"] == "NO_GPU"
    assert document["driver_probe"]["verdict"] == "NO_DEVICE"
    assert "agrees there is no usable GPU: cuInit says CUDA_ERROR_NO_DEVICE (100)" in document["explanation"]
    assert "the GPU works" not in document["explanation"]


def test_a_failing_driver_is_named_as_the_fault(stub_driver):
    env = fake_env("missing_lib", STUB_CUDA_DEVICES=RTX3090, STUB_CUDA_KERNEL="launch_fail", **stub_driver)
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=env)
    assert document["verdict"] == "LIBRARY_MISSING" and document["library"] == "libcudnn.so.7"
    assert document["driver_probe"]["verdict"] == "KERNEL_FAILED"
    assert "The driver itself fails without MindSpore: 1 of 1 devices failed the kernel" in document["explanation"]
    # No libcuda at all (fake_env's default): NO_DRIVER, said the same way.
    document = judged("missing_lib", "GPU")
    assert document["driver_probe"]["verdict"] == "NO_DRIVER"
    assert (
        "The driver itself fails without MindSpore: the CUDA driver library cannot be loaded"
        in (document["explanation"])
    )


def test_a_driver_probe_that_hangs_is_recorded_and_the_judge_completes(monkeypatch):
    monkeypatch.setattr(judge, "driver_probe_argv", lambda: [sys.executable, "-c", "import time; time.sleep(60)"])
    start = time.monotonic()
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=fake_env("nogpu"), driver_probe_timeout_s=1.0)
    assert time.monotonic() - start < 20.0
    assert document["verdict"] == "NO_GPU"
    probe = document["driver_probe"]
    assert probe["state"] == "timeout" and probe["verdict"] is None and probe["timeout_s"] == 1.0
    assert "did not finish within 1 s" in probe["reason"]
    assert "The driver probe (no MindSpore) gave no answer: the GPU probe did not finish" in document["explanation"]


def test_a_driver_probe_that_crashes_or_cannot_start_is_recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(judge, "driver_probe_argv", lambda: [sys.executable, "-c", "import os; os.abort()"])
    probe = judge.judge(sys.executable, "GPU", 20.0, {}, env=fake_env("nogpu"))["driver_probe"]
    assert probe["state"] == "crashed" and "killed by signal 6" in probe["reason"]
    monkeypatch.setattr(judge, "driver_probe_argv", lambda: [str(tmp_path / "no-python")])
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=fake_env("nogpu"))
    assert document["verdict"] == "NO_GPU"
    assert document["driver_probe"]["state"] == "crashed"
    assert "cannot start the GPU probe" in document["driver_probe"]["reason"]


def test_the_driver_probe_is_skipped_off_gpu_and_on_request(stub_driver, tmp_path):
    assert judged("ok", "CPU")["driver_probe"] == {
        "state": "skipped",
        "verdict": None,
        "reason": "the judged device is CPU, not GPU",
        "summary": "skipped: the judged device is CPU, not GPU",
    }
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=fake_env("nogpu"), driver_probe=False)
    assert document["driver_probe"]["state"] == "skipped" and document["driver_probe"]["reason"] == "--no-driver-probe"
    assert document["explanation"] == (  # nothing added
        "MindSpore and its libraries load, but there is no usable GPU: no CUDA-capable device is detected."
    )
    out = tmp_path / "judge.json"
    result = run_judge("nogpu", "--device", "GPU", "--no-driver-probe", "--json", str(out), **stub_driver)
    assert result.returncode == 1 and json.loads(out.read_text())["driver_probe"]["reason"] == "--no-driver-probe"


def test_the_driver_probe_runs_under_the_cli_and_the_summary_line_says_it(stub_driver, tmp_path):
    out = tmp_path / "judge.json"
    result = run_judge("nogpu", "--device", "GPU", "--json", str(out), STUB_CUDA_DEVICES=RTX3090, **stub_driver)
    assert result.returncode == 1, result.stderr
    assert "the GPU works" in result.stdout and "(1 x NVIDIA GeForce RTX 3090)" in result.stdout
    assert json.loads(out.read_text())["driver_probe"]["verdict"] == "OK"


def test_driver_probe_words():
    assert judge.gpus_text(["T4", "A100", "T4"]) == "2 x T4, 1 x A100"
    assert judge.driver_probe_sentence("OK", {"state": "ran", "verdict": "OK", "devices": ["T4"]}) is None
    assert judge.driver_probe_sentence("OK", judge.skipped_driver_probe("x")) is None
    for verdict in judge.MINDSPORE_FAULTS:
        sentence = judge.driver_probe_sentence(verdict, {"state": "ran", "verdict": "OK", "devices": ["T4"]})
        assert sentence and "(1 x T4)" in sentence and "the GPU works" in sentence


# --- GPU_UNSUPPORTED: a GPU the stack's libraries have no code for -------------------------------------------------
# From the libraries' own words (the fakes print them in MindSpore's formats), and from compute.py's rule on the
# compute capability the driver probe reads (--gpu-code: the stack's components, stack_resolved.gpu_code).

from tests.unit.conftest import GPU_CODE, H100, K80, RTX4090  # noqa: E402


def test_gpu_unsupported_from_cudas_no_kernel_image():
    document = judged("nokernel", "GPU")
    assert document["verdict"] == "GPU_UNSUPPORTED", document
    assert document["explanation"].startswith(
        'MindSpore cannot compute on this GPU: the CUDA runtime says "no kernel image is available for execution on '
        "the device\": the stack's libraries carry no code for the GPU's compute capability."
    )
    assert document["hint"] == judge.HINTS["GPU_UNSUPPORTED"]
    assert "stack_name: auto" in document["hint"] and "preflight" in document["hint"]
    assert "ret[209], no kernel image is available" in document["output_tail"]
    assert judged("nokernel", "CPU")["verdict"] == "OK"


def test_gpu_unsupported_from_cudnns_arch_mismatch():
    document = judged("cudnnarch", "GPU")
    assert document["verdict"] == "GPU_UNSUPPORTED", document
    assert 'cuDNN says "CUDNN_STATUS_ARCH_MISMATCH"' in document["explanation"]


def test_a_wrong_library_loaded_is_said_before_the_gpu():
    # A cuDNN other than the stack's may be the one refusing the GPU: VERSION_MISMATCH first, as with NO_GPU.
    assert judged("cudnnarch", "GPU", mindspore="2.2.14")["verdict"] == "VERSION_MISMATCH"


@pytest.mark.parametrize(
    ("line", "who", "words"),
    [
        # TensorRT 8.4 on an RTX 4080 (Ada, SM 8.9) and on Hopper: NVIDIA/TensorRT#2727, tensorrtx#1610
        (
            "[12/12/2024-10:15:17] [E] [TRT] 1: [caskUtils.cpp::trtSmToCask::147] Error Code 1: Internal Error "
            "(Unsupported SM: 0x809)",
            "TensorRT",
            "Unsupported SM: 0x809",
        ),
        ("[TRT] [E] 1: Unsupported SM: 0x900", "TensorRT", "Unsupported SM: 0x900"),
        # TensorRT 7 (NVIDIA/TensorRT#2332)
        (
            "ERROR: ../rtSafe/cuda/caskUtils.cpp (80) - Assertion Error in trtSmToCask: 0 (Unsupported SM.)",
            "TensorRT",
            "Unsupported SM.",
        ),
        # TensorRT 10 on a GPU it dropped
        (
            "[E] Error[9]: IBuilder::buildSerializedNetwork: Error Code 9: API Usage Error (Target GPU SM 61 is not "
            "supported by this TensorRT release.)",
            "TensorRT",
            "Target GPU SM 61 is not supported by this TensorRT release",
        ),
        ("cuDNN Error: cudnnCreate failed | Error Number: 6 CUDNN_STATUS_ARCH_MISMATCH", "cuDNN", "CUDNN_STATUS_ARCH"),
        ("cuModuleLoadData returned CUDA_ERROR_NO_BINARY_FOR_GPU (209)", "the CUDA runtime", "NO_BINARY_FOR_GPU"),
        ("cudaErrorNoKernelImageForDevice", "the CUDA runtime", "cudaErrorNoKernelImageForDevice"),
        ("cudaLaunchKernel failed, ret[209]", "the CUDA runtime (error 209", "ret[209]"),
    ],
)
def test_the_real_refusal_texts(line, who, words):
    result = {"imported": True, "mindspore_version": "1.5.1", "mul_ok": False, "errors": {"mul": {"type": "E"}}}
    verdict = judge.classify(probe_output(json.dumps(result), line + "\n"), 0, False, {}, "GPU")
    assert verdict["verdict"] == "GPU_UNSUPPORTED", verdict
    assert who in verdict["explanation"] and words in verdict["explanation"]
    # In the exception's message, with run_check failing while the product worked, and in a crash without a result.
    result = {"imported": True, "mindspore_version": "1.5.1", "mul_ok": False, "errors": {"mul": {"message": line}}}
    assert judge.classify(probe_output(json.dumps(result)), 0, False, {}, "GPU")["verdict"] == "GPU_UNSUPPORTED"
    assert judge.classify(line + "\nAborted\n", -6, False)["verdict"] == "GPU_UNSUPPORTED"
    lines = ["MindSpore running check failed.", line]
    verdict = judge.classify(run_check_output(lines), 0, False, {}, "GPU")
    assert verdict["verdict"] == "GPU_UNSUPPORTED"


@pytest.mark.parametrize(
    "line",
    [
        "cudaGetDeviceCount failed, ret[100], no CUDA-capable device is detected",
        "Unsupported device target GPU. This process only supports one of the ['CPU'].",  # 2.x without its plugin
        "cudaMemcpy failed, ret[2091], out of memory",
    ],
)
def test_other_failures_are_not_gpu_unsupported(line):
    result = {"imported": True, "mindspore_version": "1.5.1", "mul_ok": False, "errors": {"mul": {"message": line}}}
    assert judge.classify(probe_output(json.dumps(result), line + "\n"), 0, False, {}, "GPU")["verdict"] in (
        "NO_GPU",
        "FAILED",
    )


def test_a_refusal_with_a_working_driver_says_the_gpu_works(stub_driver):
    env = fake_env("nokernel", STUB_CUDA_DEVICES=",".join([H100] * 2), **stub_driver)
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=env)
    assert document["verdict"] == "GPU_UNSUPPORTED"
    assert (
        "The driver runs a CUDA kernel (PTX JIT-compiled for each GPU) on every GPU (2 x NVIDIA H100 80GB HBM3 "
        "(CC 9.0)) without MindSpore: the GPU works; the stack's libraries are what has no code for it."
    ) in document["explanation"]
    assert document["compute"] == {"state": "skipped", "reason": "no stack GPU code given (--gpu-code)"}


def test_the_stacks_gpu_code_on_the_cc_the_driver_reads_makes_gpu_unsupported(stub_driver):
    """run_check passes (its Mul needs no cuDNN), yet cuDNN 8.0.5 has nothing for Hopper: a GPU the preflight's
    PCI data did not know is caught once the driver reads its compute capability."""
    env = fake_env("ok", STUB_CUDA_DEVICES=",".join([H100] * 2), **stub_driver)
    document = judge.judge(
        sys.executable, "GPU", 20.0, {}, env=env, gpu_code=GPU_CODE, host="gpu7", stack="ms1.5-cuda11.1"
    )
    assert document["verdict"] == "GPU_UNSUPPORTED", document
    assert document["hint"] == judge.HINTS["GPU_UNSUPPORTED"]
    compute = document["compute"]
    assert compute["state"] == "checked" and compute["runs"] is False and compute["verdict_before"] == "OK"
    assert compute["errors"] == [
        "gpu7: stack ms1.5-cuda11.1 cannot run on GPU NVIDIA H100 80GB HBM3 (CC 9.0) at device 0 00000000:01:00.0, "
        "device 1 00000000:02:00.0: cuDNN 8.0.5 has code up to CC 8.6 and is not hardware forward compatible, so "
        "nothing of it runs on CC 9.x (NVIDIA cuDNN 8.0.5 support matrix); allowed: " + judge.GPU_CODE_WORKS + "."
    ]
    assert [g["slots"] for g in compute["gpus"]] == [["device 0 00000000:01:00.0", "device 1 00000000:02:00.0"]]
    assert len(compute["warnings"]) == 1 and "MindSpore 1.5.1" in compute["warnings"][0]  # PTX 5.3 only: JIT
    explanation = document["explanation"]
    assert explanation.startswith(compute["errors"][0])
    assert (
        "The stack's libraries support: MindSpore 1.5.1 (libmindspore_gpu.so: SASS none; PTX 5.3); cuDNN 8.0.5 "
        "(CC 3.5 to 8.6; newer 8.x untuned, nothing of 9.0 and up; NVIDIA cuDNN 8.0.5 support matrix)."
    ) in explanation
    assert "MindSpore's own check said OK: MindSpore 1.5.1 imports, run_check passes" in explanation
    assert "the GPU works; the stack's libraries are what has no code for it." in explanation


def test_the_stacks_gpu_code_on_gpus_it_runs_on_adds_notes(stub_driver):
    env = fake_env("ok", STUB_CUDA_DEVICES=RTX3090, **stub_driver)
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=env, gpu_code=GPU_CODE, host="gpu1", stack="s")
    assert document["verdict"] == "OK", document
    assert document["compute"]["runs"] is True and document["compute"]["errors"] == []
    assert document["explanation"].endswith(document["compute"]["warnings"][0])  # MindSpore's PTX JIT, a note
    assert (
        " Note: gpu1: GPU NVIDIA GeForce RTX 3090 (CC 8.6) at device 0 00000000:01:00.0: MindSpore 1.5.1 "
        in (document["explanation"])
    )
    env = fake_env("ok", STUB_CUDA_DEVICES=RTX4090, **stub_driver)
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=env, gpu_code=GPU_CODE, host="gpu2", stack="s")
    assert document["verdict"] == "OK" and len(document["compute"]["warnings"]) == 2  # JIT, and cuDNN outside
    assert "not verified by NVIDIA for this GPU." in document["explanation"]


def test_the_gpu_code_check_is_skipped_without_compute_capabilities():
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=fake_env("nokernel"), gpu_code=GPU_CODE)
    assert document["verdict"] == "GPU_UNSUPPORTED"  # from the text alone
    assert document["compute"]["state"] == "skipped"
    assert document["compute"]["reason"].startswith("the driver probe read no compute capability (NO_DRIVER")
    assert judged("ok", "CPU")["compute"]["reason"] == "the judged device is CPU, not GPU"


def test_a_gpu_below_the_probes_ptx_is_not_blamed_on_the_driver(stub_driver):
    env = fake_env("nogpu", STUB_CUDA_DEVICES=K80, STUB_CUDA_KERNEL="jit_fail", **stub_driver)
    document = judge.judge(sys.executable, "GPU", 20.0, {}, env=env)
    assert document["driver_probe"]["verdict"] == "KERNEL_FAILED"
    assert (
        "The driver probe's kernel cannot run on 1 x Tesla K80 (CC 3.7): compute capability 3.7 is below what the "
        "probe (PTX 5.0) can run, which says nothing about the driver."
    ) in document["explanation"]
    assert "The driver itself fails" not in document["explanation"]
    # A GPU at or above 5.0 failing the same way is still the driver's.
    env = fake_env("nogpu", STUB_CUDA_DEVICES=RTX3090, STUB_CUDA_KERNEL="jit_fail", **stub_driver)
    assert (
        "The driver itself fails without MindSpore"
        in judge.judge(sys.executable, "GPU", 20.0, {}, env=env)["explanation"]
    )


def test_the_cli_takes_the_gpu_code_and_accepts_gpu_unsupported(stub_driver, tmp_path):
    out = tmp_path / "judge.json"
    code = json.dumps(GPU_CODE)
    args = ("--device", "GPU", "--json", str(out), "--gpu-code", code, "--stack", "s", "--host", "gpu7")
    result = run_judge("ok", *args, STUB_CUDA_DEVICES=H100, **stub_driver)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("judge: GPU_UNSUPPORTED (") and "gpu7: stack s cannot run on GPU" in result.stdout
    assert json.loads(out.read_text())["compute"]["state"] == "checked"
    accepted = run_judge("ok", *args, "--accept", "GPU_UNSUPPORTED", STUB_CUDA_DEVICES=H100, **stub_driver)
    assert accepted.returncode == 0
    (tmp_path / "code.json").write_text(code)  # a file works as well
    from_file = run_judge(
        "ok", "--device", "GPU", "--gpu-code", str(tmp_path / "code.json"), STUB_CUDA_DEVICES=H100, **stub_driver
    )
    assert from_file.returncode == 1
    bad = run_judge("ok", "--gpu-code", '{"not": "a list"}')
    assert bad.returncode == 2 and "--gpu-code wants a JSON list" in bad.stderr


def test_gpu_unsupported_is_a_verdict_like_the_others():
    assert "GPU_UNSUPPORTED" in judge.VERDICTS and set(judge.HINTS) == set(judge.VERDICTS)
    assert judge.exit_code({"verdict": "GPU_UNSUPPORTED"}, []) == 1
    assert judge.exit_code({"verdict": "GPU_UNSUPPORTED"}, ["GPU_UNSUPPORTED"]) == 0


def test_the_report_counts_and_explains_gpu_unsupported(tmp_path):
    from msgpu_verify import report

    hosts = tmp_path / "hosts"
    hosts.mkdir()
    judged_doc = {"verdict": "GPU_UNSUPPORTED", "explanation": "gpu7: stack s cannot run on GPU X", "hint": "h"}
    (hosts / "gpu7.json").write_text(json.dumps({"host": "gpu7", "judge": judged_doc, "bench": None}))
    (hosts / "gpu1.json").write_text(json.dumps({"host": "gpu1", "judge": {"verdict": "OK", "explanation": "ok"}}))
    paths = report.write_report(hosts, tmp_path / "out", "t")
    summary = json.loads(paths[-1].read_text())
    assert summary["verdicts"] == {"GPU_UNSUPPORTED": 1, "OK": 1}
    row = next(r for r in summary["hosts"] if r["host"] == "gpu7")
    assert row["passed"] is False and row["explanation"].startswith("gpu7: stack s cannot run on GPU X")


def test_what_the_stacks_libraries_support_in_words():
    assert judge.gpu_code_support(GPU_CODE) == (
        "MindSpore 1.5.1 (libmindspore_gpu.so: SASS none; PTX 5.3); cuDNN 8.0.5 (CC 3.5 to 8.6; newer 8.x untuned, "
        "nothing of 9.0 and up; NVIDIA cuDNN 8.0.5 support matrix)"
    )
    cited = {"sass": ["8.6", "7.5"], "ptx": ["8.6"], "label": "its kernels", "min": "6.0", "max": "8.6", "source": "s"}
    assert judge.gpu_code_support([{"name": "TensorRT", "version": "8.4.1", "code": cited}, {"name": "X"}]) == (
        "TensorRT 8.4.1 (its kernels: SASS 7.5, 8.6; PTX 8.6; CC 6.0 to 8.6; nothing newer; s); X"
    )
    assert judge.gpu_code_support([{"name": "N", "version": "1", "code": {"max": "9.0", "above_max": "jit"}}]) == (
        "N 1 (CC any to 9.0; newer through PTX JIT)"
    )
