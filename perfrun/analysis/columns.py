"""Step quantities over whole columns, every step at once: the definitions
of a step's time, its phases, Others and its GPU time.

A rank's steps arrive as a (steps, STEP_COLUMNS) float64 array with NaN for
a value not recorded (store/rankfile.py, RankResult.table). Looping over a
million rows in Python costs tens of seconds; these cost milliseconds. The
rules: a missing or non-finite time counts as zero, a step never lasts less
than nothing, Others is never negative, and a step has GPU time when any of
its GPU cells was recorded (tests/oracle.py holds the same rules one row at
a time, and the tests hold the two against each other).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfrun.store.rankfile import rows_table
from perfrun.store.stepfile import COL, PHASES

_START, _END, _EXCLUDED, _SAMPLES = COL["start"], COL["end"], COL["excluded"], COL["samples"]
_PHASE_COLS = [COL[p] for p in PHASES]
_CALL_COLS = {p: COL[p + "_calls"] for p in PHASES}
_GPU_PHASE_COLS = [COL["gpu_" + p] for p in PHASES]
_GPU_COLS = _GPU_PHASE_COLS + [COL["gpu_step"]]
_GPU_STEP = COL["gpu_step"]

Table = Any  # numpy.ndarray of shape (steps, len(STEP_COLUMNS))


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


def others_times(t: Table) -> Any:
    return np.maximum(step_times(t) - phases_totals(t), 0.0)


def overshoots(t: Table) -> Any:
    return np.maximum(phases_totals(t) - step_times(t), 0.0)


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
