"""The Report as an experiment tracker holds a run's summary: flat numbers
by key (`perfrun/summary/...`, beside the series the rank logged under
`perfrun/`), a few words (the advice's kinds, where the results are), and
a short Markdown table for a tracker that shows text (TensorBoard).

Only what was measured: a figure the report does not have (no FLOPs
counted, no peak for MFU, no samples known) is left out, never logged
as 0. The launcher hands these to the runs the script opened
(launcher/trackers.py).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from perfrun.analysis.report import Report

PREFIX = "perfrun/summary/"


def summary_figures(report: Report) -> dict[str, float]:
    """The run's summary numbers: medians of the step and of each phase
    (milliseconds), the Reader Ratio and MFU (percent), steps/s and
    samples/s, achieved TFLOP/s, the reference rank's peak memory (GiB),
    the steps counted and the warm-up left out."""
    out: dict[str, Optional[float]] = {
        "steps": report.title.steps_counted,
        "warmup": report.title.warmup,
    }
    perf = report.perf
    if perf is not None:
        out["step_time_ms"] = _ms(perf.batch_cost.median)
        out["dataloader_ms"] = _ms(perf.reader_cost.median)
        out["reader_ratio_pct"] = None if perf.reader_ratio is None else perf.reader_ratio * 100
        out["ips"] = perf.ips.avg
        out["samples_per_s"] = perf.samples_ips.avg if perf.samples_ips is not None else None
    model = report.model
    if model is not None:
        for row in model.rows:
            if row.name in ("Forward", "Backward", "Optimization"):
                out[f"{row.name.lower()}_ms"] = _ms(row.cpu.median)
            if row.is_step and row.gpu is not None:
                out["gpu_ms"] = _ms(row.gpu.median)
    flops = report.flops
    if flops is not None and flops.counted:
        # The job's rate over several ranks, else the step's own row.
        rate: Any = flops.job or next((p for p in flops.phases if p.basis == "wall"), None)
        if rate is not None:
            out["tflops"] = None if rate.achieved is None else rate.achieved / 1e12
            out["mfu_pct"] = None if rate.mfu is None else rate.mfu * 100
    memory = report.memory
    if memory is not None:
        ranks = [p for p in memory.processes if p.kind == "rank"]
        if ranks:
            out["rss_peak_gib"] = ranks[0].peak / 2**30
    return {PREFIX + k: float(v) for k, v in out.items()
            if v is not None and math.isfinite(float(v))}


def advice_kinds(report: Report) -> str:
    """The kinds of the report's advice, in its order, or "none"."""
    kinds = list(dict.fromkeys(a.kind for a in report.advice))
    return ",".join(kinds) if kinds else "none"


def summary_words(report: Report) -> dict[str, str]:
    """What is not a number: the advice's kinds and the results folder."""
    return {"perfrun/advice": advice_kinds(report), "perfrun/results": report.title.run_dir}


def summary_markdown(report: Report, page: Optional[str]) -> str:
    """The summary as a Markdown table, with the advice and where the
    report is: what TensorBoard's text tab shows."""
    figures = summary_figures(report)
    lines = ["| figure | value |", "| --- | --- |"]
    for key, value in figures.items():
        lines.append(f"| {key[len(PREFIX):]} | {_shown(value)} |")
    lines += ["", f"advice: {advice_kinds(report)}"]
    for advice in report.advice:
        lines.append(f"- {advice.kind}: {advice.message}")
    lines += ["", f"results: {report.title.run_dir}"]
    if page:
        lines.append(f"report: {page}")
    return "\n".join(lines) + "\n"


def _ms(seconds: Any) -> Optional[float]:
    return None if seconds is None else float(seconds) * 1000.0


def _shown(value: float) -> str:
    return f"{value:.4g}" if value != int(value) else str(int(value))
