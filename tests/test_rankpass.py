"""One pass over a rank's steps (perfrun/analysis/rankpass.py): every figure
it gives is the figure the whole table gave, to the last digit, whatever
the blocks the steps were read in.

The whole-table way (columns.Quantities.of, series.step_series, numpy's
median of the column) is how every figure was computed when a report held
each rank's steps whole; the pass reads them a block at a time and keeps
only each step's times. These hold the two against each other on steps
with missing, infinite and negative cells, GPU times on some steps, sample
counts that vary, windows and a FLOP-counted step, in blocks of one step
up to all of them.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import perfrun.analysis.rankpass as rankpass
from perfrun.analysis import columns, series
from perfrun.analysis.build import build_report
from perfrun.analysis.flops import median_time
from perfrun.analysis.rankpass import Picked, SampleTally, read_pass
from perfrun.analysis.ranks import STRAGGLER_STEPS, straggler_steps
from perfrun.analysis.selection import counted, rank_counted, steps_range
from perfrun.analysis.summary import model_summary, perf_summary
from perfrun.report import html as page
from perfrun.store.baseline import batch_size
from perfrun.store.rankfile import RankResult
from perfrun.store.results import read_run
from perfrun.store.stepfile import COL, STEP_COLUMNS, StepWriter
from tests.builders import MS, make_rank, make_row, make_run

BLOCKS = (1, 3, 7, 64, 100_000)


def _messy_table(n: int, seed: int) -> Any:
    """`n` steps whose cells are anything a table can hold: phases missing,
    infinite or slightly negative, GPU times on some steps only, samples
    known on some, excluded time on a few."""
    rng = np.random.default_rng(seed)
    t = np.full((n, len(STEP_COLUMNS)), np.nan)
    spans = rng.lognormal(-7, 0.5, n)
    t[:, COL["end"]] = np.cumsum(spans)
    t[:, COL["start"]] = t[:, COL["end"]] - spans
    for phase, share in (("dataloader", 0.1), ("forward", 0.2), ("backward", 0.4),
                         ("optimization", 0.2)):
        t[:, COL[phase]] = spans * share * rng.uniform(0.5, 1.3, n)
        t[:, COL[phase + "_calls"]] = rng.integers(0, 3, n)
    t[rng.random(n) < 0.05, COL["dataloader"]] = np.nan
    t[rng.random(n) < 0.01, COL["forward"]] = np.inf
    t[rng.random(n) < 0.01, COL["backward"]] = -1e-9
    t[rng.random(n) < 0.03, COL["excluded"]] = spans.max()
    t[:, COL["samples"]] = rng.choice([32.0, 32.0, 16.0], n)
    t[n // 2:, COL["samples"]] = rng.choice([32.0, 0.0], n - n // 2)  # 0: not known
    gpu = rng.random(n) < 0.4
    for name in ("gpu_dataloader", "gpu_forward", "gpu_backward", "gpu_optimization",
                 "gpu_step"):
        t[gpu, COL[name]] = spans[gpu] * rng.uniform(0.1, 0.5, int(gpu.sum()))
    t[gpu & (rng.random(n) < 0.2), COL["gpu_step"]] = np.nan
    return t


def _held(table: Any, **doc: Any) -> RankResult:
    rank = make_rank([], **doc)
    rank._rows, rank._table = None, table
    return rank


def _same(a: Any, b: Any) -> None:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _same_quantities(a: columns.Quantities, b: columns.Quantities) -> None:
    for name in columns.TIMED:
        _same(a.times(name), b.times(name))
    ta, tb = a.tallies, b.tallies
    assert (ta.calls, ta.samples_known, ta.overshoot_steps, ta.overshoot_max) == (
        tb.calls, tb.samples_known, tb.overshoot_steps, tb.overshoot_max)
    if ta.samples_known:  # the total is NaN otherwise, and never asked for
        assert ta.samples_total == tb.samples_total

    def extremes(rates: Any) -> Any:
        finite = rates[np.isfinite(rates)]
        return (finite.min(), finite.max()) if finite.size else None

    assert extremes(ta.sample_rates) == extremes(tb.sample_rates)
    assert (a.gpu is None) == (b.gpu is None)
    if a.gpu is not None and b.gpu is not None:
        _same(a.gpu.step, b.gpu.step)
        _same(a.gpu.others, b.gpu.others)
        for phase in a.gpu.phases:
            _same(a.gpu.phases[phase], b.gpu.phases[phase])


@pytest.mark.parametrize("rows", BLOCKS)
def test_a_pass_in_blocks_gives_the_quantities_and_summaries_of_the_whole_table(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rankpass, "READ_ROWS", rows)
    table = _messy_table(500, seed=rows)
    rank = _held(table)
    selections = {
        "all": counted(500, 0),
        "warm-up, window and a FLOP-counted step": counted(500, 5, (100, 180), 300),
        "a window's steps": steps_range(500, 100, 180),
        "none": counted(500, 600),
    }
    found = read_pass(rank, selections)
    for name, steps in selections.items():
        whole = columns.Quantities.of(steps.take(table))
        _same_quantities(found.counted[name], whole)
        assert perf_summary(found.counted[name]) == perf_summary(steps.take(table)), name
        assert model_summary(found.counted[name]) == model_summary(steps.take(table)), name
        for q in columns.TIMED:
            values = whole.times(q)
            expected = float(np.median(values)) if values.size else None
            assert found.median(q, steps) == expected
            assert found.median(q, steps, finite=True) == (
                whole.stats(q).median if values.size else None)
    assert median_time(found.step) == found.median("step", selections["all"], finite=True)


@pytest.mark.parametrize("n", [1, 1999, 2000, 2001, 6007])
def test_the_step_chart_in_blocks_is_the_chart_of_all_the_steps(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's buckets are taken a block of whole buckets at a time: the
    same means, envelopes and set-aside time as over the whole table."""
    table = _messy_table(n, seed=n)
    whole = series.step_series(table, max_points=100)
    for rows in (1, 5, 4096):
        monkeypatch.setattr(rankpass, "READ_ROWS", rows)
        sink = series.SeriesSink(n, max_points=100)
        read_pass(_held(table), sinks=[sink], align=sink.size)
        got = sink.series()
        assert got.keys() == whole.keys()
        assert (got["x"], got["size"], got["n"]) == (whole["x"], whole["size"], whole["n"])
        for key in ("step", "min", "max", "excluded", "excluded_steps"):
            _same(got[key], whole[key])
        for q in series.QUANTITIES:
            _same(got["phases"][q], whole["phases"][q])


def test_the_picked_steps_and_the_batch_size_are_those_of_the_table(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rankpass, "READ_ROWS", 7)
    table = _messy_table(300, seed=3)
    index = np.array([0, 6, 7, 8, 150, 299])
    picked, tally = Picked(index), SampleTally()
    read_pass(_held(table), sinks=[picked, tally])
    _same(picked.rows, table[index])
    assert batch_size(*tally.tally()) == batch_size(table[:, COL["samples"]])


@pytest.mark.parametrize("seed", range(30))
def test_a_batch_size_from_a_tally_is_the_median_of_the_column(seed: int) -> None:
    rng = random.Random(seed)
    column = np.array([rng.choice([8.0, 16.0, 32.0, 33.0, 0.0, np.nan])
                       for _ in range(rng.randrange(0, 40))])
    values, counts = np.unique(column[np.isfinite(column)], return_counts=True)
    values = np.append(values, [np.nan, 0.0])  # a tally may hold what is not known
    counts = np.append(counts, [3, 2])
    assert batch_size(values, counts) == batch_size(column)


@pytest.mark.parametrize("seed", range(20))
def test_the_straggler_checks_steps_are_those_every_rank_counted(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr("perfrun.analysis.ranks.STRAGGLER_STEPS", rng.choice([5, 50, 10_000]))
    ranks = []
    for r in range(rng.randrange(2, 5)):
        n = rng.randrange(0, 300)
        window = sorted(rng.sample(range(0, 320), 2)) if rng.random() < 0.5 else None
        rank = make_rank([make_row(float(i), forward=MS) for i in range(n)], rank=r,
                         world_size=4, window=window)
        ranks.append(rank)
    warmup = rng.randrange(0, 10)
    kept = [rank_counted(rank, warmup).index() for rank in ranks]
    kept = [k for k in kept if len(k)]
    found = straggler_steps(ranks, warmup, True)
    if len(kept) < 2:
        assert found is None
        return
    common = kept[0]
    for k in kept[1:]:
        common = np.intersect1d(common, k, assume_unique=True)
    from perfrun.analysis import ranks as ranks_module

    limit = ranks_module.STRAGGLER_STEPS
    if len(common) > limit:
        common = common[np.linspace(0, len(common) - 1, limit).astype(np.int64)]
    _same(found, common)
    assert STRAGGLER_STEPS == 20_000


def _rows(n: int, seed: int, gpu: bool) -> list[list[Any]]:
    """Valid steps a rank could have written (the step file checks them)."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        kw: dict[str, Any] = {p: rng.uniform(0.1, 3.0) * MS
                              for p in ("dataloader", "forward", "backward", "optimization")}
        kw["others"] = rng.uniform(0.0, 1.0) * MS
        if i % 97 == 5:
            kw["excluded"] = 5 * MS
        row = make_row(t, samples=rng.choice([32, 32, 16]), calls=(1, 1, 1, rng.randrange(1, 3)),
                       gpu={"forward": kw["forward"] / 2, "step": kw["forward"]}
                       if gpu and i % 3 else None, **kw)
        out.append(row)
        t = row[COL["end"]] + rng.choice([0.0, MS])
    return out


def _write(folder: Path, rows: list[list[Any]], rank: int, **doc: Any) -> None:
    data = make_rank(rows, rank=rank).data
    data.update(doc)
    writer = StepWriter(str(folder / f"rank{rank}.steps"), STEP_COLUMNS)
    writer.append(rows)
    writer.close()
    data["steps"] = {"columns": list(STEP_COLUMNS), "file": f"rank{rank}.steps",
                     "count": writer.written}
    (folder / f"rank{rank}.json").write_text(json.dumps(data))


def _figures(report: Any) -> dict[str, Any]:
    """Every figure the report gives: its JSON, and what the page draws."""
    s = report.series
    page_data = {
        "steps": page.step_chart(report),
        "boxes": page.rank_box_chart(report),
        "medians": s.medians if s is not None else None,
        "steady": s.steady if s is not None else None,
        "others": [(r, list(o["x"]), [float(v) for v in o["step"]]) for r, o in s.others]
        if s is not None else None,
    }
    return {"json": json.loads(json.dumps(report.to_dict(), default=str)),
            "page": json.loads(json.dumps(page_data, default=str)),
            "environment": report.environment}


@pytest.mark.parametrize("timer_only", [False, True])
def test_a_report_is_the_same_read_in_blocks_of_any_size_or_held_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timer_only: bool
) -> None:
    """Three ranks with a window, a FLOP-counted step, GPU times and one
    rank killed outright: the report read from step files a few steps at a
    time, in blocks of thousands, and held whole (rows in the rank
    document, as a baseline holds them) gives the same figures."""
    flops = {"counted": True, "step": 40, "reason": None, "forward": 2_000_000,
             "backward": 4_000_000, "optimizer": 0, "calls": {"forward": 1}, "ops": {},
             "dtype": "float32", "autocast": False, "tf32": None, "device": "cuda",
             "device_name": None, "seconds": 0.01, "notes": []}
    docs = []
    for r, n in enumerate((900, 700, 880)):
        doc = {"world_size": 3, "window": [300, 320], "profiled": [299, 320], "flops": flops,
               "settings": {"timer_only": timer_only}, "status": "running" if r == 1 else
               "finished", "started_unix": 1000.0, "elapsed": 50.0}
        rows = _rows(n, seed=r, gpu=r != 2)
        _write(tmp_path, rows, r, **doc)
        docs.append((rows, doc))
    figures = []
    for rows_at_a_time in (5, 64, 100_000):
        monkeypatch.setattr(rankpass, "READ_ROWS", rows_at_a_time)
        run = read_run(str(tmp_path), check_steps=False)
        figures.append(_figures(build_report(run, series=True, gate=True)))
    held = []
    for r, (rows, doc) in enumerate(docs):
        rank = make_rank(rows, rank=r)
        rank.data.update(doc)
        rank.data["steps"] = {"columns": list(STEP_COLUMNS), "rows": rows}
        held.append(rank)
    whole = _figures(build_report(make_run(held, run_dir=str(tmp_path)), series=True, gate=True))
    for found in figures:
        assert found == whole
    assert whole["json"]["model"]["has_gpu"] is True
    assert whole["json"]["perf"]["samples_ips"] is not None
    assert (whole["json"]["window"] is None) == timer_only
    assert whole["json"]["problems"] and whole["page"]["steps"] is not None
    assert whole["environment"]["batch_size"] == 32


def test_a_rank_of_no_steps_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    found = read_pass(make_rank([]), {"all": counted(0, 0)})
    assert found.n == 0 and found.counted["all"].n == 0
    assert found.median("step", counted(0, 0)) is None
    assert dataclasses.asdict(found.counted["all"].tallies)["calls"] == dict.fromkeys(
        ("dataloader", "forward", "backward", "optimization"), 0)
