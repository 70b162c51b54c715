"""`playbooks/verify.yml` (what `./toolkit verify` runs) against a fully provisioned sandbox host.

`./toolkit test` runs this module between molecule default's verify and destroy steps, with
MSGPU_VERIFY_INVENTORY naming an inventory of that container (Ubuntu 20.04, site.yml converged:
driver, CUDA, cuDNN, NCCL, OpenMPI, the real mindspore-gpu wheel; no GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


# The suite runs two stages at once on CI's 2 cores: beside a DKMS build the quick CPU benchmark, 20-40 s
# alone, took over its 75 s limit (verify_bench_timeout's quick default, meant for a host of its own), and on
# 2026-12-02 beside the preflight stage on a slower machine over 300 s. The tests give it room; how long it
# took is printed, a number, not a pass/fail line (speed goals are the benchmarks' business).
SHARED_CORES = {"verify_bench_timeout": 900}


def run_verify(inventory: Path, results: Path, extra_vars: dict) -> tuple[subprocess.CompletedProcess, float]:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }
    args = [
        "ansible-playbook",
        "-i",
        str(inventory),
        "playbooks/verify.yml",
        "-e",
        json.dumps({"verify_results_dir": str(results), **extra_vars}),
    ]
    started = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    return proc, time.monotonic() - started


def host_results(results: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((results / "hosts").glob("*.json"))}


@pytest.fixture(scope="module")
def quick(inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess, float]:
    results = tmp_path_factory.mktemp("verify-quick")
    proc, wall = run_verify(inventory, results, {"verify_quick": True, **SHARED_CORES})
    print(f"verify --quick: {wall:.1f} s wall (whole playbook)")
    return results, proc, wall


def test_quick_verify_succeeds_accepting_no_gpu(quick) -> None:
    results, proc, _ = quick
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    hosts = host_results(results)
    assert hosts, f"no per-host results in {results}/hosts"
    for name, result in hosts.items():
        judge = result["judge"]
        assert judge["verdict"] == "NO_GPU", f"{name}: a host without a GPU must be judged NO_GPU, got {judge}"
        assert judge["run_check"]["said_ok"] is False
        assert judge["elapsed_s"] < judge["timeout_s"]


def test_the_driver_probe_finds_no_device_through_the_real_libcuda(quick) -> None:
    """The framework-free probe (msgpu_verify.gpu_probe) ran in the judge's child against the real libcuda of
    Ubuntu's NVIDIA 470 packages, which answers cuInit with CUDA_ERROR_NO_DEVICE (100) in a GPU-less container,
    and the judge's explanation says the driver agrees."""
    results, _, _ = quick
    for name, result in host_results(results).items():
        judge = result["judge"]
        probe = judge["driver_probe"]
        assert probe["state"] == "ran" and probe["verdict"] == "NO_DEVICE", f"{name}: {probe}"
        assert "CUDA_ERROR_NO_DEVICE" in probe["reason"], f"{name}: {probe}"
        assert "agrees there is no usable GPU" in judge["explanation"], f"{name}: {judge['explanation']}"


def test_quick_benchmark_trains_for_real_on_cpu(quick) -> None:
    results, _, _ = quick
    for name, result in host_results(results).items():
        bench = result["bench"]
        assert bench["device"] == "CPU" and bench["quick"] is True, name
        assert bench["images_per_s"] > 0
        # The training's own feeder, one epoch alone, and which of the two bound the run.
        assert bench["feeder"]["images_per_s"] > 0 and bench["feeder"]["batches"] > 0, bench["feeder"]
        assert bench["bound_by"] in ("feeder", "training"), bench["bound_by"]
        # A short run on a subset still learns MNIST far beyond chance (0.1).
        assert bench["accuracy"] > 0.8, f"{name}: accuracy {bench['accuracy']}"
        assert len(bench["loss_curve"]) >= 2
        assert bench["loss_curve"][-1][1] < bench["loss_curve"][0][1]


def test_quick_run_time_is_measured_and_within_its_limits(quick) -> None:
    results, _, _ = quick
    for name, result in host_results(results).items():
        judge, bench = result["judge"], result["bench"]
        print(f"{name}: judge {judge['elapsed_s']:.1f} s + quick benchmark {bench['elapsed_s']:.1f} s (alone: 20-40 s)")
        assert judge["elapsed_s"] < judge["timeout_s"] and bench["elapsed_s"] < bench["timeout_s"], (judge, bench)


def test_report_is_one_self_contained_page(quick) -> None:
    results, _, _ = quick
    html = (results / "report.html").read_text()
    markdown = (results / "report.md").read_text()
    for name in host_results(results):
        assert name in html and name in markdown
    assert "NO_GPU" in html and "NO_GPU" in markdown
    assert "<svg" in html
    assert 'src="http' not in html and 'href="http' not in html and "<script src" not in html
    assert json.loads((results / "summary.json").read_text())


def test_no_gpu_fails_the_host_when_not_accepted(inventory: Path, tmp_path: Path) -> None:
    """The judge is not a rubber stamp: without the sandbox's NO_GPU allowance the host fails,
    and the report still says why."""
    proc, _ = run_verify(inventory, tmp_path, {"verify_accept": [], "verify_bench": False})
    assert proc.returncode != 0
    assert "NO_GPU" in proc.stdout
    hosts = host_results(tmp_path)
    assert hosts and all(r["judge"]["verdict"] == "NO_GPU" for r in hosts.values())
    assert "NO_GPU" in (tmp_path / "report.md").read_text()
