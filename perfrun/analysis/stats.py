"""Summary statistics that cannot contradict themselves.

Paddle's step timer prints an average above its own maximum (it divides by a
count that is off by one) and can leave its minimum at infinity when nothing
was timed. Users stop trusting a profiler the first time its table is
inconsistent, so every `Stats` here guarantees `min <= median <= max`,
`min <= avg <= max`, and no infinities: an empty sample gives `None`
everywhere, which the renderers print as "-".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

# The default of --warmup lives with the option; the analysis takes it from here.
from perfrun.settings import default_warmup  # noqa: F401


@dataclass(frozen=True)
class Stats:
    """Count, total and spread of one quantity over a set of steps.

    `stdev` is the sample standard deviation (n - 1 in the denominator), 0.0
    for a single value: step times are a sample of what the loop would do if
    it ran longer, not the whole population.
    """

    n: int = 0
    total: Optional[float] = None
    avg: Optional[float] = None
    max: Optional[float] = None
    min: Optional[float] = None
    median: Optional[float] = None
    stdev: Optional[float] = None

    @classmethod
    def of(cls, values: Iterable[Optional[float]]) -> Stats:
        """Statistics of `values`, ignoring `None` and non-finite entries.

        A NaN or infinity can only come from a broken clock or a division by
        a zero-length step; dropping it keeps one bad record from turning a
        whole column into NaN, and the count `n` says how many values were
        actually used.
        """
        if _is_array(values):
            return cls._of_array(values)
        clean = [float(v) for v in values if v is not None and math.isfinite(v)]
        n = len(clean)
        if n == 0:
            return cls()
        total = math.fsum(clean)
        lo = min(clean)
        hi = max(clean)
        # total / n can land one ulp outside [lo, hi] (three steps of 0.1 s
        # average to 0.10000000000000002): clamp, so the printed table can
        # never show an average above its maximum.
        avg = _clamp(total / n, lo, hi)
        median = _clamp(statistics.median(clean), lo, hi)
        stdev = statistics.stdev(clean) if n > 1 else 0.0
        return cls(n=n, total=total, avg=avg, max=hi, min=lo, median=median, stdev=stdev)

    @classmethod
    def _of_array(cls, values: Any) -> Stats:
        """The same figures from a numpy array, at C speed: a million steps
        in milliseconds rather than seconds. Sums are taken in numpy's
        extended precision (80-bit on x86: pairwise summation with a 64-bit
        mantissa), so the total rounds to what math.fsum gives for any
        realistic run (its error is below 1e-18 of the sum, against 1e-16
        for one float64 rounding); the median is the same middle value(s).
        Where the platform has no extended type (numpy's longdouble is
        float64), the error is numpy's pairwise float64 sum's, a few units
        in the last place."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        clean = arr[np.isfinite(arr)]
        n = int(clean.size)
        if n == 0:
            return cls()
        total = float(clean.sum(dtype=np.longdouble))
        lo = float(clean.min())
        hi = float(clean.max())
        avg = _clamp(total / n, lo, hi)
        median = _clamp(float(np.median(clean)), lo, hi)
        if n > 1:
            dev = clean - total / n
            stdev = math.sqrt(float(np.dot(dev, dev)) / (n - 1))
        else:
            stdev = 0.0
        return cls(n=n, total=total, avg=avg, max=hi, min=lo, median=median, stdev=stdev)

    @staticmethod
    def avg_of(values: Any) -> Optional[float]:
        """`Stats.of(values).avg` without the median and spread: where only
        the average is wanted (one figure per rank of a long run)."""
        if not _is_array(values):
            return Stats.of(values).avg
        arr = np.asarray(values, dtype=np.float64).ravel()
        clean = arr[np.isfinite(arr)]
        if not clean.size:
            return None
        total = float(clean.sum(dtype=np.longdouble))
        return _clamp(total / clean.size, float(clean.min()), float(clean.max()))

    @property
    def empty(self) -> bool:
        return self.n == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "total": self.total,
            "avg": self.avg,
            "max": self.max,
            "min": self.min,
            "median": self.median,
            "stdev": self.stdev,
        }


@dataclass(frozen=True)
class Rate:
    """A throughput (steps/s or samples/s): avg over the whole run, max from
    the fastest step and min from the slowest.

    Not a `Stats`: the average rate is total work over total time, not the
    mean of per-step rates (which over-weights the fast steps).
    """

    avg: Optional[float] = None
    max: Optional[float] = None
    min: Optional[float] = None

    @classmethod
    def from_totals(cls, work: float, seconds: float, per_step: Iterable[float]) -> Rate:
        """`work / seconds` as the average; the per-step rates give max and
        min. Rates from zero-length steps are infinite and left out rather
        than printed as `inf`."""
        if _is_array(per_step):
            arr = np.asarray(per_step, dtype=np.float64)
            arr = arr[np.isfinite(arr)]
            # Only the extremes are needed: two values, not a list of all.
            rates = [float(arr.min()), float(arr.max())] if arr.size else []
        else:
            rates = [r for r in per_step if math.isfinite(r)]
        if seconds <= 0 or not math.isfinite(seconds):
            return cls(max=max(rates) if rates else None, min=min(rates) if rates else None)
        avg = work / seconds
        if not rates:
            return cls(avg=avg)
        lo, hi = min(rates), max(rates)
        # Mathematically a time-weighted mean of the per-step rates, so it
        # lies between them; clamp away the rounding.
        return cls(avg=_clamp(avg, lo, hi), max=hi, min=lo)

    def to_dict(self) -> dict[str, Any]:
        return {"avg": self.avg, "max": self.max, "min": self.min}


def _is_array(values: Any) -> bool:
    return isinstance(values, np.ndarray)


def _clamp(value: float, lo: float, hi: float) -> float:
    return lo if value < lo else hi if value > hi else value


def duration(seconds: float) -> str:
    """A time with three significant digits in a unit that suits it."""
    for unit, factor in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        value = seconds * factor
        if abs(value) >= 1.0 or unit == "us":
            return f"{_sig(value)} {unit}"
    return f"{seconds} s"  # pragma: no cover - the loop always returns


def size(n: float) -> str:
    """Bytes in binary units, with a decimal below 100 of the unit:
    `774 MiB`, `75.2 MiB`, `1.0 GiB`."""
    n = float(n)
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= factor:
            value = n / factor
            return f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


def times(ratio: float) -> str:
    """How many times another figure, as a sentence says it: `3.2x`,
    `86.0x`, `263x`, `2,951x`. Past 100 a decimal is noise (the slowest
    step of a long run is a thousand medians, give or take one), and the
    digits of thousands are grouped."""
    return f"{ratio:.1f}x" if abs(ratio) < 100 else f"{ratio:,.0f}x"


def _sig(value: float) -> str:
    if value == 0.0:
        return "0"
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{digits}f}"
