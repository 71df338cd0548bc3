"""Two runs side by side: the Perf and Model Summaries with the change per
row, and the gate's verdict on step time. Pure: both runs come in as
RunResults (a results folder or a baseline file, read by store/baseline.py's
`load`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from perfrun.analysis import columns
from perfrun.analysis.build import build_report
from perfrun.analysis.gate import GateResult, disturbed_verdict, gate
from perfrun.analysis.report import Report
from perfrun.analysis.selection import steady_table
from perfrun.store.results import RunResults


@dataclass
class Row:
    name: str
    base: Optional[float]
    current: Optional[float]
    unit: str  # "s" for times, "1/s" for rates
    group: str  # "perf" | "model"

    @property
    def change(self) -> Optional[float]:
        if self.base is None or self.current is None or self.base == 0:
            return None
        return self.current / self.base - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "baseline": self.base,
            "current": self.current,
            "unit": self.unit,
            "group": self.group,
            "change": self.change,
        }


@dataclass
class Comparison:
    base_label: str
    current_label: str
    rows: list[Row]
    gate: Optional[GateResult]
    threshold: Optional[float]
    mismatches: list[str] = field(default_factory=list)
    problem: Optional[str] = None
    base_report: Optional[Report] = None
    current_report: Optional[Report] = None
    #: --ignore-disturbed: the runs' disturbance flags did not stop the gate.
    ignore_disturbed: bool = False

    @property
    def throughput_change(self) -> Optional[float]:
        for row in self.rows:
            if row.name in ("ips (samples/s)",):
                return row.change
        for row in self.rows:
            if row.name == "ips":
                return row.change
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "perfrun-comparison",
            "version": 1,
            "baseline": self.base_label,
            "current": self.current_label,
            "threshold": self.threshold,
            "gate": self.gate.to_dict() if self.gate else None,
            "throughput_change": self.throughput_change,
            "rows": [r.to_dict() for r in self.rows],
            "environment_mismatches": list(self.mismatches),
            "problem": self.problem,
            "disturbed": self.disturbed_dict(),
        }

    def disturbed_dict(self) -> dict[str, Any]:
        """Each run's disturbance flags (analysis/disturbed.py)."""
        def flags(report: Optional[Report]) -> list[dict[str, Any]]:
            return [f.to_dict() for f in getattr(report, "disturbed", None) or []]

        return {"baseline": flags(self.base_report), "current": flags(self.current_report),
                "ignored": self.ignore_disturbed}


def _gate_series(report: Report, run: RunResults) -> list[float]:
    """Steady-state step times of the reference rank: the steps the Perf
    Summary counts (warm-up left out, and the detailed window unless the run
    was timer-only); from the report when it kept them (build_report's
    `gate`: taken on its one pass over the steps), else read."""
    if report.gate_steps is not None:
        return report.gate_steps.tolist()  # type: ignore[no-any-return]
    ref = next((r for r in run.ranks if r.rank == report.title.rank), None)
    if ref is None:
        return []
    title = report.title
    counted = steady_table(ref, title.warmup, title.window, title.window_excluded)
    return columns.step_times(counted).tolist()  # type: ignore[no-any-return]


def compare_report(run: RunResults, warmup: Optional[int] = None, series: bool = True,
                   gated: bool = True) -> Report:
    """A run's report as compare_runs takes it (`gated`: with the step times
    the gate compares, for a comparison with a threshold or a baseline's
    earlier runs). Raises ResultsError (a damaged step file, found as the
    report reads it)."""
    return build_report(run, warmup=warmup, series=series, gate=gated)


def compare_runs(
    base: RunResults,
    current: RunResults,
    threshold: Optional[float],
    base_label: str = "baseline",
    current_label: str = "current",
    warmup: Optional[int] = None,
    mismatches: Optional[list[str]] = None,
    base_history: Sequence[RunResults] = (),
    ignore_disturbed: bool = False,
    series: bool = True,
    reports: Optional[tuple[Report, Report]] = None,
) -> Comparison:
    """`base_history`: earlier runs stored in the same baseline file; the
    gate uses them to measure how much whole runs differ.
    `ignore_disturbed`: gate even when a run's measurement was disturbed
    (a machine known to be shared); otherwise such a run gives no verdict.
    `series`: the reports carry what the comparison's page draws.
    `reports`: both runs' reports, when the caller has built them already
    (compare_report builds them as this needs them)."""
    gated = threshold is not None or bool(base_history)
    b, c = reports or (compare_report(base, warmup, series, gated),
                       compare_report(current, warmup, series, gated))
    rows: list[Row] = []
    if b.perf is not None and c.perf is not None:
        rows += [
            Row("reader_cost", b.perf.reader_cost.avg, c.perf.reader_cost.avg, "s", "perf"),
            Row("batch_cost", b.perf.batch_cost.avg, c.perf.batch_cost.avg, "s", "perf"),
            Row(
                "batch_cost median", b.perf.batch_cost.median, c.perf.batch_cost.median, "s", "perf"
            ),
            Row("ips", b.perf.ips.avg, c.perf.ips.avg, "1/s", "perf"),
        ]
        if b.perf.samples_ips is not None and c.perf.samples_ips is not None:
            rows.append(
                Row(
                    "ips (samples/s)", b.perf.samples_ips.avg, c.perf.samples_ips.avg, "1/s", "perf"
                )
            )
    if b.model is not None and c.model is not None:
        for mb in b.model.rows:
            try:
                mc = c.model.row(mb.name)
            except KeyError:
                continue
            rows.append(Row(mb.name, mb.cpu.avg, mc.cpu.avg, "s", "model"))
    comparison = Comparison(
        base_label,
        current_label,
        rows,
        None,
        threshold,
        list(mismatches or []),
        base_report=b,
        current_report=c,
        ignore_disturbed=ignore_disturbed,
    )
    if b.problem or c.problem:
        which = "baseline" if b.problem else "current run"
        comparison.problem = f"the {which} has no measurement: {b.problem or c.problem}"
        return comparison
    if threshold is None and not base_history:
        return comparison  # no gate, and no row of the baseline's runs
    others = [_gate_series(build_report(h, warmup=warmup, series=False, gate=True), h)
              for h in base_history]
    others = [o for o in others if o]
    base_series, current_series = _gate_series(b, base), _gate_series(c, current)
    if others and base_series and current_series:
        # The gate's baseline is the median of every stored run's median:
        # the table shows that figure too, so its change and the verdict's
        # agree (the rows above are the latest baseline run's).
        medians = [statistics.median(r) for r in [base_series, *others]]
        rows.insert(
            3 if len(rows) >= 3 else len(rows),
            Row(
                f"step median, {len(medians)} baseline runs (gated)",
                statistics.median(medians),
                statistics.median(current_series),
                "s",
                "perf",
            ),
        )
    if threshold is not None:
        comparison.gate = gate(base_series, current_series, threshold, other_runs=others)
        if not ignore_disturbed:
            comparison.gate = disturbed_verdict(
                comparison.gate,
                [f.message for f in c.disturbed],
                [f.message for f in b.disturbed],
            )
    return comparison
