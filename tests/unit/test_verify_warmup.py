"""The first-run warm-up (msgpu_verify.warmup) and the GPU smoke test (msgpu_verify.smoke), with REAL child
processes running fake MindSpore packages (tests/unit/fake_mindspore).

The ``jit`` fake stands in for mindspore-gpu 1.5.1 on an sm_86 GPU: its first GPU operation "JIT-compiles" (sleeps
MSGPU_FAKE_JIT_S seconds) unless the kernel cache folder already holds what it compiled. The host's GPUs are a
folder tree (<root>/proc/driver/nvidia/gpus/<PCI address>); the driver's view in the smoke test comes from the
stand-in libcuda / libnvidia-ml compiled from tests/unit/stub_cuda. No real MindSpore, CUDA or GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

VERIFY = ROOT / "verify"
FAKES = Path(__file__).resolve().parent / "fake_mindspore"
STUBS = Path(__file__).resolve().parent / "stub_cuda"

from msgpu_verify import smoke, warmup  # noqa: E402

RTX3090 = "NVIDIA GeForce RTX 3090:8.6:24268"


@pytest.fixture()
def host(tmp_path, monkeypatch) -> dict:
    """A home (the default kernel cache ~/.nv/ComputeCache), a root with one GPU, and a clean environment."""
    home = tmp_path / "home"
    home.mkdir()
    root = tmp_path / "root"
    (root / "proc/driver/nvidia/gpus/0000:01:00.0").mkdir(parents=True)
    for name in ("CUDA_CACHE_PATH", "CUDA_CACHE_MAXSIZE", "CUDA_CACHE_DISABLE", "MSGPU_LIBNVML", "MSGPU_LIBCUDA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    return {"home": home, "root": str(root), "cache": home / ".nv" / "ComputeCache"}


def fake_env(variant: str, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES / variant), str(FAKES), str(VERIFY)])
    env.update(extra)
    return env


def warm(variant: str, host: dict, timeout_s: float = 30.0, **extra) -> dict:
    options = {k: extra.pop(k) for k in ("force", "no_gpu_reason", "root") if k in extra}
    options.setdefault("root", host["root"])
    return warmup.warmup(sys.executable, timeout_s, env=fake_env(variant, **extra), **options)


def test_ok_with_seconds_then_cached_from_the_marker(host):
    first = warm("jit", host, MSGPU_FAKE_JIT_S="1.5", CUDA_CACHE_MAXSIZE="4294967296")
    assert first["verdict"] == "OK", first
    assert first["seconds"] >= 1.5 and first["gpu_seconds"] >= 1.5
    assert first["stage_seconds"]["import"] < 1.5
    assert first["mindspore_version"] == "1.5.1"
    assert first["cache"]["path"] == str(host["cache"]) and first["cache"]["warnings"] == []
    marker = host["cache"] / f"msgpu-warmup-{warmup.hostname()}.json"
    assert first["marker"] == str(marker)
    record = json.loads(marker.read_text())
    assert record["identity"]["mindspore_package"] == str(FAKES / "jit" / "mindspore")
    assert record["seconds"] == first["seconds"] and record["mindspore_version"] == "1.5.1"
    assert warmup.exit_code(first) == 0

    start = time.monotonic()
    again = warm("jit", host, MSGPU_FAKE_JIT_S="60")  # would take a minute if it compiled again
    assert time.monotonic() - start < 10
    assert again["verdict"] == "CACHED", again
    assert again["cached_from"]["seconds"] == first["seconds"]
    assert again["seconds"] is None and "MindSpore 1.5.1" in again["explanation"]
    assert warmup.exit_code(again) == 0


def test_a_changed_driver_or_mindspore_warms_again(host):
    assert warm("jit", host, MSGPU_FAKE_JIT_S="0.2")["verdict"] == "OK"
    marker = host["cache"] / f"msgpu-warmup-{warmup.hostname()}.json"
    record = json.loads(marker.read_text())
    record["identity"]["driver_version"] = "455.45.01"
    marker.write_text(json.dumps(record))
    again = warm("jit", host, MSGPU_FAKE_JIT_S="0.2")
    assert again["verdict"] == "OK", again
    assert again["rewarm_because"] == ["driver_version '455.45.01' -> None"]
    # Another MindSpore (the 2.0.0 fake lives in another folder): warmed again too.
    other = warm("ok2", host)
    assert other["verdict"] == "OK" and other["mindspore_version"] == "2.0.0"
    assert any(change.startswith("mindspore_package ") for change in other["rewarm_because"])


def test_force_and_a_disabled_cache_always_warm(host):
    assert warm("jit", host, MSGPU_FAKE_JIT_S="0.2")["verdict"] == "OK"
    assert warm("jit", host, force=True)["verdict"] == "OK"
    disabled = warm("jit", host, MSGPU_FAKE_JIT_S="0.5", CUDA_CACHE_DISABLE="1")
    assert disabled["verdict"] == "OK" and disabled["gpu_seconds"] >= 0.5
    assert "CUDA_CACHE_DISABLE=1" in disabled["explanation"]


def test_a_small_cache_is_a_warning(host):
    document = warm("ok", host, CUDA_CACHE_MAXSIZE="268435456")
    assert document["verdict"] == "OK"
    assert "CUDA_CACHE_MAXSIZE=268435456: too small" in document["explanation"]
    unset = warmup.cache_settings({"HOME": str(host["home"])})
    assert unset["maxsize"] is None and "256 MiB on CUDA 11" in unset["warnings"][0]


@pytest.mark.parametrize(
    "variant, options, words",
    [
        ("ok", {"no_gpu_reason": "stack_no_gpu: true"}, "no GPU on this host (stack_no_gpu: true)"),
        ("ok", {"root": "/nonexistent-root"}, "the NVIDIA kernel module lists no GPU"),
        ("nogpu", {}, "MindSpore sees no GPU: MindSpore and its libraries load, but there is no usable GPU"),
    ],
)
def test_no_gpu_is_skipped_with_the_reason(host, variant, options, words):
    document = warm(variant, host, **options)
    assert document["verdict"] == "SKIPPED", document
    assert words in document["explanation"]
    assert warmup.exit_code(document) == 0
    assert not host["cache"].exists() or not list(host["cache"].glob("msgpu-warmup-*"))


def test_a_hang_while_compiling_says_first_run_kernel_compilation(host):
    start = time.monotonic()
    document = warm("jit", host, timeout_s=3.0, MSGPU_FAKE_JIT_S="3600")
    assert time.monotonic() - start < 3.0 + 6.0
    assert document["verdict"] == "HANG", document
    assert document["explanation"].startswith(
        "First-run kernel compilation (the CUDA driver JIT-compiling MindSpore's PTX for this GPU) did not finish "
        "within 3 s (last stage: begin run_check)."
    )
    assert "python -m msgpu_verify warmup --timeout 3600" in document["explanation"]
    assert "verify_warmup_timeout" in document["explanation"] and "CUDA_CACHE_MAXSIZE" in document["hint"]
    assert warmup.exit_code(document) == 1
    assert not list(host["cache"].glob("msgpu-warmup-*"))


def test_a_hang_in_import_is_not_called_compilation(host):
    document = warm("hang", host, timeout_s=2.0)
    assert document["verdict"] == "HANG"
    assert (
        "stuck in `import mindspore`" in document["explanation"] and "not kernel compilation" in document["explanation"]
    )


def test_a_broken_install_is_failed_and_left_to_the_judge(host):
    document = warm("missing_lib", host)
    assert document["verdict"] == "FAILED" and document["probe_verdict"] == "LIBRARY_MISSING"
    assert "libcudnn.so.7" in document["explanation"]


def test_the_command_line(host, tmp_path):
    out = tmp_path / "warmup.json"
    command = [sys.executable, "-m", "msgpu_verify", "warmup", "--timeout", "30", "--root", host["root"]]
    result = subprocess.run(
        [*command, "--json", str(out)], env=fake_env("ok"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("warmup: OK (")
    assert json.loads(out.read_text())["verdict"] == "OK"
    skipped = subprocess.run([*command, "--no-gpu"], env=fake_env("ok"), capture_output=True, text=True, timeout=60)
    assert skipped.returncode == 0 and "warmup: SKIPPED" in skipped.stdout and "stack_no_gpu" in skipped.stdout
    refused = subprocess.run([*command, "--timeout", "0"], env=fake_env("ok"), capture_output=True, text=True)
    assert refused.returncode == 2


# --- the GPU smoke test -------------------------------------------------------------------------------------------


@pytest.fixture()
def stubs(stub_cuda) -> dict:
    """The stand-in libcuda / libnvidia-ml (tests/unit/conftest.py builds them once per run)."""
    return stub_cuda


def run_smoke(variant: str, host: dict, out: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "msgpu_verify", "gpu-smoke", "--out", str(out), "--root", host["root"], *args]
    env = fake_env(variant, **extra)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_gpu_smoke_end_to_end(host, stubs, tmp_path):
    out = tmp_path / "smoke" / "gpu-smoke.json"
    result = run_smoke(
        "jit",
        host,
        out,
        "--libcuda",
        stubs["cuda"],
        "--libnvml",
        stubs["nvml"],
        "--expect-mindspore",
        "1.5.1",
        MSGPU_FAKE_JIT_S="2",
        CUDA_CACHE_MAXSIZE="4294967296",
        STUB_CUDA_DEVICES=RTX3090,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "OK", doc["explanation"]
    steps = doc["steps"]
    assert (
        doc["order"]
        == ["gpu_probe", "warmup_first", "warmup_second", "judge", "bench"]
        == sorted(steps, key=doc["order"].index)
    )
    assert steps["gpu_probe"]["verdict"] == "OK" and len(steps["gpu_probe"]["context_seconds"]) == 1
    assert steps["gpu_probe"]["document"]["nvml"]["driver_version"] == "470.256.02"
    first, second = steps["warmup_first"], steps["warmup_second"]
    assert first["verdict"] == second["verdict"] == "OK"
    assert first["gpu_seconds"] >= 2.0 and second["gpu_seconds"] < 1.0
    assert first["document"]["identity"]["gpus"] == ["NVIDIA GeForce RTX 3090"]
    jit = doc["jit"]
    assert jit["first_s"] == first["seconds"] and jit["second_s"] == second["seconds"]
    assert jit["cache_works"] is True and jit["ratio"] > 2 and jit["jit_cost_s"] > 1.5
    assert steps["judge"]["verdict"] == "OK" and steps["judge"]["seconds"] < 2.0  # the cache served it too
    assert steps["bench"] == {
        "status": "skipped",
        "reason": "no MNIST folder given (--data)",
        "verdict": None,
        "seconds": None,
    }
    # A fresh, empty cache folder of its own, removed at the end; the user's cache is not touched.
    assert doc["cache"]["fresh"] is True and doc["cache"]["was_empty"] is True
    assert not Path(doc["cache"]["path"]).exists() and not host["cache"].exists()
    assert doc["limits_s"] == {"gpu_probe": 120.0, "warmup": 1800.0, "judge": 600.0, "bench": 600.0}
    assert result.stdout.startswith("gpu-smoke: OK (")


def test_gpu_smoke_without_a_driver_skips_every_step_with_the_reason(host, tmp_path):
    out = tmp_path / "gpu-smoke.json"
    result = run_smoke("ok", host, out, "--libcuda", str(tmp_path / "libcuda.so.1"), "--data", "/nonexistent")
    assert result.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "NO_GPU"
    assert doc["steps"]["gpu_probe"]["verdict"] == "NO_DRIVER"
    for name in ("warmup_first", "warmup_second", "judge", "bench"):
        step = doc["steps"][name]
        assert step["status"] == "skipped" and step["reason"].startswith("the GPU probe found no GPU (NO_DRIVER: ")


def test_gpu_smoke_stops_after_a_warm_up_that_finds_no_gpu(host, stubs, tmp_path):
    out = tmp_path / "gpu-smoke.json"
    result = run_smoke(
        "nogpu", host, out, "--libcuda", stubs["cuda"], "--libnvml", stubs["nvml"], STUB_CUDA_DEVICES=RTX3090
    )
    assert result.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "NO_GPU"
    assert doc["steps"]["warmup_first"]["verdict"] == "SKIPPED"
    for name in ("warmup_second", "judge", "bench"):
        assert doc["steps"][name]["reason"].startswith("the first warm-up did not run on the GPU (SKIPPED: MindSpore")


def test_gpu_smoke_hang_while_compiling(host, stubs, tmp_path):
    out = tmp_path / "gpu-smoke.json"
    result = run_smoke(
        "jit",
        host,
        out,
        "--libcuda",
        stubs["cuda"],
        "--warmup-timeout",
        "3",
        MSGPU_FAKE_JIT_S="3600",
        STUB_CUDA_DEVICES=RTX3090,
    )
    assert result.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "HANG"
    assert "First-run kernel compilation" in doc["steps"]["warmup_first"]["reason"]
    assert doc["steps"]["judge"]["status"] == "skipped" and "HANG" in doc["steps"]["judge"]["reason"]


def test_gpu_smoke_runs_the_quick_bench_after_the_judge(host, stubs, tmp_path, monkeypatch):
    """In-process, with the benchmark stood in (training needs the real MindSpore): its call and its numbers."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKES / "jit"), str(FAKES), str(VERIFY)]))
    monkeypatch.setenv("MSGPU_FAKE_JIT_S", "0.5")
    monkeypatch.setenv("STUB_CUDA_DEVICES", RTX3090)
    monkeypatch.setenv("CUDA_CACHE_PATH", "/kept")  # the smoke test sets its own for the children
    calls = []

    def bench(**kwargs):
        calls.append(kwargs)
        return {"images_per_s": 9000.0, "accuracy": 0.97, "elapsed_s": 40.0, "device": "GPU"}

    doc = smoke.gpu_smoke(
        sys.executable, data=str(tmp_path / "mnist"), root=host["root"], libcuda=stubs["cuda"], bench=bench
    )
    assert doc["verdict"] == "OK", doc["explanation"]
    assert calls == [
        {"device": "GPU", "data": str(tmp_path / "mnist"), "quick": True, "timeout_s": 600.0, "python": sys.executable}
    ]
    assert doc["steps"]["bench"]["images_per_s"] == 9000.0 and doc["steps"]["bench"]["seconds"] == 40.0
    assert "benchmark 9000.0 images/s" in doc["explanation"]
    assert doc["jit"]["cache_works"] is True


def test_jit_summary_says_when_the_cache_did_not_serve():
    summary = smoke.jit_summary({"seconds": 300.0, "gpu_seconds": 290.0}, {"seconds": 295.0, "gpu_seconds": 285.0})
    assert summary["cache_works"] is False and summary["ratio"] == 1.02
    quick = smoke.jit_summary({"seconds": 6.0, "gpu_seconds": 1.0}, {"seconds": 6.0, "gpu_seconds": 1.0})
    assert quick["cache_works"] is True and "little or nothing to JIT-compile" in quick["note"]


def test_gpu_smoke_stops_on_a_gpu_the_stack_cannot_run_on(host, stubs, tmp_path):
    """The stack's GPU code (--gpu-code) against the compute capability the probe read: cuDNN 8.0.5 has nothing for
    Hopper, so the smoke test ends after the probe, before minutes of warm-up."""
    gpu_code = [
        {
            "name": "cuDNN",
            "version": "8.0.5",
            "code": {"min": "3.5", "max": "8.6", "above_max": "same_major", "source": "NVIDIA cuDNN 8.0.5"},
        }
    ]
    out = tmp_path / "gpu-smoke.json"
    args = ("--libcuda", stubs["cuda"], "--libnvml", stubs["nvml"], "--gpu-code", json.dumps(gpu_code))
    result = run_smoke(
        "ok", host, out, *args, "--stack", "ms1.5", "--host", "gpu7", STUB_CUDA_DEVICES="NVIDIA H100 PCIe:9.0:81559"
    )
    assert result.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "GPU_UNSUPPORTED"
    assert doc["explanation"].startswith(
        "the stack cannot run on this host's GPUs: gpu7: stack ms1.5 cannot run on GPU NVIDIA H100 PCIe (CC 9.0) at "
        "device 0"
    )
    assert doc["compute"]["state"] == "checked" and doc["compute"]["runs"] is False
    for name in ("warmup_first", "warmup_second", "judge", "bench"):
        assert doc["steps"][name]["status"] == "skipped"
    # The same stack on a GPU it runs on goes on (and the judge gets the GPU code too).
    result = run_smoke("ok", host, out, *args, STUB_CUDA_DEVICES=RTX3090)
    doc = json.loads(out.read_text())
    assert doc["compute"]["runs"] is True and doc["steps"]["warmup_first"]["status"] == "ran"
    assert doc["steps"]["judge"]["document"]["compute"]["state"] == "checked"
