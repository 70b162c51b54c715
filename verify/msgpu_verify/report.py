"""Fleet report over host result files: report.md, one self-contained report.html, summary.json.

A host result file is ``{"host": NAME, "stack": {...}, "warmup": <warm-up JSON>, "judge": <judge JSON>, "bench":
<bench JSON>}``; any of them may be missing or null (a host that failed). The warm-up (the first CUDA context and the
driver's JIT compilation of MindSpore's kernels, msgpu_verify.warmup) has its own column. On top, the fleet
section compares the hosts: how many are OK, the fleet's median images/s (per training device), each host as a
share of it; hosts that failed or run below ``slow_below`` of the median come first, with the reason. Then the
data-parallel check (``distributed.json``, msgpu_verify.distributed) and the MPI smoke test
(``mpi_smoke.json``: hosts, ranks, sum, seconds, ok) when the results folder has them, and the MindSpore
Serving check (msgpu_verify.serving) of every host whose result has a "serving" entry. Standard
library only: runs on the controller. Every value taken from the JSON is HTML-escaped; the HTML has no
scripts and no external references (inline CSS, inline SVG drawn here).
"""

from __future__ import annotations

import datetime
import html
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
VERDICT_COLOURS = {
    "OK": "#2ca02c",
    "NO_GPU": "#ff7f0e",
    "NO_DEVICE": "#ff7f0e",
    "HANG": "#9467bd",
    "NOT_RUN": "#7f7f7f",
}
STATUS_COLOURS = {"OK": "#2ca02c", "SLOW": "#ff7f0e", "FAILED": "#d62728"}
# Fleet-wide results that may sit in the results folder (or next to the host files): never a host.
FLEET_FILES = {"distributed": "distributed.json", "mpi_smoke": "mpi_smoke.json"}


def load_results(folder: Path) -> List[Dict[str, Any]]:
    """Every host's *.json under ``folder``; unreadable files become a host row that says so."""
    results: List[Dict[str, Any]] = []
    for path in sorted(folder.glob("*.json")):
        if path.name in FLEET_FILES.values():
            continue
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            data = {"host": path.stem, "judge": None, "bench": None, "error": f"unreadable result: {exc}"}
        data.setdefault("host", path.stem)
        results.append(data)
    return results


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def warmup_text(document: Any) -> str:
    """The warm-up (msgpu_verify.warmup) in a few words: "312.4 s", "cached (...)", "skipped: <reason>"."""
    if not isinstance(document, dict) or not document.get("verdict"):
        return "-"
    verdict = document["verdict"]
    if verdict == "OK":
        return f"{document.get('seconds')} s"
    if verdict == "CACHED":
        before = document.get("cached_from") or {}
        return f"cached ({before.get('seconds')} s on {before.get('warmed_at')})"
    if verdict == "SKIPPED":
        return "skipped: " + str(document.get("explanation") or "")
    return f"{verdict}: {document.get('explanation') or ''}"


def driver_probe_text(document: Any) -> Optional[str]:
    """The judge's driver probe (msgpu_verify.gpu_probe without MindSpore) in a few words, e.g. "OK (4 x NVIDIA
    GeForce RTX 3090)", "NO_DEVICE", "skipped: <reason>"; None when the judge has none (older results, no judge)."""
    if not isinstance(document, dict) or not document.get("state"):
        return None
    return str(document.get("summary") or document.get("verdict") or document["state"])


def _explanation_cell(row: Dict[str, Any]) -> str:
    probe = row.get("driver_probe")
    return f"{row['explanation']} (driver probe: {probe})" if probe else str(row["explanation"])


def host_row(result: Dict[str, Any]) -> Dict[str, Any]:
    judge = result.get("judge") or {}
    warmup = result.get("warmup") if isinstance(result.get("warmup"), dict) else {}
    # A warm-up that hung stops the host before the judge (it would hang as well): its words are the verdict.
    if not judge and warmup.get("verdict") == "HANG":
        judge = {k: warmup.get(k) for k in ("verdict", "explanation", "hint")}
    bench = result.get("bench") or {}
    steps = bench.get("step_time_ms") or {}
    seed = bench.get("seed") or {}
    feeder = bench.get("feeder") if isinstance(bench.get("feeder"), dict) else {}
    # A judge left out on purpose (verify_judge: false, as `./toolkit bench` does) is not a failure.
    skipped = not judge and (result.get("requested") or {}).get("judge") is False
    if skipped:
        explanation = "judge not run (verify_judge: false)"
    else:
        explanation = judge.get("explanation") or result.get("error") or "no judge result (the host failed earlier)"
    if bench.get("error"):
        explanation += " Benchmark: " + str(bench["error"])
    verdict = judge.get("verdict") or ("NOT_RUN" if skipped else "MISSING")
    bench_requested = (result.get("requested") or {}).get("bench") is not False
    accepted = (
        verdict == "OK" or verdict in (judge.get("accept") or []) or (skipped and (bool(bench) or not bench_requested))
    )
    return {
        "host": str(result.get("host")),
        "stack": (result.get("stack") or {}).get("name") if isinstance(result.get("stack"), dict) else None,
        "verdict": verdict,
        "passed": bool(accepted and not bench.get("error") and not result.get("error")),
        "explanation": explanation,
        "hint": judge.get("hint"),
        "device": bench.get("device") or judge.get("device"),
        "images_per_s": _num(bench.get("images_per_s")),
        "accuracy": _num(bench.get("accuracy")),
        "seed_images_per_s": _num(seed.get("images_per_s")),
        "seed_accuracy": _num(seed.get("accuracy")),
        "ratio": _num(bench.get("ratio")),
        "feeder_images_per_s": _num(feeder.get("images_per_s")),
        "feeder_kind": feeder.get("kind"),
        "bound_by": bench.get("bound_by") if bench.get("bound_by") in ("feeder", "training") else None,
        "p50_ms": _num(steps.get("p50")),
        "p95_ms": _num(steps.get("p95")),
        "quick": bool(bench.get("quick")),
        "mindspore_version": judge.get("mindspore_version") or bench.get("mindspore_version"),
        "warmup": warmup_text(warmup) if warmup else "-",
        "warmup_verdict": warmup.get("verdict"),
        "warmup_s": _num(warmup.get("seconds")) if warmup.get("verdict") == "OK" else None,
        "driver_probe": driver_probe_text(judge.get("driver_probe")),
    }


def _fmt(value: Optional[float], digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "-"
    if percent:
        return f"{value * 100:.2f} %"
    return f"{value:,.{digits}f}"


def feeder_text(row: Dict[str, Any]) -> str:
    """The bench's feeder alone (one epoch, no training) and which of the two bound the run."""
    if row.get("feeder_images_per_s") is None:
        return "-"
    bound = f" (bound by: {row['bound_by']})" if row.get("bound_by") else ""
    return _fmt(row["feeder_images_per_s"]) + bound


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _failure_reason(row: Dict[str, Any], result: Dict[str, Any]) -> Optional[str]:
    bench = result.get("bench") or {}
    if not row["passed"]:
        return f"{row['verdict']}: {row['explanation']}"
    if (result.get("requested") or {}).get("bench") and not bench:
        return "no benchmark result (the LeNet5 run did not report)"
    return None


def fleet_summary(rows: List[Dict[str, Any]], results: List[Dict[str, Any]], slow_below: float) -> Dict[str, Any]:
    """Hosts compared: OK / FAILED / SLOW (below ``slow_below`` of the median images/s of their device)."""
    by_device: Dict[str, List[float]] = {}
    for row in rows:
        if row["images_per_s"] is not None:
            by_device.setdefault(str(row["device"] or "?"), []).append(row["images_per_s"])
    medians = {device: round(statistics.median(values), 1) for device, values in sorted(by_device.items())}
    table: List[Dict[str, Any]] = []
    for index, (row, result) in enumerate(zip(rows, results)):
        median = medians.get(str(row["device"] or "?"))
        share = row["images_per_s"] / median if row["images_per_s"] is not None and median else None
        reason = _failure_reason(row, result)
        status = "FAILED" if reason else "OK"
        if not reason and share is not None and share < slow_below:
            status = "SLOW"
            reason = (
                f"{row['images_per_s']:,.1f} images/s is {share * 100:.0f} % of the fleet median {median:,.1f} "
                f"({row['device']}), below {slow_below * 100:.0f} %"
            )
        table.append(
            {
                "host": row["host"],
                "status": status,
                "reason": reason or "",
                "verdict": row["verdict"],
                "device": row["device"],
                "images_per_s": row["images_per_s"],
                "percent_of_median": None if share is None else round(share * 100, 1),
                "order": index,
            }
        )
    rank = {"FAILED": 0, "SLOW": 1, "OK": 2}
    table.sort(key=lambda entry: (rank[entry["status"]], entry["order"]))
    for entry in table:
        del entry["order"]
    failed = [e["host"] for e in table if e["status"] == "FAILED"]
    slow = [e["host"] for e in table if e["status"] == "SLOW"]
    return {
        "hosts": len(rows),
        "ok": len(rows) - len(failed) - len(slow),
        "not_ok": len(failed) + len(slow),
        "failed": failed,
        "slow": slow,
        "slow_below": slow_below,
        "median_images_per_s": medians,
        "table": table,
    }


def load_fleet_file(path: Optional[Path]) -> Optional[Dict[str, Any]]:
    """A fleet-wide result (distributed.json, mpi_smoke.json); unreadable ones say so instead of vanishing."""
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return {"error": f"{path.name} is unreadable: {exc}"}
    data["_file"] = str(path)
    data["_modified"] = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"
    )
    return data


def find_fleet_file(input_dir: Path, name: str) -> Optional[Path]:
    for folder in (input_dir.parent, input_dir):
        if (folder / name).exists():
            return folder / name
    return None


def distributed_summary(document: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if document is None:
        return None
    if "error" in document and "verdict" not in document:
        return {"verdict": "MISSING", "explanation": document["error"], "ranks": []}
    ranks = []
    for rank in document.get("ranks") or []:
        if isinstance(rank, dict):
            ranks.append(
                {
                    key: rank.get(key)
                    for key in (
                        "rank",
                        "host",
                        "gpu",
                        "device_id",
                        "steps",
                        "images_per_s",
                        "loss_first",
                        "loss_final",
                        "seconds",
                        "error",
                    )
                }
            )
    keep = (
        "verdict",
        "explanation",
        "hint",
        "np",
        "hosts_used",
        "gpus_used",
        "images_per_s",
        "loss_first",
        "loss_final",
        "missing_ranks",
        "elapsed_s",
        "notes",
        "_modified",
    )
    summary = {key: document.get(key) for key in keep}
    summary["verdict"] = summary["verdict"] or "MISSING"
    summary["ranks"] = ranks
    return summary


def mpi_smoke_summary(document: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if document is None:
        return None
    if "error" in document and "ok" not in document:
        return {"ok": False, "hosts": [], "ranks": None, "sum": None, "seconds": None, "error": document["error"]}
    hosts = document.get("hosts")
    summary = {key: document.get(key) for key in ("ok", "ranks", "sum", "seconds", "_modified")}
    summary["ok"] = summary["ok"] is True
    summary["hosts"] = [str(h) for h in hosts] if isinstance(hosts, list) else hosts
    for key in ("error", "message", "missing"):
        if document.get(key):
            summary[key] = document[key]
    return summary


def _hosts_text(hosts: Any) -> str:
    return ", ".join(map(str, hosts)) if isinstance(hosts, list) else str(hosts)


def smoke_text(smoke: Dict[str, Any]) -> str:
    """The MPI smoke test in one sentence (plain text; the caller escapes it)."""
    detail = str(smoke.get("error") or smoke.get("message") or "")
    if smoke.get("ranks") is None:
        return detail or "no result"
    text = (
        f"{smoke.get('ranks')} rank(s) on {_hosts_text(smoke.get('hosts'))}, sum {smoke.get('sum')}, "
        f"{smoke.get('seconds')} s"
    )
    if smoke.get("_modified"):
        text += f" (run {smoke['_modified']})"
    return text + (f". {detail}" if detail else ".")


def serving_rows(results: List[Dict[str, Any]]) -> Optional[List[Dict[str, Any]]]:
    """One row per host whose result has "serving"; None when no host has one (the section is left out)."""
    if not any("serving" in result for result in results):
        return None
    rows: List[Dict[str, Any]] = []
    for result in results:
        if "serving" not in result:
            continue
        doc = result.get("serving")
        doc = doc if isinstance(doc, dict) else {"verdict": "MISSING", "explanation": "no serving result was fetched"}
        server_accuracy, pipeline_accuracy = _num(doc.get("server_accuracy")), _num(doc.get("pipeline_accuracy"))
        if server_accuracy is not None:
            accuracy, source = server_accuracy, "server"
        elif pipeline_accuracy is not None:
            accuracy, source = pipeline_accuracy, "pipeline (CPU, no server)"
        else:
            accuracy, source = None, None
        steps = doc.get("steps") if isinstance(doc.get("steps"), dict) else {}
        images = (steps.get("server") or {}).get("images") or (steps.get("pipeline") or {}).get("images")
        not_run = doc.get("not_run")
        rows.append(
            {
                "host": str(result.get("host")),
                "verdict": str(doc.get("verdict") or "MISSING"),
                "version": doc.get("mindspore_serving_version"),
                "accuracy": accuracy,
                "accuracy_source": source,
                "images": images,
                "p50_ms": _num((doc.get("latency_ms") or {}).get("p50")),
                "p95_ms": _num((doc.get("latency_ms") or {}).get("p95")),
                "explanation": str(doc.get("explanation") or doc.get("error") or ""),
                "not_run": [str(n) for n in not_run] if isinstance(not_run, list) else [],
            }
        )
    return rows


def _serving_accuracy(row: Dict[str, Any]) -> str:
    if row["accuracy"] is None:
        return "-"
    return f"{_fmt(row['accuracy'], percent=True)} ({row['accuracy_source']}, {row['images']} images)"


def markdown_serving(rows: List[Dict[str, Any]]) -> List[str]:
    lines = [
        "## MindSpore Serving (LeNet5 servable, method predict_digit)",
        "",
        "| host | verdict | Serving | accuracy | p50 / p95 request ms | explanation | could not run |",
        "| --- | --- | --- | --- | ---: | --- | --- |",
    ]
    for row in rows:
        lines.append(
            "| {} | **{}** | {} | {} | {} / {} | {} | {} |".format(
                _md_cell(row["host"]),
                _md_cell(row["verdict"]),
                _md_cell(row["version"] or "-"),
                _md_cell(_serving_accuracy(row)),
                _fmt(row["p50_ms"], 2),
                _fmt(row["p95_ms"], 2),
                _md_cell(row["explanation"]),
                _md_cell("; ".join(row["not_run"]) or "-"),
            )
        )
    return [*lines, ""]


def html_serving(rows: List[Dict[str, Any]]) -> List[str]:
    body = [
        "<h2>MindSpore Serving (LeNet5 servable, method predict_digit)</h2>",
        "<table><tr><th>host</th><th>verdict</th><th>Serving</th><th>accuracy</th><th>p50 / p95 request ms</th>"
        "<th>explanation</th><th>could not run</th></tr>",
    ]
    for row in rows:
        colour = VERDICT_COLOURS.get(row["verdict"], "#d62728")
        body.append(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td class="n">{} / {}</td><td>{}</td><td>{}</td></tr>'.format(
                _e(row["host"]),
                _badge(row["verdict"], colour),
                _e(row["version"] or "-"),
                _e(_serving_accuracy(row)),
                _e(_fmt(row["p50_ms"], 2)),
                _e(_fmt(row["p95_ms"], 2)),
                _e(row["explanation"]),
                "<br>".join(_e(n) for n in row["not_run"]) or "-",
            )
        )
    body.append("</table>")
    return body


def fleet_lines(fleet: Dict[str, Any]) -> List[str]:
    """The fleet section in a few plain lines, flagged hosts first (for the playbook's and the CLI's output)."""
    medians = ", ".join(f"{v:,.1f} ({k})" for k, v in fleet["median_images_per_s"].items()) or "-"
    lines = [f"fleet: {fleet['ok']} of {fleet['hosts']} host(s) OK; median images/s {medians}"]
    lines += [f"  {e['status']} {e['host']}: {e['reason']}" for e in fleet["table"] if e["status"] != "OK"]
    dist = fleet.get("distributed")
    if dist is not None:
        lines.append(f"data-parallel: {dist['verdict']} {dist.get('explanation') or ''}".rstrip())
    smoke = fleet.get("mpi_smoke")
    if smoke is not None:
        lines.append(f"mpi smoke: {'OK' if smoke['ok'] else 'FAILED'} {smoke_text(smoke)}")
    for row in fleet.get("serving") or []:
        lines.append(f"serving {row['host']}: {row['verdict']} {row['explanation']}".rstrip())
    return lines


def markdown_fleet(fleet: Dict[str, Any]) -> List[str]:
    medians = ", ".join(f"{v:,.1f} ({k})" for k, v in fleet["median_images_per_s"].items()) or "-"
    lines = [
        "## Fleet",
        "",
        f"**{fleet['ok']} of {fleet['hosts']} host(s) OK**, {len(fleet['failed'])} FAILED, {len(fleet['slow'])} SLOW "
        f"(below {fleet['slow_below'] * 100:.0f} % of the median). Fleet median images/s: {medians}.",
        "",
        "| host | status | images/s | % of median | reason |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for entry in fleet["table"]:
        share = "-" if entry["percent_of_median"] is None else f"{entry['percent_of_median']:.1f} %"
        lines.append(
            f"| {_md_cell(entry['host'])} | **{entry['status']}** | {_fmt(entry['images_per_s'])} | {share} | "
            f"{_md_cell(entry['reason'])} |"
        )
    lines.append("")
    dist = fleet.get("distributed")
    if dist is not None:
        lines += ["## Data-parallel LeNet5 (mpirun + NCCL, one rank per GPU)", ""]
        lines.append(f"**{_md_cell(dist['verdict'])}**: {_md_cell(dist.get('explanation') or '')}")
        if dist.get("verdict") not in ("OK", "NO_GPU") and dist.get("hint"):
            lines += ["", f"What to do: {_md_cell(dist['hint'])}"]
        if dist.get("ranks"):
            lines += [
                "",
                "| rank | host | GPU | steps | images/s | loss first -> final | error |",
                "| ---: | --- | --- | ---: | ---: | --- | --- |",
            ]
            for rank in dist["ranks"]:
                lines.append(
                    "| {} | {} | {} | {} | {} | {} -> {} | {} |".format(
                        rank["rank"],
                        _md_cell(rank["host"]),
                        _md_cell(rank["gpu"]),
                        rank["steps"],
                        _fmt(_num(rank["images_per_s"])),
                        _fmt(_num(rank["loss_first"]), 3),
                        _fmt(_num(rank["loss_final"]), 3),
                        _md_cell(rank["error"] or ""),
                    )
                )
        lines.append("")
    smoke = fleet.get("mpi_smoke")
    if smoke is not None:
        state = "OK" if smoke["ok"] else "FAILED"
        lines += [
            "## MPI smoke test (mpirun over the hostfile, MPI_Allreduce of the ranks)",
            "",
            f"**{state}**: {_md_cell(smoke_text(smoke))}",
            "",
        ]
    return lines


def markdown(title: str, rows: List[Dict[str, Any]], generated: str, fleet: Optional[Dict[str, Any]] = None) -> str:
    lines = [f"# {_md_cell(title)}", "", f"Generated {generated}. {len(rows)} host(s).", ""]
    if fleet is not None:
        lines += markdown_fleet(fleet)
        lines += ["## Hosts", ""]
    lines.append(
        "| host | verdict | explanation | warm-up (first CUDA context) | images/s | accuracy | ratio vs seed "
        "| p50 / p95 step ms | feeder images/s |"
    )
    lines.append("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        quick = " (quick)" if row["quick"] else ""
        lines.append(
            "| {} | {} | {} | {} | {}{} | {} | {} | {} / {} | {} |".format(
                _md_cell(row["host"]),
                _md_cell(row["verdict"]),
                _md_cell(_explanation_cell(row)),
                _md_cell(row.get("warmup", "-")),
                _fmt(row["images_per_s"]),
                quick,
                _fmt(row["accuracy"], percent=True),
                _fmt(row["ratio"], 2),
                _fmt(row["p50_ms"], 2),
                _fmt(row["p95_ms"], 2),
                _md_cell(feeder_text(row)),
            )
        )
    if fleet is not None and fleet.get("serving"):
        lines += ["", *markdown_serving(fleet["serving"])]
    hints = [row for row in rows if row["verdict"] != "OK" and row.get("hint")]
    if hints:
        lines += ["", "## What to do", ""]
        lines += [f"- **{_md_cell(row['host'])}** ({row['verdict']}): {_md_cell(row['hint'])}" for row in hints]
    return "\n".join(lines) + "\n"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def loss_chart(series: List[Tuple[str, List[Tuple[float, float]]]], width: int = 640, height: int = 280) -> str:
    """Inline SVG line chart of loss against step, one polyline per host."""
    points = [p for _, data in series for p in data]
    if not points:
        return "<p>No loss curves.</p>"
    left, right, top, bottom = 50, 150, 15, 35
    max_x = max(p[0] for p in points) or 1.0
    max_y = max(p[1] for p in points) or 1.0
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + plot_w * x / max_x

    def sy(y: float) -> float:
        return top + plot_h * (1 - y / max_y)

    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="loss">']
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot"/>')
    for i in range(5):
        y = max_y * i / 4
        parts.append(f'<text x="{left - 5}" y="{sy(y) + 4:.1f}" class="tick" text-anchor="end">{y:.2f}</text>')
    parts.append(f'<text x="{left}" y="{height - 8}" class="tick">step 0</text>')
    parts.append(f'<text x="{left + plot_w}" y="{height - 8}" class="tick" text-anchor="end">{int(max_x)}</text>')
    for index, (name, data) in enumerate(series):
        colour = COLOURS[index % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in data)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}"/>')
        ly = top + 14 * index + 10
        parts.append(f'<rect x="{width - right + 10}" y="{ly - 8}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{width - right + 25}" y="{ly + 1}" class="tick">{_e(str(name)[:24])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(bars: List[Tuple[str, float, Optional[float]]], width: int = 640) -> str:
    """Inline SVG horizontal bars of images/s per host (seed's images/s as a thin grey bar where known)."""
    if not bars:
        return "<p>No benchmark results.</p>"
    row_h, left, right = 26, 170, 90
    height = row_h * len(bars) + 10
    top_value = max(max(v, s or 0.0) for _, v, s in bars) or 1.0
    plot_w = width - left - right
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="images/s">']
    for index, (name, value, seed) in enumerate(bars):
        y = 5 + index * row_h
        w = plot_w * value / top_value
        parts.append(f'<text x="{left - 6}" y="{y + 15}" class="tick" text-anchor="end">{_e(str(name)[:28])}</text>')
        parts.append(f'<rect x="{left}" y="{y + 2}" width="{w:.1f}" height="14" fill="{COLOURS[0]}"/>')
        if seed:
            parts.append(
                f'<rect x="{left}" y="{y + 18}" width="{plot_w * seed / top_value:.1f}" height="4" fill="#999999"/>'
            )
        parts.append(f'<text x="{left + w + 5:.1f}" y="{y + 15}" class="tick">{value:,.0f}</text>')
    parts.append("</svg>")
    return "".join(parts)


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;width:100%;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;vertical-align:top}
th{background:#f2f2f2;text-align:left}td.n{text-align:right;white-space:nowrap}
.verdict{font-weight:bold;padding:1px 6px;border-radius:3px;color:#fff;background:#d62728}
svg .plot{fill:#fafafa;stroke:#bbb}svg .tick{font-size:11px;fill:#444}
.hint{color:#555;font-size:13px}
tr.failed td{background:#fdecea}tr.slow td{background:#fff4e5}
.bar{background:#eee;height:6px;margin-top:3px}.bar div{height:6px}
"""


def _badge(text: str, colour: str) -> str:
    return f'<span class="verdict" style="background:{colour}">{_e(text)}</span>'


def html_fleet(fleet: Dict[str, Any]) -> List[str]:
    medians = ", ".join(f"{v:,.1f} ({_e(k)})" for k, v in fleet["median_images_per_s"].items()) or "-"
    body = [
        "<h2>Fleet</h2>",
        f'<p class="fleet"><b>{fleet["ok"]} of {fleet["hosts"]} host(s) OK</b>, {len(fleet["failed"])} FAILED, '
        f"{len(fleet['slow'])} SLOW (below {fleet['slow_below'] * 100:.0f} % of the median). "
        f"Fleet median images/s: {medians}.</p>",
        "<table><tr><th>host</th><th>status</th><th>images/s</th><th>% of median</th><th>reason</th></tr>",
    ]
    for entry in fleet["table"]:
        share = entry["percent_of_median"]
        bar = ""
        if share is not None:
            width = max(0.0, min(100.0, share / 1.5))  # 150 % of the median fills the cell
            colour = STATUS_COLOURS[entry["status"]]
            bar = f'<div class="bar"><div style="width:{width:.1f}%;background:{colour}"></div></div>'
        body.append(
            '<tr class="{}"><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}{}</td><td>{}</td></tr>'.format(
                entry["status"].lower(),
                _e(entry["host"]),
                _badge(entry["status"], STATUS_COLOURS[entry["status"]]),
                _e(_fmt(entry["images_per_s"])),
                "-" if share is None else f"{share:.1f} %",
                bar,
                _e(entry["reason"]),
            )
        )
    body.append("</table>")
    dist = fleet.get("distributed")
    if dist is not None:
        colour = STATUS_COLOURS["OK"] if dist["verdict"] == "OK" else VERDICT_COLOURS.get(dist["verdict"], "#d62728")
        body.append("<h2>Data-parallel LeNet5 (mpirun + NCCL, one rank per GPU)</h2>")
        hint = dist.get("hint") if dist["verdict"] not in ("OK", "NO_GPU") else None
        body.append(
            f"<p>{_badge(dist['verdict'], colour)} {_e(dist.get('explanation') or '')}</p>"
            + (f'<p class="hint">{_e(hint)}</p>' if hint else "")
        )
        if dist.get("ranks"):
            body.append(
                "<table><tr><th>rank</th><th>host</th><th>GPU</th><th>steps</th><th>images/s</th>"
                "<th>loss first &rarr; final</th><th>error</th></tr>"
            )
            for rank in dist["ranks"]:
                body.append(
                    '<tr><td class="n">{}</td><td>{}</td><td>{}</td><td class="n">{}</td><td class="n">{}</td>'
                    '<td class="n">{} &rarr; {}</td><td>{}</td></tr>'.format(
                        _e(rank["rank"]),
                        _e(rank["host"]),
                        _e(rank["gpu"]),
                        _e(rank["steps"]),
                        _e(_fmt(_num(rank["images_per_s"]))),
                        _e(_fmt(_num(rank["loss_first"]), 3)),
                        _e(_fmt(_num(rank["loss_final"]), 3)),
                        _e(rank["error"] or ""),
                    )
                )
            body.append("</table>")
    smoke = fleet.get("mpi_smoke")
    if smoke is not None:
        state = "OK" if smoke["ok"] else "FAILED"
        body.append("<h2>MPI smoke test (mpirun over the hostfile, MPI_Allreduce of the ranks)</h2>")
        body.append(f"<p>{_badge(state, STATUS_COLOURS[state])} {_e(smoke_text(smoke))}</p>")
    body.append("<h2>Hosts</h2>")
    return body


def html_page(
    title: str,
    rows: List[Dict[str, Any]],
    results: List[Dict[str, Any]],
    generated: str,
    fleet: Optional[Dict[str, Any]] = None,
) -> str:
    body: List[str] = [f"<h1>{_e(title)}</h1>", f"<p>Generated {_e(generated)}. {len(rows)} host(s).</p>"]
    if fleet is not None:
        body += html_fleet(fleet)
    body.append(
        "<table><tr><th>host</th><th>verdict</th><th>explanation</th><th>warm-up (first CUDA context)</th>"
        "<th>images/s</th><th>accuracy</th><th>ratio vs seed</th><th>p50 / p95 step ms</th>"
        "<th>feeder images/s</th></tr>"
    )
    for row in rows:
        colour = VERDICT_COLOURS.get(row["verdict"], "#d62728")
        hint = f'<div class="hint">{_e(row["hint"])}</div>' if row["verdict"] != "OK" and row.get("hint") else ""
        quick = " (quick)" if row["quick"] else ""
        body.append(
            '<tr><td>{}</td><td><span class="verdict" style="background:{}">{}</span></td><td>{}{}</td>'
            '<td>{}</td><td class="n">{}{}</td><td class="n">{}</td><td class="n">{}</td>'
            '<td class="n">{} / {}</td><td class="n">{}</td></tr>'.format(
                _e(row["host"]),
                colour,
                _e(row["verdict"]),
                _e(_explanation_cell(row)),
                hint,
                _e(row.get("warmup", "-")),
                _e(_fmt(row["images_per_s"])),
                _e(quick),
                _e(_fmt(row["accuracy"], percent=True)),
                _e(_fmt(row["ratio"], 2)),
                _e(_fmt(row["p50_ms"], 2)),
                _e(_fmt(row["p95_ms"], 2)),
                _e(feeder_text(row)),
            )
        )
    body.append("</table>")
    if fleet is not None and fleet.get("serving"):
        body += html_serving(fleet["serving"])
    series: List[Tuple[str, List[Tuple[float, float]]]] = []
    bars: List[Tuple[str, float, Optional[float]]] = []
    for result, row in zip(results, rows):
        bench = result.get("bench") or {}
        curve = []
        for point in bench.get("loss_curve") or []:
            valid = isinstance(point, (list, tuple)) and len(point) == 2
            if valid and _num(point[0]) is not None and _num(point[1]) is not None:
                curve.append((float(point[0]), float(point[1])))
        if curve:
            series.append((row["host"], curve))
        if row["images_per_s"] is not None:
            bars.append((row["host"], row["images_per_s"], row["seed_images_per_s"]))
    body.append("<h2>Training loss</h2>" + loss_chart(series))
    body.append("<h2>Images per second (grey: the seed's script on the same host)</h2>" + bar_chart(bars))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_report(
    input_dir: Path,
    out_dir: Path,
    title: str = "MindSpore GPU fleet verification",
    slow_below: float = 0.8,
    distributed: Optional[Path] = None,
    mpi_smoke: Optional[Path] = None,
) -> List[Path]:
    """Write the three files; ``distributed``/``mpi_smoke`` default to those found next to or in ``input_dir``."""
    results = load_results(input_dir)
    rows = [host_row(result) for result in results]
    fleet = fleet_summary(rows, results, slow_below)
    fleet["distributed"] = distributed_summary(
        load_fleet_file(distributed or find_fleet_file(input_dir, FLEET_FILES["distributed"]))
    )
    fleet["mpi_smoke"] = mpi_smoke_summary(
        load_fleet_file(mpi_smoke or find_fleet_file(input_dir, FLEET_FILES["mpi_smoke"]))
    )
    serving = serving_rows(results)
    if serving is not None:
        fleet["serving"] = serving
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path, summary_path = out_dir / "report.md", out_dir / "report.html", out_dir / "summary.json"
    md_path.write_text(markdown(title, rows, generated, fleet), encoding="utf-8")
    html_path.write_text(html_page(title, rows, results, generated, fleet), encoding="utf-8")
    counts: Dict[str, int] = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    summary = {"title": title, "generated": generated, "fleet": fleet, "hosts": rows, "verdicts": counts}
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return [md_path, html_path, summary_path]
