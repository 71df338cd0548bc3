"""From per-step rows to the numbers the tables print.

Everything here is a pure function of the results files' contents, so that
`perfrun report DIR` prints exactly what the live run printed, and so that
the arithmetic (warm-up, windows, Others, ratios, rates) is unit-tested on
hand-written rows rather than trusted from end-to-end runs.

Conventions:

* A step's time is `end - start - excluded` (evaluation passes and DataLoader
  iterator start-up inside the step's span are not part of the step).
* Others is the step time minus its four phases, so the phases plus Others
  add up to the step time by construction. The runtime measures exclusive
  phases inside the step's span, so Others cannot be negative except by float
  noise, which is clamped to zero; a step whose phases exceed it by more than
  `OVERSHOOT_TOLERANCE` is counted and reported as a note, never hidden.
* Model Summary Avg / Max / Min are **per step**, not per call: "Forward
  avg 12 ms" means a step spends 12 ms in forward, however many forward calls
  (micro-batches, GAN halves) it makes. Per-step figures are what add up to
  the step time; per-call figures would not.
"""

from __future__ import annotations

import math
import shlex
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from perfrun.analysis import columns
from perfrun.analysis.stats import Rate, Stats, default_warmup
from perfrun.analysis.straggler import RankSteps, Straggler
from perfrun.analysis.straggler import decide as decide_straggler
from perfrun.results import COL, PHASES, RankResult, RunResults, table_rows
from perfrun.schema import BOOTSTRAP_HINT, NO_TORCH

Row = Sequence[Any]

#: Phase names as the tables print them, in row order.
PHASE_TITLES = {
    "dataloader": "Dataloader",
    "forward": "Forward",
    "backward": "Backward",
    "optimization": "Optimization",
}

#: Phases exceeding their step by more than this (seconds) are not float
#: noise: the step is counted in `ModelSummary.overshoot_steps`.
OVERSHOOT_TOLERANCE = 1e-6

#: Sections a `Profiler.summary` mapping can switch off (the rest of its keys
#: belong to the detailed window and are not decided here).
SECTION_KEYS = ("overview", "model", "device", "dist", "kernel", "op", "mem", "memcpy")

_START, _END, _EXCLUDED, _SAMPLES = COL["start"], COL["end"], COL["excluded"], COL["samples"]
_GPU_STEP = COL["gpu_step"]


def _num(value: Any) -> float:
    """A time cell as a float: missing cells (None) count as zero."""
    if value is None:
        return 0.0
    value = float(value)
    return value if math.isfinite(value) else 0.0


def _opt_num(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# -- one row -----------------------------------------------------------------


def step_time(row: Row) -> float:
    """Wall time of the step, excluded spans removed (never negative)."""
    t = _num(row[_END]) - _num(row[_START]) - _num(row[_EXCLUDED])
    return t if t > 0.0 else 0.0


def phase_time(row: Row, phase: str) -> float:
    return _num(row[COL[phase]])


def phases_total(row: Row) -> float:
    return math.fsum(phase_time(row, p) for p in PHASES)


def others_time(row: Row) -> float:
    """The part of the step in no phase: Python between the calls, logging,
    metric computation, host-device copies the script makes itself."""
    rest = step_time(row) - phases_total(row)
    return rest if rest > 0.0 else 0.0


def overshoot(row: Row) -> float:
    """How far the phases exceed the step (0.0 when they fit)."""
    excess = phases_total(row) - step_time(row)
    return excess if excess > 0.0 else 0.0


def row_has_gpu(row: Row) -> bool:
    return any(row[COL["gpu_" + p]] is not None for p in PHASES) or row[_GPU_STEP] is not None


def gpu_phase_time(row: Row, phase: str) -> float:
    return _num(row[COL["gpu_" + phase]])


def gpu_step_time(row: Row) -> float:
    """GPU time of the step; when the runtime recorded phases but not the
    step (a step cut short), the phases are all we know of it."""
    value = _opt_num(row[_GPU_STEP])
    if value is None:
        return math.fsum(gpu_phase_time(row, p) for p in PHASES)
    return value if value > 0.0 else 0.0


def gpu_others_time(row: Row) -> float:
    rest = gpu_step_time(row) - math.fsum(gpu_phase_time(row, p) for p in PHASES)
    return rest if rest > 0.0 else 0.0


def row_samples(row: Row) -> Optional[int]:
    value = row[_SAMPLES]
    if value is None:
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


# -- which steps count --------------------------------------------------------


def rank_window(rank: RankResult) -> Optional[tuple[int, int]]:
    """The rank's detailed-profiler window `[START, END)`, if it had one."""
    window = rank.data.get("window")
    if isinstance(window, (list, tuple)) and len(window) == 2:
        try:
            return int(window[0]), int(window[1])
        except (TypeError, ValueError):
            return None
    return None


def profiled_steps(rank: RankResult) -> Optional[tuple[int, int]]:
    """The steps torch.profiler ran over: the window and, before it, the
    profiler's warm-up step (profiled, its events discarded, and as slow as
    the window's). Files without the field: the window."""
    profiled = rank.data.get("profiled")
    if isinstance(profiled, (list, tuple)) and len(profiled) == 2:
        try:
            return int(profiled[0]), int(profiled[1])
        except (TypeError, ValueError):
            pass
    return rank_window(rank)


def steady_indices(
    n_rows: int,
    warmup: int,
    window: Optional[Sequence[int]] = None,
    exclude_window: bool = True,
) -> list[int]:
    """Indices of the steps that enter the statistics.

    Warm-up steps pay one-off costs; steps inside the detailed window run
    under torch.profiler and are slower than the loop really is. Both would
    bias every average, so both are left out.
    """
    start, end = (int(window[0]), int(window[1])) if (exclude_window and window) else (0, 0)
    return [i for i in range(max(0, warmup), n_rows) if not (start <= i < end)]


def steady_count(
    n_rows: int,
    warmup: int,
    window: Optional[Sequence[int]] = None,
    exclude_window: bool = True,
) -> int:
    """len(steady_indices(...)), without making the list."""
    first = max(0, warmup)
    start, end = (int(window[0]), int(window[1])) if (exclude_window and window) else (0, 0)
    inside = max(0, min(n_rows, end) - max(first, start))
    return max(0, n_rows - first) - inside


def steady_rows(
    rank: RankResult,
    warmup: int,
    window: Optional[Sequence[int]] = None,
    exclude_window: bool = True,
) -> list[Row]:
    """The rank's rows after warm-up and outside the detailed window.

    A step's index is its position in `rank.rows` (step 0 is the first).
    `window=None` means the rank's own recorded window; pass
    `exclude_window=False` to keep the window's steps.
    """
    return table_rows(steady_table(rank, warmup, window, exclude_window))


def steady_table(
    rank: RankResult,
    warmup: int,
    window: Optional[Sequence[int]] = None,
    exclude_window: bool = True,
) -> Any:
    """steady_rows as a table (columns.py): what the analysis works on."""
    if window is None:
        window = profiled_steps(rank)
    table = rank.table
    n = int(table.shape[0])
    start, end = (int(window[0]), int(window[1])) if (exclude_window and window) else (0, 0)
    first = max(0, warmup)
    lo, hi = max(first, start), min(n, end)
    skip = _flops_skip(rank, n, first, (lo, hi))
    if skip is not None:
        keep = np.arange(n) >= first
        keep[lo:max(lo, hi)] = False
        keep[skip] = False
        return np.asfortranarray(table[keep])
    # Column-major: every quantity reads whole columns, which in the file's
    # row-major layout would be strided reads across all of it.
    if hi <= lo:  # the window is not inside the counted steps: one slice
        return np.asfortranarray(table[first:])
    return np.asfortranarray(np.concatenate([table[first:lo], table[hi:]]))


def _flops_skip(rank: RankResult, n: int, first: int, window: tuple[int, int]) -> Optional[int]:
    """The step that ran under the FLOP counter (analysis/flops.py), when it
    is among the steps counted: several times slower than the others, it is
    left out as the detailed window's steps are."""
    from perfrun.analysis.flops import counted_step

    skip = counted_step(rank.data)
    if skip is None or not first <= skip < n or window[0] <= skip < window[1]:
        return None
    return skip


# -- Perf Summary ---------------------------------------------------------------


@dataclass(frozen=True)
class PerfSummary:
    """Paddle's timer numbers: reader_cost, batch_cost, ips, Reader Ratio.

    `reader_ratio` is a fraction (0.53 prints as 53.000%); `samples_ips` is
    None unless every counted step knows its batch size, since a rate over
    some of the steps would mix two different runs' worth of time.
    """

    steps: int
    reader_cost: Stats
    batch_cost: Stats
    ips: Rate
    samples_ips: Optional[Rate]
    reader_ratio: Optional[float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "reader_cost": self.reader_cost.to_dict(),
            "batch_cost": self.batch_cost.to_dict(),
            "ips": self.ips.to_dict(),
            "samples_ips": self.samples_ips.to_dict() if self.samples_ips else None,
            "reader_ratio": self.reader_ratio,
        }


def perf_summary(rows: Any) -> PerfSummary:
    """From the counted steps: a table (columns.py) or rows as lists."""
    t = columns.as_table(rows)
    n = int(t.shape[0])
    times = columns.step_times(t)
    batch = Stats.of(times)
    reader = Stats.of(columns.phase_times(t, "dataloader"))
    total = batch.total or 0.0
    positive = times > 0.0
    with np.errstate(divide="ignore"):
        ips = Rate.from_totals(n, total, 1.0 / times[positive])
    samples_ips: Optional[Rate] = None
    counts = columns.samples(t)
    if n and not np.isnan(counts).any():
        with np.errstate(divide="ignore"):
            samples_ips = Rate.from_totals(
                float(counts.sum()), total, counts[positive] / times[positive]
            )
    if not n:
        ratio: Optional[float] = None
    elif total <= 0.0 or reader.avg is None or batch.avg is None:
        ratio = 0.0
    else:
        ratio = reader.avg / batch.avg
    return PerfSummary(
        steps=n,
        reader_cost=reader,
        batch_cost=batch,
        ips=ips,
        samples_ips=samples_ips,
        reader_ratio=ratio,
    )


# -- Model Summary --------------------------------------------------------------


@dataclass(frozen=True)
class ModelRow:
    """One line of the Model Summary. `gpu` is None when the run had no GPU
    timings: the renderers then leave the GPU column out entirely."""

    name: str
    calls: Optional[int]
    cpu: Stats
    cpu_ratio: Optional[float]
    gpu: Optional[Stats] = None
    gpu_ratio: Optional[float] = None

    @property
    def is_step(self) -> bool:
        return self.name == "ProfileStep"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "calls": self.calls,
            "cpu": self.cpu.to_dict(),
            "cpu_ratio": self.cpu_ratio,
            "gpu": self.gpu.to_dict() if self.gpu is not None else None,
            "gpu_ratio": self.gpu_ratio,
        }


@dataclass(frozen=True)
class ModelSummary:
    """ProfileStep, then each phase, then Others. Times in seconds (the
    renderers print milliseconds); Avg/Max/Min are per step."""

    steps: int
    rows: list[ModelRow]
    has_gpu: bool
    overshoot_steps: int = 0
    overshoot_max: float = 0.0

    def row(self, name: str) -> ModelRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "has_gpu": self.has_gpu,
            "rows": [r.to_dict() for r in self.rows],
            "overshoot_steps": self.overshoot_steps,
            "overshoot_max": self.overshoot_max,
        }


#: Said when the counted steps trained but timed no forward (forward_unseen).
FORWARD_UNSEEN = (
    "no forward was timed in the counted steps, though they trained: the model ran "
    "where perfrun times no module call, inside code torch.compile traced (a compiled "
    "function, or the compiled training_step Lightning makes of a compiled "
    "LightningModule) or not called as an nn.Module, so its forward is counted in Others"
)


def forward_unseen(model: Optional[ModelSummary]) -> bool:
    """The counted steps trained (a backward or an optimizer step was timed)
    yet timed no forward. The model then ran where perfrun times no module
    call, most often inside a function given to torch.compile: Dynamo traces
    the model's call there, and a traced call is never timed (hooks.py). Its
    forward is then in Others, which is no longer the loop's own Python
    alone, and the report must say so rather than blame the loop."""
    if model is None or not model.steps:
        return False
    calls = {row.name: row.calls or 0 for row in model.rows}
    return calls.get("Forward", 0) == 0 and (
        calls.get("Backward", 0) > 0 or calls.get("Optimization", 0) > 0
    )


def _ratio(part: Optional[float], whole: Optional[float]) -> Optional[float]:
    if part is None or whole is None or whole <= 0.0:
        return None
    return part / whole * 100.0


def model_summary(rows: Any) -> ModelSummary:
    """From the counted steps: a table (columns.py) or rows as lists."""
    t = columns.as_table(rows)
    n = int(t.shape[0])
    step = Stats.of(columns.step_times(t))
    has_gpu_mask = columns.gpu_mask(t)
    has_gpu = bool(has_gpu_mask.any())
    g = t[has_gpu_mask]
    gpu_step = Stats.of(columns.gpu_step_times(g)) if has_gpu else None

    def gpu_pair(values: Any) -> tuple[Optional[Stats], Optional[float]]:
        if gpu_step is None:
            return None, None
        stats = Stats.of(values)
        return stats, _ratio(stats.total, gpu_step.total)

    out = [
        ModelRow(
            "ProfileStep", n, step, _ratio(step.total, step.total),
            gpu_step, _ratio(gpu_step.total, gpu_step.total) if gpu_step else None,
        )
    ]
    for phase in PHASES:
        cpu = Stats.of(columns.phase_times(t, phase))
        calls = columns.phase_calls(t, phase)
        gpu, gpu_ratio = gpu_pair(columns.gpu_phase_times(g, phase) if has_gpu else None)
        out.append(
            ModelRow(PHASE_TITLES[phase], calls, cpu, _ratio(cpu.total, step.total), gpu, gpu_ratio)
        )
    others = Stats.of(columns.others_times(t))
    gpu, gpu_ratio = gpu_pair(columns.gpu_others_times(g) if has_gpu else None)
    out.append(ModelRow("Others", None, others, _ratio(others.total, step.total), gpu, gpu_ratio))
    excess = columns.overshoots(t)
    over = excess[excess > OVERSHOOT_TOLERANCE]
    return ModelSummary(
        steps=n,
        rows=out,
        has_gpu=has_gpu,
        overshoot_steps=int(over.size),
        overshoot_max=float(over.max()) if over.size else 0.0,
    )


# -- several ranks ----------------------------------------------------------------


def _signal_name(number: Any) -> str:
    try:
        return signal.Signals(int(number)).name
    except (TypeError, ValueError):
        return f"signal {number}"


def _steps_phrase(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def rank_problem(
    rank: RankResult, exit_status: Optional[int] = None, alive: Optional[bool] = None
) -> Optional[str]:
    """What went wrong with this rank, in a few words, or None.

    `alive`: whether the rank's process is still running (known where it
    runs on this machine; None where it cannot be known). A `running` file
    of a live process is a run in progress, not a death.

    `running` in a file read after the run means the rank never wrote its
    final record: it died (SIGKILL, OOM killer, a hard crash) and what is left
    is its last periodic flush. A clean `--stop-after` stop is not a problem.

    `exit_status` is the process's own exit status when the launcher saw it
    (one process, no torchrun). A process that exited normally yet never
    wrote its final record did not die: it replaced itself (`os.exec*`, so
    the new program runs without perfrun), left by `os._exit`, or could not
    write (perfrun then said so on its stderr).
    """
    n = rank.n_steps
    status = rank.status
    exit_info = rank.data.get("exit") or {}
    if status == "running":
        if alive:
            return f"still running ({_steps_phrase(n)} so far; this report is of its last save)"
        when = f"after {_steps_phrase(n)}" if n else "before its first step"
        if exit_status is not None and exit_status >= 0:
            return (
                f"exited with status {exit_status} {when} but never saved its final "
                "results: it re-executed itself (os.exec*) or called os._exit, or "
                "writing them failed (a full disk?)"
            )
        return f"died {when}"
    if status == "signalled":
        sig = exit_info.get("signal")
        what = f"killed by {_signal_name(sig)}" if sig is not None else "killed by a signal"
        return f"{what} after {_steps_phrase(n)}"
    if status in ("finished", "stopped"):
        exception = exit_info.get("exception")
        if exception:
            text = " ".join(str(exception).split())
            if len(text) > 80:
                text = text[:77] + "..."
            return f"raised {text} after {_steps_phrase(n)}"
        if n == 0:
            return "recorded no steps"
        return None
    return f"ended with unknown status {status!r} after {_steps_phrase(n)}"


@dataclass(frozen=True)
class RankRow:
    """One rank's line in the multi-rank table: averages per counted step."""

    rank: int
    hostname: Optional[str]
    status: str
    steps: int
    counted: int
    step_avg: Optional[float]
    phase_avg: dict[str, Optional[float]]
    others_avg: Optional[float]
    problem: Optional[str]
    #: The median counted step (not in the JSON): what FLOP rates are
    #: taken over, kept so that no rank's steps are read again for them.
    step_median: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "hostname": self.hostname,
            "status": self.status,
            "steps": self.steps,
            "counted": self.counted,
            "step_avg": self.step_avg,
            "phase_avg": dict(self.phase_avg),
            "others_avg": self.others_avg,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class SlowRank:
    rank: int
    step_avg: float
    median: float
    percent_slower: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "step_avg": self.step_avg,
            "median": self.median,
            "percent_slower": self.percent_slower,
        }


#: The quantities compared across ranks, in column order.
RANK_QUANTITIES = ("step",) + PHASES + ("others",)


@dataclass(frozen=True)
class MultiRankSummary:
    """Per-rank rows plus min / median / max across the ranks that counted
    steps (`across[q]` is a `Stats` over the ranks' averages of quantity q,
    one of `RANK_QUANTITIES`)."""

    rows: list[RankRow]
    across: dict[str, Stats]
    slowest: Optional[SlowRank]
    # The culprit/victim verdict (straggler.py); None when fewer than two
    # ranks share enough steady steps to compare on a common clock.
    straggler: Optional[Straggler] = None

    @property
    def problems(self) -> list[str]:
        return [f"rank {r.rank}: {r.problem}" for r in self.rows if r.problem]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows": [r.to_dict() for r in self.rows],
            "across": {k: v.to_dict() for k, v in self.across.items()},
            "slowest": self.slowest.to_dict() if self.slowest else None,
        }
        if self.straggler is not None:
            out["straggler"] = self.straggler.to_dict()
        return out


def multi_rank_summary(
    ranks: Sequence[RankResult],
    warmup: int,
    missing: Iterable[int] = (),
    exclude_window: bool = True,
    alive: Iterable[int] = (),
) -> MultiRankSummary:
    """Compare ranks: in data-parallel training every step waits for the
    slowest rank, so one slow rank (a throttled GPU, a busy host, a skewed
    shard) sets the pace of all of them."""
    from perfrun.analysis.flops import median_step

    live = set(alive)
    rows: list[RankRow] = []
    for rank in ranks:
        steady = steady_table(rank, warmup, exclude_window=exclude_window)
        env = rank.data.get("env") or {}
        phase_avg = {p: Stats.avg_of(columns.phase_times(steady, p)) for p in PHASES}
        rows.append(
            RankRow(
                rank=rank.rank,
                hostname=env.get("hostname"),
                status=rank.status,
                steps=rank.n_steps,
                counted=int(steady.shape[0]),
                step_avg=Stats.avg_of(columns.step_times(steady)),
                phase_avg=phase_avg,
                others_avg=Stats.avg_of(columns.others_times(steady)),
                problem=rank_problem(rank, alive=rank.rank in live),
                step_median=median_step(steady),
            )
        )
    for r in missing:
        rows.append(
            RankRow(
                rank=int(r), hostname=None, status="missing", steps=0, counted=0,
                step_avg=None, phase_avg=dict.fromkeys(PHASES), others_avg=None,
                problem="wrote nothing",
            )
        )
    rows.sort(key=lambda r: r.rank)
    across: dict[str, Stats] = {
        "step": Stats.of(r.step_avg for r in rows),
        "others": Stats.of(r.others_avg for r in rows),
    }
    for p in PHASES:
        across[p] = Stats.of(r.phase_avg[p] for r in rows)
    across = {q: across[q] for q in RANK_QUANTITIES}
    slowest: Optional[SlowRank] = None
    timed = [r for r in rows if r.step_avg is not None]
    median = across["step"].median
    if len(timed) > 1 and median:
        worst = max(timed, key=lambda r: (r.step_avg or 0.0, -r.rank))
        assert worst.step_avg is not None
        slowest = SlowRank(
            rank=worst.rank,
            step_avg=worst.step_avg,
            median=median,
            percent_slower=(worst.step_avg / median - 1.0) * 100.0,
        )
    straggler = _straggler(ranks, warmup, exclude_window)
    return MultiRankSummary(rows=rows, across=across, slowest=slowest, straggler=straggler)


#: The most steps the straggler check compares, evenly spaced over the steady
#: steps all ranks share: its verdict rests on medians per rank and per
#: phase, which a sample of this size gives to well within the noise of a
#: step, and it holds this many steps of every rank at once (a job of 64
#: ranks x 1,000,000 steps would otherwise hold all 8.7 GB of its steps).
STRAGGLER_STEPS = 20_000


def _straggler(ranks: Sequence[RankResult], warmup: int, exclude_window: bool) -> Any:
    """The straggler verdict (straggler.py) over the steady steps every rank
    recorded, at most STRAGGLER_STEPS of them: the steps are chosen from the
    ranks' step counts alone, then read rank by rank."""
    kept = [(rank, _steady_index(rank, warmup, exclude_window)) for rank in ranks]
    kept = [(rank, index) for rank, index in kept if len(index)]
    if len(kept) < 2:
        return None
    common = kept[0][1]
    for _, index in kept[1:]:
        common = np.intersect1d(common, index, assume_unique=True)
    if len(common) > STRAGGLER_STEPS:
        common = common[np.linspace(0, len(common) - 1, STRAGGLER_STEPS).astype(np.int64)]
    return decide_straggler([_rank_steps(rank, common) for rank, _ in kept])


def _steady_index(rank: RankResult, warmup: int, exclude_window: bool) -> Any:
    """The indices of the rank's steady steps (steady_table drops them, and
    ranks are compared step by step), from its step count alone."""
    n = rank.n_steps
    keep = np.arange(n) >= max(0, warmup)
    window = profiled_steps(rank) if exclude_window else None
    if window:
        idx = np.arange(n)
        keep &= (idx < int(window[0])) | (idx >= int(window[1]))
    skip = _flops_skip(rank, n, 0, (0, 0))
    if skip is not None:
        keep[skip] = False
    return np.flatnonzero(keep)


def _rank_steps(rank: RankResult, index: Any) -> RankSteps:
    """The rank's steps at `index`, with their indices and clock origin."""
    env = rank.data.get("env") or {}
    origin = rank.data.get("started_unix")
    return RankSteps(
        rank=rank.rank,
        host=env.get("hostname"),
        origin=float(origin) if isinstance(origin, (int, float)) else 0.0,
        index=index,
        table=rank.take(index),
    )


# -- Device Summary ----------------------------------------------------------------


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    util_avg: Optional[float]
    util_max: Optional[float]
    mem_used_max: Optional[int]
    mem_total: Optional[int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "util_avg": self.util_avg,
            "util_max": self.util_max,
            "mem_used_max": self.mem_used_max,
            "mem_total": self.mem_total,
        }


@dataclass(frozen=True)
class HostDevice:
    """One host's utilisation, as sampled by its lowest rank. The process
    figures are that rank's process; CPU(Process) can exceed 100% (one
    hundred per busy core)."""

    hostname: str
    rank: int
    cpu_process_avg: Optional[float]
    cpu_process_max: Optional[float]
    cpu_system_avg: Optional[float]
    cpu_system_max: Optional[float]
    rss_peak_bytes: Optional[int]
    gpus: list[GpuDevice]

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "rank": self.rank,
            "cpu_process_avg": self.cpu_process_avg,
            "cpu_process_max": self.cpu_process_max,
            "cpu_system_avg": self.cpu_system_avg,
            "cpu_system_max": self.cpu_system_max,
            "rss_peak_bytes": self.rss_peak_bytes,
            "gpus": [g.to_dict() for g in self.gpus],
        }


@dataclass(frozen=True)
class DeviceSummary:
    hosts: list[HostDevice]

    @property
    def has_gpu(self) -> bool:
        return any(h.gpus for h in self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [h.to_dict() for h in self.hosts], "has_gpu": self.has_gpu}


def _pair(section: Any) -> tuple[Optional[float], Optional[float]]:
    if not isinstance(section, Mapping):
        return None, None
    return _opt_num(section.get("avg")), _opt_num(section.get("max"))


def _opt_int(value: Any) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def device_summary(ranks: Sequence[RankResult]) -> Optional[DeviceSummary]:
    """CPU, memory and GPU utilisation per host, or None when no rank
    sampled any. Every rank on a host sees the same GPUs and the same system
    CPU; taking the lowest rank per host keeps each device once."""
    chosen: dict[str, RankResult] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        device = rank.data.get("device")
        if not isinstance(device, Mapping) or not device:
            continue
        host = str((rank.data.get("env") or {}).get("hostname") or "?")
        chosen.setdefault(host, rank)
    hosts = []
    for host, rank in chosen.items():
        device = rank.data["device"]
        proc_avg, proc_max = _pair(device.get("cpu_process_percent"))
        sys_avg, sys_max = _pair(device.get("cpu_system_percent"))
        gpus = []
        for i, g in enumerate(device.get("gpus") or []):
            if not isinstance(g, Mapping):
                continue
            index = _opt_int(g.get("index"))
            gpus.append(
                GpuDevice(
                    index=i if index is None else index,
                    name=str(g.get("name") or "GPU"),
                    util_avg=_opt_num(g.get("util_avg")),
                    util_max=_opt_num(g.get("util_max")),
                    mem_used_max=_opt_int(g.get("mem_used_max")),
                    mem_total=_opt_int(g.get("mem_total")),
                )
            )
        hosts.append(
            HostDevice(
                hostname=host,
                rank=rank.rank,
                cpu_process_avg=proc_avg,
                cpu_process_max=proc_max,
                cpu_system_avg=sys_avg,
                cpu_system_max=sys_max,
                rss_peak_bytes=_opt_int(device.get("rss_peak_bytes")),
                gpus=gpus,
            )
        )
    return DeviceSummary(hosts=hosts) if hosts else None


# -- the whole report ------------------------------------------------------------------


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

    def entries(self) -> list[tuple[str, str]]:
        """The title as (label, sentence) pairs, shared by every renderer
        (Markdown sets the command and the folder in code spans)."""
        out = []
        if self.command:
            out.append(("Command", self.command))
        out.append(("Results", self.run_dir))
        if self.world_size > 1:
            who = f"; summaries are rank {self.rank}'s" if self.rank is not None else ""
            out.append(("Ranks", f"{self.world_size}{who}"))
        if self.rank is not None and self.steps_recorded:
            how = "default; --warmup N to change" if self.warmup_default else "as set"
            warm = f"first {_steps_phrase(self.warmup)}" if self.warmup else "none"
            out.append((
                "Steps",
                f"{self.steps_counted} counted of {self.steps_recorded} recorded; "
                f"warm-up left out: {warm} ({how})",
            ))
        if self.window is not None:
            start, end = self.window
            if not self.window_excluded:
                tail = "kept in the statistics"
            elif self.window_steps:
                tail = f"{_steps_phrase(self.window_steps)} in it left out of the statistics"
            else:
                tail = "no counted step fell in it"
            out.append(("Window", f"steps [{start}, {end}) profiled in detail; {tail}"))
        return out

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
    sections: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(SECTION_KEYS, True))
    #: The detailed window's tables (analysis/window.py), when there is one.
    window: Any = None
    #: How window tables are shown: sort_by, row_limit, time_unit, op_detail.
    view: dict[str, Any] = field(default_factory=dict)
    #: Bottleneck advice (analysis/advice.py), each with the numbers it rests on.
    advice: list[Any] = field(default_factory=list)
    #: Achieved FLOP/s and MFU (analysis/flops.py); None for older files.
    flops: Any = None
    #: Why the figures may not be the script's own (analysis/disturbed.py).
    disturbed: list[Any] = field(default_factory=list)

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
            "disturbed": [f.to_dict() for f in self.disturbed],
        }


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
        calls = _opt_int(item.get("calls")) or 0
        if calls <= 0:
            continue
        detail = None
        if key == "eval":
            # `calls` is the number of passes; files from before passes were
            # told apart from batches carry no "passes" key.
            parts = []
            batches = _opt_int(item.get("batches"))
            if batches:
                parts.append(f"{batches} batches")
            forwards = _opt_int(item.get("forward_calls"))
            if forwards:
                parts.append(f"{forwards} forward calls")
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
        out.append(ExtraRow(name, calls, _num(item.get("time")), detail, unit))
    return out


def _faults(ranks: Sequence[RankResult]) -> list[Fault]:
    merged: dict[tuple[str, str], list[Any]] = {}
    for rank in ranks:
        for f in rank.data.get("faults") or []:
            if not isinstance(f, Mapping):
                continue
            key = (str(f.get("where", "?")), str(f.get("error", "?")))
            entry = merged.setdefault(key, [0, []])
            entry[0] += _opt_int(f.get("count")) or 1
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
    sections = dict.fromkeys(SECTION_KEYS, True)
    settings = (ref.data.get("settings") if ref else None) or {}
    summary = settings.get("summary") if isinstance(settings, Mapping) else None
    if isinstance(summary, Mapping):
        for key in SECTION_KEYS:
            if key in summary:
                sections[key] = bool(summary[key])
    return sections


def _no_measurement(run: RunResults) -> Optional[str]:
    if not run.ranks:
        return "no rank wrote results"
    if any(r.n_steps for r in run.ranks):
        return None
    if not any(r.data.get("torch_imported") for r in run.ranks):
        return NO_TORCH
    return "no PyTorch training loop was seen: no forward, backward or optimizer step ran"


def _launcher_exit_status(run: RunResults) -> Optional[int]:
    """The script's exit status as perfrun's launcher saw it, when the
    launcher ran the script itself (under torchrun it sees torchrun's)."""
    if run.meta.get("launcher") != "python":
        return None
    return _opt_int(run.meta.get("returncode"))


def build_report(
    run: RunResults,
    warmup: Optional[int] = None,
    exclude_window: Optional[bool] = None,
    alive: Iterable[int] = (),
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
        configured = _opt_int(settings.get("warmup"))
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
    counted = steady_count(n_rows, warmup, profiled or window, exclude_window)
    after_warmup = steady_count(n_rows, warmup)
    # The FLOP-counted step is left out too, but is no window step.
    flops_left_out = int(ref is not None and _flops_skip(
        ref, n_rows, max(0, warmup),
        tuple(profiled or window) if (exclude_window and (profiled or window)) else (0, 0),
    ) is not None)
    after_warmup -= flops_left_out
    counted -= flops_left_out
    title = Title(
        command=_command(run, ref),
        run_dir=run.run_dir,
        world_size=run.world_size,
        rank=ref.rank if ref else None,
        steps_recorded=n_rows,
        steps_counted=counted,
        warmup=warmup,
        warmup_default=warmup_default,
        window=window,
        window_excluded=exclude_window,
        window_steps=after_warmup - counted,
        profiled=profiled or window,
    )
    report = Report(title=title, sections=_sections(ref))
    report.problem = _no_measurement(run)
    report.notes = _notes(ranks)
    if report.problem is not None and not any(r.data.get("torch_imported") for r in ranks):
        report.notes.append(BOOTSTRAP_HINT)
    report.faults = _faults(ranks)

    if run.world_size > 1 or run.missing:
        report.ranks = multi_rank_summary(ranks, warmup, run.missing, exclude_window, alive)
        report.problems = report.ranks.problems
    else:
        status = _launcher_exit_status(run)
        report.problems = [
            f"rank {r.rank}: {p}"
            for r in ranks
            if (p := rank_problem(r, status, alive=r.rank in set(alive)))
        ]
    if report.problem is not None:
        # "recorded no steps" only repeats what `problem` already says.
        report.problems = [p for p in report.problems if not p.endswith("recorded no steps")]

    if ref is not None:
        report.extras = _extras(ref)
        report.device = device_summary(ranks)
    from perfrun.analysis.window import window_report

    report.window = window_report(ranks, ref, window, warmup)
    if ref is not None and ref.n_steps:
        counted = steady_table(ref, warmup, profiled or window, exclude_window)
        report.perf = perf_summary(counted)
        report.model = model_summary(counted)
        if not counted.shape[0]:
            report.notes.append(
                f"all {_steps_phrase(n_rows)} of rank {ref.rank} fall in the warm-up "
                "or the detailed window: nothing left to summarise (lower --warmup)"
            )
        if forward_unseen(report.model):
            report.notes.append(FORWARD_UNSEEN)
        report.flops = _flops(ref, ranks, counted, settings, report)
        if report.model.overshoot_steps:
            report.notes.append(
                f"{_steps_phrase(report.model.overshoot_steps)} recorded phases longer than "
                f"the step itself (by up to {report.model.overshoot_max * 1e3:.3f} ms); "
                "Others is shown as 0 for them"
            )
    from perfrun.analysis.advice import advise, inputs_for

    report.advice = advise(inputs_for(report, ref, ranks))
    report.disturbed = _disturbed(run)
    return report


def _flops(ref: RankResult, ranks: Sequence[RankResult], counted: Any,
           settings: Mapping[str, Any], report: Report) -> Any:
    """Achieved FLOP/s and MFU (analysis/flops.py), and a note on the
    counted step; a damaged record costs the figures, never the report."""
    from perfrun.analysis.flops import counted_step, flops_summary

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
        summary = flops_summary(ref.data, counted, row, peak, others)
    except Exception:  # noqa: BLE001
        return None
    if summary is not None and summary.counted and summary.step is not None:
        cost = summary.cost
        slower = f", {cost * 1e3:.1f} ms slower than the median step" if cost and cost > 0 else ""
        report.notes.append(
            f"FLOPs counted on step {summary.step} (torch's FlopCounterMode{slower}); "
            "that step is left out of the statistics"
        )
        report.notes.extend(f"FLOPs: {note}" for note in summary.notes)
    return summary


def _disturbed(run: RunResults) -> list[Any]:
    """The disturbance flags; evidence that cannot be read is no flag."""
    from perfrun.analysis.disturbed import flags_of

    try:
        return flags_of(run)
    except Exception:  # noqa: BLE001 - a damaged record must not cost the report
        return []
