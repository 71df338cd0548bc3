"""The Report: everything the renderers print, computed once from a run
(analysis/build.py assembles it), and its JSON form.

The renderers (perfrun/report/) only lay the Report out: none of them
reads the run again, so the terminal, the JSON, the Markdown and the page
cannot disagree. `Report.to_dict` is the JSON report's one home: its keys
and REPORT_VERSION.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from perfrun.analysis import digest, rankpass
from perfrun.analysis.advice import Advice
from perfrun.analysis.device import DeviceSummary
from perfrun.analysis.disturbed import Flag
from perfrun.analysis.flops import FlopsSummary
from perfrun.analysis.memory import MemorySummary
from perfrun.analysis.pipeline import PipelineSummary
from perfrun.analysis.ranks import MultiRankSummary, Unsaved, steps_phrase
from perfrun.analysis.series import PageSeries
from perfrun.analysis.summary import ModelSummary, PerfSummary
from perfrun.analysis.window import WindowReport
from perfrun.settings import SUMMARY_KEYS


@dataclass(frozen=True)
class ExtraRow:
    """Time spent outside steps that users still want to see: evaluation
    passes and DataLoader start-up would otherwise vanish from the tables."""

    name: str
    calls: int
    time: float
    detail: Optional[str] = None
    unit: str = "call"  # what `calls` counts ("pass" for evaluation)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "calls": self.calls, "time": self.time,
                "detail": self.detail, "unit": self.unit}


def _and(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True)
class Fault:
    """A failure inside one of perfrun's own hooks (the script was not
    affected; the numbers it would have produced are missing)."""

    where: str
    error: str
    count: int
    ranks: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"{self.where}: {self.error} (x{self.count})"

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "error": self.error, "count": self.count,
                "ranks": list(self.ranks)}


@dataclass(frozen=True)
class Title:
    """What the numbers are about: which command, which ranks, which steps."""

    command: Optional[str]
    run_dir: str
    world_size: int
    rank: Optional[int]
    steps_recorded: int
    steps_counted: int
    warmup: int
    warmup_default: bool
    window: Optional[tuple[int, int]]
    window_excluded: bool
    window_steps: int
    # The steps torch.profiler ran over: the window and its warm-up step.
    profiled: Optional[tuple[int, int]] = None
    # The counted steps left out for the window: the profiler's warm-up
    # step before it, its own, the settling steps after it (selection.py).
    window_parts: tuple[int, int, int] = (0, 0, 0)
    # The counted steps ran forward passes and no backward, no optimizer
    # step: an inference or evaluation loop, not training.
    forward_only: bool = False
    # A run in progress: which ranks are still running, said in a sentence
    # (ranks.running_sentence); None for a run that has ended.
    running: Optional[str] = None

    def entries(self) -> list[tuple[str, str]]:
        """The title as (label, sentence) pairs, shared by every renderer
        (Markdown sets the command and the folder in code spans)."""
        out = []
        if self.command:
            out.append(("Command", self.command))
        out.append(("Results", self.run_dir))
        if self.running:
            out.append(("Running", self.running))
        if self.world_size > 1:
            who = f"; summaries are rank {self.rank}'s" if self.rank is not None else ""
            out.append(("Ranks", f"{self.world_size}{who}"))
        if self.rank is not None and self.steps_recorded:
            how = "default; --warmup N to change" if self.warmup_default else "as set"
            warm = f"first {steps_phrase(self.warmup)}" if self.warmup else "none"
            what = ("; forward passes only (no backward, no optimizer step): an inference "
                    "or evaluation loop" if self.forward_only else "")
            out.append((
                "Steps",
                f"{self.steps_counted:,} counted of {self.steps_recorded:,} recorded; "
                f"warm-up left out: {warm} ({how}){what}",
            ))
        if self.window is not None:
            out.append(("Window", self._window_sentence()))
        return out

    def _window_sentence(self) -> str:
        assert self.window is not None
        start, end = self.window
        if self.rank is not None and self.steps_recorded <= start:
            return (f"steps [{start}, {end}) were to be profiled in detail, but the run "
                    f"ended after {steps_phrase(self.steps_recorded)}, before the window "
                    "opened")
        if not self.window_excluded:
            tail = "kept in the statistics"
        elif self.window_steps:
            before, inside, after = self.window_parts
            why = []
            if inside:
                why.append(f"the window's {inside}")
            if before:
                why.append("the profiler's warm-up step before it" if before == 1 else
                           f"the profiler's {before} warm-up steps before it")
            if after:
                why.append(f"{steps_phrase(after)} after it, where the ranks wait for each "
                           "other's trace export")
            said = ": " + _and(why) if why and sum(self.window_parts) == self.window_steps else ""
            tail = f"{steps_phrase(self.window_steps)} left out of the statistics{said}"
        else:
            tail = "no counted step fell in it"
        return f"steps [{start}, {end}) profiled in detail; {tail}"

    def lines(self) -> list[str]:
        return [f"{label}: {text}" for label, text in self.entries()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "run_dir": self.run_dir,
            "world_size": self.world_size,
            "rank": self.rank,
            "steps_recorded": self.steps_recorded,
            "steps_counted": self.steps_counted,
            "warmup": self.warmup,
            "warmup_default": self.warmup_default,
            "window": list(self.window) if self.window else None,
            "profiled": list(self.profiled) if self.profiled else None,
            "window_excluded": self.window_excluded,
            "window_steps": self.window_steps,
            "window_parts": list(self.window_parts),
            "forward_only": self.forward_only,
            "running": self.running,
        }


REPORT_VERSION = 1


@dataclass
class Report:
    """Everything the renderers print, computed once.

    `problem` is set when there is nothing to summarise (the gates and
    `perfrun report` map it to `ExitCode.NO_MEASUREMENT`); `problems` lists
    ranks that died, were killed or wrote nothing, which is worth saying even
    when the other ranks' numbers are fine. `sections` says which optional
    tables the user asked for (`Profiler.summary`).
    """

    title: Title
    perf: Optional[PerfSummary] = None
    model: Optional[ModelSummary] = None
    ranks: Optional[MultiRankSummary] = None
    device: Optional[DeviceSummary] = None
    extras: list[ExtraRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    problem: Optional[str] = None
    sections: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(SUMMARY_KEYS, True))
    #: The detailed window's tables (analysis/window.py), when there is one.
    window: Optional[WindowReport] = None
    #: How window tables are shown: sort_by, row_limit, time_unit, op_detail.
    view: dict[str, Any] = field(default_factory=dict)
    #: Bottleneck advice (analysis/advice.py), each with the numbers it rests on.
    advice: list[Advice] = field(default_factory=list)
    #: Achieved FLOP/s and MFU (analysis/flops.py); None for older files.
    flops: Optional[FlopsSummary] = None
    #: The reference rank's DataLoaders, stage by stage (analysis/pipeline.py);
    #: None in timer-only, or for files of an older perfrun.
    pipeline: Optional[PipelineSummary] = None
    #: Host memory of each rank and its children over the run
    #: (analysis/memory.py); None for files without it.
    memory: Optional[MemorySummary] = None
    #: Why the figures may not be the script's own (analysis/disturbed.py).
    disturbed: list[Flag] = field(default_factory=list)
    #: What the page draws (analysis/series.py): the step series, each
    #: rank's medians and distribution, the traces; None when not built.
    series: Optional[PageSeries] = None
    #: The environment the run was measured in (store/baseline.py's
    #: fingerprint), as the page prints it.
    environment: dict[str, Any] = field(default_factory=dict)
    #: The merged results the JSON report ends with (`results`): the run
    #: folder, run.json, the missing ranks and every rank's document (with
    #: its step file's path, not its steps); None when not asked for.
    results: Optional[dict[str, Any]] = None
    #: The reference rank's steady step times, as the gate compares them
    #: (analysis/compare.py; not in the JSON); None when not asked for.
    gate_steps: Any = None
    #: Steps that ran and are not in the results, a save having failed
    #: (analysis/ranks.py `unsaved_steps`): the results are incomplete.
    unsaved: Optional[Unsaved] = None
    #: How each rank's medians and percentiles were taken, by rank:
    #: digest.EXACT, or over a rank too long to hold digest.METHOD
    #: (analysis/rankpass.py, analysis/digest.py).
    quantiles: dict[int, str] = field(default_factory=dict)

    def quantiles_dict(self) -> dict[str, Any]:
        """The JSON report's `quantiles`: the reference rank's method (its
        figures are the summaries'), the bound on a median's or
        percentile's error relative to its value (0 where exact), the ranks
        whose figures were digested, and the step count above which a rank
        is."""
        method = self.quantiles.get(self.title.rank, digest.EXACT) \
            if self.title.rank is not None else digest.EXACT
        return {
            "method": method,
            "relative_error": digest.RELATIVE_ERROR if method == digest.METHOD else 0.0,
            "digested_ranks": sorted(r for r, m in self.quantiles.items() if m == digest.METHOD),
            "array_steps": rankpass.ARRAY_STEPS,
        }

    def show(self, section: str) -> bool:
        return bool(self.sections.get(section, True))

    def to_dict(self) -> dict[str, Any]:
        """Raw, unrounded numbers under stable keys (seconds, fractions,
        bytes): for machines, so nothing is formatted here."""
        return {
            "format": "perfrun-report",
            "version": REPORT_VERSION,
            "title": self.title.to_dict(),
            "problem": self.problem,
            "problems": list(self.problems),
            "perf": self.perf.to_dict() if self.perf else None,
            "model": self.model.to_dict() if self.model else None,
            "ranks": self.ranks.to_dict() if self.ranks else None,
            "device": self.device.to_dict() if self.device else None,
            "extras": [e.to_dict() for e in self.extras],
            "notes": list(self.notes),
            "faults": [f.to_dict() for f in self.faults],
            "sections": dict(self.sections),
            "window": self.window.to_dict() if self.window is not None else None,
            "advice": [a.to_dict() for a in self.advice],
            "flops": self.flops.to_dict() if self.flops is not None else None,
            "pipeline": self.pipeline.to_dict() if self.pipeline is not None else None,
            "memory": self.memory.to_dict() if self.memory is not None else None,
            "disturbed": [f.to_dict() for f in self.disturbed],
            "quantiles": self.quantiles_dict(),
            "unsaved": self.unsaved.to_dict() if self.unsaved is not None else None,
            **({"results": self.results} if self.results is not None else {}),
        }
