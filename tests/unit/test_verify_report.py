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
        "gpu01": {
            "host": "gpu01",
            "stack": {"name": "ms1.5-cuda11.1"},
            "judge": judge("OK", "all good"),
            "bench": bench(25000.0, 9000.0),
        },
        "hostile": {
            "host": HOSTILE,
            "stack": {},
            "judge": judge("NO_GPU", "no <b>GPU</b> | here"),
            "bench": bench(7000.0, 3500.0),
        },
        "gpu03": {"host": "gpu03", "stack": None, "judge": None, "bench": None},
    }
    for name, result in results.items():
        (folder / f"{name}.json").write_text(json.dumps(result))


def run_report(tmp_path: Path) -> subprocess.CompletedProcess:
    write_inputs(tmp_path / "in")
    command = [
        sys.executable,
        "-m",
        "msgpu_verify",
        "report",
        "--input",
        str(tmp_path / "in"),
        "--out",
        str(tmp_path / "out"),
        "--title",
        "Fleet <check>",
    ]
    env = {"PYTHONPATH": str(ROOT / "verify"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_report_files_and_table(tmp_path):
    result = run_report(tmp_path)
    assert result.returncode == 0, result.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| gpu01 | OK | all good | - | 25,000.0 | 98.12 % | 2.78 | 1.25 / 2.50 |" in md
    assert "| gpu03 | MISSING |" in md
    assert "no <b>GPU</b> \\| here" in md  # the pipe cannot break the table
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdicts"] == {"OK": 1, "NO_GPU": 1, "MISSING": 1}
    assert {row["host"] for row in summary["hosts"]} == {"gpu01", "gpu03", HOSTILE}


def test_the_warm_up_has_its_own_column(tmp_path):
    """msgpu_verify.warmup's time apart from the judge's: seconds, cached, skipped with the reason; a warm-up that
    hung (the judge is not run after it) is the host's verdict in its own words."""
    from msgpu_verify import report

    folder = tmp_path / "in"
    folder.mkdir()
    warm = {"verdict": "OK", "seconds": 312.4, "explanation": "warmed"}
    cached = {"verdict": "CACHED", "cached_from": {"seconds": 298.0, "warmed_at": "2026-12-01 10:00 UTC"}}
    skipped = {"verdict": "SKIPPED", "explanation": "no GPU on this host (stack_no_gpu: true): nothing to compile"}
    hang = {
        "verdict": "HANG",
        "explanation": "First-run kernel compilation (the CUDA driver JIT-compiling MindSpore's PTX for this GPU) "
        "did not finish within 1800 s (last stage: begin run_check).",
        "hint": "Run `python -m msgpu_verify warmup --timeout 3600` once",
    }
    for name, warmup, judged in (
        ("gpu01", warm, judge("OK", "all good")),
        ("gpu02", cached, judge("OK", "all good")),
        ("cpu01", skipped, judge("NO_GPU", "no GPU")),
        ("gpu04", hang, None),
    ):
        record = {"host": name, "warmup": warmup, "judge": judged, "bench": bench(20000.0, 9000.0) if judged else None}
        (folder / f"{name}.json").write_text(json.dumps(record))
    report.write_report(folder, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| warm-up (first CUDA context) |" in md
    assert "| gpu01 | OK | all good | 312.4 s |" in md
    assert "| gpu02 | OK | all good | cached (298.0 s on 2026-12-01 10:00 UTC) |" in md
    assert "| skipped: no GPU on this host (stack_no_gpu: true): nothing to compile |" in md
    assert "| gpu04 | HANG | First-run kernel compilation (the CUDA driver JIT-compiling" in md
    assert "- **gpu04** (HANG): Run `python -m msgpu_verify warmup --timeout 3600` once" in md
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<th>warm-up (first CUDA context)</th>" in page and "<td>312.4 s</td>" in page
    rows = {row["host"]: row for row in json.loads((tmp_path / "out" / "summary.json").read_text())["hosts"]}
    assert rows["gpu01"]["warmup_s"] == 312.4 and rows["gpu01"]["warmup_verdict"] == "OK"
    assert rows["gpu02"]["warmup_s"] is None and rows["gpu02"]["warmup_verdict"] == "CACHED"
    assert rows["gpu04"]["verdict"] == "HANG" and not rows["gpu04"]["passed"]


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
    from msgpu_verify import bench

    epochs = [
        {"epoch": 1, "images_per_s": 100.0},
        {"epoch": 2, "images_per_s": 300.0},
        {"epoch": 3, "images_per_s": 500.0},
        {"epoch": 4, "images_per_s": 400.0},
    ]
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
    command = [
        sys.executable,
        "-m",
        "msgpu_verify",
        "bench",
        "--data",
        str(tmp_path / "nothing"),
        "--quick",
        "--json",
        str(out),
    ]
    env = {"PYTHONPATH": str(ROOT / "verify"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert "neither a folder nor" in json.loads(out.read_text())["error"]


def test_a_judge_left_out_on_purpose_is_not_run_not_missing():
    from msgpu_verify import report

    row = report.host_row(
        {"host": "gpu04", "requested": {"judge": False, "bench": True}, "judge": None, "bench": bench(7000.0, 3500.0)}
    )
    assert row["verdict"] == "NOT_RUN" and row["explanation"] == "judge not run (verify_judge: false)"
    assert row["images_per_s"] == 7000.0
    failed = report.host_row({"host": "gpu05", "requested": {"judge": True, "bench": True}, "judge": None})
    assert failed["verdict"] == "MISSING"


# --- the fleet section: hosts compared, the data-parallel check and the MPI smoke test ---


def write_fleet(root: Path) -> Path:
    """Four hosts: two healthy, gpu03 slow (55 % of the median), gpu04 failed; plus the fleet-wide results."""
    hosts = root / "hosts"
    hosts.mkdir(parents=True)
    results = {
        "gpu01": {"judge": judge("OK", "all good"), "bench": bench(20000.0, 9000.0)},
        "gpu02": {"judge": judge("OK", "all good"), "bench": bench(21000.0, 9000.0)},
        "gpu03": {"judge": judge("OK", "all good"), "bench": bench(11000.0, 9000.0)},
        "gpu04": {"judge": judge("LIBRARY_MISSING", "libcudnn.so.8 is missing"), "bench": None},
    }
    for name, result in results.items():
        result.update(host=name, stack={"name": "ms1.5-cuda11.1"}, requested={"judge": True, "bench": True})
        result["judge"]["accept"] = []
        (hosts / f"{name}.json").write_text(json.dumps(result))
    distributed = {
        "verdict": "ONE_GPU_BUSY",
        "explanation": "ranks 0, 1 all used GPU 0 of gpu01. Each rank must drive its own GPU: CUDA_VISIBLE_DEVICES",
        "hint": "Give each rank its own GPU <local rank>.",
        "np": 2,
        "hosts_used": ["gpu01"],
        "gpus_used": 1,
        "ranks": [
            {
                "rank": 0,
                "host": "gpu01",
                "gpu": "0",
                "steps": 3000,
                "images_per_s": 9000.0,
                "loss_first": 2.30,
                "loss_final": 0.2,
            },
            {
                "rank": 1,
                "host": "gpu01",
                "gpu": "0",
                "steps": 3000,
                "images_per_s": 8000.0,
                "loss_first": 2.30,
                "loss_final": 0.21,
            },
        ],
    }
    (root / "distributed.json").write_text(json.dumps(distributed))
    smoke = {"hosts": ["gpu01", "gpu02", "gpu03", "gpu04"], "ranks": 4, "sum": 6, "seconds": 1.7, "ok": True}
    (root / "mpi_smoke.json").write_text(json.dumps(smoke))
    return hosts


def run_fleet_report(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    hosts = write_fleet(tmp_path / "verify")
    command = [
        sys.executable,
        "-m",
        "msgpu_verify",
        "report",
        "--input",
        str(hosts),
        "--out",
        str(tmp_path / "verify"),
        *extra,
    ]
    env = {"PYTHONPATH": str(ROOT / "verify"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_fleet_summary_flags_the_slow_and_the_failed_host(tmp_path):
    result = run_fleet_report(tmp_path)
    assert result.returncode == 0, result.stderr
    fleet = json.loads((tmp_path / "verify" / "summary.json").read_text())["fleet"]
    assert fleet["hosts"] == 4 and fleet["ok"] == 2 and fleet["not_ok"] == 2
    assert fleet["failed"] == ["gpu04"] and fleet["slow"] == ["gpu03"]
    assert fleet["median_images_per_s"] == {"GPU": 20000.0}  # median of 20000, 21000, 11000
    table = fleet["table"]
    assert [(e["host"], e["status"]) for e in table] == [
        ("gpu04", "FAILED"),
        ("gpu03", "SLOW"),
        ("gpu01", "OK"),
        ("gpu02", "OK"),
    ]
    assert table[0]["reason"] == "LIBRARY_MISSING: libcudnn.so.8 is missing"
    assert table[1]["percent_of_median"] == 55.0
    assert "55 % of the fleet median 20,000.0 (GPU), below 80 %" in table[1]["reason"]
    assert table[3]["percent_of_median"] == 105.0
    assert fleet["distributed"]["verdict"] == "ONE_GPU_BUSY"
    assert [r["gpu"] for r in fleet["distributed"]["ranks"]] == ["0", "0"]
    assert fleet["mpi_smoke"]["ok"] is True and fleet["mpi_smoke"]["sum"] == 6
    # the fleet files next to hosts/ are not hosts themselves
    summary = json.loads((tmp_path / "verify" / "summary.json").read_text())
    assert sorted(row["host"] for row in summary["hosts"]) == ["gpu01", "gpu02", "gpu03", "gpu04"]


def test_slow_threshold_is_configurable_and_checked(tmp_path):
    assert run_fleet_report(tmp_path, "--slow-below", "0.5").returncode == 0
    fleet = json.loads((tmp_path / "verify" / "summary.json").read_text())["fleet"]
    assert fleet["slow"] == [] and fleet["slow_below"] == 0.5
    bad = run_fleet_report(tmp_path / "again", "--slow-below", "80")
    assert bad.returncode == 2
    assert "--slow-below '80': allowed is a fraction of the median, 0 < x <= 1" in bad.stderr


def test_fleet_section_leads_the_markdown(tmp_path):
    assert run_fleet_report(tmp_path).returncode == 0
    md = (tmp_path / "verify" / "report.md").read_text()
    assert md.index("## Fleet") < md.index("## Data-parallel") < md.index("## MPI smoke") < md.index("## Hosts")
    assert "**2 of 4 host(s) OK**, 1 FAILED, 1 SLOW (below 80 % of the median)" in md
    fleet_rows = [
        line
        for line in md[md.index("## Fleet") : md.index("## Data-parallel")].splitlines()
        if line.startswith("| gpu")
    ]
    assert fleet_rows[0].startswith("| gpu04 | **FAILED** | - | - | LIBRARY_MISSING: libcudnn.so.8 is missing |")
    assert fleet_rows[1].startswith("| gpu03 | **SLOW** | 11,000.0 | 55.0 % |")
    assert fleet_rows[2] == "| gpu01 | **OK** | 20,000.0 | 100.0 % |  |"
    assert "**ONE_GPU_BUSY**: ranks 0, 1 all used GPU 0 of gpu01" in md
    assert "What to do: Give each rank its own GPU <local rank>." in md
    assert "| 1 | gpu01 | 0 | 3000 | 8,000.0 | 2.300 -> 0.210 |  |" in md
    assert "**OK**: 4 rank(s) on gpu01, gpu02, gpu03, gpu04, sum 6, 1.7 s" in md


def test_fleet_section_in_html_is_escaped_and_flags_hosts(tmp_path):
    assert run_fleet_report(tmp_path).returncode == 0
    page = (tmp_path / "verify" / "report.html").read_text()
    fleet = page[page.index("<h2>Fleet</h2>") : page.index("<h2>Data-parallel")]
    rows = re.findall(r'<tr class="(\w+)"><td>([^<]+)</td>', fleet)
    assert rows == [("failed", "gpu04"), ("slow", "gpu03"), ("ok", "gpu01"), ("ok", "gpu02")]
    assert ">FAILED</span>" in fleet and ">SLOW</span>" in fleet
    assert "55.0 %" in fleet and "width:36.7%" in fleet  # 55 % of the median on a 150 % scale
    assert "Give each rank its own GPU &lt;local rank&gt;." in page
    assert ">ONE_GPU_BUSY</span>" in page and ">OK</span> 4 rank(s) on gpu01, gpu02, gpu03, gpu04" in page
    assert "<script" not in page.lower() and page.count("<svg") == 2


def test_no_fleet_files_and_unreadable_ones(tmp_path):
    hosts = write_fleet(tmp_path / "verify")
    (tmp_path / "verify" / "distributed.json").unlink()
    (tmp_path / "verify" / "mpi_smoke.json").write_text("{not json")
    from msgpu_verify import report

    report.write_report(hosts, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["fleet"]["distributed"] is None
    assert summary["fleet"]["mpi_smoke"]["ok"] is False
    assert "mpi_smoke.json is unreadable" in summary["fleet"]["mpi_smoke"]["error"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Data-parallel" not in md and "**FAILED**: mpi_smoke.json is unreadable: " in md


def test_accepted_no_gpu_host_is_ok_in_the_fleet():
    from msgpu_verify import report

    sandbox = {
        "host": "sandbox",
        "judge": dict(judge("NO_GPU", "no GPU"), accept=["NO_GPU"]),
        "bench": dict(bench(900.0, 300.0), device="CPU"),
        "requested": {"judge": True, "bench": True},
    }
    strict = dict(sandbox, host="strict", judge=dict(judge("NO_GPU", "no GPU"), accept=[]))
    rows = [report.host_row(r) for r in (sandbox, strict)]
    fleet = report.fleet_summary(rows, [sandbox, strict], 0.8)
    assert [(e["host"], e["status"]) for e in fleet["table"]] == [("strict", "FAILED"), ("sandbox", "OK")]
    assert fleet["median_images_per_s"] == {"CPU": 900.0}


def test_the_judges_driver_probe_is_in_the_hosts_row(tmp_path):
    """The judge's driver probe (gpu_probe.py without MindSpore) in a few words after the explanation; old results
    without one keep their row as it was."""
    from msgpu_verify import report

    works = judge("NO_GPU", "no usable GPU. The driver runs a CUDA kernel on every GPU (4 x RTX 3090) ...")
    works["driver_probe"] = {"state": "ran", "verdict": "OK", "summary": "OK (4 x RTX 3090)"}
    skipped = judge("OK", "all good")
    skipped["driver_probe"] = {"state": "skipped", "verdict": None, "reason": "x", "summary": "skipped: x"}
    hung = judge("HANG", "stuck")
    hung["driver_probe"] = {"state": "timeout", "verdict": None, "reason": "the GPU probe did not finish within 60 s"}
    folder = tmp_path / "in"
    folder.mkdir()
    for name, document in (("gpu01", works), ("gpu02", skipped), ("gpu03", hung), ("gpu04", judge("OK", "old"))):
        (folder / f"{name}.json").write_text(json.dumps({"host": name, "judge": document, "bench": None}))
    report.write_report(folder, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [row["driver_probe"] for row in summary["hosts"]] == ["OK (4 x RTX 3090)", "skipped: x", "timeout", None]
    assert summary["hosts"][0]["verdict"] == "NO_GPU" and summary["hosts"][0]["explanation"] == works["explanation"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| gpu01 | NO_GPU | no usable GPU. The driver runs a CUDA kernel on every GPU (4 x RTX 3090) ... " in md
    assert "... (driver probe: OK (4 x RTX 3090)) | - |" in md
    assert "| gpu04 | OK | old | - |" in md
    html_text = (tmp_path / "out" / "report.html").read_text()
    assert "(driver probe: OK (4 x RTX 3090))" in html_text and "(driver probe: skipped: x)" in html_text


def test_the_feeder_alone_and_what_bound_the_run_are_in_the_hosts_row(tmp_path):
    """bench.json's feeder (one epoch of the training's own feeder, alone) and bound_by: a last column; results
    from before the feeder was measured show "-", an unknown bound_by is left out."""
    from msgpu_verify import report

    feeder = {"kind": "pre-batched GeneratorDataset (sink)", "images_per_s": 321139.0, "seconds": 0.19, "batches": 1875}
    slow = dict(feeder, images_per_s=62586.0)
    folder = tmp_path / "in"
    folder.mkdir()
    for name, extra in (
        ("gpu01", {"feeder": feeder, "bound_by": "training"}),
        ("gpu02", {"feeder": slow, "bound_by": "feeder"}),
        ("gpu03", {}),
        ("gpu04", {"feeder": slow, "bound_by": HOSTILE}),
    ):
        document = {"host": name, "judge": judge("OK", "all good"), "bench": dict(bench(40000.0, 9000.0), **extra)}
        (folder / f"{name}.json").write_text(json.dumps(document))
    report.write_report(folder, tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| p50 / p95 step ms | feeder images/s |" in md
    assert "| 1.25 / 2.50 | 321,139.0 (bound by: training) |" in md
    assert "| 1.25 / 2.50 | 62,586.0 (bound by: feeder) |" in md
    assert "| gpu03 | OK | all good | - | 40,000.0 | 98.12 % | 4.44 | 1.25 / 2.50 | - |" in md
    assert "| 1.25 / 2.50 | 62,586.0 |" in md
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<th>feeder images/s</th>" in page and '<td class="n">62,586.0 (bound by: feeder)</td>' in page
    assert "alert" not in page
    rows = {row["host"]: row for row in json.loads((tmp_path / "out" / "summary.json").read_text())["hosts"]}
    assert (rows["gpu02"]["feeder_images_per_s"], rows["gpu02"]["bound_by"]) == (62586.0, "feeder")
    assert rows["gpu02"]["feeder_kind"] == "pre-batched GeneratorDataset (sink)"
    assert (rows["gpu03"]["feeder_images_per_s"], rows["gpu03"]["bound_by"]) == (None, None)
    assert rows["gpu04"]["bound_by"] is None
