"""The statistics scripts/bench_overhead.py states its verdicts with: a
confidence interval for the median over pairs that narrows as pairs are
added (the range only widens), held to its stated coverage."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
from conftest import import_file

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_overhead.py"


@pytest.fixture(scope="module")
def bench():
    try:
        yield import_file(SCRIPT, "bench_overhead")
    finally:
        sys.modules.pop("bench_overhead", None)


def binomial_coverage(n: int, j: int) -> float:
    """Coverage of [x(j), x(n-j+1)] for the median, summed term by term."""
    tail = sum(math.comb(n, i) for i in range(j)) / 2 ** n
    return 1 - 2 * tail


@pytest.mark.parametrize("n", range(2, 41))
def test_the_interval_is_the_narrowest_with_the_coverage_it_states(bench, n: int) -> None:
    values = [float(i) for i in range(1, n + 1)]  # x(j) is j
    lo, hi, coverage = bench.median_interval(values)
    j = int(lo)
    assert hi == n - j + 1
    assert coverage == pytest.approx(binomial_coverage(n, j))
    if j > 1 or n >= 6:
        assert coverage >= bench.CONFIDENCE
    # One order statistic further in would fall short of the confidence.
    if j + 1 <= (n + 1) // 2:
        assert binomial_coverage(n, j + 1) < bench.CONFIDENCE


def test_the_interval_holds_the_true_median_as_often_as_it_says(bench) -> None:
    # Lopsided pairs, as a busy machine gives them: lognormal with a tail.
    rng = random.Random(7)
    true_median = math.exp(0.0)
    for n in (9, 15, 31):
        trials, held = 2000, 0
        for _ in range(trials):
            sample = [rng.lognormvariate(0.0, 0.5) for _ in range(n)]
            lo, hi, _ = bench.median_interval(sample)
            held += lo <= true_median <= hi
        assert held / trials >= bench.CONFIDENCE - 0.015, (n, held / trials)


def test_pair_stats_gives_the_interval_of_ratios_and_differences(bench) -> None:
    plain = [10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8]
    profiled = [10.1, 10.2, 10.0, 10.2, 10.0, 10.5, 9.9]
    s = bench.pair_stats(plain, profiled)
    ratios = sorted(b / a for a, b in zip(plain, profiled))
    assert (s["ratio_ci_lo"], s["ratio_ci_hi"]) == (ratios[0], ratios[-1])  # 7 pairs: range
    assert s["ci_coverage"] == pytest.approx(1 - 2 / 128)
    assert s["ratio_ci_lo"] <= s["ratio_median"] <= s["ratio_ci_hi"]
    assert s["diff_ci_lo"] <= s["diff_median"] <= s["diff_ci_hi"]
