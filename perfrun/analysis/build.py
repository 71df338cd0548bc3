"""The Report assembled from a run, once.

`build_report` reads what it needs of a merged run (store/results.py) and
asks each analysis for its part: which steps count (selection.py), the
Perf and Model Summaries (summary.py), the ranks (ranks.py), the devices
(device.py), the detailed window (window.py), FLOP rates (flops.py), what
disturbed the measurement (disturbed.py), the advice (advice.py) and the
page's series (series.py). Its shape is analysis/report.py's.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from perfrun.analysis.advice import AdviceInputs, advise
from perfrun.analysis.allocator import devices_memory
from perfrun.analysis.columns import Quantities
from perfrun.analysis.device import device_summary
from perfrun.analysis.disturbed import Flag, flags_of, host_evidence
from perfrun.analysis.flops import FlopsSummary, counted_step, counted_step_note, flops_summary
from perfrun.analysis.memory import MemorySummary, StepStarts, memory_summary
from perfrun.analysis.pipeline import PipelineSummary, loader_pipeline
from perfrun.analysis.rankpass import (
    Picked,
    RankPass,
    Sampled,
    SampleTally,
    digested,
    read_pass,
)
from perfrun.analysis.ranks import (
    Steady,
    multi_rank_summary,
    rank_problem,
    run_endings,
    running_sentence,
    steady_of,
    steps_phrase,
    straggler_of,
    straggler_steps,
    unsaved_steps,
)
from perfrun.analysis.report import ExtraRow, Fault, Report, Title
from perfrun.analysis.selection import (
    Counted,
    counted,
    disturbed_steps,
    profiled_steps,
    rank_counted,
    rank_window,
)
from perfrun.analysis.series import PageSeries, SeriesSink, add_rank, medians_of
from perfrun.analysis.stats import default_warmup
from perfrun.analysis.straggler import Straggler
from perfrun.analysis.summary import (
    backward_collectives,
    forward_unseen,
    forward_unseen_note,
    model_summary,
    perf_summary,
)
from perfrun.analysis.window import INSIDE, outside_steps, window_report, window_steps
from perfrun.settings import SUMMARY_KEYS
from perfrun.store.baseline import READ, batch_size, fingerprint
from perfrun.store.childfile import read_children
from perfrun.store.layout import rank_stem
from perfrun.store.pipelinefile import loader_files
from perfrun.store.rankfile import PROFILING_DISABLED, RankResult
from perfrun.store.results import BOOTSTRAP_HINT, NO_TORCH, RunResults
from perfrun.store.schema import as_finite, as_int, finite_or_zero
from perfrun.store.stepfile import COL


def _command(run: RunResults, ref: Optional[RankResult]) -> Optional[str]:
    sources: list[Any] = []
    if ref is not None:
        env = ref.data.get("env") or {}
        sources += [env.get("command"), env.get("argv")]
    sources.append(run.meta.get("command"))
    for value in sources:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, (list, tuple)) and value:
            return shlex.join(str(v) for v in value)
    return None


def _extras(rank: RankResult) -> list[ExtraRow]:
    extra = rank.data.get("extra") or {}
    out = []
    spec = (
        ("eval", "Eval"),
        ("dataloader_init", "DataLoader start-up"),
        ("stop_iteration", "DataLoader end of data"),
        ("profiler", "Profiler"),
    )
    for key, name in spec:
        unit = "call"
        item = extra.get(key)
        if not isinstance(item, Mapping):
            continue
        calls = as_int(item.get("calls")) or 0
        if calls <= 0:
            continue
        detail = None
        if key == "eval":
            # `calls` is the number of passes; files from before passes were
            # told apart from batches carry no "passes" key.
            parts = []
            batches = as_int(item.get("batches"))
            if batches:
                parts.append(f"{batches} batches")
            forwards = as_int(item.get("forward_calls"))
            if forwards:
                parts.append(f"{forwards} forward calls")
            if rollouts(item):
                parts.append("all with the model in training mode, as in an RL rollout "
                             "rather than a validation")
            detail = ", ".join(parts + ["not counted in steps"])
            if "passes" in item:
                unit = "pass"
        elif key == "profiler":
            detail = (
                "the detailed window's profiler start, stop, trace export and tables, "
                "not counted in steps"
            )
        elif key == "dataloader_init":
            detail = "iterator creation and worker start-up, not counted in steps"
        else:
            detail = "StopIteration at the end of each epoch, not counted in steps"
        out.append(ExtraRow(name, calls, finite_or_zero(item.get("time")), detail, unit))
    return out


def rollouts(item: Mapping[str, Any]) -> bool:
    """Whether a rank's evaluation passes (`extra.eval`) look like data
    collection: no batch fetched, and nearly every forward (9 in 10; a
    nested root call is counted only in `forward_calls`) made with the
    model in training mode under no_grad, as a PPO's rollouts are;
    validation puts the model in eval mode (runtime/steps.py)."""
    forwards = as_int(item.get("forward_calls")) or 0
    train_mode = as_int(item.get("train_mode_forward_calls")) or 0
    return forwards > 0 and not as_int(item.get("batches")) and train_mode >= 0.9 * forwards


def _faults(ranks: Sequence[RankResult]) -> list[Fault]:
    merged: dict[tuple[str, str], list[Any]] = {}
    for rank in ranks:
        for f in rank.data.get("faults") or []:
            if not isinstance(f, Mapping):
                continue
            key = (str(f.get("where", "?")), str(f.get("error", "?")))
            entry = merged.setdefault(key, [0, []])
            entry[0] += as_int(f.get("count")) or 1
            if rank.rank not in entry[1]:
                entry[1].append(rank.rank)
    return [Fault(w, e, c, tuple(rs)) for (w, e), (c, rs) in merged.items()]


def _notes(ranks: Sequence[RankResult]) -> list[str]:
    seen: dict[str, None] = {}
    for rank in ranks:
        for note in rank.data.get("notes") or []:
            seen.setdefault(str(note), None)
        if rank.restart:
            seen.setdefault(
                f"rank {rank.rank} was restarted {rank.restart} time(s); "
                "its last run's results are shown", None
            )
    return list(seen)


def _sections(ref: Optional[RankResult]) -> dict[str, bool]:
    sections = dict.fromkeys(SUMMARY_KEYS, True)
    settings = (ref.data.get("settings") if ref else None) or {}
    summary = settings.get("summary") if isinstance(settings, Mapping) else None
    if isinstance(summary, Mapping):
        for key in SUMMARY_KEYS:
            if key in summary:
                sections[key] = bool(summary[key])
    return sections


def _no_measurement(run: RunResults, children: Optional[Children] = None,
                    alive: Iterable[int] = ()) -> Optional[str]:
    """Why there is nothing to summarise, or None. Only what is known: a
    rank whose saves failed did run steps (its final save counts them), and
    one that had imported torch and ended without its final save may have
    (its file is a periodic save, which may predate its steps), so neither
    is "no training loop"."""
    if not run.ranks:
        return "no rank wrote results"
    if any(r.n_steps for r in run.ranks):
        return None
    unsaved = unsaved_steps(run.ranks, run_endings(run), alive)
    if unsaved is not None and unsaved.steps:
        if unsaved.ran == unsaved.steps:
            why = f" ({unsaved.reason})" if unsaved.reason else ""
            return f"none of the {unsaved.ran:,} steps that ran could be saved{why}"
        return f"no step was saved: {unsaved.sentence()}"
    live = set(alive)
    cut = [r.rank for r in run.ranks if r.status == "running" and r.rank not in live
           and r.data.get("torch_imported")]
    if children is not None and children.steps:
        # Training ran, where perfrun counts it but does not profile it.
        return (f"no training loop in the script's own process: {children.steps} optimizer "
                f"steps ran in {children.trained} {_processes(children.trained)} it started "
                f"({children.who}), which perfrun counts but does not profile (Child "
                "processes, under Outside the steps)")
    if cut:
        who = ("rank " if len(cut) == 1 else "ranks ") + ",".join(str(r) for r in cut)
        its = "its" if len(cut) == 1 else "their"
        return (f"no step was saved: {who} ended without saving {its} final results, and "
                f"{its} last save held no step (whether it trained is not known: Ranks with "
                "problems says how it ended)")
    disabled = _disabled(run.ranks)
    if disabled is not None:
        return disabled
    if not any(r.data.get("torch_imported") for r in run.ranks):
        return _before_torch(run.ranks) or NO_TORCH
    return "no PyTorch training loop was seen: no forward, backward or optimizer step ran"


def _disabled(ranks: Sequence[RankResult]) -> Optional[str]:
    """A rank that could not start profiling when the script imported torch
    (runtime/lite.py: a full disk, say) trained unseen: its fault says why,
    and no step of it was recorded, which is not "no training loop"."""
    for rank in ranks:
        for f in rank.data.get("faults") or []:
            if isinstance(f, Mapping) and f.get("where") == PROFILING_DISABLED:
                return (f"no step was recorded: profiling was disabled on rank {rank.rank} when "
                        f"the script imported torch ({f.get('error')})")
    return None


def _before_torch(ranks: list[RankResult]) -> Optional[str]:
    """Why no rank imported torch, when a rank says: the script did not
    start (a SyntaxError in its own file), or raised before it got there.
    Not "never imported torch", which points at where torch was imported."""
    for rank in ranks:
        exit_info = rank.data.get("exit") or {}
        exception = exit_info.get("exception")
        if not exception:
            continue
        start_error = exit_info.get("start_error")
        if start_error:
            return f"the script did not start: {exception}: {start_error}"
        return (f"no PyTorch training loop was seen: the script raised {exception} "
                "before it imported torch")
    return None


def build_report(
    run: RunResults,
    warmup: Optional[int] = None,
    exclude_window: Optional[bool] = None,
    alive: Iterable[int] = (),
    series: bool = True,
    results: bool = False,
    gate: bool = False,
) -> Report:
    """Summarise a merged run.

    `alive`: the ranks whose processes are still running (a report of a run
    in progress): their `running` status is no death.

    `warmup=None` takes the value the run was started with (its settings),
    else `default_warmup` of the reference rank's step count.
    `exclude_window=None` leaves the detailed window's steps out unless the
    run was timer-only (no profiler ran in the window, so its steps are
    ordinary). The reference rank for the Perf and Model Summaries is rank 0,
    or the lowest rank that recorded steps when rank 0 recorded none.

    `series=False` leaves out what only the page draws (`series`): a live
    view that rebuilds the report every few seconds has no use for it.
    `results=True` adds the merged results the JSON report ends with
    (`results`); `gate=True` the step times the gate compares (`gate_steps`).

    Each rank's steps are read once, for every figure (rankpass.py), one
    rank at a time.
    """
    ranks = list(run.ranks)
    with_rows = [r for r in ranks if r.n_steps]
    ref = next((r for r in ranks if r.rank == 0 and r.n_steps), None)
    ref = ref or (with_rows[0] if with_rows else (ranks[0] if ranks else None))
    settings = (ref.data.get("settings") if ref else None) or {}
    if not isinstance(settings, Mapping):
        settings = {}

    n_rows = ref.n_steps if ref else 0
    warmup_default = False
    if warmup is None:
        configured = as_int(settings.get("warmup"))
        if configured is not None and configured >= 0:
            warmup = configured
        else:
            warmup = default_warmup(n_rows)
            warmup_default = True
    if exclude_window is None:
        exclude_window = not bool(settings.get("timer_only", False))

    window = rank_window(ref) if ref else None
    if window is None and isinstance(settings.get("scheduler"), (list, tuple)):
        sched = settings["scheduler"]
        if len(sched) == 2:
            window = (int(sched[0]), int(sched[1]))
    profiled = profiled_steps(ref) if ref else None
    disturbed = disturbed_steps(ref) if ref else None
    flops_step = counted_step(ref.data) if ref is not None else None
    steps = counted(n_rows, warmup, (disturbed or window) if exclude_window else None,
                    flops_step)
    # The FLOP-counted step is left out too, but is no window step.
    after_warmup = counted(n_rows, warmup, None, steps.skip).count
    parts: tuple[int, int, int] = (0, 0, 0)
    if window is not None and exclude_window:
        # The steps left out, by why: the profiler's warm-up step before
        # the window, the window's own, the settling steps after it.
        first, last = (disturbed or profiled or window)
        edges = ((min(first, window[0]), window[0]), window, (window[1], max(last, window[1])))
        parts = tuple(max(0, min(hi, n_rows) - max(lo, warmup)) for lo, hi in edges)  # type: ignore[assignment]
    live = set(alive)
    title = Title(
        command=_command(run, ref),
        run_dir=run.run_dir,
        world_size=run.world_size,
        rank=ref.rank if ref else None,
        steps_recorded=n_rows,
        steps_counted=steps.count,
        warmup=warmup,
        warmup_default=warmup_default,
        window=window,
        window_excluded=exclude_window,
        window_steps=after_warmup - steps.count,
        profiled=profiled or window,
        window_parts=parts,
        running=running_sentence(
            [(r.rank, r.n_steps) for r in ranks if r.status == "running" and r.rank in live]),
    )
    report = Report(title=title, sections=_sections(ref))
    children = _children(run.run_dir, ref) if ref is not None else None
    report.problem = _no_measurement(run, children, alive)
    report.notes = _notes(ranks)
    if report.problem == NO_TORCH:
        report.notes.append(BOOTSTRAP_HINT)
    report.faults = _faults(ranks)

    # Every rank's steps, read once, here, for every figure below that rests
    # on them (rankpass.py); a damaged step file is refused now, before any
    # figure is taken.
    multi = run.world_size > 1 or bool(run.missing)
    read = _read_ranks(run, ref, warmup, exclude_window, steps, window, multi, series,
                       gate_window=(title.window, title.window_excluded) if gate else None)
    endings = run_endings(run)
    report.unsaved = unsaved_steps(ranks, endings, live)
    if multi:
        report.ranks = multi_rank_summary(ranks, warmup, run.missing, exclude_window, live,
                                          endings, run.first_failed,
                                          stopped=bool(run.meta.get("signals")),
                                          steady=read.steady, straggler=read.straggler)
        report.problems = report.ranks.problems
    else:
        live = set(alive)
        report.problems = [
            f"rank {r.rank}: {p}"
            for r in ranks
            if (p := rank_problem(r, endings.get(r.rank), alive=r.rank in live,
                                  step_time=read.died.get(r.rank)
                                  if r.rank not in live else None))
        ]
    if report.problem is not None:
        # "recorded no steps", or "did not start" (one script, one error),
        # only repeat what `problem` already says.
        report.problems = [p for p in report.problems if not p.endswith("recorded no steps")
                           and ": did not start: " not in p]
    # Steps that are not all those a rank saved (its step file cut short):
    # which ones every figure below rests on.
    report.problems[:0] = [f"rank {r.rank}: {r.steps_note}" for r in ranks if r.steps_note]

    child_steps = 0
    if ref is not None:
        report.extras = _extras(ref)
        report.device = device_summary(ranks)
        if children is not None:
            report.extras.append(children.row)
            child_steps = children.steps
    report.window = window_report(ranks, ref, window, warmup, read.ref)
    table = read.summary
    if ref is not None and table is not None:
        report.perf = perf_summary(table)
        report.model = model_summary(table)
        if not table.n:
            report.notes.append(
                f"all {steps_phrase(n_rows)} of rank {ref.rank} fall in the warm-up "
                "or the detailed window: nothing left to summarise (lower --warmup)"
            )
        if forward_unseen(report.model, backward_collectives(ref.data)):
            report.notes.append(forward_unseen_note(report.model))
        if report.model.calls().get("Forward") and not report.model.trained:
            report.title = dataclasses.replace(report.title, forward_only=True)
        report.flops = _flops(ref, ranks, table, settings, report)
        if report.model.overshoot_steps:
            report.notes.append(
                f"{steps_phrase(report.model.overshoot_steps)} recorded phases longer than "
                f"the step itself (by up to {report.model.overshoot_max * 1e3:.3f} ms); "
                "Others is shown as 0 for them"
            )
    if ref is not None:
        report.pipeline = _pipeline(ref)
    report.memory = _memory(run, ranks, warmup)
    report.advice = advise(advice_inputs(report, ref, ranks, run.meta))
    trained_elsewhere = _trained_in_children(report, child_steps)
    if trained_elsewhere:
        # The parent's loop is a test or a wait: its Reader Ratio and
        # Others say nothing of the training, which ran in the children.
        report.notes.append(trained_elsewhere)
        report.advice = [a for a in report.advice if a.kind not in _TRAINING_ADVICE]
    report.disturbed = _disturbed(run)
    if results:
        report.results = _results(run)
    report.environment = fingerprint(run, batch=read.batch)
    report.series = read.page
    report.gate_steps = read.gate_steps
    report.quantiles = read.quantiles
    return report


@dataclass
class _Read:
    """What build_report takes from the passes over the ranks' steps."""

    #: Each rank's figures over its counted steps (the Ranks table).
    steady: dict[int, Steady] = field(default_factory=dict)
    #: The median counted step of each rank that may have died (its file
    #: says running), to count the steps it lost.
    died: dict[int, Optional[float]] = field(default_factory=dict)
    straggler: Optional[Straggler] = None
    #: The reference rank's pass, and the Quantities of its counted steps.
    ref: Optional[RankPass] = None
    summary: Optional[Quantities] = None
    page: Optional[PageSeries] = None
    #: The fingerprint's batch size, when its rank is the reference.
    batch: Any = READ
    gate_steps: Any = None
    #: How each rank's medians and percentiles were taken (RankPass.quantiles).
    quantiles: dict[int, str] = field(default_factory=dict)


#: The name the summaries' steps are asked of the reference's pass under.
_SUMMARY = "summary"


def _read_ranks(run: RunResults, ref: Optional[RankResult], warmup: int,
                exclude_window: bool, steps: Counted, window: Optional[tuple[int, int]],
                multi: bool, series: bool,
                gate_window: Optional[tuple[Any, bool]] = None) -> _Read:
    """Read each rank's steps once (rankpass.py), in rank order, and take
    from each what the report needs: its Ranks-table figures, its part of
    the page, its rows for the straggler check; from the reference rank the
    Quantities of the summaries' `steps` and of the window, the batch size
    and, with `gate_window` ((window, excluded) of the title), the step
    times the gate compares. A rank's steps are let go before the next
    one's are read, but the reference's, which the FLOP rates and the
    window need once every rank is in."""
    out = _Read()
    ranks = run.ranks
    index = straggler_steps(ranks, warmup, exclude_window) if multi else None
    picked: dict[int, Picked] = {}
    page = PageSeries(rank=ref.rank if ref is not None else None) if series else None
    medians = []
    fingerprinted = next((r for r in ranks if r.rank == 0), ranks[0] if ranks else None)
    for rank in ranks:
        is_ref = rank is ref
        counted_steps = rank_counted(rank, warmup, exclude_window=exclude_window)
        sinks: list[Any] = []
        if index is not None and counted_steps.count:
            picked[rank.rank] = Picked(index)
            sinks.append(picked[rank.rank])
        chart = SeriesSink(rank.n_steps) if page is not None else None
        if chart is not None:
            sinks.append(chart)
        tally = SampleTally() if is_ref and fingerprinted is ref else None
        if tally is not None:
            sinks.append(tally)
        asked = {}
        # The other steps figures are taken over, named before the pass
        # (a rank too long to hold keeps only what they ask: rankpass.py).
        named = [counted_steps]
        died = not multi and rank.status == "running" and rank.n_steps
        if died:
            named.append(rank_counted(rank, warmup))
        sampled = None
        if is_ref:
            asked[_SUMMARY] = steps
            inside = window_steps(ref, window)
            if inside is not None and window is not None:
                asked[INSIDE] = inside
                named.append(outside_steps(rank, window, warmup))
            if gate_window is not None:
                chosen = rank_counted(rank, warmup, gate_window[0], gate_window[1])
                if digested(rank):
                    # The gate's bootstrap over a sample of the steps
                    # (rankpass.Sampled), as over a rank of that length.
                    sampled = Sampled(chosen)
                    sinks.append(sampled)
        found = read_pass(rank, asked, sinks, chart.size if chart is not None else 1, named)
        out.steady[rank.rank] = steady_of(found, counted_steps)
        out.quantiles[rank.rank] = found.quantiles
        if died:
            median = found.median("step", rank_counted(rank, warmup), finite=True)
            # flops.median_time's: none that is not positive.
            out.died[rank.rank] = median if median is not None and median > 0.0 else None
        if page is not None and chart is not None:
            medians.append(add_rank(page, rank, found, chart.series(), is_ref, warmup,
                                    exclude_window))
        if is_ref:
            out.ref = found
            out.summary = found.counted[_SUMMARY] if rank.n_steps else None
            if tally is not None:
                out.batch = batch_size(*tally.tally())
            if sampled is not None:
                out.gate_steps = sampled.times
            elif gate_window is not None:
                chosen = rank_counted(rank, warmup, gate_window[0], gate_window[1])
                out.gate_steps = found.times("step", chosen)
        del found
    if page is not None:
        page.medians = medians_of([r.rank for r in ranks], medians)
        out.page = page
    if index is not None:
        with_rows = [rank for rank in ranks if rank.rank in picked]
        out.straggler = straggler_of(with_rows, index,
                                     {r: p.rows for r, p in picked.items()})
    return out


#: Advice read from the steps' phases: about the training loop.
_TRAINING_ADVICE = ("io-bound", "cpu-bound", "gpu-bound", "sync-stall", "unstable-timing")
#: The name of the extra row for a rank's children.
CHILDREN_ROW = "Child processes"


@dataclass(frozen=True)
class Children:
    """What the processes a rank's script started reported of themselves."""

    row: ExtraRow
    #: Their optimizer steps, all together.
    steps: int
    #: How many of them took one.
    trained: int
    #: Who trained: each kind, its processes and pids.
    who: str
    #: How the script started them ("multiprocessing", "ray").
    starters: tuple[str, ...]


#: How each kind of child came to be, as the report says it.
_STARTED_BY = {
    "multiprocessing": "started by the script with multiprocessing",
    "ray": "workers of the Ray cluster the script started",
}


def _processes(n: int) -> str:
    return "process" if n == 1 else "processes"


def _children(run_dir: str, ref: RankResult) -> Optional[Children]:
    """The processes the reference rank's script started itself (store/
    childfile.py) and what they trained: one row, with each target's
    optimizer steps, and their optimizer steps in all; None when it started
    none that reported."""
    found, bad = read_children(run_dir, rank_stem(ref.rank, int(ref.data.get("restart") or 0)))
    if not found and not bad:
        return None
    by_target: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for child in found:
        by_target.setdefault((child["started_by"], child["target"]), []).append(child)
    parts, trained = [], []
    for (starter, target), docs in by_target.items():
        steps = sum(d["optimizer_steps"] for d in docs)
        raised = sum(d["status"] == "raised" for d in docs)
        pids = ", ".join(str(d["pid"]) for d in docs)
        part = (f"{target}: {len(docs)} {_processes(len(docs))} (pid {pids}), "
                f"{steps} optimizer steps")
        if raised:
            part += f", {raised} raised"
        parts.append(f"{part}; {_STARTED_BY.get(starter, starter)}")
        if steps:
            trained.append(f"{target}, pid {pids}")
    if bad:
        parts.append(f"{bad} record(s) unreadable")
    detail = "; ".join(parts) + "; not profiled"
    total = sum(float(d["seconds"]) for d in found)
    steps = sum(d["optimizer_steps"] for d in found)
    row = ExtraRow(CHILDREN_ROW, len(found), total, detail, "process")
    return Children(row, steps, sum(1 for d in found if d["optimizer_steps"]),
                    "; ".join(trained), tuple(sorted({d["started_by"] for d in found})))


def _trained_in_children(report: Report, child_steps: int) -> Optional[str]:
    """The note for a rank that did not train while the processes it
    started did (Hogwild: children train, the parent tests), or None."""
    if not child_steps or report.model is None or report.model.trained:
        return None
    return ("this process did not train (no backward, no optimizer step in its steps): the "
            "training ran in the processes it started (Child processes, under Outside the "
            "steps), which perfrun does not profile; its steps are the script's own loop (a "
            "test, a wait) and no advice is given on them. To profile training processes, "
            "start them as ranks: perfrun --nproc-per-node N SCRIPT")


def _results(run: RunResults) -> dict[str, Any]:
    """The merged results, as the JSON report ends with them: every rank's
    document, and where its per-step records are (its step file: a long
    run's millions of steps do not belong in a report)."""
    return {
        "run_dir": run.run_dir,
        "meta": run.meta,
        "missing_ranks": run.missing,
        "ranks": [_with_step_path(r) for r in run.ranks],
    }


def _with_step_path(rank: RankResult) -> dict[str, Any]:
    """A rank's document for the JSON report: format 2's steps with the
    step file's full path added (format 1's rows are inline already)."""
    if rank.steps_file is None:
        return rank.data
    steps = dict(rank.data.get("steps") or {}, path=os.path.abspath(rank.steps_file))
    return dict(rank.data, steps=steps)


def _flops(ref: RankResult, ranks: Sequence[RankResult], table: Any,
           settings: Mapping[str, Any], report: Report) -> Optional[FlopsSummary]:
    """Achieved FLOP/s and MFU (analysis/flops.py), and a note on the
    counted step; a damaged record costs the figures, never the report."""
    try:
        peak = settings.get("peak_tflops")
        peak = float(peak) if isinstance(peak, (int, float)) and peak > 0 else None
        # Every rank's median step comes from the multi-rank summary, which
        # has read each rank once already; the counted step is one row.
        by_rank = {row.rank: row for row in report.ranks.rows} if report.ranks else {}
        others = [(r.rank, r.data, by_rank[r.rank].step_median)
                  for r in ranks if r.n_steps and r.rank in by_rank] if len(ranks) > 1 else []
        step = counted_step(ref.data)
        row = ref.take([step]) if step is not None and 0 <= step < ref.n_steps else None
        summary = flops_summary(ref.data, table, row, peak, others)
    except Exception:  # noqa: BLE001
        return None
    if summary is not None and summary.counted and summary.step is not None:
        whole = summary.rate("ProfileStep")
        report.notes.append(counted_step_note(summary.step, summary.cost,
                                              whole.seconds if whole else None, ref.n_steps))
        report.notes.extend(f"FLOPs: {note}" for note in summary.notes)
    return summary


def _pipeline(ref: RankResult) -> Optional[PipelineSummary]:
    """The reference rank's DataLoaders stage by stage; tables that cannot
    be read cost the table, never the report."""
    try:
        return loader_pipeline(ref)
    except Exception:  # noqa: BLE001
        return None


def _memory(run: RunResults, ranks: Sequence[RankResult], warmup: int) -> Optional[MemorySummary]:
    """Each rank's and child's resident set over the run; the children
    that are DataLoader workers named so (their pids are in the names of
    the workers' batch tables). What cannot be read costs the table only."""
    try:
        workers: dict[int, str] = {}
        inputs = []
        devices: list[tuple[int, Mapping[str, Any], int]] = []
        for r in ranks:
            loaders = r.data.get("dataloaders")
            stem = rank_stem(r.rank, r.restart)
            for entry in loaders if isinstance(loaders, list) else []:
                number = entry.get("loader") if isinstance(entry, Mapping) else None
                if isinstance(number, int):
                    for pid, _path in loader_files(run.run_dir, stem, number)[1]:
                        workers[pid] = f"DataLoader {number} worker"
            memory = r.data.get("memory")
            if not isinstance(memory, Mapping):
                continue
            starts = StepStarts(r.mapped(), COL["start"], COL["end"]) if r.n_steps else None
            steps = (starts, starts.last_end) if starts is not None else ((), float("-inf"))
            inputs.append((r.rank, memory, steps))
            devices.append((r.rank, memory, max(0, r.n_steps - 1)))
        summary = memory_summary(inputs, warmup, workers)
        found = devices_memory(devices, warmup)
        if found:
            summary = summary if summary is not None else MemorySummary()
            summary.devices = found
        return summary
    except Exception:  # noqa: BLE001 - a damaged record must not cost the report
        return None


def _disturbed(run: RunResults) -> list[Flag]:
    """The disturbance flags; evidence that cannot be read is no flag."""
    try:
        return flags_of(run)
    except Exception:  # noqa: BLE001 - a damaged record must not cost the report
        return []


def _other_cores(meta: Mapping[str, Any], host: Any) -> Optional[float]:
    """The cores other processes took on `host` during the run, on average
    (the launcher's host-load evidence), where it was measured."""
    try:
        evidence = host_evidence(meta)
    except Exception:  # noqa: BLE001 - a damaged record must not cost the report
        return None
    mine = [e for e in evidence if e.get("host") == host] or (
        evidence if len(evidence) == 1 else [])
    return as_finite(mine[0].get("other_cores")) if mine else None


def _uses_gpu(report: Report, ranks: Sequence[RankResult]) -> bool:
    if report.model is not None and report.model.has_gpu:
        return True
    return any(bool(r.data.get("gpu")) or bool(r.data.get("cuda")) for r in ranks)


def advice_inputs(
    report: Report, ref: Optional[RankResult], ranks: Sequence[RankResult],
    meta: Optional[Mapping[str, Any]] = None,
) -> AdviceInputs:
    """The rules' inputs from a built report and the rank files it came from
    (`ref` is the rank whose Perf and Model Summaries the report shows;
    `meta` the run's run.json, for the load other processes put on its host)."""
    data: Mapping[str, Any] = ref.data if ref is not None else {}
    device = data.get("device")
    cpu_count = as_int(device.get("cpu_count")) if isinstance(device, Mapping) else None
    host = (data.get("env") or {}).get("hostname")
    other_cores = _other_cores(meta or {}, host)
    on_host = sum(1 for r in ranks if (r.data.get("env") or {}).get("hostname") == host)
    extra = data.get("extra")
    init = extra.get("dataloader_init") if isinstance(extra, Mapping) else None
    loaders = data.get("dataloaders")
    window = report.window
    reference = window.reference if window is not None else None
    return AdviceInputs(
        perf=report.perf,
        model=report.model,
        ranks=report.ranks,
        device=report.device,
        uses_gpu=_uses_gpu(report, ranks),
        dataloaders=[d for d in loaders if isinstance(d, Mapping)]
        if isinstance(loaders, list) else [],
        dataloader_init=init if isinstance(init, Mapping) else None,
        steps=report.title.steps_recorded,
        cpu_count=cpu_count,
        other_cores=other_cores,
        ranks_per_host=max(1, on_host) if host else 1,
        window=tuple(window.window) if window is not None else None,
        window_summary=reference.summary if reference is not None else None,
        window_rank=reference.rank if reference is not None else None,
        pipeline=report.pipeline,
        memory=report.memory,
        backward_collectives=backward_collectives(data) if ref is not None else None,
    )
