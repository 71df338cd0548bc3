"""Statistics and summaries on hand-built rows with known numbers."""

from __future__ import annotations

import math
import random
import signal
import statistics
from typing import Any

import pytest
from builders import MS, make_rank, make_row, make_rows, make_run
from oracle import others_time, step_time

from perfrun.analysis.build import build_report
from perfrun.analysis.device import device_summary
from perfrun.analysis.ranks import (
    Ending,
    first_failure,
    lost_span,
    multi_rank_summary,
    rank_outcome,
    rank_problem,
    run_endings,
    running_sentence,
)
from perfrun.analysis.selection import rank_counted, steady_rows
from perfrun.analysis.stats import Rate, Stats, default_warmup
from perfrun.analysis.summary import model_summary, perf_summary
from perfrun.analysis.window import window_report

# -- Stats -----------------------------------------------------------------------


def test_stats_of_nothing_is_empty_not_infinite() -> None:
    s = Stats.of([])
    assert s.n == 0 and s.empty
    assert (s.total, s.avg, s.max, s.min, s.median, s.stdev) == (None,) * 6


def test_stats_of_one_value() -> None:
    s = Stats.of([0.25])
    assert (s.n, s.total, s.avg, s.max, s.min, s.median, s.stdev) == (1, 0.25, 0.25, 0.25,
                                                                     0.25, 0.25, 0.0)


def test_identical_values_average_to_themselves() -> None:
    # 0.1 * 3 / 3 is 0.10000000000000002 in floating point: an average above
    # the maximum, exactly the inconsistency Paddle's timer prints.
    s = Stats.of([0.1, 0.1, 0.1])
    assert s.avg == 0.1 and s.max == 0.1 and s.min == 0.1 and s.median == 0.1


def test_stats_known_values() -> None:
    s = Stats.of([4.0, 1.0, 3.0, 2.0])
    assert (s.total, s.avg, s.max, s.min, s.median) == (10.0, 2.5, 4.0, 1.0, 2.5)
    assert s.stdev == pytest.approx(statistics.stdev([1.0, 2.0, 3.0, 4.0]))


def test_stats_drop_missing_and_non_finite_values() -> None:
    s = Stats.of([1.0, None, float("nan"), float("inf"), 3.0])
    assert s.n == 2 and s.avg == 2.0 and s.max == 3.0


def test_min_avg_max_order_holds_on_random_samples() -> None:
    rng = random.Random(1234)
    for _ in range(2000):
        n = rng.randint(1, 40)
        scale = 10.0 ** rng.randint(-7, 2)
        if rng.random() < 0.3:
            values = [rng.choice([0.1, 0.3, 1e-5, 0.7]) * scale] * n
        else:
            values = [rng.random() * scale for _ in range(n)]
        s = Stats.of(values)
        assert s.min is not None and s.avg is not None and s.max is not None
        assert s.min <= s.avg <= s.max, values
        assert s.min <= s.median <= s.max  # type: ignore[operator]
        assert all(math.isfinite(v) for v in (s.total, s.avg, s.stdev))  # type: ignore[arg-type]


def test_rate_average_is_work_over_time_and_stays_in_range() -> None:
    # 1 step of 1 s and 3 steps of 1/3 s: 4 steps in 2 s is 2 steps/s, not
    # the mean of per-step rates (2.5).
    r = Rate.from_totals(4, 2.0, [1.0, 3.0, 3.0, 3.0])
    assert (r.avg, r.max, r.min) == (2.0, 3.0, 1.0)
    empty = Rate.from_totals(0, 0.0, [])
    assert (empty.avg, empty.max, empty.min) == (None, None, None)


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, 0), (1, 0), (2, 0), (3, 1), (10, 1), (19, 1), (20, 2), (49, 4), (50, 5), (10_000, 5)],
)
def test_default_warmup(n: int, expected: int) -> None:
    assert default_warmup(n) == expected


# -- rows --------------------------------------------------------------------------


def test_step_time_leaves_out_excluded_spans() -> None:
    row = make_row(1.0, forward=0.25, others=0.125, excluded=0.5)
    assert step_time(row) == 0.375
    assert others_time(row) == 0.125


def test_others_is_clamped_at_zero_for_float_noise() -> None:
    row = make_row(0.0, forward=0.5)
    row[1] -= 1e-12  # end a hair before the phase's end
    assert others_time(row) == 0.0


def test_steady_rows_skip_warmup_and_window() -> None:
    rows = make_rows([{"forward": MS}] * 10)
    rank = make_rank(rows, window=[4, 6])
    picked = steady_rows(rank, warmup=2)
    assert [rows.index(r) for r in picked] == [2, 3, 6, 7, 8, 9]
    kept = steady_rows(rank, warmup=2, exclude_window=False)
    assert [rows.index(r) for r in kept] == list(range(2, 10))
    other = steady_rows(rank, warmup=0, window=[0, 8])
    assert [rows.index(r) for r in other] == [8, 9]


# -- Perf Summary -----------------------------------------------------------------------


def test_perf_summary_known_numbers() -> None:
    # Steps of 1/8, 1/4 and 1/2 s with 1/16 s in the DataLoader each.
    rows = make_rows([
        {"dataloader": 1 / 16, "others": 1 / 16, "samples": 32},
        {"dataloader": 1 / 16, "others": 3 / 16, "samples": 32},
        {"dataloader": 1 / 16, "others": 7 / 16, "samples": 32},
    ])
    p = perf_summary(rows)
    assert p.steps == 3
    assert (p.batch_cost.total, p.batch_cost.max, p.batch_cost.min) == (7 / 8, 1 / 2, 1 / 8)
    assert p.batch_cost.avg == pytest.approx(7 / 24)
    assert p.reader_cost.avg == 1 / 16
    assert p.ips.avg == pytest.approx(24 / 7)
    assert (p.ips.max, p.ips.min) == (8.0, 2.0)
    assert p.reader_ratio == pytest.approx(3 / 14)
    assert p.samples_ips is not None
    assert p.samples_ips.avg == pytest.approx(96 / (7 / 8))
    assert (p.samples_ips.max, p.samples_ips.min) == (256.0, 64.0)


def test_samples_rate_needs_every_step_to_know_its_batch() -> None:
    rows = make_rows([{"forward": MS, "samples": 8}, {"forward": MS, "samples": None},
                      {"forward": MS, "samples": 0}])
    assert perf_summary(rows).samples_ips is None
    assert perf_summary(rows[:1]).samples_ips is not None


def test_perf_summary_of_no_steps() -> None:
    p = perf_summary([])
    assert p.steps == 0 and p.batch_cost.empty and p.ips.avg is None and p.reader_ratio is None


def test_perf_rows_keep_min_avg_max_order_on_random_runs() -> None:
    rng = random.Random(7)
    for _ in range(300):
        rows = make_rows([
            {"dataloader": rng.random() * 0.01, "forward": rng.random() * 0.02,
             "others": rng.random() * 1e-4, "samples": rng.randint(1, 64)}
            for _ in range(rng.randint(1, 30))
        ])
        p = perf_summary(rows)
        for s in (p.reader_cost, p.batch_cost, p.ips, p.samples_ips):
            assert s is not None and s.min <= s.avg <= s.max  # type: ignore[operator]


# -- Model Summary ---------------------------------------------------------------------------


def _training_rows(n: int = 6, gpu: bool = False) -> list[list[float]]:
    out = []
    for i in range(n):
        kw = {
            "dataloader": (i % 3 + 1) * MS,
            "forward": 10 * MS,
            "backward": (20 + i) * MS,
            "optimization": 5 * MS,
            "others": (i + 1) * MS,
            "calls": (1, 2, 1, 1),
        }
        if gpu:
            kw["gpu"] = {"forward": 8 * MS, "backward": 18 * MS, "optimization": 4 * MS,
                         "step": 32 * MS}
        out.append(kw)
    return make_rows(out)


def test_phases_and_others_add_up_to_the_step_exactly() -> None:
    rows = _training_rows()
    for row in rows:
        phases = row[2] + row[3] + row[4] + row[5]
        assert phases + others_time(row) == step_time(row)
    m = model_summary(rows)
    names = [r.name for r in m.rows]
    assert names == ["ProfileStep", "Dataloader", "Forward", "Backward", "Optimization", "Others"]
    parts = sum(r.cpu.total for r in m.rows[1:])  # type: ignore[misc]
    assert parts == m.row("ProfileStep").cpu.total
    assert sum(r.cpu_ratio for r in m.rows[1:]) == pytest.approx(100.0)  # type: ignore[misc]
    assert m.row("ProfileStep").cpu_ratio == 100.0
    assert m.row("Others").cpu.total == 21 * MS
    assert m.overshoot_steps == 0


def test_model_summary_calls_and_per_step_figures() -> None:
    m = model_summary(_training_rows(6))
    assert m.row("ProfileStep").calls == 6
    assert m.row("Forward").calls == 12  # two outermost forward calls a step
    assert m.row("Others").calls is None
    # Per step, not per call: each step spends 10 "ms" in its two forwards.
    assert m.row("Forward").cpu.avg == 10 * MS
    assert m.row("Backward").cpu.max == 25 * MS and m.row("Backward").cpu.min == 20 * MS


def test_gpu_columns_absent_without_gpu_timings() -> None:
    m = model_summary(_training_rows())
    assert not m.has_gpu
    assert all(r.gpu is None and r.gpu_ratio is None for r in m.rows)


def test_gpu_columns_present_with_gpu_timings() -> None:
    m = model_summary(_training_rows(4, gpu=True))
    assert m.has_gpu
    assert m.row("ProfileStep").gpu.total == 4 * 32 * MS  # type: ignore[union-attr]
    assert m.row("Forward").gpu_ratio == pytest.approx(25.0)
    assert m.row("Others").gpu.avg == 2 * MS  # type: ignore[union-attr]
    assert m.row("Dataloader").gpu.total == 0.0  # type: ignore[union-attr]
    assert sum(r.gpu_ratio for r in m.rows[1:]) == pytest.approx(100.0)  # type: ignore[misc]


def test_gpu_others_clamped_when_phases_exceed_gpu_step() -> None:
    rows = make_rows([{"forward": MS, "gpu": {"forward": 4 * MS, "step": 3 * MS}}])
    assert model_summary(rows).row("Others").gpu.total == 0.0  # type: ignore[union-attr]


def test_phases_longer_than_their_step_are_reported() -> None:
    rows = _training_rows(4)
    rows[2][1] -= 0.005  # the step ends about 2 ms before its phases do
    m = model_summary(rows)
    assert m.overshoot_steps == 1
    assert m.overshoot_max == pytest.approx(0.005 - 3 * MS)
    assert m.row("Others").cpu.min == 0.0
    report = build_report(make_run([make_rank(rows)]), warmup=0)
    assert any("longer than the step" in n for n in report.notes)


# -- several ranks ----------------------------------------------------------------------------


def _rank_rows(step_ms: int, n: int = 8) -> list[list[float]]:
    return make_rows([{"forward": (step_ms - 4) * MS, "others": 4 * MS}] * n)


def test_multi_rank_names_the_slowest_rank_and_flags_missing_ones() -> None:
    ranks = [
        make_rank(_rank_rows(32), rank=0, world_size=4),
        make_rank(_rank_rows(32), rank=1, world_size=4),
        make_rank(_rank_rows(48, n=5), rank=2, world_size=4, status="running"),
    ]
    m = multi_rank_summary(ranks, warmup=1, missing=[3])
    assert [r.rank for r in m.rows] == [0, 1, 2, 3]
    assert m.slowest is not None
    assert m.slowest.rank == 2
    assert m.slowest.percent_slower == pytest.approx(50.0)
    step = m.across["step"]
    assert (step.min, step.median, step.max) == (32 * MS, 32 * MS, 48 * MS)
    assert m.across["forward"].max == 44 * MS
    assert m.rows[2].counted == 4 and m.rows[2].steps == 5
    assert m.problems == ["rank 2: died after 5 steps", "rank 3: wrote nothing"]
    assert m.rows[3].status == "missing" and m.rows[3].step_avg is None


def test_no_slowest_rank_with_a_single_timed_rank() -> None:
    ranks = [make_rank(_rank_rows(32), rank=0, world_size=2),
             make_rank([], rank=1, world_size=2, status="running")]
    m = multi_rank_summary(ranks, warmup=0)
    assert m.slowest is None
    assert m.problems == ["rank 1: died before its first step"]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"status": "finished"}, None),
        ({"status": "stopped"}, None),
        ({"status": "finished", "n": 0}, "recorded no steps"),
        ({"status": "running"}, "died after 3 steps"),
        ({"status": "signalled", "signal": 9}, "killed by SIGKILL after 3 steps"),
        ({"status": "signalled", "n": 1}, "killed by a signal after 1 step"),
        ({"status": "finished", "exception": "ValueError: bad lr"},
         "raised ValueError: bad lr after 3 steps"),
    ],
)
def test_rank_problem(kwargs: dict, expected: str | None) -> None:
    kwargs = dict(kwargs)
    n = kwargs.pop("n", 3)
    assert rank_problem(make_rank(_rank_rows(8, n=n), **kwargs)) == expected


def _ended(rank: Any, at: float, **exit: Any) -> Any:
    """`rank` with its last save `at` seconds since the epoch (started at
    1000), its `exit` record updated with `exit`, saving every 2 s."""
    rank.data.update(started_unix=1000.0, elapsed=at - 1000.0)
    rank.data["exit"].update(exit)
    rank.data["settings"].setdefault("flush_interval", 2.0)
    return rank


def test_a_rank_that_left_by_os_exit_or_did_not_start_says_so() -> None:
    rank = _ended(make_rank(_rank_rows(8, n=30)), 1010.0, os_exit=3)
    assert rank_problem(rank) == "left by os._exit(3) after 30 steps"
    assert rank_outcome(rank) == "os._exit(3)"
    assert rank_problem(_ended(make_rank(_rank_rows(8)), 1010.0, os_exit=0)) is None
    syntax = _ended(make_rank([], torch_imported=False, exception="SyntaxError"), 1000.1,
                    start_error="invalid syntax (train.py, line 2)")
    assert rank_problem(syntax) == "did not start: SyntaxError: invalid syntax (train.py, line 2)"
    assert rank_outcome(syntax) == "not started"


def test_a_keyboardinterrupt_the_script_raised_is_not_said_to_be_a_signal() -> None:
    """Issue 44: Python ends by SIGINT after an uncaught KeyboardInterrupt,
    the script's own `raise KeyboardInterrupt` included: the rank raised
    it, and nothing killed it. A Ctrl-C's is the signal's."""
    raised = _ended(make_rank(_rank_rows(8, n=21), exception="KeyboardInterrupt"), 1010.0)
    ending = Ending(status=-signal.SIGINT, by=1010.5, launcher="python")
    assert rank_problem(raised, ending) == "raised KeyboardInterrupt after 21 steps"
    assert rank_outcome(raised, ending) == "raised"
    ctrl_c = _ended(make_rank(_rank_rows(8, n=21), status="signalled",
                              exception="KeyboardInterrupt", signal=signal.SIGINT), 1010.0)
    assert rank_problem(ctrl_c, ending) == "killed by SIGINT after 21 steps"
    # Another exception, then a signal: the signal is still said.
    other = _ended(make_rank(_rank_rows(8, n=21), exception="ValueError"), 1010.0)
    assert rank_problem(other, Ending(status=-signal.SIGTERM)) == (
        "raised ValueError after 21 steps; a signal then ended it (SIGTERM)")


def test_the_report_of_a_script_that_did_not_start_says_what_stopped_it() -> None:
    syntax = _ended(make_rank([], torch_imported=False, exception="SyntaxError"), 1000.1,
                    start_error="invalid syntax (train.py, line 2)")
    report = build_report(make_run([syntax]))
    assert report.problem == ("the script did not start: SyntaxError: invalid syntax "
                              "(train.py, line 2)")
    assert report.problems == [] and not any("imported" in n for n in report.notes)
    raised = _ended(make_rank([], torch_imported=False, exception="ModuleNotFoundError"), 1000.1)
    report = build_report(make_run([raised]))
    assert report.problem == ("no PyTorch training loop was seen: the script raised "
                              "ModuleNotFoundError before it imported torch")


def test_a_rank_killed_outright_names_the_signal_and_what_it_may_have_lost() -> None:
    """The launcher saw the process die by SIGKILL 1.5 s after the rank's
    last save: at most those 1.5 s of steps, about 190 of its 8 ms steps,
    are not in its results."""
    rank = _ended(make_rank(_rank_rows(8, n=40), status="running"), 1020.0)
    ending = Ending(status=-9, by=1021.5, launcher="python")
    assert rank_problem(rank, ending, step_time=8 * MS) == (
        "killed by SIGKILL after 40 steps; at most its last 1.5 s of steps (about 190 "
        "steps at its median step) are not in its results: a rank saves every 2 s, and "
        "SIGKILL leaves it no time to save the rest")
    assert rank_outcome(rank, ending) == "killed"
    # Its last save held the steps up to the buffered clock's last replay,
    # 0.8 s before it: those 0.8 s are lost too.
    rank.data["extra"]["flush"] = {"replayed": 20.0 - 0.8}
    assert "at most its last 2.3 s of steps (about 290 steps" in rank_problem(
        rank, ending, step_time=8 * MS)
    del rank.data["extra"]["flush"]
    # When the launcher's end is not known, the next save that never came
    # bounds the loss: one flush interval after the last.
    assert rank_problem(rank, Ending(status=-9)) == (
        "killed by SIGKILL after 40 steps; at most its last 2.0 s of steps are not in its "
        "results: a rank saves every 2 s, and SIGKILL leaves it no time to save the rest")
    assert rank_problem(rank).startswith("died after 40 steps; at most its last 2.0 s of steps")
    del rank.data["elapsed"]
    assert rank_problem(rank, Ending(status=-9)) == (
        "killed by SIGKILL after 40 steps; the steps after its last save are not in its "
        "results: a rank saves every 2 s, and SIGKILL leaves it no time to save the rest")
    # Exited by itself without its final save: not a kill.
    assert rank_problem(rank, Ending(status=0)).startswith(
        "exited with status 0 after 40 steps but never saved its final results")


def test_what_a_kill_lost_is_bounded_by_the_save_that_never_came() -> None:
    """Issue 44: a rank SIGKILLed 2 s into a 2 s save interval, on a run
    whose launcher ended 25 s later (the other ranks trained on): the steps
    after its last save are at most one interval's, about 540 of its
    3.7 ms steps, not the 25 s to the launcher's end (about 6,800)."""
    rank = _ended(make_rank(_rank_rows(8, n=40), status="running"), 1020.0)
    ending = Ending(status=-9, by=1045.2, launcher="torchrun")
    assert rank_problem(rank, ending, step_time=3.7e-3) == (
        "killed by SIGKILL after 40 steps; at most its last 2.0 s of steps (about 540 "
        "steps at its median step) are not in its results: a rank saves every 2 s, and "
        "SIGKILL leaves it no time to save the rest")
    # A save takes time, and a busy machine may keep the flush thread
    # waiting: the longest save, and the longest seen between two saves,
    # widen the bound; the launcher's end still caps it.
    assert lost_span(20.0, 20.0, 2.0, 0.1, 0.0, None) == pytest.approx(2.1)
    assert lost_span(20.0, 20.0, 2.0, 0.1, 3.5, None) == pytest.approx(3.5)
    assert lost_span(20.0, 19.2, 2.0, 0.0, 0.0, None) == pytest.approx(2.8)
    assert lost_span(20.0, 19.2, 2.0, 0.0, 0.0, 20.5) == pytest.approx(1.3)
    assert lost_span(20.0, 20.0, 2.0, 0.0, 0.0, 19.0) == 0.0
    rank.data["extra"]["flush"] = {"max": 0.05, "gap": 4.0}
    assert "at most its last 4.0 s of steps (about 1,100 steps" in rank_problem(
        rank, ending, step_time=3.7e-3)


def test_run_endings_read_the_launchers_and_torchruns_records() -> None:
    ranks = [make_rank(rank=r, world_size=2) for r in (0, 1)]
    meta = {"launcher": "torchrun", "started": 1000.0, "elapsed": 30.0, "returncode": 1}
    run = make_run(ranks, meta=meta)
    run.exit_codes = {1: 1, 0: -15}
    assert run_endings(run) == {0: Ending(-15, 1030.0, "torchrun"),
                                1: Ending(1, 1030.0, "torchrun")}
    run = make_run(ranks[:1], meta={"launcher": "python", "returncode": -9})
    assert run_endings(run) == {0: Ending(-9, None, "python")}


def _two_ranks_failing(first_at: float, second_at: float, **second: Any) -> list:
    raised = _ended(make_rank(_rank_rows(8, n=100), rank=1, world_size=2,
                              exception="RuntimeError"), first_at)
    other = _ended(make_rank(_rank_rows(8, n=100), rank=0, world_size=2, **second), second_at)
    return [other, raised]


def test_the_first_rank_to_fail_is_named_and_the_others_fail_after_it() -> None:
    """Rank 1 raises; rank 0 then raises too (its collective lost its peer)
    and torchrun ends it: rank 1 is the root cause, rank 0 a consequence,
    whatever order the ranks are listed in or torchrun's record says."""
    ranks = _two_ranks_failing(1010.0, 1010.4, exception="RuntimeError")
    endings = {0: Ending(-15, 1011.0, "torchrun"), 1: Ending(1, 1011.0, "torchrun")}
    assert first_failure(ranks, endings, recorded=0) == 1
    m = multi_rank_summary(ranks, warmup=1, endings=endings, recorded_first=0)
    assert m.first_failed == 1
    assert m.problems == [
        "rank 1: the first rank to fail: raised RuntimeError after 100 steps",
        "rank 0: raised RuntimeError after 100 steps, once rank 1 had failed; torchrun "
        "then ended it (SIGTERM)",
    ]
    assert [(r.rank, r.outcome) for r in m.rows] == [(0, "raised"), (1, "raised, first")]
    assert m.to_dict()["first_failed"] == 1


def test_a_rank_torchrun_stopped_is_terminated_not_failed() -> None:
    ranks = _two_ranks_failing(1010.0, 1010.2, status="signalled", signal=15)
    endings = {0: Ending(-15, 1011.0, "torchrun"), 1: Ending(1, 1011.0, "torchrun")}
    m = multi_rank_summary(ranks, warmup=1, endings=endings)
    assert m.problems == [
        "rank 1: the first rank to fail: raised RuntimeError after 100 steps",
        "rank 0: terminated by torchrun (SIGTERM) after 100 steps, once rank 1 had failed",
    ]
    assert [r.outcome for r in m.rows] == ["terminated", "raised, first"]


def test_a_rank_killed_outright_first_is_the_root_cause() -> None:
    """Rank 0 is killed by SIGKILL (its last save 1.2 s before), rank 1
    raises when its collective loses rank 0: rank 0 failed first."""
    died = _ended(make_rank(_rank_rows(8, n=50), rank=0, world_size=2, status="running"),
                  1008.8)
    raised = _ended(make_rank(_rank_rows(8, n=50), rank=1, world_size=2,
                              exception="RuntimeError"), 1010.1)
    endings = {0: Ending(-9, 1011.0, "torchrun"), 1: Ending(1, 1011.0, "torchrun")}
    assert first_failure([died, raised], endings) == 0


@pytest.mark.parametrize("case", ["one failed", "stopped", "all signalled", "no times"])
def test_no_first_failure_without_a_chain_of_failures(case: str) -> None:
    ranks = _two_ranks_failing(1010.0, 1010.4, exception="RuntimeError")
    endings: dict = {}
    stopped = False
    if case == "one failed":
        ranks = _two_ranks_failing(1010.0, 1012.0)
    elif case == "stopped":
        stopped = True
    elif case == "all signalled":
        ranks = [_ended(make_rank(_rank_rows(8), rank=r, world_size=2, status="signalled",
                                  signal=2), 1010.0 + r) for r in (0, 1)]
    else:
        for rank in ranks:
            rank.data.pop("elapsed")
        assert first_failure(ranks, endings, recorded=1) == 1
    assert first_failure(ranks, endings, stopped=stopped) is None
def test_a_live_rank_is_running_not_a_problem() -> None:
    """A report taken during the run: a `running` rank whose process is
    alive is in progress, said at the top, and not among the problems; one
    whose process is gone died."""
    ranks = [make_rank(_rank_rows(32), rank=0, world_size=3, status="running"),
             make_rank(_rank_rows(32, n=5), rank=1, world_size=3, status="running"),
             make_rank(_rank_rows(32, n=4), rank=2, world_size=3, status="running")]
    assert rank_problem(ranks[0], alive=True) is None
    m = multi_rank_summary(ranks, warmup=1, alive=[0, 1])
    assert [r.status for r in m.rows] == ["running", "running", "running"]
    assert m.problems == ["rank 2: died after 4 steps"]
    report = build_report(make_run(ranks), warmup=1, alive=[0, 1])
    assert report.title.running == ("ranks 0,1 are still running: this report is of their "
                                    "last saves")
    assert ("Running", report.title.running) in report.title.entries()
    assert report.problems == ["rank 2: died after 4 steps"]

    one = build_report(make_run([make_rank(_rank_rows(8, n=39), status="running")]),
                       alive=[0])
    assert one.title.running == ("rank 0 is still running (39 steps so far): this report is "
                                 "of its last save")
    assert one.problems == []
    assert one.title.to_dict()["running"] == one.title.running
    ended = build_report(make_run([make_rank(_rank_rows(8, n=39))]))
    assert ended.title.running is None
    assert "Running" not in dict(ended.title.entries())
    assert running_sentence([]) is None


# -- Device Summary ---------------------------------------------------------------------------


def _device(proc: float, gpus: int = 1) -> dict:
    return {
        "cpu_process_percent": {"avg": proc, "max": proc * 2},
        "cpu_system_percent": {"avg": 20.0, "max": 40.0},
        "rss_peak_bytes": 2**30,
        "gpus": [{"index": i, "name": "H100", "util_avg": 50.0, "util_max": 90.0,
                  "mem_used_max": 2**33, "mem_total": 2**36} for i in range(gpus)],
    }


def test_device_summary_keeps_one_rank_per_host() -> None:
    ranks = [
        make_rank(rank=1, hostname="a", device=_device(200.0)),
        make_rank(rank=0, hostname="a", device=_device(100.0)),
        make_rank(rank=2, hostname="b", device=_device(300.0, gpus=2)),
    ]
    d = device_summary(ranks)
    assert d is not None and d.has_gpu
    assert [(h.hostname, h.rank) for h in d.hosts] == [("a", 0), ("b", 2)]
    assert d.hosts[0].cpu_process_avg == 100.0
    assert len(d.hosts[1].gpus) == 2


def test_device_summary_without_gpus_or_samples() -> None:
    d = device_summary([make_rank(device=_device(100.0, gpus=0))])
    assert d is not None and not d.has_gpu
    assert device_summary([make_rank()]) is None


# -- build_report --------------------------------------------------------------------------------


def test_problem_when_no_rank_wrote_results() -> None:
    report = build_report(make_run([], missing=[0]))
    assert report.problem == "no rank wrote results"
    assert report.perf is None and report.model is None


def test_problem_when_torch_was_never_imported() -> None:
    report = build_report(make_run([make_rank(torch_imported=False)]))
    assert report.problem == "no PyTorch training loop was seen: the script never imported torch"


def test_problem_when_no_step_ran() -> None:
    report = build_report(make_run([make_rank()]))
    assert report.problem == (
        "no PyTorch training loop was seen: no forward, backward or optimizer step ran"
    )
    assert report.problems == []  # "recorded no steps" would only repeat it


def test_no_problem_for_a_normal_run() -> None:
    report = build_report(make_run([make_rank(_training_rows(20))]))
    assert report.problem is None and report.problems == []
    assert not report.title.forward_only
    assert report.ranks is None  # one rank: no multi-rank table


def test_warmup_default_settings_and_argument() -> None:
    rank = make_rank(_training_rows(30))
    default = build_report(make_run([rank]))
    assert (default.title.warmup, default.title.warmup_default) == (3, True)
    assert default.perf is not None and default.perf.steps == 27
    configured = build_report(make_run([make_rank(_training_rows(30), settings={"warmup": 7})]))
    assert (configured.title.warmup, configured.title.warmup_default) == (7, False)
    explicit = build_report(make_run([rank]), warmup=0)
    assert explicit.title.steps_counted == 30 and explicit.model.steps == 30  # type: ignore[union-attr]


def test_window_steps_left_out_unless_timer_only() -> None:
    rows = _training_rows(20)
    report = build_report(make_run([make_rank(rows, window=[5, 10])]), warmup=2)
    assert report.title.window == (5, 10)
    assert report.title.window_steps == 5 and report.title.steps_counted == 13
    assert report.perf is not None and report.perf.steps == 13
    timer_only = build_report(
        make_run([make_rank(rows, window=[5, 10], settings={"timer_only": True})]), warmup=2
    )
    assert not timer_only.title.window_excluded and timer_only.title.steps_counted == 18


def test_the_window_line_says_why_each_step_is_left_out() -> None:
    rows = _training_rows(20)
    # torch.profiler's warm-up step (4) before the window [5, 10).
    rank = make_rank(rows, window=[5, 10])
    rank.data["profiled"] = [4, 10]
    report = build_report(make_run([rank]), warmup=2)
    assert report.title.window_steps == 6 and report.title.window_parts == (1, 5, 0)
    [line] = [t for label, t in report.title.entries() if label == "Window"]
    assert line == ("steps [5, 10) profiled in detail; 6 steps left out of the statistics: "
                    "the window's 5 and the profiler's warm-up step before it")


def test_several_ranks_leave_out_the_steps_after_the_window_on_every_rank() -> None:
    # The export ends at different times on each rank: the first collective
    # after it holds a wait on the rank that finished first.
    ranks = []
    for r in range(2):
        rows = _rank_rows(20, n=20)
        rank = make_rank(rows, rank=r, world_size=2, window=[5, 10])
        rank.data["profiled"] = [4, 10]
        ranks.append(rank)
    report = build_report(make_run(ranks), warmup=2)
    assert report.title.window_parts == (1, 5, 2)
    assert report.title.steps_counted == 20 - 2 - 8
    [line] = [t for label, t in report.title.entries() if label == "Window"]
    assert line.endswith("the window's 5, the profiler's warm-up step before it and 2 steps "
                         "after it, where the ranks wait for each other's trace export")
    for rank in ranks:
        index = rank_counted(rank, 2).index()
        assert 10 not in index and 11 not in index and 12 in index


def test_the_profilers_overhead_is_quoted_only_from_enough_steps_beyond_their_spread() -> None:
    # 40 steps of 10 ms +- 1 ms, the window's 5 at 13 ms: +30%, beyond a
    # spread of about 5%.
    ms = [10 + (i % 3 - 1) for i in range(40)]
    ms[20:25] = [13] * 5
    rows = make_rows([{"forward": m * MS, "calls": (0, 1, 0, 0)} for m in ms])
    rank = make_rank(rows, window=[20, 25])
    w = window_report([rank], rank, (20, 25), 2)
    assert w is not None and w.window_count == 5 and w.outside_count == 33
    assert w.overhead == pytest.approx(0.3) and w.overhead_measurable
    # Faster inside than outside: the steps differ in kind, no overhead.
    ms[20:25] = [2] * 5
    rows = make_rows([{"forward": m * MS, "calls": (0, 1, 0, 0)} for m in ms])
    rank = make_rank(rows, window=[20, 25])
    w = window_report([rank], rank, (20, 25), 2)
    assert w is not None and w.overhead is not None and not w.overhead_measurable
    # Two steps inside against five outside: no figure at all.
    rank = make_rank(make_rows([{"forward": 10 * MS}] * 9), window=[5, 7])
    w = window_report([rank], rank, (5, 7), 0)
    assert w is not None and w.overhead is None


def test_a_window_that_never_opened_is_not_said_to_be_profiled() -> None:
    report = build_report(make_run([make_rank(_training_rows(8), window=[20, 30])]), warmup=2)
    [line] = [t for label, t in report.title.entries() if label == "Window"]
    assert line == ("steps [20, 30) were to be profiled in detail, but the run ended after "
                    "8 steps, before the window opened")


def test_warmup_that_leaves_nothing_is_said() -> None:
    report = build_report(make_run([make_rank(_training_rows(4))]), warmup=10)
    assert report.perf is not None and report.perf.steps == 0
    assert report.perf.batch_cost.avg is None
    assert any("nothing left to summarise" in n for n in report.notes)


def test_notes_deduplicated_and_faults_merged_across_ranks() -> None:
    fault = {"where": "hooks.forward", "error": "TypeError: x", "count": 2}
    ranks = [
        make_rank(_rank_rows(8), rank=0, world_size=2, notes=["NVML unavailable", "a"],
                  faults=[fault]),
        make_rank(_rank_rows(8), rank=1, world_size=2, notes=["NVML unavailable"],
                  faults=[fault]),
    ]
    report = build_report(make_run(ranks))
    assert report.notes == ["NVML unavailable", "a"]
    assert [str(f) for f in report.faults] == ["hooks.forward: TypeError: x (x4)"]
    assert report.faults[0].ranks == (0, 1)


def test_extras_report_eval_and_dataloader_startup() -> None:
    extra = {
        "eval": {"calls": 2, "forward_calls": 20, "time": 1.5},
        "dataloader_init": {"calls": 3, "time": 0.25},
        "stop_iteration": {"calls": 0, "time": 0.0},
    }
    report = build_report(make_run([make_rank(_training_rows(10), extra=extra)]))
    assert [(e.name, e.calls, e.time) for e in report.extras] == [
        ("Eval", 2, 1.5), ("DataLoader start-up", 3, 0.25)]


def test_summaries_come_from_rank_zero_and_list_every_rank() -> None:
    ranks = [make_rank(_rank_rows(16), rank=0, world_size=2),
             make_rank(_rank_rows(64), rank=1, world_size=2)]
    report = build_report(make_run(ranks), warmup=0)
    assert report.title.rank == 0
    assert report.perf is not None and report.perf.batch_cost.avg == 16 * MS
    assert report.ranks is not None and report.ranks.slowest is not None
    assert report.ranks.slowest.rank == 1


def test_lowest_rank_with_steps_is_the_reference_when_rank_zero_has_none() -> None:
    ranks = [make_rank([], rank=0, world_size=2, status="running"),
             make_rank(_rank_rows(16), rank=1, world_size=2)]
    report = build_report(make_run(ranks), warmup=0)
    assert report.problem is None
    assert report.title.rank == 1
    assert report.problems == ["rank 0: died before its first step"]


def test_restarted_rank_is_noted() -> None:
    report = build_report(make_run([make_rank(_rank_rows(8), restart=2)]))
    assert any("restarted 2 time(s)" in n for n in report.notes)


def test_summary_settings_choose_sections() -> None:
    rank = make_rank(_rank_rows(8), settings={"summary": {"device": False, "model": True}})
    report = build_report(make_run([rank]))
    assert report.show("model") and not report.show("device") and report.show("dist")
