"""The per-step rules, one row at a time, as the tests' oracle.

perfrun computes every step quantity over whole columns at once
(perfrun/analysis/columns.py). These say the same rules for one row of
STEP_COLUMNS in plain Python, slowly and obviously, so the tests can hold
the fast code against them: a missing or non-finite time counts as zero, a
step's time is its span less the time set aside in it and never below
zero, and Others is the step less its phases, never below zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from perfrun.store.stepfile import COL, PHASES

Row = Sequence[Any]


def _num(value: Any) -> float:
    """A time cell as a float: missing cells (None) count as zero."""
    if value is None:
        return 0.0
    value = float(value)
    return value if math.isfinite(value) else 0.0


def step_time(row: Row) -> float:
    """Wall time of the step, excluded spans removed (never negative)."""
    t = _num(row[COL["end"]]) - _num(row[COL["start"]]) - _num(row[COL["excluded"]])
    return t if t > 0.0 else 0.0


def phase_time(row: Row, phase: str) -> float:
    return _num(row[COL[phase]])


def phases_total(row: Row) -> float:
    return math.fsum(phase_time(row, p) for p in PHASES)


def others_time(row: Row) -> float:
    """The part of the step in no phase."""
    rest = step_time(row) - phases_total(row)
    return rest if rest > 0.0 else 0.0
