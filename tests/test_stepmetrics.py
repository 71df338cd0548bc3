"""What a rank's metrics endpoint says of its steps (runtime/stepmetrics.py),
on hand-built rows: the step and phase histograms, the counters, the
samples a second, and the rank's state in one word."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfrun.runtime.stepmetrics import BUCKETS, PHASES, STATES, StepTally, rank_state
from tests.builders import MS, make_rows


def table(rows: list[list[object]]) -> np.ndarray:
    """Rows as the flush thread hands them over: float64, NaN where a
    value is unknown."""
    return np.array([[math.nan if v is None else v for v in row] for row in rows],
                    dtype=np.float64)


STEPS = [
    dict(dataloader=1 * MS, forward=2 * MS, backward=4 * MS, optimization=1 * MS, others=1 * MS,
         samples=32),
    # An evaluation pass inside the step's span is not the step's.
    dict(dataloader=1 * MS, forward=2 * MS, backward=4 * MS, optimization=1 * MS,
         excluded=64 * MS, samples=32),
    dict(dataloader=512 * MS, forward=2 * MS, backward=4 * MS, optimization=2 * MS, samples=32),
]


def test_a_step_is_its_span_less_what_is_excluded_and_its_phases_add_up_to_it() -> None:
    tally = StepTally()
    tally.add(table(make_rows(STEPS)))
    assert tally.steps == 3 and tally.step.count == 3
    assert tally.step.sum == (9 + 8 + 520) * MS
    assert {name: tally.phases[name].sum for name in PHASES} == {
        "dataloader": 514 * MS, "forward": 6 * MS, "backward": 12 * MS,
        "optimization": 4 * MS, "others": 1 * MS,
    }
    assert sum(tally.phases[name].sum for name in PHASES) == tally.step.sum
    assert all(tally.phases[name].count == 3 for name in PHASES)
    assert tally.samples == 96


def test_the_buckets_are_cumulative_and_a_value_on_a_bound_is_at_or_below_it() -> None:
    tally = StepTally()
    # Steps of exactly 1 ms, 2.5 ms, 0.3 s and 1,000 s (past every bound).
    tally.add(table(make_rows([dict(others=s) for s in (0.001, 0.0025, 0.3, 1000.0)])))
    buckets = dict(tally.step.buckets())
    assert list(buckets) == [*BUCKETS, math.inf]
    assert buckets[0.0005] == 0
    assert buckets[0.001] == 1 and buckets[0.0025] == 2
    assert buckets[0.25] == 2 and buckets[0.5] == 3
    assert buckets[250.0] == 3 and buckets[math.inf] == 4 == tally.step.count
    counts = [n for _, n in tally.step.buckets()]
    assert counts == sorted(counts)


def test_a_run_tallied_a_flush_at_a_time_says_what_it_says_tallied_at_once() -> None:
    rng = np.random.default_rng(7)
    steps = [dict(dataloader=float(d), forward=float(f), backward=float(b), others=float(o),
                  samples=16)
             for d, f, b, o in rng.exponential(0.01, size=(1000, 4))]
    rows = table(make_rows(steps))
    whole, parts = StepTally(), StepTally()
    whole.add(rows)
    for chunk in np.array_split(rows, [1, 300, 301, 999]):
        parts.add(chunk)
    assert parts.steps == whole.steps == 1000
    for name in ("step", *PHASES):
        a = whole.step if name == "step" else whole.phases[name]
        b = parts.step if name == "step" else parts.phases[name]
        assert a.buckets() == b.buckets() and a.count == b.count
        assert a.sum == pytest.approx(b.sum, rel=1e-12)


def test_samples_a_second_are_the_latest_flushs_and_unknown_samples_say_none() -> None:
    tally = StepTally()
    tally.add(table(make_rows([dict(others=64 * MS)] * 4)))  # no batch size known
    assert tally.samples == 0 and tally.samples_per_second is None
    tally.add(table(make_rows([dict(others=256 * MS, samples=64)] * 2)))
    assert tally.samples_per_second == 128 / (512 * MS)
    tally.add(table(make_rows([dict(others=512 * MS, samples=64)])))
    assert tally.samples_per_second == 64 / (512 * MS)  # the latest flush's, not the run's
    assert tally.samples == 192
    tally.add(table(make_rows([dict(others=MS)])))  # a flush without samples keeps it
    assert tally.samples_per_second == 64 / (512 * MS)


def test_an_empty_batch_changes_nothing() -> None:
    tally = StepTally()
    tally.add(np.empty((0, len(make_rows([{}])[0]))))
    assert tally.steps == 0 and tally.step.buckets()[-1] == (math.inf, 0)


@pytest.mark.parametrize(
    "status, exit, state",
    [
        ("running", {"exception": None, "signal": None}, "running"),
        ("finished", {"exception": None, "signal": None}, "finished"),
        ("finished", {"exception": "ValueError", "signal": None}, "failed"),
        ("finished", {"exception": None, "signal": None, "os_exit": 3}, "failed"),
        ("finished", {"exception": None, "signal": None, "os_exit": 0}, "finished"),
        ("stopped", {"exception": None, "signal": None}, "stopped"),
        ("signalled", {"exception": None, "signal": 15}, "signalled"),
    ],
)
def test_the_rank_state_is_one_word_of_the_documented_five(
    status: str, exit: dict[str, object], state: str
) -> None:
    assert rank_state(status, exit) == state
    assert state in STATES
