"""The run_check judge: every verdict with REAL child processes running fake MindSpore packages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

VERIFY = ROOT / "verify"
FAKES = Path(__file__).resolve().parent / "fake_mindspore"
sys.path.insert(0, str(VERIFY))

from msgpu_verify import judge  # noqa: E402
from msgpu_verify._proc import RESULT_MARKER, run_child  # noqa: E402


def fake_env(variant: str, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES / variant), str(FAKES), str(VERIFY)])
    env.update(extra)
    return env


def run_judge(variant: str, *args: str, timeout: float = 20.0, **extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "msgpu_verify", "judge", "--python", sys.executable, *args]
    return subprocess.run(command, env=fake_env(variant, **extra), capture_output=True, text=True, timeout=timeout)


def judged(variant: str, device: str = "CPU", timeout_s: float = 20.0, **expected: str) -> dict:
    return judge.judge(sys.executable, device, timeout_s, expected, env=fake_env(variant))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (it is only waiting to be reaped by its parent).
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


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
