"""The fleet report: Markdown, one self-contained HTML file, summary.json; hostile input escaped."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

HOSTILE = '<script>alert("x")</script><img src=http://evil.example/x.png>'


def bench(images_per_s: float, seed: float) -> dict:
    return {
        "device": "GPU",
        "quick": False,
        "images_per_s": images_per_s,
        "accuracy": 0.9812,
        "ratio": round(images_per_s / seed, 3),
        "seed": {"images_per_s": seed, "accuracy": 0.97, "elapsed_s": 80.0},
        "step_time_ms": {"p50": 1.25, "p95": 2.5},
        "loss_curve": [[1, 2.30], [1000, 2.1], [2000, 0.5], [5625, 0.05]],
        "epochs": [{"epoch": 1, "seconds": 9.0, "images_per_s": 6600.0, "loss_first": 2.3, "loss_last": 2.1}],
    }


def judge(verdict: str, explanation: str) -> dict:
    return {"verdict": verdict, "explanation": explanation, "hint": "Do <this> & that.", "mindspore_version": "1.5.1"}


def write_inputs(folder: Path) -> None:
    folder.mkdir()
    results = {
        "gpu01": {"host": "gpu01", "stack": {"name": "ms1.5-cuda11.1"}, "judge": judge("OK", "all good"),
                  "bench": bench(25000.0, 9000.0)},
        "hostile": {"host": HOSTILE, "stack": {}, "judge": judge("NO_GPU", "no <b>GPU</b> | here"),
                    "bench": bench(7000.0, 3500.0)},
        "gpu03": {"host": "gpu03", "stack": None, "judge": None, "bench": None},
    }
    for name, result in results.items():
        (folder / f"{name}.json").write_text(json.dumps(result))


def run_report(tmp_path: Path) -> subprocess.CompletedProcess:
    write_inputs(tmp_path / "in")
    command = [sys.executable, "-m", "msgpu_verify", "report", "--input", str(tmp_path / "in"),
               "--out", str(tmp_path / "out"), "--title", "Fleet <check>"]
    env = {"PYTHONPATH": str(ROOT / "verify"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_report_files_and_table(tmp_path):
    result = run_report(tmp_path)
    assert result.returncode == 0, result.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| gpu01 | OK | all good | 25,000.0 | 98.12 % | 2.78 | 1.25 / 2.50 |" in md
    assert "| gpu03 | MISSING |" in md
    assert "no <b>GPU</b> \\| here" in md  # the pipe cannot break the table
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdicts"] == {"OK": 1, "NO_GPU": 1, "MISSING": 1}
    assert {row["host"] for row in summary["hosts"]} == {"gpu01", "gpu03", HOSTILE}


def test_html_is_self_contained_and_escaped(tmp_path):
    assert run_report(tmp_path).returncode == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    # No tag refers to anything outside the file (the hostile name's URL only appears as escaped text).
    tags = re.findall(r"<[^>]*>", page)
    assert tags
    for tag in tags:
        assert not re.search(r"\b(src|href|xmlns|action)\s*=|https?:|url\(", tag, re.IGNORECASE), tag
    assert "url(" not in page and "@import" not in page
    assert "<img" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "Fleet &lt;check&gt;" in page
    assert "no &lt;b&gt;GPU&lt;/b&gt;" in page
    # Two inline SVG charts: loss curves (one polyline per host with a curve) and images/s bars.
    assert page.count("<svg") == 2
    assert page.count("<polyline") == 2
    assert "25,000" in page


# --- the benchmark numbers the report shows (bench.py's pure parts; training itself needs MindSpore) ---


def test_headline_is_the_median_of_epochs_after_the_first():
    sys.path.insert(0, str(ROOT / "verify"))
    from msgpu_verify import bench

    epochs = [{"epoch": 1, "images_per_s": 100.0}, {"epoch": 2, "images_per_s": 300.0},
              {"epoch": 3, "images_per_s": 500.0}, {"epoch": 4, "images_per_s": 400.0}]
    assert bench.headline(epochs) == 400.0
    assert bench.headline(epochs[:1]) == 100.0
    assert bench.headline([]) is None
    assert bench.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert bench.percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    assert bench.sink_chunk(1875) == 125 and bench.sink_chunk(400) == 100 and bench.sink_chunk(1873) == 1873
    assert bench.effective_sink("auto", "GPU")[0] is True
    assert bench.effective_sink("off", "GPU")[0] is False
    assert bench.effective_sink("on", "CPU")[0] is False


def test_bench_cli_reports_a_data_problem_as_json(tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "msgpu_verify", "bench", "--data", str(tmp_path / "nothing"), "--quick",
               "--json", str(out)]
    env = {"PYTHONPATH": str(ROOT / "verify"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert "neither a folder nor" in json.loads(out.read_text())["error"]


def test_a_judge_left_out_on_purpose_is_not_run_not_missing():
    sys.path.insert(0, str(ROOT / "verify"))
    from msgpu_verify import report

    row = report.host_row(
        {"host": "gpu04", "requested": {"judge": False, "bench": True}, "judge": None, "bench": bench(7000.0, 3500.0)}
    )
    assert row["verdict"] == "NOT_RUN" and row["explanation"] == "judge not run (verify_judge: false)"
    assert row["images_per_s"] == 7000.0
    failed = report.host_row({"host": "gpu05", "requested": {"judge": True, "bench": True}, "judge": None})
    assert failed["verdict"] == "MISSING"
