"""Achieved FLOP/s and MFU, from the FLOPs a rank counted on one step
(runtime/flops.py) and the measured median phase times of its steady steps.

Pure functions of the results files' contents, like summary.py, which calls
them (this module imports nothing of it).

* Achieved FLOP/s of a phase = the counted step's FLOPs in that phase / the
  median time a steady step spends in it. The median, not the mean: one
  slow step (a checkpoint, a recompile) must not move the rate.
* Which time: on a GPU the Forward and Backward rates use the phase's GPU
  time (CUDA events), since the CPU only launches the kernels and returns;
  the whole step uses the wall-clock step time, as MFU is defined
  (model FLOPs per second of training, everything included).
* MFU = achieved / peak, on a GPU only, the peak picked from peaks.py by
  the device name and the dtype the step ran in, or `--peak-tflops`. On a
  CPU there is no MFU (no table of CPU peaks would be right for a shared,
  frequency-scaling core): achieved GFLOP/s only.
* Several ranks: each rank's own rate and MFU, and the job's: the FLOPs of
  all ranks over the step time of the slowest rank (a synchronous job steps
  at its pace), over the sum of the ranks' peaks.
* What counting cost: the counted step's time less the median step's
  (`cost`), said in a note; where that is COST_SHARE of the run's time in
  steps or more (a short run), the note says so with the figure and names
  --no-flops, which runs without the count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from perfrun.analysis import columns, digest
from perfrun.analysis.peaks import Peak, peak_for

#: The share of a run's time in steps above which the counted step's extra
#: time is said to stretch the run, and --no-flops named.
COST_SHARE = 0.1

#: (row name in the Model Summary, key in the rank's `flops`, phase column).
PHASE_ROWS = (
    ("ProfileStep", None, None),
    ("Forward", "forward", "forward"),
    ("Backward", "backward", "backward"),
    ("Optimization", "optimizer", "optimization"),
)


def counted_step(data: Mapping[str, Any]) -> Optional[int]:
    """The step that ran under the FLOP counter (slower: left out of the
    statistics), or None. Read from a rank file's top level; files from
    before FLOPs were counted have none."""
    section = data.get("flops")
    if not isinstance(section, Mapping):
        return None
    step = section.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return step


def median_time(values: Any) -> Optional[float]:
    """The median of the finite values, None when there are none or it is
    not positive (no rate can be taken over it). `values`: an array, or a
    Digest (analysis/digest.py)."""
    if isinstance(values, digest.Digest):
        found = values.quantile(0.5)
        return found if found is not None and found > 0.0 else None
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return None
    value = float(np.median(arr))
    return value if value > 0.0 else None


def achieved(flops: Optional[float], seconds: Optional[float]) -> Optional[float]:
    """FLOP/s, or None where either is unknown or zero."""
    if not flops or not seconds or seconds <= 0.0 or not math.isfinite(seconds):
        return None
    return float(flops) / seconds


def mfu(rate: Optional[float], peak: Optional[float]) -> Optional[float]:
    """Achieved over peak, a fraction (0.41 prints as 41%)."""
    if rate is None or not peak or peak <= 0.0:
        return None
    return rate / peak


@dataclass(frozen=True)
class PhaseRate:
    """One Model Summary row's FLOPs and rate. `basis`: which time the rate
    divides by ("wall" for the step, "cpu" or "gpu" for a phase)."""

    name: str
    flops: int
    seconds: Optional[float]
    basis: str
    achieved: Optional[float]
    mfu: Optional[float]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "flops": self.flops, "seconds": self.seconds,
                "basis": self.basis, "achieved": self.achieved, "mfu": self.mfu}


@dataclass(frozen=True)
class RankRate:
    """One rank's whole-step rate, or the job's (`rank` None)."""

    rank: Optional[int]
    flops: int
    seconds: Optional[float]
    achieved: Optional[float]
    peak: Optional[float]
    mfu: Optional[float]

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "flops": self.flops, "seconds": self.seconds,
                "achieved": self.achieved, "peak": self.peak, "mfu": self.mfu}


@dataclass(frozen=True)
class FlopsSummary:
    """The reference rank's rates per phase, each rank's and the job's.
    `reason` says why nothing was counted (`counted` False)."""

    counted: bool
    reason: Optional[str] = None
    step: Optional[int] = None
    on_gpu: bool = False
    device_name: Optional[str] = None
    dtype: Optional[str] = None
    autocast: bool = False
    tf32: Optional[bool] = None
    peak: Optional[Peak] = None
    peak_reason: Optional[str] = None
    phases: list[PhaseRate] = field(default_factory=list)
    #: How much longer the counted step took than the median steady step.
    cost: Optional[float] = None
    ranks: list[RankRate] = field(default_factory=list)
    job: Optional[RankRate] = None
    notes: list[str] = field(default_factory=list)

    @property
    def unit(self) -> tuple[str, float]:
        """TFLOP/s on a GPU, GFLOP/s on a CPU: the unit and its factor."""
        return ("TFLOP/s", 1e-12) if self.on_gpu else ("GFLOP/s", 1e-9)

    def rate(self, name: str) -> Optional[PhaseRate]:
        return next((p for p in self.phases if p.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        peak = self.peak
        return {
            "counted": self.counted,
            "reason": self.reason,
            "step": self.step,
            "on_gpu": self.on_gpu,
            "device_name": self.device_name,
            "dtype": self.dtype,
            "autocast": self.autocast,
            "tf32": self.tf32,
            "peak": None if peak is None else {
                "flops": peak.flops, "source": peak.source, "model": peak.model,
                "dtype": peak.dtype,
            },
            "peak_reason": self.peak_reason,
            "phases": [p.to_dict() for p in self.phases],
            "cost": self.cost,
            "ranks": [r.to_dict() for r in self.ranks],
            "job": self.job.to_dict() if self.job is not None else None,
            "notes": list(self.notes),
        }


def _section(data: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    section = data.get("flops")
    return section if isinstance(section, Mapping) else None


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _device_name(data: Mapping[str, Any], section: Mapping[str, Any]) -> Optional[str]:
    name = section.get("device_name")
    if isinstance(name, str) and name:
        return name
    cuda = data.get("cuda")
    if isinstance(cuda, Mapping) and isinstance(cuda.get("name"), str):
        return cuda["name"]
    return None


def _total(section: Mapping[str, Any]) -> int:
    return sum(_int(section.get(k)) for k in ("forward", "backward", "optimizer"))


def rank_peak(data: Mapping[str, Any], override_tflops: Optional[float]
              ) -> tuple[Optional[Peak], Optional[str]]:
    """The peak one rank's GPU is held to, or why there is none."""
    section = _section(data) or {}
    if section.get("device") != "cuda":
        return None, "no MFU on a CPU"
    tf32 = section.get("tf32")
    return peak_for(_device_name(data, section), section.get("dtype") or None,
                    tf32 if isinstance(tf32, bool) else None, override_tflops)


def counted_step_note(step: int, cost: Optional[float], median: Optional[float],
                      steps: int) -> str:
    """The note on the counted step: what it cost beyond the median step,
    and, where that is COST_SHARE or more of the run's time in steps (the
    `steps` steps at the median, and the cost), that share and the option
    that does without it."""
    slower = ""
    if cost is not None and cost > 0:
        slower = f", {cost * 1e3:.1f} ms slower than the median step"
        if median is not None and median >= 0 and steps > 0:
            share = cost / (cost + median * steps)
            if share >= COST_SHARE:
                slower += (f": {share * 100:.0f}% of this run's time in steps; "
                           "--no-flops runs without the count")
    return (f"FLOPs counted on step {step} (torch's FlopCounterMode{slower}); "
            "that step is left out of the statistics")


def median_step(steady: Any) -> Optional[float]:
    """The median step time of the counted steps (their Quantities, or a
    table: columns.py), the time a rate is taken over; None without steps."""
    if isinstance(steady, columns.Quantities):
        return _median_of(steady, "step")
    t = columns.as_table(steady)
    return median_time(columns.step_times(t)) if t.shape[0] else None


def _median_of(q: columns.Quantities, name: str) -> Optional[float]:
    """median_time of the quantity `name` (columns.TIMED) of `q`, from its Stats,
    which hold the same median (of the finite values): the Perf and Model
    Summaries take them anyway, and a median of 10^7 steps costs a quarter
    of a second."""
    if not q.n:
        return None
    median = q.stats(name).median
    return median if median is not None and median > 0.0 else None


def flops_summary(
    data: Mapping[str, Any],
    steady: Any,
    counted_row: Any = None,
    override_tflops: Optional[float] = None,
    others: Sequence[tuple[int, Mapping[str, Any], Optional[float]]] = (),
) -> Optional[FlopsSummary]:
    """The reference rank's `data` (its rank file) and `steady` (its counted
    steps: their Quantities, or a table, columns.py); `counted_row`: the counted step's own row
    (a table of one step), for what counting cost it. `others`: (rank,
    data, median step seconds) of every rank, the reference included, for
    the per-rank and job-wide figures (empty for one rank): the summary
    has those medians in hand already, so no rank's steps are read twice.
    None for files without the section."""
    section = _section(data)
    if section is None:
        return None
    step = counted_step(data)
    if not section.get("counted"):
        reason = section.get("reason")
        return FlopsSummary(counted=False, step=step,
                            reason=str(reason) if reason else "not counted")
    q = columns.quantities(steady)
    on_gpu = section.get("device") == "cuda"
    peak, peak_reason = rank_peak(data, override_tflops)
    peak_flops = peak.flops if peak is not None else None
    step_seconds = median_step(q)
    gpu = q.gpu if on_gpu else None
    phases = []
    for name, key, column in PHASE_ROWS:
        if key is None:
            flops = _total(section)
            seconds, basis = step_seconds, "wall"
        else:
            flops = _int(section.get(key))
            if gpu is not None:
                seconds, basis = median_time(gpu.phases[column]), "gpu"
            else:
                seconds = _median_of(q, column)
                basis = "cpu"
        rate = achieved(flops, seconds)
        phases.append(PhaseRate(name, flops, seconds, basis, rate,
                                mfu(rate, peak_flops) if on_gpu else None))
    cost = None
    if counted_row is not None and step is not None and step_seconds is not None:
        row = columns.as_table(counted_row)
        if row.shape[0] == 1:
            cost = float(columns.step_times(row)[0]) - step_seconds
    notes = [str(n) for n in section.get("notes") or [] if isinstance(n, str)]
    ranks, job = job_rates(others, override_tflops)
    tf32 = section.get("tf32")
    return FlopsSummary(
        counted=True, step=step, on_gpu=on_gpu,
        device_name=_device_name(data, section),
        dtype=section.get("dtype") if isinstance(section.get("dtype"), str) else None,
        autocast=bool(section.get("autocast")),
        tf32=tf32 if isinstance(tf32, bool) else None,
        peak=peak if on_gpu else None,
        peak_reason=None if (peak is not None or not on_gpu) else peak_reason,
        phases=phases, cost=cost, ranks=ranks, job=job, notes=notes,
    )


def job_rates(
    ranks: Sequence[tuple[int, Mapping[str, Any], Optional[float]]],
    override_tflops: Optional[float] = None,
) -> tuple[list[RankRate], Optional[RankRate]]:
    """Each counted rank's whole-step rate and MFU, from (rank, data, its
    median step seconds), and the job's: all ranks' FLOPs over the slowest
    rank's median step time, over the sum of their peaks (no job MFU
    unless every rank has a peak)."""
    out: list[RankRate] = []
    for rank, data, median_step in ranks:
        section = _section(data)
        if section is None or not section.get("counted"):
            continue
        seconds = median_step if median_step is not None and median_step > 0 else None
        flops = _total(section)
        rate = achieved(flops, seconds)
        peak, _ = rank_peak(data, override_tflops)
        p = peak.flops if peak is not None else None
        out.append(RankRate(rank, flops, seconds, rate, p, mfu(rate, p)))
    if len(out) < 2:
        return out, None
    times = [r.seconds for r in out if r.seconds is not None]
    seconds = max(times) if len(times) == len(out) else None
    flops = sum(r.flops for r in out)
    rate = achieved(flops, seconds)
    peaks = [r.peak for r in out]
    total_peak = sum(peaks) if all(p is not None for p in peaks) else None  # type: ignore[misc]
    return out, RankRate(None, flops, seconds, rate, total_peak, mfu(rate, total_peak))
