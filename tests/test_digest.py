"""A long rank's figures in memory that does not grow with its steps
(perfrun/analysis/digest.py, the digesting pass of analysis/rankpass.py),
held against the figures of the same steps held whole.

Counts, totals, minima and maxima are the same; standard deviations the
same to 1e-12; medians and percentiles within digest.RELATIVE_ERROR of the
value. The data are shaped as step times are: log-normal, two modes (a
step that sometimes checkpoints), a few huge outliers, exact zeros (a
phase a loop does not have), small negatives and non-finite cells where a
table may hold them. The pass's limit (rankpass.ARRAY_STEPS) is lowered
so that both paths run on the same steps.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import perfrun.analysis.rankpass as rankpass
from perfrun.analysis import columns, digest
from perfrun.analysis.build import build_report
from perfrun.analysis.digest import Digest
from perfrun.analysis.flops import median_time
from perfrun.analysis.rankpass import Sampled, read_pass
from perfrun.analysis.selection import counted, steps_range
from perfrun.analysis.stats import Stats
from perfrun.analysis.summary import model_summary, perf_summary
from perfrun.report import render
from perfrun.store.results import read_run
from perfrun.store.stepfile import COL, STEP_COLUMNS, StepWriter
from tests.builders import make_rank
from tests.test_rankpass import _held, _messy_table

QS = (0, 1, 10, 25, 50, 75, 90, 99, 100)


def _shaped(kind: str, n: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        return rng.lognormal(np.log(2e-3), 0.4, n)
    if kind == "bimodal":
        return np.where(rng.random(n) < 0.9, rng.normal(1e-3, 5e-5, n),
                        rng.normal(40e-3, 2e-3, n))
    if kind == "outliers":
        values = rng.lognormal(np.log(80e-6), 0.2, n)
        huge = [30.0, 120.0, 1e3, 4e4, 1e-12][:n]
        values[rng.choice(n, len(huge), replace=False)] = huge
        return values
    if kind == "zeros and negatives":
        values = rng.lognormal(np.log(1e-4), 1.0, n)
        values[rng.random(n) < 0.3] = 0.0
        values[rng.random(n) < 0.05] *= -1e-3
        values[:3] = [1e-30, 5e-21, -1e-25][:n]  # below the finest bins
        return values
    if kind == "non-finite":
        values = rng.lognormal(np.log(5e-3), 0.8, n)
        values[rng.random(n) < 0.02] = np.nan
        values[rng.random(n) < 0.01] = np.inf
        values[rng.random(n) < 0.01] = -np.inf
        return values
    raise AssertionError(kind)


def _digest(values: Any, block: int) -> Digest:
    d = Digest()
    for lo in range(0, values.size, block):
        d.add(values[lo:lo + block])
    return d


def _near(found: float, expected: float) -> None:
    bound = max(digest.RELATIVE_ERROR * abs(expected), digest.ABSOLUTE_ERROR)
    assert abs(found - expected) <= bound, (found, expected)


KINDS = ("lognormal", "bimodal", "outliers", "zeros and negatives", "non-finite")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,block", [(1, 1), (2, 1), (3, 2), (997, 64), (200_003, 65_536)])
def test_a_digest_gives_the_figures_of_the_values_held_whole(kind: str, n: int,
                                                             block: int) -> None:
    values = _shaped(kind, n, seed=n)
    d = _digest(values, block)
    whole = Stats.of(values)
    got = d.stats()
    assert d.size == n
    assert (got.n, got.min, got.max) == (whole.n, whole.min, whole.max)
    if not whole.n:
        assert got == Stats()
        return
    assert got.total == pytest.approx(whole.total, rel=1e-12, abs=1e-300)
    assert got.avg == pytest.approx(whole.avg, rel=1e-12, abs=1e-300)
    assert got.stdev == pytest.approx(whole.stdev, rel=1e-12, abs=1e-300)
    _near(got.median, whole.median)
    finite = values[np.isfinite(values)]
    for q, expected in zip(QS, np.percentile(finite, QS)):
        _near(d.quantile(q / 100), float(expected))
    assert digest.percentiles(d, QS) == [d.quantile(q / 100) for q in QS]
    positive = finite[finite > 0]
    if positive.size:
        rates = 1.0 / positive
        assert sorted(digest.per_second(d)) == [rates.min(), rates.max()]


def test_a_digest_of_nothing_gives_nothing() -> None:
    d = Digest()
    d.add(np.array([np.nan, np.inf]))
    assert (d.size, d.n, d.stats(), d.quantile(0.5), d.avg()) == (2, 0, Stats(), None, None)
    assert median_time(d) is None and digest.per_second(d).size == 0


def test_the_bins_a_long_rank_holds_stay_small() -> None:
    """A histogram holds the bins between the values' smallest and largest
    only: log-normal step times over 10^6 steps, a few hundred KiB."""
    d = _digest(_shaped("lognormal", 1_000_000, 1), 65_536)
    assert d._positive.counts.nbytes < 512 * 1024
    assert d._negative.counts.size == 0


def _summaries(q: columns.Quantities) -> tuple[Any, Any]:
    return perf_summary(q).to_dict(), model_summary(q).to_dict()


def _alike(found: Any, expected: Any, path: str = "") -> None:
    """The same figures but medians (within RELATIVE_ERROR) and what is
    computed from sums (totals, averages, standard deviations, rates:
    1e-12 relative)."""
    if isinstance(expected, dict):
        assert found.keys() == expected.keys(), path
        for k in expected:
            _alike(found[k], expected[k], f"{path}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(found) == len(expected), path
        for i, (f, e) in enumerate(zip(found, expected)):
            _alike(f, e, f"{path}[{i}]")
    elif path.endswith(".median") and expected is not None:
        _near(found, expected)
    elif path.endswith(".stdev") and expected is not None:
        assert found == pytest.approx(expected, rel=1e-12, abs=1e-300), path
    elif isinstance(expected, float):
        assert found == pytest.approx(expected, rel=1e-12, abs=1e-300), path
    else:
        assert found == expected, path


def test_a_digesting_pass_gives_the_summaries_of_the_held_pass(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over steps with missing, infinite and negative cells and GPU times
    on some: the Perf and Model Summaries of a pass that digests equal
    those of a pass that holds the steps, to the bound; a selection of at
    most ARRAY_STEPS steps (the window's) is exact on either."""
    n = 5000
    table = _messy_table(n, seed=7)
    selections = {"all": counted(n, 0), "counted": counted(n, 5, (1000, 1080), 3000),
                  "window": steps_range(n, 1000, 1080), "none": counted(n, n + 10)}
    held = read_pass(_held(table), selections)
    monkeypatch.setattr(rankpass, "ARRAY_STEPS", 100)
    monkeypatch.setattr(rankpass, "DIGEST_ROWS", 333)
    outside = counted(n, 5, (990, 1080))
    found = read_pass(_held(table), selections, selections=[outside])
    assert found.quantiles == digest.METHOD and held.quantiles == digest.EXACT
    assert found.n == held.n == n
    assert isinstance(found.counted["all"].step, Digest)
    assert isinstance(found.counted["window"].step, np.ndarray)
    for name in selections:
        _alike(_summaries(found.counted[name]), _summaries(held.counted[name]))
        for q in columns.TIMED:
            expected = held.median(q, selections[name])
            if expected is None:
                assert found.median(q, selections[name]) is None
            else:
                _near(found.median(q, selections[name]), expected)
    assert _summaries(found.counted["window"]) == _summaries(held.counted["window"])
    times = held.times("step", outside)
    assert digest.size(found.times("step", outside)) == times.size
    assert digest.avg_of(found.times("step", outside)) == pytest.approx(
        Stats.avg_of(times), rel=1e-12)
    with pytest.raises(KeyError):
        found.times("step", counted(n, 6))


def test_the_gates_sample_is_spread_over_the_steps_in_order(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rankpass, "DIGEST_ROWS", 1000)
    n = 20_000
    table = _messy_table(n, seed=2)
    steps = counted(n, 10, (5000, 5100), 7000)
    whole = columns.step_times(steps.take(table))
    small = Sampled(steps, size=n)
    sample = Sampled(steps, size=500)
    rankpass._digest_pass(_held(table), {}, [small, sample], 1, [])
    np.testing.assert_array_equal(small.times, whole)
    assert sample.times.size == 500
    # Each drawn from its own stretch of the steps, in their order.
    positions = sample.positions
    assert (np.diff(positions) > 0).all()
    np.testing.assert_array_equal(sample.times, whole[positions])
    edges = (np.arange(501) * (steps.count / 500)).astype(np.int64)
    assert (np.searchsorted(edges, positions, side="right") - 1).tolist() == list(range(500))
    again = Sampled(steps, size=500)
    np.testing.assert_array_equal(again.positions, positions)


def _lognormal_rows(n: int, seed: int, origin: float) -> Any:
    """Steps as a training loop writes them: phases log-normal, two
    optimizer calls, a batch of 64, every 500th step a checkpoint in
    Others, no DataLoader time on some steps."""
    rng = np.random.default_rng(seed)
    rows = np.full((n, len(STEP_COLUMNS)), np.nan)
    total = np.zeros(n)
    for name, median in (("dataloader", 40e-6), ("forward", 300e-6), ("backward", 700e-6),
                         ("optimization", 120e-6)):
        values = rng.lognormal(np.log(median), 0.25, n)
        if name == "dataloader":
            values[rng.random(n) < 0.1] = 0.0
        rows[:, COL[name]] = values
        total += values
    others = rng.lognormal(np.log(30e-6), 0.5, n)
    others[::500] += 0.05
    total += others
    end = origin + np.cumsum(total)
    rows[:, COL["end"]] = end
    rows[:, COL["start"]] = np.concatenate(([origin], end[:-1]))
    rows[:, COL["excluded"]] = 0.0
    for name, calls in (("dataloader", 1), ("forward", 1), ("backward", 1),
                        ("optimization", 2)):
        rows[:, COL[name + "_calls"]] = calls
    rows[:, COL["samples"]] = 64.0
    return rows


def test_a_report_over_a_step_file_prints_the_same_tables_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's step file written as a run writes it (StepWriter): the
    report's table is the same whether the rank's steps were held or
    digested, and its JSON says which it was and the bound."""
    n = 30_000
    writer = StepWriter(str(tmp_path / "rank0.steps"), STEP_COLUMNS)
    at = 1.0
    for lo in range(0, n, 7000):
        rows = _lognormal_rows(min(7000, n - lo), seed=lo, origin=at)
        at = float(rows[-1, COL["end"]])
        writer.append_held(rows.reshape(-1), rows.shape[0])
    writer.close()
    data = make_rank([], rank=0).data
    data.update(status="finished", window=[2000, 2010], profiled=[1999, 2010],
                settings={"timer_only": True})
    data["steps"] = {"columns": list(STEP_COLUMNS), "file": "rank0.steps", "count": n}
    (tmp_path / "rank0.json").write_text(json.dumps(data))

    def report(fmt: str) -> tuple[str, Any]:
        built = build_report(read_run(str(tmp_path)), series=True, gate=True)
        out = io.StringIO()
        render(built, fmt, out)
        return out.getvalue(), built

    held, held_report = report("table")
    monkeypatch.setattr(rankpass, "ARRAY_STEPS", 1000)
    digested, digested_report = report("table")
    assert digested == held
    assert "Perf Summary" in held and "ProfileStep" in held
    assert held_report.to_dict()["quantiles"] == {
        "method": "exact", "relative_error": 0.0, "digested_ranks": [], "array_steps": 1000}
    assert digested_report.to_dict()["quantiles"] == {
        "method": "histogram", "relative_error": digest.RELATIVE_ERROR, "digested_ranks": [0],
        "array_steps": 1000}
    assert len(digested_report.gate_steps) == 1000
    assert len(held_report.gate_steps) == digested_report.perf.steps
    _alike(digested_report.perf.to_dict(), held_report.perf.to_dict())
