"""A quantity's figures over a long rank's steps in memory that does not
grow with the steps: what a report takes from a rank too long to hold.

A rank of 10^7 steps holds 80 MB for each quantity a report takes figures
of (the step time, four phases, Others, their GPU times), and a report
over it held 660 MiB. Most of what a report prints needs no step kept:
count, total, minimum and maximum are exact over a block at a time, and so
is the sample standard deviation, merged block by block from each block's
(count, mean, sum of squared deviations) (Chan, Golub and LeVeque's
pairwise update: no cancellation, as a one-pass sum of squares would
have). Medians, quartiles and percentiles are what needs every value;
here they come from a histogram of the values, fine enough that no table
can tell: each bin holds the floats that share their sign, exponent and
top 12 bits of mantissa (`bits >> 40`), 4,096 bins an octave, so a bin is
at most 2^-12 (2.4e-4) of its lower edge wide, and an order statistic is
read inside its bin by linear interpolation between the bin's edges
(clamped to the values' own minimum and maximum). Its error is under
RELATIVE_ERROR of the value, well under the three significant digits the
tables print; a percentile between two order statistics inherits that
bound. Values below 2^-64 s share one bin (error under ABSOLUTE_ERROR)
and so do those above 2^64, so that a histogram spans 128 octaves at most:
4 MiB, and some 100 KiB for a quantity whose steps stay within a few
octaves.

`Digest` is that summary of one quantity; the functions below take their
figure from a Digest or, exactly as before, from an array, so that the
summaries, the Ranks table, the page and the window read either alike
(analysis/rankpass.py decides which a rank gets).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from perfrun.analysis.stats import Stats

#: Bits of a float64 dropped to name its bin: 52 - 40 = 12 mantissa bits
#: kept, 4,096 bins an octave.
BIN_SHIFT = 40
#: The bound on a quantile's error, relative to its value: a bin's width
#: over its lower edge.
RELATIVE_ERROR = 2.0 ** -(52 - BIN_SHIFT)
#: The bound on the error of a quantile below 2^-64 s (their one bin's
#: width): no step time is that short, but a difference of two may be.
ABSOLUTE_ERROR = 2.0 ** -64
#: The smallest and largest magnitudes with bins of their own; below and
#: above, one bin each.
_FLOOR_KEY = int(np.float64(2.0 ** -64).view(np.int64)) >> BIN_SHIFT
_CEIL_KEY = int(np.float64(2.0 ** 64).view(np.int64)) >> BIN_SHIFT
#: The name of the method in the JSON report, and of the exact one.
METHOD = "histogram"
EXACT = "exact"


class _Bins:
    """Counts of positive magnitudes by bin, dense over the bins seen."""

    def __init__(self) -> None:
        self.base = 0
        self.counts = np.zeros(0, dtype=np.int64)
        self._cum: Optional[Any] = None

    @property
    def total(self) -> int:
        return int(self.counts.sum()) if self.counts.size else 0

    def add(self, magnitudes: Any) -> None:
        keys = np.clip(magnitudes.view(np.int64) >> BIN_SHIFT, _FLOOR_KEY, _CEIL_KEY)
        lo, hi = int(keys.min()), int(keys.max())
        part = np.bincount(keys - lo, minlength=hi - lo + 1)
        if not self.counts.size:
            self.base, self.counts = lo, part.astype(np.int64)
        else:
            base = min(self.base, lo)
            top = max(self.base + self.counts.size, hi + 1)
            if base != self.base or top != self.base + self.counts.size:
                grown = np.zeros(top - base, dtype=np.int64)
                grown[self.base - base:self.base - base + self.counts.size] = self.counts
                self.base, self.counts = base, grown
            self.counts[lo - self.base:hi + 1 - self.base] += part
        self._cum = None

    def order(self, k: int, lo: float, hi: float) -> float:
        """The k-th smallest magnitude (0-based), read inside its bin;
        `lo`, `hi`: the smallest and largest magnitudes counted."""
        if self._cum is None:
            self._cum = np.cumsum(self.counts)
        cum = self._cum
        i = int(np.searchsorted(cum, k, side="right"))
        count = int(self.counts[i])
        before = int(cum[i]) - count
        key = self.base + i
        a = 0.0 if key <= _FLOOR_KEY else float(np.int64(key << BIN_SHIFT).view(np.float64))
        b = (math.inf if key >= _CEIL_KEY
             else float(np.int64((key + 1) << BIN_SHIFT).view(np.float64)))
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            return a
        return a + (k - before + 0.5) / count * (b - a)


class Digest:
    """One quantity's figures over a set of steps, fed a block of values
    at a time (`add`): `size` values seen, `n` finite, their exact total
    (in numpy's extended precision, as Stats sums), minimum and maximum,
    their mean and sum of squared deviations (merged per block), the
    smallest positive value (the fastest step's rate) and the histogram
    the quantiles are read from. Non-finite values are counted in `size`
    and left out of the rest, as Stats leaves them out."""

    def __init__(self) -> None:
        self.size = 0
        self.n = 0
        self.total = np.longdouble(0.0)
        self.lo = math.inf
        self.hi = -math.inf
        self.least_positive = math.inf
        self.mean = 0.0
        self.m2 = 0.0
        self.zeros = 0
        self._positive = _Bins()
        self._negative = _Bins()

    def add(self, values: Any) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        self.size += int(values.size)
        finite = np.isfinite(values)
        if not finite.all():
            values = values[finite]
        m = int(values.size)
        if not m:
            return
        block_sum = values.sum(dtype=np.longdouble)
        self.total += block_sum
        lo, hi = float(values.min()), float(values.max())
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        mean = float(block_sum / m)
        dev = values - mean
        m2 = float(np.dot(dev, dev))
        n = self.n + m
        delta = mean - self.mean
        self.mean += delta * m / n
        self.m2 += m2 + delta * delta * self.n * m / n
        self.n = n
        if lo > 0.0:
            positive = values
        else:
            positive = values[values > 0.0]
            negative = values[values < 0.0]
            self.zeros += m - int(positive.size) - int(negative.size)
            if negative.size:
                self._negative.add(-negative)
        if positive.size:
            self.least_positive = min(self.least_positive, float(positive.min()))
            self._positive.add(positive)

    def order(self, k: int) -> float:
        """The k-th smallest finite value (0-based): exact for the first
        and the last and for zeros, else within RELATIVE_ERROR."""
        if k <= 0:
            return self.lo
        if k >= self.n - 1:
            return self.hi
        below = self._negative.total
        if k < below:
            # The negative values, largest magnitude first.
            return -self._negative.order(below - 1 - k, max(0.0, -self.hi), -self.lo)
        if k < below + self.zeros:
            return 0.0
        return self._positive.order(k - below - self.zeros, max(0.0, self.lo), self.hi)

    def quantile(self, q: float) -> Optional[float]:
        """The q-quantile (0..1) as numpy's default (linear) method takes
        it over the finite values; None without any."""
        if not self.n:
            return None
        at = q * (self.n - 1)
        k = int(math.floor(at))
        low = self.order(k)
        if at == k:
            return low
        high = self.order(k + 1)
        return low + (at - k) * (high - low)

    def avg(self) -> Optional[float]:
        if not self.n:
            return None
        return _clamp(float(self.total) / self.n, self.lo, self.hi)

    def stats(self) -> Stats:
        """Stats.of's figures: exact but for the median (RELATIVE_ERROR)
        and the standard deviation (merged per block: a few units in the
        last place)."""
        if not self.n:
            return Stats()
        total = float(self.total)
        median = self.quantile(0.5)
        assert median is not None
        stdev = math.sqrt(max(self.m2, 0.0) / (self.n - 1)) if self.n > 1 else 0.0
        return Stats(n=self.n, total=total, avg=_clamp(total / self.n, self.lo, self.hi),
                     max=self.hi, min=self.lo, median=_clamp(median, self.lo, self.hi),
                     stdev=stdev)


def _clamp(value: float, lo: float, hi: float) -> float:
    return lo if value < lo else hi if value > hi else value


# -- each figure from a Digest or, as before, from an array ------------------------------


def size(values: Any) -> int:
    """How many values (finite or not)."""
    if isinstance(values, Digest):
        return values.size
    return int(np.asarray(values).size)


def stats_of(values: Any) -> Stats:
    """Stats.of(values)."""
    if isinstance(values, Digest):
        return values.stats()
    return Stats.of(values)


def avg_of(values: Any) -> Optional[float]:
    """Stats.avg_of(values)."""
    if isinstance(values, Digest):
        return values.avg()
    return Stats.avg_of(values)


def median_of(values: Any) -> Optional[float]:
    """The median of the finite values; None without any."""
    if isinstance(values, Digest):
        return values.quantile(0.5)
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    return float(np.median(arr)) if arr.size else None


def percentiles(values: Any, qs: Sequence[float]) -> list[float]:
    """np.percentile(values, qs) (qs in percent) of values all finite, as
    floats; a Digest's over its finite values."""
    if isinstance(values, Digest):
        return [float(values.quantile(q / 100.0) or 0.0) for q in qs]
    return [float(v) for v in np.percentile(values, list(qs))]


def per_second(values: Any) -> Any:
    """The rates of the values above zero (1 / value): all of them from an
    array, their extremes (all Rate.from_totals asks for) from a Digest."""
    if isinstance(values, Digest):
        if values.hi <= 0.0 or not values.n:
            return np.empty(0)
        return np.array([1.0 / values.least_positive, 1.0 / values.hi])
    times = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return 1.0 / times[times > 0.0]
