"""Fleet report over host result files: report.md, one self-contained report.html, summary.json.

A host result file is ``{"host": NAME, "stack": {...}, "judge": <judge JSON>, "bench": <bench JSON>}``;
judge or bench may be missing or null (a host that failed). Standard library only: runs on the
controller. Every value taken from the JSON is HTML-escaped; the HTML has no scripts and no external
references (inline CSS, inline SVG drawn here).
"""

from __future__ import annotations

import datetime
import html
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
VERDICT_COLOURS = {"OK": "#2ca02c", "NO_GPU": "#ff7f0e", "HANG": "#9467bd", "NOT_RUN": "#7f7f7f"}


def load_results(folder: Path) -> List[Dict[str, Any]]:
    """Every *.json under ``folder``; unreadable files become a host row that says so."""
    results: List[Dict[str, Any]] = []
    for path in sorted(folder.glob("*.json")):
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


def host_row(result: Dict[str, Any]) -> Dict[str, Any]:
    judge = result.get("judge") or {}
    bench = result.get("bench") or {}
    steps = bench.get("step_time_ms") or {}
    seed = bench.get("seed") or {}
    # A judge left out on purpose (verify_judge: false, as `./toolkit bench` does) is not a failure.
    skipped = not judge and (result.get("requested") or {}).get("judge") is False
    if skipped:
        explanation = "judge not run (verify_judge: false)"
    else:
        explanation = judge.get("explanation") or result.get("error") or "no judge result (the host failed earlier)"
    if bench.get("error"):
        explanation += " Benchmark: " + str(bench["error"])
    return {
        "host": str(result.get("host")),
        "stack": (result.get("stack") or {}).get("name") if isinstance(result.get("stack"), dict) else None,
        "verdict": judge.get("verdict") or ("NOT_RUN" if skipped else "MISSING"),
        "explanation": explanation,
        "hint": judge.get("hint"),
        "device": bench.get("device") or judge.get("device"),
        "images_per_s": _num(bench.get("images_per_s")),
        "accuracy": _num(bench.get("accuracy")),
        "seed_images_per_s": _num(seed.get("images_per_s")),
        "seed_accuracy": _num(seed.get("accuracy")),
        "ratio": _num(bench.get("ratio")),
        "p50_ms": _num(steps.get("p50")),
        "p95_ms": _num(steps.get("p95")),
        "quick": bool(bench.get("quick")),
        "mindspore_version": judge.get("mindspore_version") or bench.get("mindspore_version"),
    }


def _fmt(value: Optional[float], digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "-"
    if percent:
        return f"{value * 100:.2f} %"
    return f"{value:,.{digits}f}"


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(title: str, rows: List[Dict[str, Any]], generated: str) -> str:
    lines = [f"# {_md_cell(title)}", "", f"Generated {generated}. {len(rows)} host(s).", ""]
    lines.append("| host | verdict | explanation | images/s | accuracy | ratio vs seed | p50 / p95 step ms |")
    lines.append("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        quick = " (quick)" if row["quick"] else ""
        lines.append(
            "| {} | {} | {} | {}{} | {} | {} | {} / {} |".format(
                _md_cell(row["host"]),
                _md_cell(row["verdict"]),
                _md_cell(row["explanation"]),
                _fmt(row["images_per_s"]),
                quick,
                _fmt(row["accuracy"], percent=True),
                _fmt(row["ratio"], 2),
                _fmt(row["p50_ms"], 2),
                _fmt(row["p95_ms"], 2),
            )
        )
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
"""


def html_page(title: str, rows: List[Dict[str, Any]], results: List[Dict[str, Any]], generated: str) -> str:
    body: List[str] = [f"<h1>{_e(title)}</h1>", f"<p>Generated {_e(generated)}. {len(rows)} host(s).</p>"]
    body.append(
        "<table><tr><th>host</th><th>verdict</th><th>explanation</th><th>images/s</th><th>accuracy</th>"
        "<th>ratio vs seed</th><th>p50 / p95 step ms</th></tr>"
    )
    for row in rows:
        colour = VERDICT_COLOURS.get(row["verdict"], "#d62728")
        hint = f'<div class="hint">{_e(row["hint"])}</div>' if row["verdict"] != "OK" and row.get("hint") else ""
        quick = " (quick)" if row["quick"] else ""
        body.append(
            '<tr><td>{}</td><td><span class="verdict" style="background:{}">{}</span></td><td>{}{}</td>'
            '<td class="n">{}{}</td><td class="n">{}</td><td class="n">{}</td>'
            '<td class="n">{} / {}</td></tr>'.format(
                _e(row["host"]),
                colour,
                _e(row["verdict"]),
                _e(row["explanation"]),
                hint,
                _e(_fmt(row["images_per_s"])),
                _e(quick),
                _e(_fmt(row["accuracy"], percent=True)),
                _e(_fmt(row["ratio"], 2)),
                _e(_fmt(row["p50_ms"], 2)),
                _e(_fmt(row["p95_ms"], 2)),
            )
        )
    body.append("</table>")
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


def write_report(input_dir: Path, out_dir: Path, title: str = "MindSpore GPU fleet verification") -> List[Path]:
    results = load_results(input_dir)
    rows = [host_row(result) for result in results]
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path, summary_path = out_dir / "report.md", out_dir / "report.html", out_dir / "summary.json"
    md_path.write_text(markdown(title, rows, generated), encoding="utf-8")
    html_path.write_text(html_page(title, rows, results, generated), encoding="utf-8")
    counts: Dict[str, int] = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    summary = {"title": title, "generated": generated, "hosts": rows, "verdicts": counts}
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return [md_path, html_path, summary_path]
