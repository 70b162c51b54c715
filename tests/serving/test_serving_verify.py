"""playbooks/verify.yml with MindSpore Serving on the serving host: the quick benchmark trains LeNet5 for
real (CPU), `msgpu_verify serving` exports it to MindIR, deploys the `lenet5` servable, validates its
config, runs the servable's own pipeline on real MNIST test images, and tries the server, which Serving
refuses on a host without a GPU: the verdict must be NO_DEVICE, with Serving's own message, and the
report must say what could not run. MNIST reaches the host through the controller's cache (the verify
role fills it from the catalog's MNIST sources in order; here `stack_sources.mnist` points the first at
the repository's own copy, data/mnist, as a file:// URL, as a site's mirror would be).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.serving.conftest import ROOT, ServingHost

MNIST = ROOT / "data" / "mnist"
SERVABLE = "/var/lib/msgpu/verify/servables/lenet5"


@pytest.fixture(scope="module")
def verified(serving_host: ServingHost, tmp_path_factory: pytest.TempPathFactory):
    results = tmp_path_factory.mktemp("serving-verify")
    # The repository's copy of MNIST as the first source (a site's mirror would be an http(s) URL).
    sources = {"mnist": MNIST.as_uri()}
    started = time.monotonic()
    run = serving_host.playbook(
        playbook="verify.yml",
        extra_vars={
            "verify_quick": True,
            "verify_results_dir": str(results),
            # The judge needs the NVIDIA stack (tests/system covers it); MPI is not installed here.
            "verify_judge": False,
            "verify_distributed": False,
            "stack_sources": sources,
        },
    )
    print(f"verify.yml with Serving (quick): {time.monotonic() - started:.1f} s")
    document = json.loads((results / "hosts" / f"{serving_host.name}.json").read_text())
    return run, document, results


def test_verify_passes_with_serving_judged_no_device(verified, serving_host: ServingHost):
    run, document, _ = verified
    assert run.rc == 0, run.output[-6000:]
    serving = document["serving"]
    assert serving["verdict"] == "NO_DEVICE", serving
    assert serving["failed_step"] is None
    # Serving's own refusal is recorded: its MindSpore backend runs MindIR on GPU/Ascend only.
    refusal = serving["steps"]["server"]["refusal"]
    assert "device type" in refusal.lower(), refusal
    assert any("MindSpore Lite" in note for note in serving["not_run"]), serving["not_run"]


def test_every_step_that_needs_no_device_passed(verified):
    _, document, _ = verified
    steps = document["serving"]["steps"]
    assert [steps[n]["status"] for n in ("import", "export", "config", "pipeline")] == ["ok"] * 4, steps
    assert steps["server"]["status"] == "refused"


def test_the_servable_answers_real_mnist_like_the_trained_model(verified):
    _, document, _ = verified
    serving, bench = document["serving"], document["bench"]
    # The servable's pre-processing, the exported MindIR and its post-processing, on real test images:
    # the digits must match the labels about as well as the benchmark's own evaluation.
    assert serving["pipeline_accuracy"] >= 0.9, serving["steps"]["pipeline"]
    assert bench["accuracy"] >= 0.9 and abs(serving["pipeline_accuracy"] - bench["accuracy"]) < 0.05


def test_the_servable_is_deployed_on_the_host(verified, serving_host: ServingHost):
    result = serving_host.sh(
        f"test -s {SERVABLE}/1/lenet5.mindir && grep -c 'def predict_digit' {SERVABLE}/servable_config.py"
        f" && stat -c '%U' {SERVABLE}/1/lenet5.mindir"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "msgpu"]


def test_versions_are_the_catalogs(verified, serving_host: ServingHost):
    from tests.serving.conftest import STACK

    _, document, _ = verified
    versions = document["serving"]["versions"]
    assert versions.get("mindspore_serving") == str(STACK["serving"]), versions
    assert versions.get("mindspore") == str(STACK["mindspore"]), versions


def test_the_report_has_a_serving_section(verified):
    _, _, results = verified
    report = (results / "report.md").read_text()
    assert "Serving" in report and "NO_DEVICE" in report
    summary = json.loads((results / "summary.json").read_text())
    assert summary["fleet"]["serving"], summary["fleet"]


def test_mnist_came_through_the_controllers_cache(verified, serving_host: ServingHost):
    from tests.serving.conftest import ARTIFACT_CACHE

    cached = sorted(p.name for p in (Path(ARTIFACT_CACHE) / "mnist").iterdir())
    assert set(cached) >= {"train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}, cached
    copied = serving_host.sh("ls /var/lib/msgpu/verify/data/source")
    assert copied.returncode == 0, copied.stderr
    assert set(cached) <= set(copied.stdout.split())
