"""The gate's decisions on synthetic step times, and the small pure pieces
around it (threshold parsing, fingerprint comparison).

Series come from a seeded random.Random, either independent noise or AR(1)
noise (each step's deviation carries over part of the previous one, as the
machine's state does), so every verdict here is reproducible and fast.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from perfrun.analysis.gate import (
    MIN_STEPS,
    GateResult,
    Verdict,
    autocorrelation_time,
    block_length,
    gate,
)
from perfrun.settings import parse_threshold
from perfrun.store.baseline import mismatches

#: Median step time of the synthetic baseline, in seconds.
STEP = 0.002


def series(
    seed: int, n: int = 200, scale: float = 1.0, noise: float = 0.05, rho: float = 0.0
) -> list[float]:
    """`n` step times around STEP * scale with relative noise `noise`:
    independent when `rho` is 0, else AR(1) with lag-one correlation `rho`
    (the stationary spread stays `noise` whatever `rho` is)."""
    rng = random.Random(seed)
    innovation = noise * math.sqrt(1.0 - rho * rho)
    deviation = rng.gauss(0.0, noise)
    out = []
    for _ in range(n):
        deviation = rho * deviation + rng.gauss(0.0, innovation)
        out.append(STEP * scale * max(0.2, 1.0 + deviation))
    return out


# -- verdicts -------------------------------------------------------------------


@pytest.mark.parametrize("rho", [0.0, 0.7, 0.9])
def test_identical_distributions_never_fail(rho: float) -> None:
    verdicts = []
    for seed in range(20):
        base = series(1000 + seed, n=120, rho=rho)
        current = series(2000 + seed, n=120, rho=rho)
        result = gate(base, current, 0.05)
        assert result.verdict != Verdict.FAIL, (seed, result)
        verdicts.append(result.verdict)
    if rho == 0.0:
        # Independent 5% noise over 120 steps pins the median to about 1%:
        # the gate should not only keep quiet but say PASS.
        assert verdicts.count(Verdict.PASS) == len(verdicts), verdicts


@pytest.mark.parametrize("rho", [0.0, 0.7, 0.9])
def test_a_30_percent_slowdown_fails(rho: float) -> None:
    for seed in range(5):
        base = series(1000 + seed, rho=rho)
        current = series(2000 + seed, scale=1.3, rho=rho)
        result = gate(base, current, 0.05)
        assert result.verdict == Verdict.FAIL, (seed, result)
        assert result.ratio == pytest.approx(1.3, rel=0.05)
        assert result.low is not None and result.high is not None
        assert 1.05 < result.low <= result.ratio <= result.high
        assert "slower than the 5% allowed" in result.reason


def test_a_faster_run_passes() -> None:
    result = gate(series(1), series(2, scale=0.7), 0.05)
    assert result.verdict == Verdict.PASS
    assert result.high is not None and result.high < 1.05
    assert "within the 5% allowed" in result.reason


def test_a_change_near_the_threshold_is_inconclusive() -> None:
    """5% slower against a 5% limit, with noise: the interval must straddle
    the limit, and the gate must say so rather than guess."""
    result = gate(series(1, noise=0.1), series(2, scale=1.05, noise=0.1), 0.05)
    assert result.verdict == Verdict.INCONCLUSIVE, result
    assert result.low is not None and result.high is not None
    assert result.low < 1.05 < result.high
    assert "straddles" in result.reason


def test_autocorrelated_noise_widens_the_interval() -> None:
    """The same spread with AR(1) correlation carries fewer independent
    steps' worth of information: the interval must be wider."""
    iid = gate(series(1), series(2), 0.05)
    correlated = gate(series(1, rho=0.9), series(2, rho=0.9), 0.05)
    assert iid.low is not None and iid.high is not None
    assert correlated.low is not None and correlated.high is not None
    assert correlated.high - correlated.low > 2 * (iid.high - iid.low)


@pytest.mark.parametrize("n_base, n_current", [(8, 200), (200, 8), (5, 3), (MIN_STEPS - 1, 200)])
def test_too_few_steps_is_inconclusive_and_says_how_many(n_base: int, n_current: int) -> None:
    result = gate(series(1, n=n_base), series(2, n=n_current, scale=2.0), 0.05)
    assert result.verdict == Verdict.INCONCLUSIVE
    assert result.ratio is None and result.low is None and result.high is None
    assert (result.baseline_steps, result.current_steps) == (n_base, n_current)
    assert f"at least {MIN_STEPS}" in result.reason
    if n_base < MIN_STEPS:
        assert f"the baseline has {n_base}" in result.reason
    if n_current < MIN_STEPS:
        assert f"the current run has {n_current}" in result.reason


def test_min_steps_is_the_threshold_of_too_few() -> None:
    base, current = series(1, n=MIN_STEPS), series(2, n=MIN_STEPS, scale=1.5)
    assert gate(base, current, 0.05).verdict == Verdict.FAIL
    result = gate(base, current, 0.05, min_steps=MIN_STEPS + 1)
    assert result.verdict == Verdict.INCONCLUSIVE
    assert f"at least {MIN_STEPS + 1}" in result.reason


def test_a_zero_baseline_is_inconclusive_not_a_crash() -> None:
    result = gate([0.0] * 50, series(2, n=50), 0.05)
    assert result.verdict == Verdict.INCONCLUSIVE
    assert "zero" in result.reason


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_the_same_inputs_always_give_the_same_verdict(rho: float) -> None:
    """CI reruns of the same two result files must not flip the verdict: the
    bootstrap's seed is fixed, so the whole result is reproducible."""
    base = series(7, noise=0.1, rho=rho)
    current = series(8, scale=1.05, noise=0.1, rho=rho)
    first = gate(base, current, 0.05)
    for _ in range(3):
        assert gate(list(base), list(current), 0.05) == first


def test_to_dict() -> None:
    result = gate(series(1), series(2, scale=1.3), 0.05)
    doc: dict[str, Any] = result.to_dict()
    assert doc["verdict"] == "fail"
    assert doc["threshold"] == 0.05
    assert doc["confidence"] == 0.95
    assert (doc["baseline_steps"], doc["current_steps"]) == (200, 200)
    assert doc["ci_low"] <= doc["ratio"] <= doc["ci_high"]
    assert doc["block_length"] == result.block >= 1
    assert isinstance(result, GateResult)


# -- block length ---------------------------------------------------------------


def test_autocorrelation_time_of_independent_noise_is_about_one() -> None:
    assert autocorrelation_time(series(3, n=1000)) < 1.5
    assert autocorrelation_time([STEP] * 100) == 1.0  # no variance at all


def test_block_length_grows_with_autocorrelation() -> None:
    n = 400
    lengths = [block_length(series(5, n=n, rho=rho)) for rho in (0.0, 0.5, 0.8, 0.95)]
    assert lengths == sorted(lengths), lengths
    assert lengths[0] == math.ceil(n ** (1 / 3))  # the n^(1/3) floor for independent steps
    assert lengths[-1] > 3 * lengths[0], lengths
    assert all(1 <= b <= n // 4 for b in lengths)


def test_block_length_is_capped_at_a_quarter_of_the_run() -> None:
    assert block_length(series(5, n=40, rho=0.99)) <= 10
    assert block_length([STEP] * 3) == 1


# -- thresholds -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("5%", 0.05),
        ("0.05", 0.05),
        ("5", 0.05),
        (" 5% ", 0.05),
        ("12.5%", 0.125),
        ("0%", 0.0),
        ("0", 0.0),
        ("150%", 1.5),
    ],
)
def test_parse_threshold(text: str, value: float) -> None:
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "%", "five", "5%%", "-5%", "-0.05", "nan", "inf", "5 pct"])
def test_parse_threshold_refuses_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="--max-regression"):
        parse_threshold(text)


# -- fingerprints -----------------------------------------------------------------


def fingerprint(**changes: Any) -> dict[str, Any]:
    fp: dict[str, Any] = {
        "hostname": "ci-runner-1",
        "gpus": [],
        "driver": None,
        "cuda": None,
        "torch": "2.13.0",
        "python": "3.11.9",
        "world_size": 1,
        "batch_size": 64,
        "script": "/home/ci/work/train.py",
        "script_args": ["--epochs", "1"],
        "command": ["perfrun", "train.py"],
        "git": {"commit": "a" * 40, "dirty": False},
    }
    fp.update(changes)
    return fp


def test_mismatches_of_identical_fingerprints_is_empty() -> None:
    assert mismatches(fingerprint(), fingerprint()) == []


def test_mismatches_reports_each_differing_key() -> None:
    found = mismatches(
        fingerprint(),
        fingerprint(torch="2.12.1", batch_size=32, world_size=8, gpus=["NVIDIA H100"]),
    )
    assert found == [
        "gpus: baseline [], current ['NVIDIA H100']",
        "torch: baseline '2.13.0', current '2.12.1'",
        "world_size: baseline 1, current 8",
        "batch_size: baseline 64, current 32",
    ]


def test_mismatches_ignores_what_is_expected_to_differ() -> None:
    """The commit is the change under test; the host name, the folder the
    checkout lives in, the arguments and the command line vary between CI
    jobs of the same configuration."""
    current = fingerprint(
        git={"commit": "b" * 40, "dirty": True},
        hostname="ci-runner-7",
        script="/builds/other/checkout/train.py",
        script_args=["--epochs", "2"],
        command=["perfrun", "--timer-only", "train.py"],
    )
    assert mismatches(fingerprint(), current) == []


def test_mismatches_compares_the_script_by_name() -> None:
    found = mismatches(fingerprint(), fingerprint(script="/home/ci/work/finetune.py"))
    assert found == ["script: baseline 'train.py', current 'finetune.py'"]


def test_earlier_baseline_runs_widen_the_interval_by_their_spread() -> None:
    # Whole runs of one workload differ (here by up to +-6%); steps within a
    # run barely vary, so a one-run baseline sees a tight interval and calls
    # an 8% slower run a regression. With the earlier runs stored in the
    # baseline the gate knows runs move that much and does not fire.
    rng = random.Random(7)

    def run(level: float) -> list[float]:
        return [level * (1 + rng.gauss(0, 0.002)) for _ in range(200)]

    baseline_runs = [run(0.010 * f) for f in (1.0, 1.06, 0.94, 1.03, 0.97)]
    current = run(0.0108)
    alone = gate(baseline_runs[0], current, 0.05)
    assert alone.verdict == Verdict.FAIL
    assert alone.baseline_runs == 1 and alone.between_run_spread is None
    pooled = gate(baseline_runs[0], current, 0.05, other_runs=baseline_runs[1:])
    assert pooled.verdict != Verdict.FAIL
    assert pooled.baseline_runs == 5
    assert pooled.between_run_spread is not None and 0.03 < pooled.between_run_spread < 0.06
    assert pooled.low < alone.low and pooled.high > alone.high
    # A real regression still fails against the pooled baseline.
    assert gate(baseline_runs[0], run(0.016), 0.05, other_runs=baseline_runs[1:]).verdict == (
        Verdict.FAIL
    )
