"""The report as one self-contained HTML page: charts where people would
rather look than read.

Why this shape:
- One file, fully offline. The page must open from a laptop after `scp`,
  on a cluster with no internet, so plotly's JavaScript is embedded, not
  linked from a CDN. Plotly is the library HTA's users already know; its
  Python package ships the minified bundle (plotly.min.js), so embedding it
  needs no network and no build step. Every run folder holds a page, so the
  4.8 MB bundle goes in packed (plotly_bundle: 1.8 MB) and the page unpacks
  it with the browser's own DecompressionStream. The charts are written as
  plain plotly JSON (`{"data": [...], "layout": {...}}`) rather than through
  plotly's Python figure classes: those validate every attribute and cost
  more than the whole report, and the report is written at the end of
  every run.
- The tables are the text renderers' own blocks (content.py,
  window_blocks.py, comparison.py), so a number on the page is the number
  in the terminal; the charts add what a table cannot show (step time over
  the run, ranks side by side, the module tree, the two distributions of a
  comparison).
- The page is drawn from the Report alone: its series, medians and
  distributions are computed with the rest of the Report
  (analysis/series.py, which also says how a 10^6-step run is bucketed), so
  the page never reads the run again and cannot disagree with the tables.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import html
import importlib.util
import json
import math
import os
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from perfrun.analysis.compare import Comparison
from perfrun.analysis.report import Report
from perfrun.analysis.series import QUANTITIES
from perfrun.analysis.summary import PHASE_TITLES
from perfrun.report.comparison import comparison_blocks, verdict_line
from perfrun.report.content import blocks
from perfrun.report.jsonout import finite
from perfrun.report.primitives import Block, LinesBlock, TableBlock, TitleBlock, fmt_sig
from perfrun.store.files import atomic_write_text
from perfrun.store.layout import REPORT_FILE

#: Rows per window table in the page (the terminal's default is 20): the
#: page's tables sort and filter, so they can hold every operator.
HTML_ROW_LIMIT = 1000
MIB = 1 << 20

#: Colours per phase, shared by every chart (a phase reads alike everywhere).
PHASE_COLOURS = {
    "dataloader": "#e4572e",
    "forward": "#4c78a8",
    "backward": "#72b7b2",
    "optimization": "#f2a541",
    "others": "#a0a0a0",
}
TITLES = {**PHASE_TITLES, "others": "Others", "step": "Step"}
#: Pixels between two rows of labels above a chart (10-pixel text).
LABEL_ROW = 14


# -- numbers (pure) ----------------------------------------------------------------


def _ms(values: Any) -> list[Optional[float]]:
    """Seconds as milliseconds rounded to 0.1 us: enough digits for any step,
    and a third of the JSON of full float64 reprs."""
    arr = np.asarray(values, dtype=np.float64) * 1e3
    return [round(float(v), 4) if math.isfinite(v) else None for v in arr]


# -- charts (plotly JSON) --------------------------------------------------------------


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0.01, "xanchor": "left"},
        "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
        "legend": {"orientation": "h", "y": -0.18},
        "hovermode": "x unified",
        "template": None,
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "font": {"family": "system-ui, sans-serif", "size": 12},
    }
    layout.update(extra)
    return layout


#: Pixels at the top of a chart that plotly's toolbar takes (its buttons
#: are 28 high): a title that is to stay clear of it starts below.
MODEBAR = 32


def memory_chart(report: Report) -> Optional[dict[str, Any]]:
    """Memory over the run beside the step time: each rank's resident
    memory and each child's private memory at the steps they were read in
    (the Memory Summary's processes); None where no process has two
    readings inside the steps."""
    memory = report.memory
    if memory is None:
        return None
    data: list[dict[str, Any]] = []
    for p in memory.processes:
        if len(p.points) < 2:
            continue
        what = "private" if p.measure == "uss" else "resident"
        data.append({
            "type": "scatter", "mode": "lines+markers", "name": f"{p.label}, {what}",
            "x": [s for s, _ in p.points], "y": [round(b / MIB, 1) for _, b in p.points],
            "marker": {"size": 3}, "line": {"width": 1.2},
            "hovertemplate": "step %{x}: %{y:.1f} MiB",
        })
    for d in memory.devices:
        if len(d.points) < 2:
            continue
        for k, what, dash in ((1, "allocated", "solid"), (2, "reserved", "dot")):
            data.append({
                "type": "scatter", "mode": "lines+markers", "name": f"{d.label} GPU, {what}",
                "x": [p[0] for p in d.points], "y": [round(p[k] / MIB, 1) for p in d.points],
                "marker": {"size": 3}, "line": {"width": 1.2, "dash": dash},
                "hovertemplate": "step %{x}: %{y:.1f} MiB",
            })
    if not data:
        return None
    # The title at the left, as every chart's (_layout), its explanation on
    # a line of its own, both below the row of plotly's toolbar (top right,
    # MODEBAR pixels high): centred on it, the one long line ran under the
    # toolbar's buttons.
    height = 360
    layout = _layout(
        "Memory over the run<br><sup>a rank's resident memory, a child's private memory; "
        "GPU: the allocator's at the end of sampled steps</sup>",
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": "MiB"}, "rangemode": "tozero"},
        height=height, margin={"t": MODEBAR + 50, "r": 20, "b": 45, "l": 60},
        showlegend=True, legend={"orientation": "h", "y": -0.25},
        hovermode="closest",
    )
    layout["title"].update({"font": {"size": 13}, "yref": "container", "yanchor": "top",
                            "y": 1.0 - MODEBAR / height})
    return {"data": data, "layout": layout}


def step_chart(report: Report) -> Optional[dict[str, Any]]:
    """Step time over the whole run: the reference rank's phases stacked,
    the min / max envelope, warm-up and the detailed window shaded, steps
    holding set-aside time (eval, DataLoader start-up) marked, the steady
    median and its 10th-90th percentile band; other ranks' step times as
    lines that can be switched on from the legend."""
    series = report.series
    if series is None or series.steps is None:
        return None
    s = series.steps
    x = s["x"]
    per = "step" if s["size"] == 1 else f"bucket of {s['size']} steps"
    data: list[dict[str, Any]] = []
    for q in QUANTITIES:
        data.append({
            "type": "scatter", "mode": "lines", "name": TITLES[q], "x": x,
            "y": _ms(s["phases"][q]), "stackgroup": "phases",
            "line": {"width": 0.5, "color": PHASE_COLOURS[q]},
            "hovertemplate": "%{y:.4f} ms",
        })
    if s["size"] > 1:
        data.append({
            "type": "scatter", "mode": "lines", "name": "min per bucket", "x": x,
            "y": _ms(s["min"]), "line": {"width": 0.6, "color": "#555", "dash": "dot"},
            "hovertemplate": "%{y:.4f} ms",
        })
        data.append({
            "type": "scatter", "mode": "lines", "name": "max per bucket", "x": x,
            "y": _ms(s["max"]), "line": {"width": 0.8, "color": "#222"},
            "fill": "tonexty", "fillcolor": "rgba(0,0,0,0.06)",
            "hovertemplate": "%{y:.4f} ms",
        })
    marks = np.nonzero(np.asarray(s["excluded_steps"]) > 0)[0]
    if marks.size:
        top = np.asarray(s["max"])[marks]
        data.append({
            "type": "scatter", "mode": "markers",
            "name": "time set aside (eval, DataLoader start-up, profiler)",
            "x": [x[i] for i in marks], "y": _ms(top),
            "customdata": _ms(np.asarray(s["excluded"])[marks]),
            "marker": {"symbol": "triangle-down", "size": 8, "color": "#7b2cbf"},
            "hovertemplate": "set aside from the step: %{customdata:.4f} ms",
        })
    for rank, o in series.others:
        data.append({
            "type": "scatter", "mode": "lines", "name": f"rank {rank} step",
            "x": o["x"], "y": _ms(o["step"]), "visible": "legendonly",
            "line": {"width": 1}, "hovertemplate": "%{y:.4f} ms",
        })
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    rows = [0]  # label rows used above the plot
    title = report.title
    n = s["n"]

    def region(lo: float, hi: float, colour: str, label: str) -> None:
        shapes.append({
            "type": "rect", "xref": "x", "yref": "paper", "x0": lo - 0.5, "x1": hi - 0.5,
            "y0": 0, "y1": 1, "fillcolor": colour, "opacity": 0.15, "line": {"width": 0},
            "layer": "below",
        })
        # Each region's label on a row of its own above the plot: warm-up
        # and a window a few steps apart would print one over the other.
        annotations.append({
            "x": (lo + hi) / 2 - 0.5, "y": 1.0, "xref": "x", "yref": "paper", "text": label,
            "showarrow": False, "yanchor": "bottom", "font": {"size": 10},
            "yshift": LABEL_ROW * rows[0],
        })
        rows[0] += 1

    if title.warmup:
        region(0, min(title.warmup, n), "#f4d35e", f"warm-up ({title.warmup})")
    profiled, window = series.profiled, series.window
    if profiled:
        label = f"window [{window[0]}, {window[1]})" if window else "window"
        if window and tuple(profiled) != tuple(window):
            label += " and the profiler's warm-up step"
        region(profiled[0], min(profiled[1], n), "#ee964b", label)
    steady = series.steady
    if steady is not None:
        p10, med, p90 = steady["p10"], steady["median"], steady["p90"]
        shapes.append({
            "type": "rect", "xref": "paper", "yref": "y", "x0": 0, "x1": 1,
            "y0": p10 * 1e3, "y1": p90 * 1e3, "fillcolor": "#2a9d8f", "opacity": 0.12,
            "line": {"width": 0}, "layer": "below",
        })
        shapes.append({
            "type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1,
            "y0": med * 1e3, "y1": med * 1e3, "line": {"color": "#2a9d8f", "width": 1.5,
                                                        "dash": "dash"},
        })
        annotations.append({
            "x": 1, "y": med * 1e3, "xref": "paper", "yref": "y", "xanchor": "right",
            "yanchor": "bottom", "showarrow": False, "font": {"size": 10, "color": "#1d6b62"},
            "bgcolor": "rgba(255,255,255,0.8)",
            "text": f"steady median {fmt_sig(med, factor=1e3)} ms (p10-p90 "
                    f"{fmt_sig(p10, factor=1e3)}-{fmt_sig(p90, factor=1e3)} ms, "
                    f"{steady['n']} steps)",
        })
    heading = f"Step time over the run (rank {series.rank}, {n} steps, one point per {per})"
    yaxis: dict[str, Any] = {"title": {"text": "ms"}, "rangemode": "tozero"}
    # A few spikes (a checkpoint, a flush) in the max envelope would flatten
    # the stacked phases into a line at the bottom: the axis starts cut
    # above the bucket means, and double-clicking the chart shows it all.
    means = np.asarray(s["step"])
    top = float(np.max(s["max"])) if n else 0.0
    if n and means.size:
        usual = 1.5 * float(np.percentile(means, 99))
        if top > 3 * usual > 0:
            yaxis["range"] = [0, usual * 1e3]
            heading += (f"<br><sup>axis cut at {usual * 1e3:.3f} ms; the slowest step took "
                        f"{top * 1e3:.3f} ms (double-click the chart to see all)</sup>")
    layout = _layout(
        heading,
        xaxis={"title": {"text": "step"}, "rangeslider": {"visible": n > 200}},
        yaxis=yaxis,
        margin={"l": 60, "r": 20, "t": 70 + LABEL_ROW * max(rows[0] - 1, 0), "b": 60},
        # Below the range slider, which would otherwise cover it.
        legend={"orientation": "h", "y": -0.6 if n > 200 else -0.2},
        shapes=shapes,
        annotations=annotations,
        height=520,
    )
    return {"data": data, "layout": layout, "meta": {"points": len(x), "bucket": s["size"]}}


def heatmap_chart(medians: dict[str, Any]) -> dict[str, Any]:
    """Rank x phase: each cell's text is the rank's median ms per step in the
    phase; its colour is that time over the phase's median across ranks, so
    a rank slow in a small phase stands out as much as one slow in the
    largest (coloured by raw time, the Step column would always be hottest).
    The slowest rank per phase is boxed."""
    quantities = medians["quantities"]
    labels = [TITLES[q] for q in quantities]
    ranks = medians["ranks"]
    ms = [[None if v is None else round(v * 1e3, 4) for v in row] for row in medians["values"]]
    typical = []
    for j in range(len(quantities)):
        known = [row[j] for row in ms if row[j] is not None]
        typical.append(float(np.median(known)) if known else None)
    z = [
        [None if v is None else (round(v / typical[j], 4) if typical[j] else 1.0)
         for j, v in enumerate(row)]
        for row in ms
    ]
    text = [["-" if v is None else f"{v:.4f}" for v in row] for row in ms]
    spread = max([0.1] + [abs(v - 1.0) for row in z for v in row if v is not None])
    ylabels = [f"rank {r}" for r in ranks]
    data: list[dict[str, Any]] = [{
        "type": "heatmap", "x": labels, "y": ylabels, "z": z, "text": text,
        # Blue faster, red slower than the ranks' median; at least +-10%
        # of range, so noise between equal ranks stays pale.
        "texttemplate": "%{text}", "colorscale": "RdBu",
        "zmin": 1.0 - spread, "zmax": 1.0 + spread,
        "hoverongaps": False, "colorbar": {"title": {"text": "x median"}},
        "hovertemplate": "%{y}, %{x}: %{text} ms per step (median), %{z:.3f}x the ranks' "
                         "median<extra></extra>",
    }]
    sx, sy = [], []
    for q, r in medians["slowest"].items():
        sx.append(TITLES[q])
        sy.append(f"rank {r}")
    if sx:
        data.append({
            "type": "scatter", "mode": "markers", "x": sx, "y": sy, "name": "slowest rank",
            "marker": {"symbol": "square-open", "size": 30, "line": {"width": 2},
                       "color": "#111111"},
            "hovertemplate": "slowest in %{x}: %{y}<extra></extra>",
        })
    layout = _layout(
        "Time per step by rank and phase (median over steady steps, ms; colour: against the "
        "ranks' median; box: slowest rank)",
        yaxis={"autorange": "reversed", "type": "category"},
        xaxis={"type": "category"}, hovermode="closest", showlegend=False,
        height=max(220, 80 + 40 * len(ranks)),
    )
    return {"data": data, "layout": layout}


def _box(name: str, stats: dict[str, float], colour: Optional[str] = None) -> dict[str, Any]:
    box: dict[str, Any] = {
        "type": "box", "name": name, "x": [name],
        "q1": [round(stats["q1"] * 1e3, 4)], "median": [round(stats["median"] * 1e3, 4)],
        "q3": [round(stats["q3"] * 1e3, 4)], "lowerfence": [round(stats["min"] * 1e3, 4)],
        "upperfence": [round(stats["max"] * 1e3, 4)], "mean": [round(stats["mean"] * 1e3, 4)],
        "boxpoints": False,
    }
    if colour:
        box["marker"] = {"color": colour}
    return box


def rank_box_chart(report: Report) -> Optional[dict[str, Any]]:
    """Per-rank step-time distributions over steady steps: box = quartiles,
    whiskers = min and max, dashed = mean."""
    boxes = report.series.boxes if report.series is not None else []
    data = [_box(f"rank {rank}", stats) for rank, stats in boxes]
    if not data:
        return None
    layout = _layout(
        "Step time per rank (steady steps; box: quartiles, whiskers: min and max)",
        yaxis={"title": {"text": "ms"}}, showlegend=False, hovermode="closest", height=360,
    )
    return {"data": data, "layout": layout}


def overview_chart(window: dict[str, Any], rank: int) -> Optional[dict[str, Any]]:
    """The window's Overview Summary as bars: time per event type."""
    rows = ((window.get("ranks") or {}).get(str(rank)) or {}).get("overview") or []
    rows = [r for r in rows if isinstance(r, dict) and r.get("time")]
    if not rows:
        return None
    names = [f"{r.get('type')} ({r.get('side', 'cpu')})" for r in rows]
    data = [{
        "type": "bar", "orientation": "h", "y": names,
        "x": _ms([r.get("time") or 0.0 for r in rows]),
        "text": [f"{(r.get('ratio') or 0) * 100:.1f}%" for r in rows],
        "textposition": "auto", "marker": {"color": "#4c78a8"},
        "hovertemplate": "%{y}: %{x:.4f} ms (%{text})<extra></extra>",
    }]
    layout = _layout(
        f"Overview of the window (rank {rank}): time per event type, ms",
        yaxis={"autorange": "reversed", "type": "category"}, hovermode="closest",
        height=max(220, 60 + 28 * len(rows)), margin={"l": 170, "r": 20, "t": 50, "b": 40},
    )
    return {"data": data, "layout": layout}


def module_icicle(window: dict[str, Any], rank: int) -> Optional[dict[str, Any]]:
    """The Module Summary as an icicle: each module's width is its time
    (forward + backward, its submodules included)."""
    modules = (((window.get("ranks") or {}).get(str(rank)) or {}).get("modules") or {})
    rows = [r for r in modules.get("modules") or [] if isinstance(r, dict) and r.get("name")]
    if not rows:
        return None
    names = {r["name"] for r in rows}
    parent_of: dict[str, str] = {}
    for r in rows:
        parent = str(r.get("parent") or "")
        while parent and parent not in names:  # an ancestor never called (ModuleList)
            parent = parent.rsplit(".", 1)[0] if "." in parent else ""
        parent_of[r["name"]] = "" if parent == r["name"] else parent
    value = {r["name"]: float(r.get("total") or 0.0) for r in rows}
    children: dict[str, list[str]] = {}
    for name, parent in parent_of.items():
        children.setdefault(parent, []).append(name)

    def total(name: str) -> float:
        # "total" branch values: a parent is never narrower than its children.
        value[name] = max(value[name], sum(total(c) for c in children.get(name, [])))
        return value[name]

    for root in children.get("", []):
        total(root)
    ids = list(parent_of)
    # The boxes' sizes keep every digit (a parent must not come out
    # narrower than its children's sum); their text is rounded, as the
    # tables' figures are.
    data = [{
        "type": "icicle", "ids": ids, "labels": [n.rsplit(".", 1)[-1] for n in ids],
        "parents": [parent_of[n] for n in ids], "values": _ms([value[n] for n in ids]),
        "branchvalues": "total", "customdata": ids,
        "text": [fmt_sig(value[n], factor=1e3) for n in ids],
        "texttemplate": "%{label}<br>%{text} ms",
        "hovertemplate": "%{customdata}: %{text} ms<extra></extra>",
    }]
    layout = _layout(
        f"Modules of the window (rank {rank}): forward + backward ms, submodules inside",
        margin={"l": 10, "r": 10, "t": 50, "b": 10}, height=420,
    )
    return {"data": data, "layout": layout}


def comparison_charts(comparison: Comparison) -> list[tuple[str, dict[str, Any]]]:
    """Both runs' steady step-time distributions, and the gate's ratio with
    its interval against the threshold."""
    out: list[tuple[str, dict[str, Any]]] = []
    boxes = []
    for label, rep, colour in (
        ("baseline", comparison.base_report, "#8d99ae"),
        ("current", comparison.current_report, "#e4572e"),
    ):
        if rep is None or rep.series is None:
            continue
        stats = rep.series.box(rep.title.rank)
        if stats:
            boxes.append(_box(f"{label} ({stats['n']} steps)", stats, colour))
    if boxes:
        out.append(("compare-dist", {
            "data": boxes,
            "layout": _layout("Step time, baseline and current (steady steps; box: quartiles, "
                              "whiskers: min and max)", yaxis={"title": {"text": "ms"}},
                              showlegend=False, hovermode="closest", height=360),
        }))
    gate = comparison.gate
    if gate is not None and gate.ratio is not None:
        low = gate.low if gate.low is not None else gate.ratio
        high = gate.high if gate.high is not None else gate.ratio
        colour = {"fail": "#c1121f", "pass": "#2a9d8f"}.get(gate.verdict.value, "#f2a541")
        limit = 1.0 + gate.threshold
        data = [{
            "type": "scatter", "mode": "markers", "x": [round(gate.ratio, 5)], "y": ["step time"],
            "name": "ratio current / baseline",
            "error_x": {"type": "data", "symmetric": False,
                        "array": [round(high - gate.ratio, 5)],
                        "arrayminus": [round(gate.ratio - low, 5)], "thickness": 2, "width": 8},
            "marker": {"size": 12, "color": colour},
            "hovertemplate": "ratio %{x:.4f}<extra></extra>",
        }]
        lo_x = min(low, 1.0) - 0.02
        hi_x = max(high, limit) + 0.02
        layout = _layout(
            f"Gate: median step-time ratio {gate.ratio:.4f} (interval {low:.4f}-{high:.4f}), "
            f"threshold {limit:.4f}: {gate.verdict.value.upper()}",
            xaxis={"range": [lo_x, hi_x], "title": {"text": "current / baseline"}},
            yaxis={"type": "category"}, hovermode="closest", height=220, showlegend=False,
            shapes=[
                {"type": "line", "xref": "x", "yref": "paper", "x0": 1, "x1": 1, "y0": 0,
                 "y1": 1, "line": {"color": "#555", "dash": "dot"}},
                {"type": "line", "xref": "x", "yref": "paper", "x0": limit, "x1": limit,
                 "y0": 0, "y1": 1, "line": {"color": "#c1121f", "dash": "dash"}},
            ],
        )
        out.append(("gate", {"data": data, "layout": layout}))
    return out


# -- HTML ---------------------------------------------------------------------------


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _numeric(text: str) -> bool:
    try:
        float(text.replace("%", "").replace(",", "").strip().split(" ")[0])
        return True
    except ValueError:
        return False


def _table_html(block: TableBlock) -> str:
    many = len(block.rows) > 12
    cls = "sortable" + (" filterable" if many else "")
    parts = [f'<section class="block" id="{_esc(block.key)}"><h3>{_esc(block.title)}</h3>']
    for info in block.info:
        parts.append(f'<p class="info">{_esc(info)}</p>')
    if many:
        parts.append(f'<input class="filter" type="search" placeholder="filter {len(block.rows)}'
                     f' rows" data-table="t-{_esc(block.key)}">')
    parts.append(f'<table class="{cls}" id="t-{_esc(block.key)}"><thead><tr>')
    for c in block.columns:
        parts.append(f'<th class="{"l" if c.align == "left" else "r"}">{_esc(c.header)}</th>')
    parts.append("</tr></thead><tbody>")
    for i, row in enumerate(block.rows):
        attrs = ' class="strong"' if i in block.strong else ""
        parts.append(f"<tr{attrs}>")
        for c, cell in zip(block.columns, row):
            indent = len(cell) - len(cell.lstrip(" "))
            style = f' style="padding-left:{0.4 + indent * 0.5:.1f}em"' if indent else ""
            align = "l" if c.align == "left" else "r"
            parts.append(f'<td class="{align}"{style}>{_esc(cell.strip())}</td>')
        parts.append("</tr>")
    parts.append("</tbody></table>")
    for line in block.footer:
        parts.append(f'<p class="info">{_esc(line)}</p>')
    parts.append("</section>")
    return "".join(parts)


def _lines_html(block: LinesBlock) -> str:
    title = f"<h3>{_esc(block.title)}</h3>" if block.title else ""
    items = "".join(f"<li>{_esc(line)}</li>" for line in block.lines)
    tag = "ul" if block.bullets else "ul class=\"plain\""
    return (f'<section class="block {block.level}" id="{_esc(block.key)}">{title}'
            f"<{tag}>{items}</ul></section>")


def _title_html(block: TitleBlock) -> str:
    rows = "".join(
        f"<tr><th>{_esc(k)}</th><td>{'<code>' + _esc(v) + '</code>' if k in block.code_labels else _esc(v)}</td></tr>"  # noqa: E501
        for k, v in block.entries
    )
    return f'<section class="block" id="title"><table class="kv">{rows}</table></section>'


def blocks_html(items: Sequence[Block]) -> str:
    out = []
    for block in items:
        if isinstance(block, TitleBlock):
            out.append(_title_html(block))
        elif isinstance(block, LinesBlock):
            out.append(_lines_html(block))
        else:
            out.append(_table_html(block))
    return "\n".join(out)


def _chart_div(key: str, spec: dict[str, Any]) -> str:
    payload = json.dumps({"data": spec["data"], "layout": spec["layout"]}, allow_nan=False,
                         separators=(",", ":"))
    # `</` inside a script element would end it early.
    payload = payload.replace("</", "<\\/")
    return (f'<div class="chart" id="chart-{_esc(key)}"></div>'
            f'<script type="application/json" class="chart-spec" data-target="chart-{_esc(key)}">'
            f"{payload}</script>")


#: RFC 1924's base-85 alphabet (Python's b85encode) with `<` written as
#: `.`, which the alphabet lacks: no `<` in the page's data, so nothing in
#: it can end or confuse the element that holds it.
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
B85_PAGE = _B85.replace("<", ".")


def cache_dir() -> str:
    """Where perfrun keeps what it can make again: $XDG_CACHE_HOME/perfrun,
    else ~/.cache/perfrun."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "perfrun")


@functools.lru_cache(maxsize=4)
def _packed(path: str, mtime: float, size: int) -> str:
    """The bundle packed (see plotly_bundle), from the cache when this very
    file (its path, modification time and size) was packed before: packing
    costs about 0.3 s, reading it back (and checking its SHA-256, the
    file's first line) a few milliseconds. A cache that cannot be read or
    written, or fails its check, costs the packing only."""
    key = hashlib.sha256(f"{path}\0{mtime}\0{size}".encode()).hexdigest()[:16]
    cached = os.path.join(cache_dir(), f"plotly-{key}.b85")
    try:
        with open(cached, encoding="ascii") as f:
            digest, _, text = f.read().partition("\n")
        if text and hashlib.sha256(text.encode("ascii")).hexdigest() == digest:
            return text
    except (OSError, UnicodeDecodeError):
        pass
    data = gzip.compress(_read(path), compresslevel=9, mtime=0)
    text = base64.b85encode(data).decode("ascii").translate(str.maketrans("<", "."))
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        tmp = f"{cached}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(hashlib.sha256(text.encode("ascii")).hexdigest() + "\n" + text)
        os.replace(tmp, cached)
    except OSError:
        pass
    return text


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def plotly_bundle() -> str:
    """plotly's own minified bundle, from the installed plotly package (no
    network; no import of plotly's Python side, which is slow to load),
    gzipped and written in base 85 (B85_PAGE), which the page's script
    decodes and hands to the browser's DecompressionStream.

    Why: the bundle is 4.8 MB, and every run folder holds a page. Gzipped it
    is 1.5 MB, and base 85 (a quarter more, where base 64 adds a third)
    keeps the page under 2 MB, still one file that opens offline. Made once
    per installed bundle (about 0.3 s) and kept in the cache (cache_dir)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise RuntimeError("the plotly package is not installed (pip install plotly)")
    path = os.path.join(os.path.dirname(spec.origin), "package_data", "plotly.min.js")
    st = os.stat(path)
    return _packed(path, st.st_mtime, st.st_size)


CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1em 1.5em;color:#222}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-top:.6em}
h3{font-size:1em;margin:.8em 0 .3em}nav a{margin-right:1em}
table{border-collapse:collapse;font-size:.85em;margin:.3em 0}
td,th{padding:.15em .6em;border-bottom:1px solid #eee;white-space:nowrap}
th{background:#f5f5f5;cursor:pointer;position:sticky;top:0}
table.kv th{cursor:default;text-align:left}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}td.l,th.l{text-align:left}
tr.strong td{font-weight:600}.info{color:#555;font-size:.85em;margin:.2em 0}
.warning{border-left:4px solid #f2a541;padding-left:.6em}
.error{border-left:4px solid #c1121f;padding-left:.6em}
.verdict{font-size:1.1em;font-weight:600;padding:.5em;border-radius:4px}
.verdict.pass{background:#e0f2ef}.verdict.fail{background:#fbe0e0}
.verdict.inconclusive,.verdict.none{background:#fdf1dc}
.chart{width:100%;min-height:200px}.scroll{overflow-x:auto}
input.filter{margin:.2em 0;padding:.2em;width:20em}ul.plain{list-style:none;padding-left:0}
code{background:#f3f3f3;padding:0 .2em;word-break:break-all}
#js-errors{color:#c1121f}
"""

SCRIPT = """
(function(){
  var errors = document.getElementById('js-errors');
  window.addEventListener('error', function(e){
    errors.textContent += 'JS error: ' + e.message + '\\n';
  });
  // plotly's bundle, gzipped in base 85 (html.py, plotly_bundle): decoded
  // here, inflated by the browser's own DecompressionStream, then run.
  function unpack(text){
    var alphabet = 'B85_PAGE', value = new Uint8Array(128);
    for (var k = 0; k < 85; k++) value[alphabet.charCodeAt(k)] = k;
    var n = text.length, rest = n % 5, whole = n - rest;
    var out = new Uint8Array(whole / 5 * 4 + (rest ? rest - 1 : 0)), o = 0;
    function group(i, len){
      var x = 0;
      for (var j = 0; j < 5; j++) x = x * 85 + (j < len ? value[text.charCodeAt(i + j)] : 84);
      return [x >>> 24, (x >>> 16) & 255, (x >>> 8) & 255, x & 255];
    }
    for (var i = 0; i < whole; i += 5) {
      var b = group(i, 5);
      out[o] = b[0]; out[o + 1] = b[1]; out[o + 2] = b[2]; out[o + 3] = b[3]; o += 4;
    }
    if (rest) { var t = group(whole, rest); for (var m = 0; m < rest - 1; m++) out[o++] = t[m]; }
    return out;
  }
  function loadPlotly(){
    if (typeof DecompressionStream === 'undefined')
      return Promise.reject(new Error('this browser cannot unpack the charts (no ' +
        'DecompressionStream): open the page in a current Chrome, Firefox or Safari'));
    var packed = document.getElementById('plotly-packed');
    var stream = new Blob([unpack(packed.textContent)]).stream()
      .pipeThrough(new DecompressionStream('gzip'));
    return new Response(stream).text().then(function(code){
      var el = document.createElement('script');
      el.textContent = code;
      document.head.appendChild(el);
    });
  }
  var specs = document.querySelectorAll('script.chart-spec');
  var drawn = 0;
  function draw(){
    specs.forEach(function(el){
      try {
        var spec = JSON.parse(el.textContent);
        Plotly.newPlot(el.dataset.target, spec.data, spec.layout,
                       {responsive: true, displaylogo: false});
        drawn += 1;
      } catch (e) { errors.textContent += 'chart ' + el.dataset.target + ': ' + e + '\\n'; }
    });
  }
  function cellValue(td){
    var t = td.textContent.trim(), v = parseFloat(t.replace(/[,%]/g, ''));
    return isNaN(v) ? t.toLowerCase() : v;
  }
  document.querySelectorAll('table.sortable').forEach(function(table){
    table.querySelectorAll('th').forEach(function(th, col){
      th.title = 'sort';
      th.addEventListener('click', function(){
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var dir = th.dataset.dir === 'desc' ? 1 : -1; th.dataset.dir = dir < 0 ? 'desc' : 'asc';
        rows.sort(function(a, b){
          var x = cellValue(a.cells[col]), y = cellValue(b.cells[col]);
          if (typeof x !== typeof y) return typeof x === 'number' ? -1 : 1;
          return x < y ? -dir : x > y ? dir : 0;
        });
        rows.forEach(function(r){ body.appendChild(r); });
      });
    });
  });
  document.querySelectorAll('input.filter').forEach(function(input){
    input.addEventListener('input', function(){
      var q = input.value.toLowerCase();
      var table = document.getElementById(input.dataset.table);
      Array.prototype.forEach.call(table.tBodies[0].rows, function(r){
        r.style.display = r.textContent.toLowerCase().indexOf(q) >= 0 ? '' : 'none';
      });
    });
  });
  function done(){
    document.body.setAttribute('data-charts', specs.length);
    document.body.setAttribute('data-charts-drawn', drawn);
    document.body.setAttribute('data-ready', '1');
  }
  (specs.length ? loadPlotly().then(draw) : Promise.resolve())
    .catch(function(e){ errors.textContent += 'charts: ' + e.message + '\\n'; })
    .then(done);
})();
"""


def _page(title: str, sections: list[tuple[str, str, str]]) -> str:
    nav = " ".join(f'<a href="#{_esc(k)}">{_esc(h)}</a>' for k, h, _ in sections if h)
    body = "\n".join(
        f'<section id="{_esc(k)}"><h2>{_esc(h)}</h2>{content}</section>' if h else content
        for k, h, content in sections
    )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width\"><title>{_esc(title)}</title>"
        f"<style>{CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1><nav>{nav}</nav><pre id=\"js-errors\"></pre>\n{body}\n"
        f'<script type="application/octet-stream" id="plotly-packed">{plotly_bundle()}</script>'
        f"<script>{SCRIPT.replace('B85_PAGE', B85_PAGE)}</script></body></html>\n"
    )


def _environment_html(report: Report) -> str:
    rows = []
    for key, value in report.environment.items():
        if value in (None, [], {}, ""):
            continue
        if isinstance(value, (list, dict)):
            value = json.dumps(value, sort_keys=True)
        rows.append(f"<tr><th>{_esc(key)}</th><td><code>{_esc(value)}</code></td></tr>")
    return f'<table class="kv" id="fingerprint">{"".join(rows)}</table>'


def _trace_html(report: Report, base_dir: Optional[str]) -> str:
    """A link to each rank's window trace, relative to where the page is
    written (so the run folder can be copied whole), and the one command
    that opens it in Perfetto's UI."""
    if report.window is None or report.series is None:
        return ""
    lines = []
    for rank, trace in report.series.traces:
        path = os.path.join(report.title.run_dir, trace)
        href = os.path.relpath(path, base_dir) if base_dir else "file://" + os.path.abspath(path)
        lines.append(
            f'<li>rank {rank}: <a href="{_esc(href)}">{_esc(trace)}</a> — open '
            f'<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> and drop the file on it, '
            f"or from a shell: <code>curl -LO https://raw.githubusercontent.com/google/perfetto/"
            f"main/tools/open_trace_in_ui &amp;&amp; python3 open_trace_in_ui -i "
            f"{_esc(os.path.abspath(path))}</code></li>"
        )
    return f'<ul id="traces">{"".join(lines)}</ul>' if lines else ""


def _split(items: list[Block]) -> dict[str, list[Block]]:
    """The report's blocks by where they go on the page."""
    groups: dict[str, list[Block]] = {"title": [], "summary": [], "ranks": [], "window": [],
                                      "advice": [], "rest": []}
    summary_keys = {"perf", "model", "device", "memory", "problem"}
    for b in items:
        key = getattr(b, "key", None)
        if isinstance(b, TitleBlock) or key == "disturbed":
            groups["title"].append(b)
        elif key in summary_keys or (key or "").startswith("pipeline"):
            groups["summary"].append(b)
        elif key == "ranks":
            groups["ranks"].append(b)
        elif key == "advice":
            groups["advice"].append(b)
        elif key in ("extras", "problems", "faults", "notes"):
            groups["rest"].append(b)
        else:  # the detailed window's tables and notes (window_blocks.py)
            groups["window"].append(b)
    return groups


def _advice_html(report: Report) -> str:
    """Each piece of advice with the numbers it quotes (its evidence)."""
    out = []
    for a in report.advice:
        if not a.evidence:
            continue
        d = a.to_dict()
        actions = "".join(f"<li>{_esc(x)}</li>" for x in d.get("actions") or [])
        evidence = json.dumps(finite(d.get("evidence")), sort_keys=True, indent=1)
        out.append(
            f'<div class="advice"><h3>{_esc(d.get("title"))}</h3><p>{_esc(d.get("message"))}</p>'
            f"<p>Try:</p><ul>{actions}</ul><details><summary>the numbers it rests on"
            f"</summary><pre>{_esc(evidence)}</pre></details></div>"
        )
    return "".join(out) or "<p>No advice: nothing stood out.</p>"


def render_html(report: Report, base_dir: Optional[str] = None,
                comparison: Optional[Comparison] = None) -> str:
    """The whole page of one run (with a comparison, when the run was
    gated). `base_dir` is the folder the page will be written to, for
    relative links to the trace files; None for absolute ones."""
    if report.series is None:
        raise ValueError("the page draws the report's series: build the report with "
                         "series=True")
    # The page's tables sort, filter and scroll: every row, whole names.
    view = dict(report.view, name_width=4096,
                row_limit=max(int(report.view.get("row_limit") or 0), HTML_ROW_LIMIT))
    groups = _split(blocks(report, view))
    sections: list[tuple[str, str, str]] = [("head", "", blocks_html(groups["title"]))]
    if comparison is not None:
        sections.append(("compare", "Comparison with the baseline", comparison_body(comparison)))
    chart = step_chart(report)
    if chart is not None:
        sections.append(("steps", "Step time over the run", _chart_div("steps", chart)))
    memory = memory_chart(report)
    if memory is not None:
        sections.append(("memory-run", "Memory over the run", _chart_div("memory", memory)))
    sections.append(("summary", "Summaries", blocks_html(groups["summary"])))
    medians = report.series.medians if report.series is not None else {}
    if len(medians.get("ranks") or ()) > 1:
        parts = [_chart_div("heatmap", heatmap_chart(medians)), _medians_table(medians)]
        box = rank_box_chart(report)
        if box is not None:
            parts.append(_chart_div("rank-box", box))
        parts.append(blocks_html(groups["ranks"]))
        sections.append(("ranks", "Ranks", "".join(parts)))
    if report.window is not None:
        window = report.window.to_dict()
        rank = report.title.rank
        parts = []
        for key, spec in (("overview", overview_chart(window, rank)),
                          ("modules", module_icicle(window, rank))):
            if spec is not None:
                parts.append(_chart_div(key, spec))
        parts.append(_trace_html(report, base_dir))
        parts.append(f'<div class="scroll">{blocks_html(groups["window"])}</div>')
        sections.append(("window", "Detailed window", "".join(parts)))
    sections.append(("advice", "Advice", _advice_html(report)))
    if groups["rest"]:
        sections.append(("more", "Outside the steps, notes", blocks_html(groups["rest"])))
    sections.append(("environment", "Environment", _environment_html(report)))
    return _page("perfrun report", sections)


def _medians_table(medians: dict[str, Any]) -> str:
    """The heatmap's numbers as a table (sortable, and readable without the
    chart)."""
    head = "".join(f'<th class="r">{_esc(TITLES[q])}</th>' for q in medians["quantities"])
    rows = []
    for r, values in zip(medians["ranks"], medians["values"]):
        cells = []
        for q, v in zip(medians["quantities"], values):
            mark = " *" if medians["slowest"].get(q) == r else ""
            text = "-" if v is None else f"{v * 1e3:.4f}"
            cells.append(f'<td class="r" data-q="{q}">{text}{mark}</td>')
        rows.append(f'<tr data-rank="{r}"><td class="l">rank {r}</td>{"".join(cells)}</tr>')
    return (
        '<h3>Median ms per step (* slowest rank in the phase)</h3>'
        f'<table class="sortable" id="rank-medians"><thead><tr><th class="l">Rank</th>{head}'
        f'</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def comparison_body(comparison: Comparison) -> str:
    gate = comparison.gate
    kind = "none" if gate is None else gate.verdict.value
    if comparison.problem:
        kind = "fail"
    parts = [f'<p class="verdict {kind}" id="verdict">{_esc(verdict_line(comparison))}</p>']
    for key, spec in comparison_charts(comparison):
        parts.append(_chart_div(key, spec))
    items = [b for b in comparison_blocks(comparison) if not isinstance(b, TitleBlock)
             and getattr(b, "key", "") != "verdict"]
    parts.append(blocks_html(items))
    return "".join(parts)


def render_comparison_html(comparison: Comparison) -> str:
    """`perfrun compare --format html`: the comparison, then the current
    run's environment."""
    head = TitleBlock("perfrun compare", [("Baseline", comparison.base_label),
                                          ("Current", comparison.current_label)],
                      code_labels=("Baseline", "Current"))
    sections = [("head", "", blocks_html([head])),
                ("compare", "Comparison", comparison_body(comparison))]
    current = comparison.current_report
    if current is not None and current.title.rank is not None:
        sections.append(("environment", "Environment (current run)",
                         _environment_html(current)))
    return _page("perfrun compare", sections)


def write_run_html(report: Report, comparison: Optional[Comparison] = None) -> str:
    """Write the page into the report's run folder (`report.html`,
    atomically: a reader never sees half a page) and return its path."""
    page = render_html(report, report.title.run_dir, comparison=comparison)
    path = os.path.join(report.title.run_dir, REPORT_FILE)
    atomic_write_text(path, page)
    return path
