"""The score report as one self-contained HTML page: inline CSS and SVG charts, no script, no link.

Everything from the data (conversation text, reasons, tool results, service names) is HTML-escaped: a
conversation that carries markup shows it as text and cannot run in the reader's browser.
"""

from __future__ import annotations

import datetime as dt
import json
from html import escape
from typing import Any

from collector.history.report_data import BINS, DailyPoint, ReportData, Worst
from scoring.errors import InvalidTestCaseError
from scoring.interactions import render_step
from scoring.test_case import load_test_case

WIDTH, HEIGHT, PAD = 640, 200, 36
SERIES = (("mean", "mean", "#1f6feb"), ("p10", "p10", "#d29922"), ("pass_rate", "pass rate", "#2da44e"))
MAX_TEXT = 2000
CSP = "default-src 'none'; style-src 'unsafe-inline'"  # nothing is fetched and nothing runs, even if opened

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1000px;
color:#1f2328;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f6f8fa}
svg{background:#fff;border:1px solid #d0d7de}.axis{stroke:#8c959f;stroke-width:1}.grid{stroke:#eaeef2}
.label{font-size:11px;fill:#57606a}.legend span{display:inline-block;margin-right:14px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
details{margin:8px 0;border:1px solid #d0d7de;border-radius:6px;padding:6px 10px}
summary{cursor:pointer;font-weight:600}.turn{margin:6px 0;padding:6px 8px;border-radius:6px;white-space:pre-wrap}
.user{background:#ddf4ff}.assistant{background:#f6f8fa}.call{margin:4px 0 4px 16px;font-family:ui-monospace,
monospace;font-size:12px;white-space:pre-wrap;color:#57606a}.muted{color:#57606a}
"""


def _x(index: int, count: int) -> float:
    return PAD + (WIDTH - 2 * PAD) * (index / (count - 1) if count > 1 else 0.5)


def _y(value: float) -> float:
    return HEIGHT - PAD + (2 * PAD - HEIGHT) * value


def _frame(days: list[dt.date], y_labels: list[tuple[float, str]]) -> list[str]:
    parts = [f'<line class="axis" x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}"/>']
    for value, label in y_labels:
        y = _y(value)
        parts.append(f'<line class="grid" x1="{PAD}" y1="{y:.1f}" x2="{WIDTH - PAD}" y2="{y:.1f}"/>')
        parts.append(f'<text class="label" x="4" y="{y + 4:.1f}">{escape(label)}</text>')
    step = max(1, len(days) // 8)
    for i, day in enumerate(days):
        if i % step == 0 or i == len(days) - 1:
            parts.append(f'<text class="label" x="{_x(i, len(days)) - 16:.1f}" y="{HEIGHT - 12}">'
                         f'{day.strftime("%m-%d")}</text>')
    return parts


def line_chart(title: str, days: list[dt.date], points: list[DailyPoint]) -> str:
    """Mean, p10 and pass rate per day; a point for every day that has scores."""
    index = {day: i for i, day in enumerate(days)}
    parts = _frame(days, [(0.0, "0"), (0.5, "0.5"), (1.0, "1")])
    for key, label, color in SERIES:
        coords = [(index[p.day], getattr(p, key), p) for p in points if getattr(p, key) is not None
                  and p.day in index]
        if len(coords) > 1:
            path = " ".join(f"{_x(i, len(days)):.1f},{_y(v):.1f}" for i, v, _ in coords)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        for i, value, point in coords:
            parts.append(f'<circle class="point" data-series="{key}" data-day="{point.day.isoformat()}" '
                         f'cx="{_x(i, len(days)):.1f}" cy="{_y(value):.1f}" r="3.5" fill="{color}">'
                         f'<title>{point.day.isoformat()} {label} {value:.3f} ({point.conversations} '
                         f'conversations)</title></circle>')
    legend = "".join(f'<span><i class="swatch" style="background:{c}"></i>{escape(label)}</span>'
                     for _, label, c in SERIES)
    return (f'<figure class="chart" data-chart="daily" data-title="{escape(title)}"><figcaption><b>'
            f'{escape(title)}</b> <span class="legend">{legend}</span></figcaption>'
            f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'aria-label="{escape(title)}">{"".join(parts)}</svg></figure>')


def bar_chart(title: str, labels: list[str], values: list[float], fmt: str, kind: str) -> str:
    top = max(values, default=0.0) or 1.0
    width = (WIDTH - 2 * PAD) / max(1, len(values))
    parts = _frame([], [(0.0, "0"), (1.0, format(top, fmt))])
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = (HEIGHT - 2 * PAD) * value / top
        x = PAD + i * width
        parts.append(f'<rect class="bar" data-label="{escape(label)}" x="{x + 2:.1f}" y="{HEIGHT - PAD - h:.1f}" '
                     f'width="{max(1.0, width - 4):.1f}" height="{h:.1f}" fill="#1f6feb">'
                     f'<title>{escape(label)}: {format(value, fmt)}</title></rect>')
        if len(values) <= 16 or i % max(1, len(values) // 8) == 0:
            parts.append(f'<text class="label" x="{x + 2:.1f}" y="{HEIGHT - 12}">{escape(label)}</text>')
    return (f'<figure class="chart" data-chart="{kind}" data-title="{escape(title)}"><figcaption><b>'
            f'{escape(title)}</b></figcaption><svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" role="img" aria-label="{escape(title)}">{"".join(parts)}</svg></figure>')


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"… ({len(text) - MAX_TEXT} more characters)"


def _json(value: Any) -> str:
    return _clip(json.dumps(value, ensure_ascii=False, default=str))


def transcript(test_case: dict[str, Any]) -> str:
    """The turns and MCP calls, as text; a stored case that no longer validates is shown raw."""
    try:
        case = load_test_case(test_case)
    except InvalidTestCaseError as exc:
        return f'<p class="muted">stored test case does not validate ({escape(str(exc))}):</p>' \
               f'<pre>{escape(_json(test_case))}</pre>'
    parts = []
    for i, turn in enumerate(case.turns):
        body = escape(_clip(turn.content)) if turn.content else '<span class="muted">(no text)</span>'
        calls = []
        if turn.role == "assistant":
            for call in render_step(i, turn).get("mcp_calls", []):
                target = call.get("name") or call.get("uri")
                args = f" {_json(call['arguments'])}" if "arguments" in call else ""
                calls.append(f'<div class="call">MCP {escape(call["kind"])} {escape(str(target))}{escape(args)}'
                             f' → {escape(_json(call["result"]))}</div>')
        parts.append(f'<div class="turn {turn.role}"><b>{turn.role}</b>: {body}{"".join(calls)}</div>')
    return "".join(parts)


def _worst(items: list[Worst]) -> str:
    if not items:
        return '<p class="muted">No judged scores in this period.</p>'
    out = []
    for w in items:
        score = "error" if w.score is None else f"{w.score:.3f}"
        why = w.error if w.score is None else w.reason
        out.append(f'<details class="worst"><summary>{escape(w.metric)} {score}: {escape(w.conversation_id)} '
                   f'v{w.version} <span class="muted">({escape(w.service or "no service")})</span></summary>'
                   f'<p><b>Reason:</b> {escape(why or "(none)")}</p>{transcript(w.test_case)}</details>')
    return "".join(out)


def _table(headers: list[str], rows: list[tuple[Any, ...]], empty: str) -> str:
    if not rows:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(_clip(str(v)))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(data: ReportData, source: str) -> str:
    """The whole page."""
    title = f"tracejudge scores {data.since.isoformat()} to {data.until.isoformat()}"
    sections = [f"<h1>{escape(title)}</h1><p class=\"muted\">From {escape(source)}"
                + (f"; replicas: {escape(', '.join(data.replicas))}" if data.replicas else "") + ".</p>"]
    sections.append("<h2>Daily scores</h2>")
    if not data.daily:
        sections.append('<p class="muted">No scores in this period.</p>')
    for (metric, service), points in sorted(data.daily.items()):
        sections.append(line_chart(f"{metric} · {service}", data.days, points))
    sections.append("<h2>Score distribution</h2>")
    labels = [f"{i / BINS:.1f}" for i in range(BINS)]
    for metric, counts in sorted(data.histogram.items()):
        sections.append(bar_chart(f"{metric}: latest score per conversation", labels, [float(c) for c in counts],
                                  ".0f", "histogram"))
    sections.append("<h2>Evaluation cost per day</h2>")
    sections.append(bar_chart("judge spend (USD)", [d.strftime("%m-%d") for d in data.days],
                              [data.cost.get(d, 0.0) for d in data.days], ".4f", "cost"))
    sections.append("<h2>Worst conversations</h2>" + _worst(data.worst))
    sections.append("<h2>Judge fallbacks and failures</h2><h3>Fallbacks (System One to the LLM)</h3>"
                    + _table(["metric", "reason", "scores"], data.fallbacks, "No fallback in this period."))
    sections.append("<h3>Scores recorded with an error</h3>"
                    + _table(["metric", "error", "scores"], data.score_errors, "No scoring error in this period."))
    failed = ("Failed jobs are kept in each replica's own file; report on a replica to see them."
              if data.failed_jobs is None else "No failed job in this period.")
    sections.append("<h3>Failed scoring jobs</h3>"
                    + _table(["metric", "last error", "jobs"], data.failed_jobs or [], failed))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f'<body>{"".join(sections)}</body></html>')
