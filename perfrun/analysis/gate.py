"""The CI performance gate: is the current run slower than the baseline?

A pure function of two lists of steady-state step times. Step times within
one run are autocorrelated (thermal state, caches, a neighbour's load come
and go over many steps), so treating them as independent samples makes the
confidence interval far too narrow and the gate fire on noise. The interval
here comes from a *moving block bootstrap*: resampling runs of consecutive
steps keeps that correlation inside each block.

The verdict is three-way, like asv's:

* FAIL when the whole interval of the ratio current/baseline (of median
  step time) lies above 1 + threshold: slower, beyond doubt;
* PASS when the whole interval lies below 1 + threshold;
* INCONCLUSIVE otherwise (noise too large to tell), and when either run has
  too few steady steps to say anything (the message gives the count needed).

A run whose measurement was disturbed (analysis/disturbed.py: a throttled
or shared GPU, a CPU taken by other processes, steal) says nothing about
the change under test, whichever way its figures went: a slow disturbed
run is no regression, and a disturbed baseline can hide one.
`disturbed_verdict` makes any verdict on such a pair INCONCLUSIVE, names
the flags in the reason and keeps the verdict the figures alone gave
(`undisturbed`), for the report.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

MIN_STEPS = 20
RESAMPLES = 1000
CONFIDENCE = 0.95
SEED = 20240601  # fixed: the same two runs always get the same verdict


class Verdict(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class GateResult:
    verdict: Verdict
    ratio: Optional[float]  # median current / median baseline
    low: Optional[float]
    high: Optional[float]
    threshold: float
    baseline_steps: int
    current_steps: int
    block: int
    reason: str
    baseline_runs: int = 1
    between_run_spread: Optional[float] = None
    #: The disturbance flags that made the verdict INCONCLUSIVE, each
    #: "current run: ..." or "baseline: ..." (see disturbed_verdict).
    disturbed: tuple[str, ...] = ()
    #: The verdict the step times alone gave, when a disturbance overrode it.
    undisturbed: Optional[Verdict] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "ratio": self.ratio,
            "ci_low": self.low,
            "ci_high": self.high,
            "confidence": CONFIDENCE,
            "threshold": self.threshold,
            "baseline_steps": self.baseline_steps,
            "current_steps": self.current_steps,
            "block_length": self.block,
            "reason": self.reason,
            "baseline_runs": self.baseline_runs,
            "between_run_spread": self.between_run_spread,
            "disturbed": list(self.disturbed),
            "undisturbed_verdict": self.undisturbed.value if self.undisturbed else None,
        }


def autocorrelation_time(values: Sequence[float]) -> float:
    """Integrated autocorrelation time 1 + 2 * sum of the lag-k
    autocorrelations, summed while they stay above noise: how many
    consecutive steps carry one step's worth of information."""
    n = len(values)
    if n < 4 or max(values) == min(values):
        # A constant series has no correlation to measure (and its mean,
        # rounded, would leave tiny equal deviations that look fully
        # correlated).
        return 1.0
    mean = sum(values) / n
    dev = [v - mean for v in values]
    var = sum(d * d for d in dev)
    if var <= 0:
        return 1.0
    tau = 1.0
    for k in range(1, min(n // 4, 2000)):
        rho = sum(dev[i] * dev[i + k] for i in range(n - k)) / var
        if rho < 0.05:
            break
        tau += 2.0 * rho
    return tau


def block_length(values: Sequence[float]) -> int:
    """Blocks must be longer than the correlation: at least n^(1/3) (the
    usual rule) and twice the autocorrelation time, at most n/4."""
    n = len(values)
    length = max(n ** (1.0 / 3.0), 2.0 * autocorrelation_time(values))
    return max(1, min(int(math.ceil(length)), max(1, n // 4)))


def _resample_medians(
    values: Sequence[float], block: int, count: int, rng: random.Random
) -> list[float]:
    n = len(values)
    starts = n - block + 1
    blocks_needed = math.ceil(n / block)
    out = []
    for _ in range(count):
        sample: list[float] = []
        for _ in range(blocks_needed):
            s = rng.randrange(starts)
            sample.extend(values[s : s + block])
        out.append(statistics.median(sample[:n]))
    return out


def ratio_interval(
    baseline: Sequence[float],
    current: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    other_runs: Sequence[Sequence[float]] = (),
) -> tuple[float, float, float, int]:
    """(ratio, low, high, block): the ratio of median step times and its
    percentile interval from independent block bootstraps of both runs.
    With `other_runs` (earlier baseline runs), the baseline's median is the
    median of the runs' medians, each run resampled on its own."""
    rng = random.Random(seed)
    runs = [list(baseline), *[list(r) for r in other_runs if r]]
    block = max([block_length(r) for r in runs] + [block_length(current)])
    block = min([block, len(current)] + [len(r) for r in runs])
    per_run = [_resample_medians(r, block, resamples, rng) for r in runs]
    b = [statistics.median(vals) for vals in zip(*per_run)]
    c = _resample_medians(current, block, resamples, rng)
    ratios = sorted(cm / bm for bm, cm in zip(b, c) if bm > 0)
    point = statistics.median(current) / statistics.median([statistics.median(r) for r in runs])
    alpha = (1.0 - CONFIDENCE) / 2.0
    lo = ratios[int(math.floor(alpha * (len(ratios) - 1)))]
    hi = ratios[int(math.ceil((1.0 - alpha) * (len(ratios) - 1)))]
    return point, lo, hi, block


# Student's t, two-sided 95%, for 1..9 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)


def t_quantile(dof: int) -> float:
    if dof < 1:
        return float("inf")
    if dof <= len(_T975):
        return _T975[dof - 1]
    return 1.959964 + 2.4 / dof  # within 0.01 of the table from 10 on


def between_run_spread(runs: Sequence[Sequence[float]]) -> Optional[float]:
    """Standard deviation of the runs' log median step times: how much whole
    runs of one workload differ (another process's memory layout, a
    neighbour's load), which no resampling of one run's steps can see."""
    medians = [statistics.median(r) for r in runs if r]
    medians = [m for m in medians if m > 0]
    if len(medians) < 2:
        return None
    return statistics.stdev(math.log(m) for m in medians)


def gate(
    baseline: Sequence[float],
    current: Sequence[float],
    threshold: float,
    min_steps: int = MIN_STEPS,
    other_runs: Sequence[Sequence[float]] = (),
) -> GateResult:
    """Decide PASS / FAIL / INCONCLUSIVE for `threshold` (0.05 = 5% slower
    allowed). `baseline` is the latest baseline run's steady step times,
    `other_runs` earlier runs of the same baseline: with two or more runs in
    all, the interval also widens by their run-to-run spread, which is what
    keeps the false-alarm rate down on shared machines."""
    other_runs = [r for r in other_runs if len(r) >= min_steps]
    nb, nc = len(baseline), len(current)
    if nb < min_steps or nc < min_steps:
        which = []
        if nb < min_steps:
            which.append(f"the baseline has {nb}")
        if nc < min_steps:
            which.append(f"the current run has {nc}")
        reason = (
            f"too few steady steps to decide: {' and '.join(which)}; at least {min_steps} "
            "are needed in each (run longer, or lower --warmup)"
        )
    elif statistics.median(baseline) <= 0:
        reason = "the baseline's median step time is zero"
    else:
        reason = ""
    if reason:
        return GateResult(Verdict.INCONCLUSIVE, None, None, None, threshold, nb, nc, 0, reason)
    ratio, lo, hi, block = ratio_interval(baseline, current, other_runs=other_runs)
    runs = 1 + len(other_runs)
    spread = between_run_spread([baseline, *other_runs])
    if spread is not None and ratio > 0 and lo > 0:
        # Combine in log space: the bootstrap's half-width (within runs) and
        # the run-to-run spread of one new run against the mean of `runs`.
        # The spread is estimated from only `runs` medians: Student's t
        # with runs - 1 degrees of freedom, not the normal quantile, or a
        # baseline whose few runs happen to agree would look certain.
        z = 1.959964
        within = (math.log(hi) - math.log(lo)) / (2 * z)
        between = spread * math.sqrt(1.0 + 1.0 / runs)
        half = math.hypot(z * within, t_quantile(runs - 1) * between)
        lo, hi = ratio * math.exp(-half), ratio * math.exp(half)
    limit = 1.0 + threshold
    pct = f"{(ratio - 1) * 100:+.1f}%"
    ci = f"95% CI [{(lo - 1) * 100:+.1f}%, {(hi - 1) * 100:+.1f}%]"
    basis = (
        f"; baseline of {runs} runs, run-to-run spread {spread * 100:.1f}%"
        if spread is not None
        else "; one baseline run: run-to-run variation is not accounted for"
    )
    if lo > limit:
        verdict = Verdict.FAIL
        reason = (
            f"median step time {pct} ({ci}{basis}): slower than the {threshold * 100:g}% allowed"
        )
    elif hi < limit:
        verdict = Verdict.PASS
        reason = f"median step time {pct} ({ci}{basis}): within the {threshold * 100:g}% allowed"
    else:
        verdict = Verdict.INCONCLUSIVE
        reason = (
            f"median step time {pct} ({ci}{basis}): the interval straddles the "
            f"{threshold * 100:g}% limit; too noisy to decide (run more steps)"
        )
    return GateResult(verdict, ratio, lo, hi, threshold, nb, nc, block, reason, runs, spread)


def disturbed_verdict(
    result: GateResult,
    current: Sequence[str] = (),
    baseline: Sequence[str] = (),
) -> GateResult:
    """`result` made INCONCLUSIVE when either run was disturbed (`current`,
    `baseline`: the flags' messages). A gate with nothing to decide on (too
    few steps: no ratio) is left as it is: that is a missing measurement,
    whatever else happened."""
    flags = tuple([f"current run: {m}" for m in current] + [f"baseline: {m}" for m in baseline])
    if not flags or result.ratio is None:
        return result
    which = " and ".join(
        w for w, f in (("the current run", current), ("the baseline", baseline)) if f
    )
    reason = (
        f"measurement disturbed in {which} ({'; '.join(flags)}): no verdict from it; the "
        f"step times alone gave {result.verdict.value.upper()} ({result.reason}); rerun on "
        "a quiet machine, or pass --ignore-disturbed where it is always shared"
    )
    return dataclasses.replace(
        result, verdict=Verdict.INCONCLUSIVE, reason=reason, disturbed=flags,
        undisturbed=result.verdict,
    )
