"""Step quantities over whole columns, every step at once: the definitions
of a step's time, its phases, Others and its GPU time.

A rank's steps arrive as a (steps, STEP_COLUMNS) float64 array with NaN for
a value not recorded (store/rankfile.py, RankResult.table), or a block of
them at a time. Looping over a million rows in Python costs tens of
seconds; these cost milliseconds. The
rules: a missing or non-finite time counts as zero, a step never lasts less
than nothing, Others is never negative, and a step has GPU time when any of
its GPU cells was recorded (tests/oracle.py holds the same rules one row at
a time, and the tests hold the two against each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from perfrun.analysis import digest
from perfrun.store.rankfile import rows_table
from perfrun.store.stepfile import COL, PHASES

_START, _END, _EXCLUDED, _SAMPLES = COL["start"], COL["end"], COL["excluded"], COL["samples"]
_PHASE_COLS = [COL[p] for p in PHASES]
_CALL_COLS = {p: COL[p + "_calls"] for p in PHASES}
_GPU_PHASE_COLS = [COL["gpu_" + p] for p in PHASES]
_GPU_COLS = _GPU_PHASE_COLS + [COL["gpu_step"]]
_GPU_STEP = COL["gpu_step"]

Table = Any  # numpy.ndarray of shape (steps, len(STEP_COLUMNS))

#: Phases exceeding their step by more than this (seconds) are not float
#: noise: the step is counted in `Tallies.overshoot_steps` (the Model
#: Summary's note).
OVERSHOOT_TOLERANCE = 1e-6


def as_table(rows: Any) -> Table:
    """A table from a table, or from rows as lists (None for missing)."""
    if isinstance(rows, np.ndarray):
        return rows
    return rows_table(rows)


def num(values: Any) -> Any:
    """Missing (NaN) and non-finite cells as zero: a time not recorded
    adds nothing."""
    values = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(values), values, 0.0)


def step_times(t: Table) -> Any:
    times = num(t[:, _END]) - num(t[:, _START]) - num(t[:, _EXCLUDED])
    return np.maximum(times, 0.0)


def phase_times(t: Table, phase: str) -> Any:
    return num(t[:, COL[phase]])


def phase_calls(t: Table, phase: str) -> int:
    return int(num(t[:, _CALL_COLS[phase]]).astype(np.int64).sum())


def phases_totals(t: Table) -> Any:
    return num(t[:, _PHASE_COLS]).sum(axis=1)


def others_times(t: Table, step: Any = None) -> Any:
    """`step`: step_times(t), when the caller has them already."""
    return np.maximum((step_times(t) if step is None else step) - phases_totals(t), 0.0)


def overshoots(t: Table, step: Any = None) -> Any:
    """`step`: step_times(t), when the caller has them already."""
    return np.maximum(phases_totals(t) - (step_times(t) if step is None else step), 0.0)


def gpu_mask(t: Table) -> Any:
    """Steps with any GPU cell recorded."""
    return ~np.isnan(t[:, _GPU_COLS]).all(axis=1)


def gpu_phase_times(t: Table, phase: str) -> Any:
    return num(t[:, COL["gpu_" + phase]])


def gpu_step_times(t: Table) -> Any:
    """GPU time of each step; where the step's own cell is missing (a step
    cut short), the sum of its phases."""
    own = t[:, _GPU_STEP]
    known = np.isfinite(own)
    phases = num(t[:, _GPU_PHASE_COLS]).sum(axis=1)
    return np.where(known, np.maximum(np.where(known, own, 0.0), 0.0), phases)


def gpu_others_times(t: Table) -> Any:
    phases = num(t[:, _GPU_PHASE_COLS]).sum(axis=1)
    return np.maximum(gpu_step_times(t) - phases, 0.0)


def samples(t: Table) -> Any:
    """Samples per step as float, NaN where unknown (missing, or not a
    positive count)."""
    values = t[:, _SAMPLES]
    whole = np.trunc(np.where(np.isfinite(values), values, 0.0))
    return np.where(whole > 0, whole, np.nan)


# -- the quantities of a set of steps, computed once -------------------------------------


@dataclass
class Gpu:
    """The GPU times of the steps that have any GPU cell recorded
    (gpu_mask): each step's, each phase's and Others'."""

    step: Any
    phases: dict[str, Any]
    others: Any

    @classmethod
    def of(cls, t: Table) -> Optional[Gpu]:
        """The GPU times of the steps of `t` that have any; None when none
        has."""
        mask = gpu_mask(t)
        if not mask.any():
            return None
        g = t[mask]
        return cls(gpu_step_times(g), {p: gpu_phase_times(g, p) for p in PHASES},
                   gpu_others_times(g))

    @classmethod
    def join(cls, parts: Sequence[Optional[Gpu]]) -> Optional[Gpu]:
        """Parts of consecutive steps as one, in order."""
        found = [p for p in parts if p is not None]
        if not found:
            return None
        if len(found) == 1:
            return found[0]
        return cls(np.concatenate([p.step for p in found]),
                   {q: np.concatenate([p.phases[q] for p in found]) for q in PHASES},
                   np.concatenate([p.others for p in found]))


@dataclass
class Tallies:
    """What the summaries count over a set of steps rather than take
    statistics of: calls per phase, samples, the steps whose phases add up
    to more than the step. Each is a whole-number sum, an extreme or a
    flag, so tallies of consecutive parts of the steps add up to the
    tallies of the whole, exactly."""

    #: Calls per phase, summed.
    calls: dict[str, int]
    #: Every step knows its samples (columns.samples is never NaN).
    samples_known: bool
    #: The samples, summed (whole numbers: exact in any order).
    samples_total: float
    #: An array whose finite smallest and largest values are those of the
    #: steps' samples per second (samples / step time, over steps of
    #: positive time): all of them, or each part's extremes.
    sample_rates: Any
    #: Steps whose phases exceed the step by more than OVERSHOOT_TOLERANCE,
    #: and by how much at most.
    overshoot_steps: int
    overshoot_max: float

    @classmethod
    def of(cls, t: Table, step: Any) -> Tallies:
        """The tallies of the steps of `t`, whose step times (step_times)
        are `step`."""
        counts = samples(t)
        positive = step > 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            rates = counts[positive] / step[positive]
        excess = overshoots(t, step)
        over = excess[excess > OVERSHOOT_TOLERANCE]
        return cls(
            calls={p: phase_calls(t, p) for p in PHASES},
            samples_known=not np.isnan(counts).any(),
            samples_total=float(counts.sum()),
            sample_rates=rates,
            overshoot_steps=int(over.size),
            overshoot_max=float(over.max()) if over.size else 0.0,
        )

    @classmethod
    def join(cls, parts: Sequence[Tallies]) -> Tallies:
        """Parts' tallies as the tallies of all their steps. The rates are
        kept as each part's extremes: only those are ever asked for."""
        rates = []
        for p in parts:
            finite = p.sample_rates[np.isfinite(p.sample_rates)]
            if finite.size:
                rates += [finite.min(), finite.max()]
        return cls(
            calls={q: sum(p.calls[q] for p in parts) for q in PHASES},
            samples_known=all(p.samples_known for p in parts),
            samples_total=float(sum(p.samples_total for p in parts)),
            sample_rates=np.array(rates, dtype=np.float64),
            overshoot_steps=sum(p.overshoot_steps for p in parts),
            overshoot_max=max([0.0] + [p.overshoot_max for p in parts]),
        )


#: The quantities a step has a time for in `Quantities`, by name.
TIMED = ("step", *PHASES, "others")


@dataclass
class Quantities:
    """What the Perf and Model Summaries, the FLOP rates and the Ranks
    table take from a set of steps: each step's time, each phase's, Others',
    as 1-D arrays (statistics are taken over these exact arrays, so they
    are the same however the steps were read), or for a rank too long to
    hold as Digests (analysis/digest.py), the tallies and the GPU times.
    Built from a table at once (`of`), or by a pass that reads a rank a
    block at a time and keeps only these (analysis/rankpass.py).
    Each quantity's Stats is taken once and kept (`stats`): the Perf and
    Model Summaries both print the step time's."""

    step: Any
    phases: dict[str, Any]
    others: Any
    tallies: Tallies
    gpu: Optional[Gpu] = None
    _stats: dict[str, digest.Stats] = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return digest.size(self.step)

    def times(self, name: str) -> Any:
        """The times of `name`, one of TIMED."""
        if name == "step":
            return self.step
        if name == "others":
            return self.others
        return self.phases[name]

    def stats(self, name: str) -> digest.Stats:
        found = self._stats.get(name)
        if found is None:
            found = self._stats[name] = digest.stats_of(self.times(name))
        return found

    @classmethod
    def of(cls, t: Table) -> Quantities:
        """The quantities of every step of the table `t`."""
        step = step_times(t)
        return cls(step, {p: phase_times(t, p) for p in PHASES}, others_times(t, step),
                   Tallies.of(t, step), Gpu.of(t))


def quantities(rows: Any) -> Quantities:
    """`rows` as Quantities: Quantities as they are, a table or rows as
    lists (None for missing) computed."""
    if isinstance(rows, Quantities):
        return rows
    return Quantities.of(as_table(rows))
