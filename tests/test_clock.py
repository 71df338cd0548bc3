"""PhaseClock: the phase stack between the hooks and the step tracker.

A recording tracker stands in for StepTracker, so these tests see exactly what
the clock reports (which phase, when, how much of it was its own) and nothing
of step detection. Time comes from a fake clock moved by hand; every duration
is a small integer, so the sums and differences compared below are exact.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import pytest

from perfrun.runtime.clock import PhaseClock
from perfrun.runtime.steps import BWD, DATA, FWD, OPT, ZERO, StepTracker


class FakeTime:
    """A clock that only moves when told to."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def run(self, seconds: float) -> None:
        self.t += seconds


class RecordingTracker:
    """Records the calls the clock makes; `begin` answers "evaluation" for
    the kinds listed in `eval_kinds` when gradients are off."""

    def __init__(self, eval_kinds: tuple[int, ...] = ()) -> None:
        self.eval_kinds = eval_kinds
        self.calls: list[tuple[Any, ...]] = []
        self.resume = 0.0  # no perfrun work at any edge

    def begin(self, kind: int, t: float, grad: bool = True, ident: object = None) -> bool:
        self.calls.append(("begin", kind, t, grad, ident))
        return not grad and kind in self.eval_kinds

    def end(self, kind: int, t: float, exclusive: float, is_eval: bool = False) -> None:
        self.calls.append(("end", kind, t, exclusive, is_eval))


def make_clock(
    eval_kinds: tuple[int, ...] = (),
) -> tuple[PhaseClock, RecordingTracker, FakeTime]:
    time = FakeTime(100.0)
    tracker = RecordingTracker(eval_kinds)
    clock = PhaseClock(tracker, now=time)  # type: ignore[arg-type]
    return clock, tracker, time


def test_top_level_phase_reports_begin_and_its_whole_duration() -> None:
    clock, tracker, time = make_clock()
    clock.enter(FWD, True, "model")
    assert clock.depth() == 1
    time.run(4)
    clock.exit()
    assert clock.depth() == 0
    assert tracker.calls == [
        ("begin", FWD, 100.0, True, "model"),
        ("end", FWD, 104.0, 4.0, False),
    ]


def test_nested_phase_is_subtracted_from_its_parent() -> None:
    # LBFGS: optimizer.step(closure) runs zero_grad, forward and backward.
    clock, tracker, time = make_clock()
    clock.enter(OPT, True, "lbfgs")
    time.run(1)
    clock.enter(ZERO, True, "lbfgs")
    time.run(1)
    clock.exit()
    clock.enter(FWD, True, "model")
    time.run(4)
    clock.exit()
    clock.enter(BWD)
    time.run(8)
    clock.exit()
    time.run(2)
    clock.exit()
    # Only the outermost phase is announced to the tracker...
    assert [c for c in tracker.calls if c[0] == "begin"] == [("begin", OPT, 100.0, True, "lbfgs")]
    # ...but every phase ends with its own (exclusive) time.
    assert [c for c in tracker.calls if c[0] == "end"] == [
        ("end", ZERO, 102.0, 1.0, False),
        ("end", FWD, 106.0, 4.0, False),
        ("end", BWD, 114.0, 8.0, False),
        ("end", OPT, 116.0, 3.0, False),
    ]
    exclusive = sum(c[3] for c in tracker.calls if c[0] == "end")
    assert exclusive == 16.0  # the wall time of the outer call, counted once


def test_three_levels_each_subtracts_only_its_direct_children() -> None:
    clock, tracker, time = make_clock()
    clock.enter(OPT)
    time.run(2)
    clock.enter(FWD)
    time.run(3)
    clock.enter(BWD)
    time.run(5)
    clock.exit()
    time.run(1)
    clock.exit()
    time.run(4)
    clock.exit()
    ends = [(c[1], c[3]) for c in tracker.calls if c[0] == "end"]
    assert ends == [(BWD, 5.0), (FWD, 4.0), (OPT, 6.0)]
    assert sum(e for _, e in ends) == 15.0


def test_same_kind_nesting_is_one_call() -> None:
    # GradScaler.step calling optimizer.step: one optimization call whose
    # time is the outer call's.
    clock, tracker, time = make_clock()
    clock.enter(OPT, True, "scaler")
    time.run(1)
    clock.enter(OPT, True, "sgd")
    assert clock.depth() == 2
    time.run(2)
    clock.exit()
    time.run(1)
    clock.exit()
    assert clock.depth() == 0
    assert tracker.calls == [
        ("begin", OPT, 100.0, True, "scaler"),
        ("end", OPT, 104.0, 4.0, False),
    ]


def test_same_kind_nesting_several_deep_is_one_call() -> None:
    clock, tracker, time = make_clock()
    clock.enter(OPT, True, "a")
    clock.enter(OPT, True, "b")
    clock.enter(OPT, True, "c")
    time.run(3)
    clock.exit()
    clock.exit()
    time.run(1)
    clock.exit()
    assert tracker.calls == [
        ("begin", OPT, 100.0, True, "a"),
        ("end", OPT, 104.0, 4.0, False),
    ]


def test_phase_inside_a_same_kind_nested_call_is_still_subtracted() -> None:
    # An LBFGS subclass whose step calls super().step(closure): both steps
    # are wrapped (one optimization call), and the closure's forward and
    # backward are still their own phases, not optimization time.
    clock, tracker, time = make_clock()
    clock.enter(OPT, True, "my_lbfgs")
    time.run(1)
    clock.enter(OPT, True, "my_lbfgs")
    time.run(1)
    clock.enter(FWD, True, "model")
    time.run(4)
    clock.exit()
    clock.enter(BWD)
    time.run(8)
    clock.exit()
    time.run(1)
    clock.exit()
    time.run(1)
    clock.exit()
    assert clock.depth() == 0
    assert [c for c in tracker.calls if c[0] == "end"] == [
        ("end", FWD, 106.0, 4.0, False),
        ("end", BWD, 114.0, 8.0, False),
        ("end", OPT, 116.0, 4.0, False),
    ]


def test_nested_phase_inherits_the_eval_flag_of_the_top_level_one() -> None:
    clock, tracker, time = make_clock(eval_kinds=(FWD,))
    clock.enter(FWD, False, "model")
    time.run(2)
    clock.enter(DATA, False)  # a fetch made inside an evaluation forward
    time.run(1)
    clock.exit()
    clock.exit()
    assert tracker.calls == [
        ("begin", FWD, 100.0, False, "model"),
        ("end", DATA, 103.0, 1.0, True),
        ("end", FWD, 103.0, 2.0, True),
    ]


def test_listener_sees_nested_edges_but_not_folded_calls() -> None:
    # Forward inside an optimizer step's closure gets its own range (the
    # trace and NVTX show what the rows count); a same-kind call folded
    # into its parent (GradScaler.step -> optimizer.step) gets none.
    clock, _tracker, time = make_clock(eval_kinds=(FWD,))
    edges: list[tuple[int, bool, bool]] = []
    clock.listener = lambda kind, enter, is_eval: edges.append((kind, enter, is_eval))
    clock.enter(OPT)
    clock.enter(FWD)
    time.run(1)
    clock.exit()
    clock.enter(OPT)
    clock.exit()
    clock.exit()
    clock.enter(FWD, False)
    clock.exit()
    assert edges == [
        (OPT, True, False),
        (FWD, True, False),
        (FWD, False, False),
        (OPT, False, False),
        (FWD, True, True),
        (FWD, False, True),
    ]


def test_a_listener_attached_as_a_step_begins_hears_that_steps_first_edge() -> None:
    # The agent attaches the CUDA timer and the allocator's peaks at the step
    # begin where it first sees the script's CUDA (cudaside.py), that is,
    # inside tracker.begin for the step's first edge. That edge (step 0's
    # DataLoader fetch) is theirs: without it, step 0's fetch had no peak.
    clock, tracker, time = make_clock()
    edges: list[tuple[int, bool, bool]] = []

    def begin(kind: int, t: float, grad: bool = True, ident: object = None) -> bool:
        if clock.listener is None:
            clock.listener = lambda k, e, ev: edges.append((k, e, ev))
        return False

    tracker.begin = begin  # type: ignore[method-assign]
    clock.enter(DATA)
    time.run(1)
    clock.exit()
    clock.enter(FWD)
    clock.exit()
    assert edges == [(DATA, True, False), (DATA, False, False),
                     (FWD, True, False), (FWD, False, False)]


def test_phase_entered_after_perfrun_work_starts_when_the_work_ended() -> None:
    clock, tracker, time = make_clock()
    tracker.resume = 103.0  # e.g. the profiler exported its trace at this edge
    clock.enter(DATA)
    time.run(5)
    clock.exit()
    assert tracker.calls[-1] == ("end", DATA, 105.0, 2.0, False)


def test_abort_drops_the_phase_without_ending_it() -> None:
    clock, tracker, time = make_clock(eval_kinds=(DATA,))
    edges: list[tuple[int, bool, bool]] = []
    clock.listener = lambda kind, enter, is_eval: edges.append((kind, enter, is_eval))
    clock.enter(DATA, False)
    time.run(3)
    assert clock.abort() == (100.0, True)
    assert clock.depth() == 0
    # The tracker heard the start, never an end; the listener saw both edges.
    assert tracker.calls == [("begin", DATA, 100.0, False, None)]
    assert edges == [(DATA, True, True), (DATA, False, True)]


def test_abort_of_a_nested_phase_leaves_its_time_to_the_parent() -> None:
    clock, tracker, time = make_clock()
    clock.enter(FWD)
    time.run(1)
    clock.enter(DATA)
    time.run(2)
    assert clock.abort() == (101.0, False)
    time.run(1)
    clock.exit()
    assert tracker.calls[-1] == ("end", FWD, 104.0, 4.0, False)


def test_abort_of_a_folded_call_returns_now() -> None:
    clock, tracker, time = make_clock()
    clock.enter(DATA)
    time.run(1)
    clock.enter(DATA)
    time.run(1)
    assert clock.abort() == (102.0, False)
    assert clock.depth() == 1
    time.run(1)
    clock.exit()
    assert tracker.calls[-1] == ("end", DATA, 103.0, 3.0, False)


def test_exit_with_nothing_open_is_ignored() -> None:
    clock, tracker, _time = make_clock()
    clock.exit()
    assert tracker.calls == []
    assert clock.depth() == 0


def test_unwind_closes_every_open_phase_innermost_first() -> None:
    clock, tracker, time = make_clock()
    clock.enter(OPT)
    time.run(1)
    clock.enter(FWD)
    time.run(2)
    clock.enter(FWD)  # folded
    time.run(3)
    clock.unwind()
    assert clock.depth() == 0
    assert [c for c in tracker.calls if c[0] == "end"] == [
        ("end", FWD, 106.0, 5.0, False),
        ("end", OPT, 106.0, 1.0, False),
    ]


def test_clock_feeds_a_real_tracker_exclusive_times() -> None:
    time = FakeTime()
    tracker = StepTracker()
    tracker.optimizer_seen = True
    clock = PhaseClock(tracker, now=time)
    for _ in range(2):
        clock.enter(OPT, True, "lbfgs")
        time.run(1)
        clock.enter(FWD, True, "model")
        time.run(4)
        clock.exit()
        clock.enter(BWD)
        time.run(8)
        clock.exit()
        time.run(1)
        clock.exit()
    tracker.finish(time())
    assert [r[:11] for r in tracker.rows] == [
        [0.0, 14.0, 0.0, 4.0, 8.0, 2.0, 0.0, 0, 1, 1, 1],
        [14.0, 28.0, 0.0, 4.0, 8.0, 2.0, 0.0, 0, 1, 1, 1],
    ]


def test_default_clock_reads_perf_counter() -> None:
    clock = PhaseClock(StepTracker())
    assert clock.now is perf_counter


# -- the buffered clock (timer-only hot path) ---------------------------------------------------


def _drive(clock, now):
    """One training step's events as the hooks report them, twice, with an
    epoch end in between: enough to exercise every event kind."""
    from perfrun.runtime.steps import BWD, DATA, FWD, OPT, ZERO

    clock.optimizer_built()
    for _ in range(2):
        now.t += 1
        clock.iterator_made(now.t, now.t + 1)
        now.t += 1
        for _ in range(3):
            clock.enter(DATA, True, None)
            now.t += 2
            clock.exit()
            clock.fetched(8)
            clock.enter(ZERO, True, 7)
            now.t += 1
            clock.exit()
            clock.enter(FWD, True, 1)
            now.t += 3
            clock.exit()
            clock.enter(BWD, True, None)
            now.t += 4
            clock.exit()
            clock.enter(OPT, True, 7)
            now.t += 5
            clock.exit()
            now.t += 1
        clock.enter(DATA, True, None)
        now.t += 1
        clock.fetch_stopped()


def test_buffered_clock_replays_to_the_same_steps_as_the_phase_clock() -> None:
    from perfrun.runtime.clock import BufferedClock, PhaseClock
    from perfrun.runtime.steps import StepTracker

    class Now:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    direct_now, buffered_now = Now(), Now()
    direct = PhaseClock(StepTracker("auto"), now=direct_now)
    inner = PhaseClock(StepTracker("auto"), now=buffered_now)
    buffered = BufferedClock(inner, limit=5, interval=1e9)
    _drive(direct, direct_now)
    _drive(buffered, buffered_now)
    # Nothing lost in the buffer once drained, and every row identical.
    buffered.drain()
    direct.tracker.finish(direct_now.t)
    inner.tracker.finish(buffered_now.t)
    assert len(direct.tracker.rows) == 6
    assert inner.tracker.rows == direct.tracker.rows
    assert inner.tracker.stop_calls == direct.tracker.stop_calls == 2
    assert inner.tracker.init_calls == direct.tracker.init_calls == 2


def test_buffered_clock_reports_a_failing_replay_and_goes_on() -> None:
    from perfrun.runtime.clock import BufferedClock, PhaseClock
    from perfrun.runtime.steps import FWD, StepTracker

    faults: list[str] = []
    inner = PhaseClock(StepTracker("auto"))
    buffered = BufferedClock(inner, on_fault=lambda where, exc: faults.append(str(exc)))
    original = inner.tracker.begin

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    inner.tracker.begin = broken
    buffered.enter(FWD)
    buffered.exit()
    buffered.drain()
    inner.tracker.begin = original
    assert faults == ["injected"]
    buffered.enter(FWD)
    buffered.exit()
    buffered.drain()
    assert inner.tracker.open


def test_events_as_the_hooks_record_them() -> None:
    """The hooks hand the clock one event per edge; FETCHED ends a fetch and
    gives its samples in one event; an exit that did not raise is its time
    alone (a float), the same as (EXIT, False, t)."""
    from perfrun.runtime.clock import ENTER, EXIT, FETCHED, ITER, OPTIM, STOP

    time = FakeTime(0.0)
    direct = PhaseClock(StepTracker("auto"), now=time)
    recorded = PhaseClock(StepTracker("auto"), now=time)
    recorded.event((OPTIM,))
    direct.optimizer_built()
    recorded.event((ITER, 0.0, 1.0))
    direct.iterator_made(0.0, 1.0)
    t = 1.0
    for _ in range(3):
        recorded.event((ENTER, DATA, True, None, t))
        recorded.event((FETCHED, 8, t + 2))
        recorded.event((ENTER, FWD, True, 1, t + 2))
        recorded.event((EXIT, False, t + 5))
        recorded.event((ENTER, OPT, True, 7, t + 5))
        recorded.event(float(t + 6))
        for kind, start, end in ((DATA, t, t + 2), (FWD, t + 2, t + 5), (OPT, t + 5, t + 6)):
            direct.enter_at(kind, start, True, {FWD: 1, OPT: 7}.get(kind))
            direct.exit_at(end)
            if kind == DATA:
                direct.fetched(8)
        t += 6
    recorded.event((ENTER, DATA, True, None, t))
    recorded.event((STOP, t + 1))
    direct.enter_at(DATA, t, True, None)
    direct.fetch_stopped_at(t + 1)
    recorded.tracker.finish(t + 1)
    direct.tracker.finish(t + 1)
    assert recorded.tracker.rows == direct.tracker.rows
    assert len(recorded.tracker.rows) == 3
    assert {row[11] for row in recorded.tracker.rows} == {8}  # samples


def test_going_live_replays_what_was_buffered_first() -> None:
    from perfrun.runtime.clock import EXIT, BufferedClock

    time = FakeTime(0.0)
    inner = PhaseClock(StepTracker("auto"), now=time)
    buffered = BufferedClock(inner, interval=1e9)
    direct = PhaseClock(StepTracker("auto"), now=time)
    for clock in (buffered, direct):
        clock.enter_at(FWD, 1.0, True, "model")
        clock.exit_at(2.0)
        clock.enter_at(OPT, 2.0, True, "opt")
    assert not inner.tracker.open  # all three still in the buffer
    buffered.set_live(True)
    assert inner.tracker.open and inner.depth() == 1
    # From now on each event reaches the state machine as it is recorded.
    buffered.record((EXIT, False, 3.0))
    direct.exit_at(3.0)
    assert inner.tracker.closed
    assert buffered.buf == []
    buffered.set_live(False)
    for clock in (buffered, direct):
        clock.enter_at(FWD, 4.0, True, "model")
        clock.exit_at(5.0)
    assert inner.depth() == 0 and len(buffered.buf) == 2
    buffered.drain()
    inner.tracker.finish(6.0)
    direct.tracker.finish(6.0)
    assert inner.tracker.rows == direct.tracker.rows


def test_flush_thread_replays_only_a_stale_buffer() -> None:
    """A script that stops making edges (a long sleep, a kill coming) must
    not keep its finished steps in the buffer: the flush thread replays
    them once the replay is overdue, and leaves a fresh buffer, or a live
    clock, to the script's own thread."""
    import threading

    from perfrun.runtime.clock import ENTER, EXIT, BufferedClock

    time = FakeTime(0.0)
    inner = PhaseClock(StepTracker("auto"), now=time)
    buffered = BufferedClock(inner, interval=0.5)
    for start in (0.0, 0.1):
        buffered.record((ENTER, FWD, True, "model", start))
        buffered.record((EXIT, False, start + 0.05))
    time.t = 0.55
    buffered.drain_stale()  # due, but the script may still make its next edge
    assert len(buffered.buf) == 4 and not inner.tracker.open
    time.t = 0.65
    worker = threading.Thread(target=buffered.drain_stale)
    worker.start()
    worker.join()
    assert buffered.buf == [] and inner.tracker.open
    assert len(inner.tracker.rows) == 1  # the first step ended where the second began
    buffered.set_live(True)
    time.t = 10.0
    buffered.drain_stale()  # live: nothing buffered, nothing done
    assert len(inner.tracker.rows) == 1


def test_the_replay_comes_after_about_so_many_edges_within_bounds() -> None:
    """A replay costs about 0.2 ms whatever it holds (its own run, cold, and
    the kernels after it): a script of long steps is replayed a few times a
    second, not every 20 ms; one of short steps every 20 ms still, so that
    a replay's burst stays short."""
    from perfrun.runtime.clock import ENTER, EXIT, BufferedClock

    time = FakeTime(0.0)
    inner = PhaseClock(StepTracker("auto"), now=time)
    buffered = BufferedClock(inner, interval=0.02, longest=0.25, events=2048)
    assert buffered.last == 0.02

    def steps(n: int, step: float) -> None:
        for _ in range(n):
            buffered.record((ENTER, FWD, True, "model", time.t))
            time.t += step
            buffered.record((EXIT, False, time.t))

    # Long steps (30 ms, 2 edges each): 2,048 edges would take 30 s.
    steps(4, 0.03)
    buffered.drain()
    assert buffered.last == pytest.approx(time.t + 0.25)
    # Steps of 10 us: 2,048 edges in 10 ms; by the interval's floor, 20 ms.
    steps(8000, 0.00001)
    buffered.drain()
    assert buffered.last == pytest.approx(time.t + 0.02)
    # 2,048 edges in 100 ms: the next replay in 100 ms.
    steps(1024, 0.1 / 1024)
    buffered.drain()
    assert buffered.last == pytest.approx(time.t + 0.1)
    assert len(inner.tracker.rows) == 4 + 8000 + 1024 - 1


def test_replay_wait_is_the_pace_of_so_many_edges_within_bounds() -> None:
    from perfrun.runtime.clock import replay_wait

    assert replay_wait(0.12, 8, 0.02, 1.0, 2048) == 1.0  # long steps: the ceiling
    assert replay_wait(0.08, 16000, 0.02, 1.0, 2048) == 0.02  # short steps: the floor
    assert replay_wait(0.1, 2048, 0.02, 1.0, 2048) == pytest.approx(0.1)
    assert replay_wait(5.0, 0, 0.02, 1.0, 2048) == 1.0  # nothing made: the ceiling
