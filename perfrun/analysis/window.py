"""The detailed window's part of the report: pure functions over the rank
files' `window_summary` sections (written by runtime/window.py from the
profiler trace) and their step rows."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from perfrun.analysis import digest
from perfrun.analysis.rankpass import RankPass, read_pass
from perfrun.analysis.selection import Counted, rank_counted, steps_range
from perfrun.analysis.summary import ModelSummary, model_summary
from perfrun.analysis.trace import summarize
from perfrun.store.layout import nsys_report
from perfrun.store.rankfile import RankResult

# --sort-by key -> the field of a table row it sorts on (descending, except name).
SORT_FIELDS = {
    "cpu-total": "total",
    "cpu-avg": "avg",
    "cpu-max": "max",
    "cpu-min": "min",
    "gpu-total": "gpu_total",
    "gpu-avg": "gpu_avg",
    "gpu-max": "gpu_max",
    "gpu-min": "gpu_min",
    "calls": "calls",
    "name": "name",
}
# Tables whose rows carry only one kind of time (kernels: GPU only; user
# ranges: CPU only) sort the other kind's keys on the time they have.
_SAME_KIND = {"gpu_total": "total", "gpu_avg": "avg", "gpu_max": "max", "gpu_min": "min"}


def sort_rows(rows: Sequence[dict[str, Any]], sort_by: str) -> list[dict[str, Any]]:
    key = SORT_FIELDS.get(sort_by, "total")
    if key == "name":
        return sorted(rows, key=lambda r: str(r.get("name", "")))
    if rows and all(r.get(key) is None for r in rows):
        key = _SAME_KIND.get(key, key)
        if all(r.get(key) is None for r in rows):
            key = "total"
    return sorted(rows, key=lambda r: (-(r.get(key) or 0.0), str(r.get("name", ""))))


@dataclass
class RankWindow:
    rank: int
    summary: dict[str, Any]


#: How far the trace's time for a phase (its ranges) may be from the step
#: table's over the same steps before the difference is shown: the two read
#: their clocks a few statements apart at each edge (perfrun's clock, then
#: the profiler's range), so each call may differ by that much.
UNTRACED_PER_CALL = 100e-6
UNTRACED_RATIO = 0.01


def untraced(model: ModelSummary, overview: Sequence[dict[str, Any]]) -> list[str]:
    """Where the window's Overview (the trace's phase ranges) and its Model
    Summary (the step rows over the same steps) disagree on a row by more
    than the clocks' difference: time the step table counts that no trace
    event covers (the process descheduled, or paused, between perfrun's
    clock and the profiler's range at an edge). One line per row, said as
    such rather than left as two numbers that do not agree."""
    times = {o.get("type"): o for o in overview}
    out = []
    for row in model.rows:
        o = times.get(row.name)
        if o is None or not row.calls:
            continue
        steps_time, trace_time = row.cpu.total, float(o.get("time") or 0.0)
        gap = steps_time - trace_time
        if abs(gap) <= max(UNTRACED_PER_CALL * row.calls, UNTRACED_RATIO * steps_time):
            continue
        if gap > 0:
            out.append(
                f"{row.name}: the step table counts {gap * 1e3:.3f} ms more than the trace's "
                f"ranges over the same steps ({steps_time * 1e3:.3f} vs {trace_time * 1e3:.3f} "
                "ms): time with no trace event at the phase's edges (the process was "
                "descheduled or paused between perfrun's clock and the profiler's range)"
            )
        else:
            out.append(
                f"{row.name}: the trace's ranges hold {-gap * 1e3:.3f} ms more than the step "
                f"table over the same steps ({trace_time * 1e3:.3f} vs {steps_time * 1e3:.3f} "
                "ms): the step table gave that time to a neighbouring phase or to Others"
            )
    return out


#: The least steps inside the window, and outside it, for the profiler's
#: overhead to be quoted.
OVERHEAD_MIN_INSIDE = 3
OVERHEAD_MIN_OUTSIDE = 10


@dataclass
class WindowReport:
    window: tuple[int, int]
    ranks: list[RankWindow] = field(default_factory=list)
    model: Optional[ModelSummary] = None
    window_median: Optional[float] = None
    outside_median: Optional[float] = None
    #: How many steps each median is over, and the steps outside's own
    #: spread (half their interquartile range over their median).
    window_count: int = 0
    outside_count: int = 0
    outside_spread: Optional[float] = None
    warnings: list[str] = field(default_factory=list)
    #: What the window is, where it is not steps [START, END) of a run
    #: (`perfrun analyze`: the trace's own steps).
    label: Optional[str] = None
    #: Lines about where the data came from (the tables' info lines).
    notes: list[str] = field(default_factory=list)

    @property
    def overhead(self) -> Optional[float]:
        """How much slower the window's steps were than the steps outside
        it: the profiler's own cost, measured (0.25 = 25% slower). None
        from too few steps on either side (OVERHEAD_MIN_INSIDE,
        OVERHEAD_MIN_OUTSIDE): a median of two steps against one is noise."""
        if not self.window_median or not self.outside_median:
            return None
        if (self.window_count < OVERHEAD_MIN_INSIDE
                or self.outside_count < OVERHEAD_MIN_OUTSIDE):
            return None
        return self.window_median / self.outside_median - 1.0

    @property
    def overhead_measurable(self) -> bool:
        """The window's steps slower than the others by more than the
        others' own spread: only then is the difference the profiler's.
        Faster by more than it, the steps differ in kind (a window over
        the loop's other half), not by a profiler cost."""
        overhead, spread = self.overhead, self.outside_spread
        return overhead is not None and spread is not None and overhead > spread

    @property
    def reference(self) -> Optional[RankWindow]:
        return self.ranks[0] if self.ranks else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": list(self.window),
            "overhead": self.overhead,
            "overhead_measurable": self.overhead_measurable,
            "window_median_step": self.window_median,
            "outside_median_step": self.outside_median,
            "window_steps": self.window_count,
            "outside_steps": self.outside_count,
            "outside_spread": self.outside_spread,
            "model": self.model.to_dict() if self.model else None,
            "ranks": {str(r.rank): r.summary for r in self.ranks},
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }


#: The name the window's steps are asked of a pass under (rankpass.py).
INSIDE = "window"


def window_steps(ref: Optional[RankResult], window: Optional[tuple[int, int]]
                 ) -> Optional[Counted]:
    """The window's steps of `ref`, whose Quantities window_report takes
    from the pass over its steps; None when there is no window report to
    make (no window, or a timer-only run: no profiler ran in it)."""
    if window is None or ref is None:
        return None
    settings = ref.data.get("settings") or {}
    if settings.get("timer_only"):
        return None
    return steps_range(ref.n_steps, window[0], window[1])


def outside_steps(ref: RankResult, window: tuple[int, int], warmup: int) -> Counted:
    """The steps the window's are held against: the counted steps less the
    window's and the profiler's warm-up step before it (no outside step)."""
    start, end = window
    first = start
    profiled = ref.data.get("profiled")
    if isinstance(profiled, (list, tuple)) and len(profiled) == 2 and isinstance(profiled[0], int):
        first = min(start, profiled[0])  # the profiler's warm-up step is no outside step
    return rank_counted(ref, warmup, (first, end))


def window_report(
    ranks: Sequence[RankResult],
    ref: Optional[RankResult],
    window: Optional[tuple[int, int]],
    warmup: int,
    steps: Optional[RankPass] = None,
) -> Optional[WindowReport]:
    """The window's tables, from the ranks' window summaries, and how much
    slower its steps ran than the others. `steps`: the pass over `ref`'s
    steps (rankpass.py) that gathered the Quantities of its window_steps
    under INSIDE, when the caller has made it already."""
    inside_steps = window_steps(ref, window)
    if inside_steps is None or ref is None or window is None:
        return None
    settings = ref.data.get("settings") or {}
    start, end = window
    report = WindowReport(window=(start, end))
    for rank in ranks:
        summary = rank.data.get("window_summary")
        if isinstance(summary, dict):
            report.ranks.append(RankWindow(rank.rank, summary))
    outside = outside_steps(ref, window, warmup)
    if steps is None:
        steps = read_pass(ref, {INSIDE: inside_steps}, selections=[outside])
    n_steps = steps.n
    inside = steps.counted[INSIDE]
    times = steps.times("step", outside)
    if inside.n:
        report.model = model_summary(inside)
        report.window_median = digest.median_of(inside.step)
        report.window_count = inside.n
    if digest.size(times):
        report.outside_median = digest.median_of(times)
        report.outside_count = digest.size(times)
        if report.outside_median is not None and report.outside_median > 0:
            q1, q3 = digest.percentiles(times, [25, 75])
            report.outside_spread = float((q3 - q1) / 2 / report.outside_median)
    if n_steps <= start:
        report.warnings.append(
            f"the detailed window [{start}, {end}) starts after the script's last step: "
            f"only {n_steps} steps ran, so nothing was recorded (lower --scheduler)"
        )
    elif n_steps < end:
        report.warnings.append(
            f"the script ended inside the detailed window [{start}, {end}): steps "
            f"{start}..{n_steps - 1} were recorded"
        )
    if settings.get("nsys"):
        report.notes.append(
            "under --nsys the window is nsys's capture range and torch.profiler records CPU "
            "activities only (two CUPTI clients cannot share a process): the GPU tables are "
            f"in the nsys report, {nsys_report('<R>')} in the run folder (open it in Nsight "
            "Systems, or `nsys stats` it)"
        )
    if report.model is not None and report.ranks:
        summary = report.ranks[0].summary if report.ranks[0].rank == ref.rank else None
        if (summary and summary.get("steps_from", "perfrun") == "perfrun"
                and summary.get("steps") == report.model.steps):
            report.notes.extend(untraced(report.model, summary.get("overview") or ()))
    if not report.ranks and n_steps > start:
        report.warnings.append("no window tables: the profiler recorded nothing (see notes)")
    return report


def trace_window_report(traces: Sequence[tuple[int, str, dict[str, Any]]]) -> WindowReport:
    """The window tables of traces a user already has (`perfrun analyze`):
    (rank, file name, summary) per trace, the first one the reference."""
    report = WindowReport(window=(0, 0))
    for rank, _name, summary in traces:
        report.ranks.append(RankWindow(rank, summary))
    if traces:
        _rank, name, s = traces[0]
        source = {
            "perfrun": "perfrun's step ranges",
            "ProfilerStep": "torch.profiler's ProfilerStep#N ranges",
            "trace": "no step ranges in the trace: the whole trace is one window",
        }.get(str(s.get("steps_from")), "")
        ids = s.get("step_ids")
        which = f" #{ids[0]}..#{ids[1]}" if isinstance(ids, list) and len(ids) == 2 else ""
        report.label = f"{name}: {s.get('steps', 0)} steps{which} ({source})"
    return report


@dataclass
class TraceAnalysis:
    """`perfrun analyze`: the window tables of torch.profiler traces a user
    already has, one file per rank, computed as the window computes its own.
    `traces` are (path, rank, summary) in the files' order."""

    traces: list[tuple[str, int, dict[str, Any]]]
    window: WindowReport
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "perfrun-analyze",
            "version": 1,
            "traces": [{"path": p, "rank": r, "summary": s} for p, r, s in self.traces],
            "notes": list(self.notes),
        }


def analyze_traces(loaded: Sequence[Any]) -> TraceAnalysis:
    """The analysis of loaded traces (tracefile.Trace: path, rank, events,
    skipped). Ranks come from the traces; where they are missing or repeat,
    the files' order numbers them."""
    ranks = [t.rank for t in loaded]
    if None in ranks or len(set(ranks)) != len(ranks):
        ranks = list(range(len(loaded)))
    traces = []
    named = []
    notes = []
    for rank, trace in zip(ranks, loaded):
        summary = summarize(trace.events)
        traces.append((trace.path, int(rank), summary))
        named.append((int(rank), os.path.basename(trace.path), summary))
        if trace.skipped:
            notes.append(f"{trace.path}: {trace.skipped} malformed events skipped")
    return TraceAnalysis(traces, trace_window_report(named), notes)
