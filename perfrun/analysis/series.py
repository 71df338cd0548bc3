"""What the page draws, as numbers: the step time over the whole run, each
rank's medians and distribution, the traces to open.

report.html (perfrun/report/html.py) draws the run where a table cannot
show it: every step with its phases stacked, ranks side by side, two
distributions of a comparison. Computed here, with the rest of the Report,
the page needs nothing but the Report, and its figures are taken over the
same counted steps as the tables' (selection.py).

A run of 10^6 steps would make a per-step plot of tens of MB. Past
MAX_BUCKETS steps, consecutive steps are grouped into equal buckets: the
stacked phases are each bucket's mean (so they still add up to its mean
step time) and the step time's min and max in each bucket are kept as an
envelope, so a single slow step is never averaged away. Distributions are
kept as their quartiles, never as the points. The buckets are taken as the
pass over a rank's steps reads them (rankpass.py), a block of whole
buckets at a time, so the series costs no second read of the rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from perfrun.analysis import columns, digest
from perfrun.analysis.rankpass import Block, RankPass
from perfrun.analysis.selection import Counted, profiled_steps, rank_counted, rank_window
from perfrun.store.rankfile import RankResult
from perfrun.store.stepfile import COL, PHASES

#: At most this many points per series in the step-time chart: beyond it,
#: buckets of consecutive steps (mean phases, min / max envelope). 2,000
#: points is about the width of a screen in pixels, so no detail a reader
#: could see is lost, and a 10^6-step run adds ~0.5 MB to the page.
MAX_BUCKETS = 2000
#: The quantities stacked in the step chart: the phases, then Others.
QUANTITIES = (*PHASES, "others")
#: The quantities of each rank's medians: those, then the whole step.
MEDIAN_QUANTITIES = (*QUANTITIES, "step")


def bucket_size(n: int, max_points: int = MAX_BUCKETS) -> int:
    """Steps per point of the step chart of `n` steps."""
    return max(1, math.ceil(n / max_points)) if n else 1


def step_series(table: Any, max_points: int = MAX_BUCKETS) -> dict[str, Any]:
    """Per-step (or per-bucket) series of one rank's steps for the chart.

    Returns `x` (each point's first step index), `size` (steps per bucket,
    1 when every step is drawn), the mean of each phase and of Others, the
    step time's mean, min and max, and per point the time set aside from
    the steps (`excluded`: eval passes, DataLoader start-up, end of data,
    the profiler) summed, with the number of steps that had any. Bucket
    means of the phases add up to the bucket's mean step time, as each
    step's phases add up to its time.
    """
    n = int(table.shape[0])
    size = bucket_size(n, max_points)
    step = columns.step_times(table)
    parts = {p: columns.phase_times(table, p) for p in PHASES}
    part = series_part(0, step, parts, columns.others_times(table, step), table, size)
    return join_series([part], n, size)


def series_part(lo: int, step: Any, phases: dict[str, Any], others: Any, table: Any,
                size: int) -> dict[str, Any]:
    """step_series of steps lo.. (`table`, with their times `step`, `phases`
    and `others`: columns.py), in buckets of `size` steps; `lo` is a multiple
    of `size`. A bucket's figures are its own steps' alone, so the parts of
    a pass over the steps a block at a time join (join_series) into the
    series of them all, to the last digit."""
    n = int(table.shape[0])
    parts = dict(phases, others=others)
    excluded = columns.num(table[:, COL["excluded"]])
    if size == 1:
        return {
            "phases": parts,
            "step": step,
            "excluded": excluded,
            "excluded_steps": (excluded > 0).astype(np.int64),
        }
    starts = np.arange(0, n, size)
    counts = np.diff(np.append(starts, n)).astype(np.float64)

    def mean(values: Any) -> Any:
        return np.add.reduceat(values, starts) / counts

    return {
        "x": (lo + starts).tolist(),
        "phases": {k: mean(v) for k, v in parts.items()},
        "step": mean(step),
        "min": np.minimum.reduceat(step, starts),
        "max": np.maximum.reduceat(step, starts),
        "excluded": np.add.reduceat(excluded, starts),
        "excluded_steps": np.add.reduceat((excluded > 0).astype(np.int64), starts),
    }


def join_series(parts: Sequence[dict[str, Any]], n: int, size: int) -> dict[str, Any]:
    """The series_part of consecutive blocks of `n` steps as step_series."""

    def joined(key: str) -> Any:
        arrays = [p[key] for p in parts]
        if len(arrays) == 1:
            return arrays[0]
        return np.concatenate(arrays) if arrays else np.empty(0)

    def joined_phase(key: str) -> Any:
        arrays = [p["phases"][key] for p in parts]
        if len(arrays) == 1:
            return arrays[0]
        return np.concatenate(arrays) if arrays else np.empty(0)

    phases = {k: joined_phase(k) for k in QUANTITIES}
    if size == 1:
        step = joined("step")
        return {
            "x": list(range(n)),
            "size": 1,
            "n": n,
            "phases": phases,
            "step": step,
            "min": step,
            "max": step,
            "excluded": joined("excluded"),
            "excluded_steps": joined("excluded_steps"),
        }
    return {
        "x": [x for p in parts for x in p["x"]],
        "size": size,
        "n": n,
        "phases": phases,
        "step": joined("step"),
        "min": joined("min"),
        "max": joined("max"),
        "excluded": joined("excluded"),
        "excluded_steps": joined("excluded_steps"),
    }


class SeriesSink:
    """A pass's sink (rankpass.py) that gathers step_series of a rank's
    steps a block at a time: the pass's blocks hold whole buckets."""

    def __init__(self, n: int, max_points: int = MAX_BUCKETS) -> None:
        self.n = n
        self.size = bucket_size(n, max_points)
        self.parts: list[dict[str, Any]] = []

    def __call__(self, block: Block) -> None:
        self.parts.append(series_part(block.lo, block.step, block.phases, block.others,
                                      block.table, self.size))

    def series(self) -> dict[str, Any]:
        return join_series(self.parts, self.n, self.size)


def box_stats(values: Any) -> Optional[dict[str, float]]:
    """Quartiles, median, mean, min and max of `values` (seconds): a box
    plot drawn from these costs the same for 10 steps as for 10^7.
    `values`: an array, or a Digest (analysis/digest.py)."""
    if isinstance(values, digest.Digest):
        if not values.n:
            return None
        q1, med, q3 = digest.percentiles(values, [25, 50, 75])
        return {"min": values.lo, "q1": q1, "median": med, "q3": q3, "max": values.hi,
                "mean": float(values.total / values.n), "n": values.n}
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return None
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return {
        "min": float(arr.min()),
        "q1": float(q1),
        "median": float(med),
        "q3": float(q3),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
        "n": int(arr.size),
    }


def _medians(steps: RankPass, counted: Counted) -> list[Optional[float]]:
    """A rank's median time per step in each of MEDIAN_QUANTITIES, over its
    `counted` steps; None where it has none. Medians, not means: one slow
    step (a checkpoint, a GC pause) must not make a rank look slow in a
    phase."""
    if not counted.count:
        return [None] * len(MEDIAN_QUANTITIES)
    return [steps.median(q, counted) for q in MEDIAN_QUANTITIES]


def medians_of(ranks: Sequence[int], values: Sequence[Sequence[Optional[float]]]
               ) -> dict[str, Any]:
    """Every rank's medians (`values`, ranks x MEDIAN_QUANTITIES) as the page
    draws them: `ranks`, `quantities`, `values` (seconds, None where a rank
    has no counted step) and `slowest` (quantity -> rank), the rank with the
    highest median per quantity when there are several ranks."""
    quantities = list(MEDIAN_QUANTITIES)
    slowest: dict[str, int] = {}
    if len(ranks) > 1:
        for j, q in enumerate(quantities):
            known = [(v[j], r) for r, v in zip(ranks, values) if v[j] is not None]
            if known and max(known)[0] > 0:
                slowest[q] = max(known)[1]
    return {"ranks": list(ranks), "quantities": quantities, "values": [list(v) for v in values],
            "slowest": slowest}


@dataclass
class PageSeries:
    """The page's numbers of one run (seconds throughout)."""

    #: The reference rank (the one the summaries show) and its steps'
    #: series (step_series), None when it recorded no step.
    rank: Optional[int] = None
    steps: Optional[dict[str, Any]] = None
    #: The steps torch.profiler ran over, and the window, of that rank.
    profiled: Optional[tuple[int, int]] = None
    window: Optional[tuple[int, int]] = None
    #: p10, median and p90 of its counted steps' times, and how many.
    steady: Optional[dict[str, float]] = None
    #: Every other rank's step series: (rank, step_series).
    others: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: medians_of every rank, and each rank's step-time distribution.
    medians: dict[str, Any] = field(default_factory=dict)
    boxes: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    #: Each rank's window trace, relative to the run folder: (rank, path).
    traces: list[tuple[int, str]] = field(default_factory=list)

    def box(self, rank: Optional[int]) -> Optional[dict[str, float]]:
        return next((b for r, b in self.boxes if r == rank), None)


def add_rank(out: PageSeries, rank: RankResult, steps: RankPass, series: dict[str, Any],
             is_ref: bool, warmup: int, exclude_window: bool) -> list[Optional[float]]:
    """One rank's part of the page, added to `out`, from the pass over its
    steps (rankpass.py) and the series its SeriesSink gathered on the way;
    its medians returned (for medians_of, once every rank is in).
    `is_ref`: the reference rank (the one the summaries show), `warmup` and
    `exclude_window` the rule its summaries were counted by. build_report
    makes one pass over each rank for every figure, and hands each here
    before it lets the rank's steps go: a report over many long ranks holds
    one rank at a time."""
    counted = rank_counted(rank, warmup, exclude_window=exclude_window)
    times = steps.times("step", counted)
    stats = box_stats(times)
    if stats:
        out.boxes.append((rank.rank, stats))
    summary = rank.data.get("window_summary")
    trace = summary.get("trace") if isinstance(summary, dict) else None
    if trace:
        out.traces.append((rank.rank, str(trace)))
    medians = _medians(steps, counted)
    if not rank.n_steps:
        return medians
    if not is_ref:
        out.others.append((rank.rank, {"x": series["x"], "step": series["step"]}))
        return medians
    out.steps = series
    out.profiled, out.window = profiled_steps(rank), rank_window(rank)
    if digest.size(times):
        p10, med, p90 = digest.percentiles(times, [10, 50, 90])
        out.steady = {"p10": p10, "median": med, "p90": p90, "n": digest.size(times)}
    return medians
