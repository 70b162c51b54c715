"""The Serving check's CPU steps on the default stack (`ms1.5-cuda11.1`), which has no MindSpore Serving.

`./toolkit test` runs this module against molecule default's converged host (MSGPU_VERIFY_INVENTORY; the default
stack: the real mindspore-gpu 1.5.1 in /home/msgpu/venvs/mindspore-1.5.1, no GPU, no mindspore_serving: its 1.5.0
wheel is only on the vendor's server). `playbooks/verify.yml` runs with `verify_serving: true` and the quick
benchmark (the judge and the data-parallel check have their own tests): the benchmark trains LeNet5 on the CPU and
saves the checkpoint, then `python -m msgpu_verify serving` in the venv exports it to MindIR with MindSpore 1.5.1,
deploys the split servable (servable_config.py + lenet5_pipeline.py) and runs the servable's own pre/post-processing
around the MindIR on real MNIST test images, and skips the steps that need Serving. The verdict is NOT_INSTALLED -
true, and it fails the host (only OK and NO_DEVICE pass) - with the CPU steps' result in its explanation and JSON.
The whole playbook takes about as long as the quick verify (the benchmark, ~30-80 s, dominates).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.system.test_verify import SHARED_CORES, host_results, run_verify

# In `./toolkit test --full` only (a second quick benchmark on the default host; testbed/scenarios.py:
# EXTENDED_MARKER).
pytestmark = pytest.mark.extended

ROOT = Path(__file__).resolve().parents[2]
CATALOG = yaml.safe_load((ROOT / "catalog" / "stacks.yml").read_text())
STACK = CATALOG["stacks"][CATALOG["default_stack"]]
SERVABLE = "/var/lib/msgpu/verify/servables/lenet5"  # <verify_remote_dir>/servables/lenet5 (roles/verify defaults)
MINDSPORE_USER = "msgpu"  # the mindspore role's default mindspore_user, who runs the checks


@pytest.fixture(scope="module")
def checked(inventory: Path, tmp_path_factory: pytest.TempPathFactory):
    results = tmp_path_factory.mktemp("serving-cpu-steps")
    proc, wall = run_verify(
        inventory,
        results,
        {
            "verify_quick": True,
            "verify_serving": True,
            "verify_judge": False,
            "verify_distributed": False,
            **SHARED_CORES,
        },
    )
    print(f"verify.yml --quick with the Serving check on the default stack: {wall:.1f} s wall")
    return results, proc, wall


def hosts_of(inventory: Path) -> list[str]:
    return list(yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_servers"]["hosts"])


def serving_docs(results: Path) -> dict[str, dict]:
    docs = {}
    for name, result in host_results(results).items():
        assert result.get("bench", {}).get("checkpoint"), f"{name}: the benchmark saved no checkpoint: {result}"
        assert isinstance(result.get("serving"), dict), f"{name}: no serving result: {result.get('serving')}"
        docs[name] = result["serving"]
    assert docs, f"no per-host results in {results}/hosts"
    return docs


def test_the_verdict_is_not_installed_and_fails_the_host_naming_the_cpu_steps(checked) -> None:
    results, proc, _ = checked
    # NOT_INSTALLED is not accepted (only OK and NO_DEVICE are): the last play fails the host, with the reason.
    assert proc.returncode != 0, proc.stdout[-4000:]
    said = " ".join(proc.stdout.split())  # the YAML result format folds long messages over lines
    assert "MindSpore Serving: NOT_INSTALLED - mindspore_serving is not installed" in said, proc.stdout[-4000:]
    for name, doc in serving_docs(results).items():
        assert (doc["verdict"], doc["failed_step"]) == ("NOT_INSTALLED", "import"), f"{name}: {doc['explanation']}"
        assert "stack_serving_enabled" in doc["explanation"]
        assert "the CPU steps (export, pipeline) passed" in doc["explanation"], doc["explanation"]
        assert doc["cpu_steps"] == {"export": "ok", "pipeline": "ok", "passed": True}, doc["steps"]
        assert doc["versions"]["mindspore"] == str(STACK["mindspore"]), doc["versions"]
        assert doc["mindspore_serving_version"] is None


def test_export_and_pipeline_ran_for_real_on_mindspore_1_5(checked) -> None:
    results, _, _ = checked
    for name, doc in serving_docs(results).items():
        steps = doc["steps"]
        assert steps["import"]["missing"] == "mindspore_serving", steps["import"]
        export, pipeline = steps["export"], steps["pipeline"]
        assert export["status"] == "ok" and export["bytes"] > 100_000, export  # LeNet5's MindIR: ~250 KB
        assert pipeline["status"] == "ok", pipeline
        assert pipeline["device"] == "CPU" and pipeline["images"] == doc["images"] == 100
        assert pipeline["accuracy"] >= 0.9 and doc["pipeline_accuracy"] == pipeline["accuracy"], pipeline
        assert pipeline["labels_match_bench"] is True
        # MindSpore 1.5.1's MnistDataset hands the benchmark binarized images (0/255), the servable gets the raw
        # grey levels: the tensors differ (measured ~3.1 at most), the accuracy does not suffer.
        assert isinstance(pipeline["preprocess_max_abs_diff_vs_bench"], float)
        for step in (export, pipeline):
            assert step["seconds"] < 120, f"{name}: {step}"
        print(
            f"{name}: export {export['seconds']} s, pipeline {pipeline['seconds']} s, accuracy {pipeline['accuracy']} "
            f"on {pipeline['images']} images, {pipeline['ms_per_image']} ms/image, preprocess max abs diff "
            f"{pipeline['preprocess_max_abs_diff_vs_bench']}; whole check {doc['elapsed_s']} s"
        )


def test_the_steps_that_need_serving_are_skipped_with_the_reason(checked) -> None:
    results, _, _ = checked
    for doc in serving_docs(results).values():
        for name in ("config", "server"):
            step = doc["steps"][name]
            assert step["status"] == "skipped" and "mindspore_serving" in step["reason"], step
        assert [note.split(":")[0] for note in doc["not_run"]] == ["config", "server"], doc["not_run"]
        assert doc["server_accuracy"] is None


def test_the_split_servable_is_deployed_for_the_check_user(checked, inventory: Path) -> None:
    for host in hosts_of(inventory):
        proc = subprocess.run(
            [
                "docker",
                "exec",
                host,
                "stat",
                "-c",
                "%n %U",
                f"{SERVABLE}/servable_config.py",
                f"{SERVABLE}/lenet5_pipeline.py",
                f"{SERVABLE}/1/lenet5.mindir",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert [line.split()[1] for line in proc.stdout.splitlines()] == [MINDSPORE_USER] * 3, proc.stdout


def test_the_report_shows_the_pipeline_accuracy(checked) -> None:
    results, _, _ = checked
    report = (results / "report.md").read_text()
    assert "NOT_INSTALLED" in report and "pipeline (CPU, no server)" in report
    rows = json.loads((results / "summary.json").read_text())["fleet"]["serving"]
    assert rows and all(r["verdict"] == "NOT_INSTALLED" and r["accuracy"] >= 0.9 for r in rows), rows
