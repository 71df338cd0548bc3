"""The CUDA phase timer's bookkeeping, with a stand-in for torch.cuda.Event.

A real CUDA event cannot exist on this machine's CPU-only torch, so
`FakeEvent` records a time from a hand-moved clock and answers
`elapsed_time` in milliseconds as the real one does. What is tested is
perfrun's own logic: a phase's GPU time excludes the phases nested in it
(forward and backward inside an optimizer step's closure), a closure's own
time and evaluation go to no column, and a relabel moves a phase's time to
the column the step tracker finally chose. The real events are checked on a
GPU by the project's GPU check.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from perfrun.runtime.gpu import CudaPhaseTimer
from perfrun.runtime.steps import BWD, CLOSURE, DATA, FWD, OPT

CLOCK = [0.0]


class FakeEvent:
    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = CLOCK[0]

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1e3


def make_timer() -> CudaPhaseTimer:
    CLOCK[0] = 0.0
    torch: Any = SimpleNamespace(cuda=SimpleNamespace(Event=FakeEvent))
    return CudaPhaseTimer(torch)


def phase(timer: CudaPhaseTimer, kind: int, seconds: float, is_eval: bool = False) -> None:
    timer.edge(kind, True, is_eval)
    CLOCK[0] += seconds
    timer.edge(kind, False, is_eval)


def test_nested_phases_are_subtracted_from_their_parent() -> None:
    timer = make_timer()
    timer.step_begin(0, 0.0)
    phase(timer, DATA, 1)
    timer.edge(OPT, True, False)
    CLOCK[0] += 1
    timer.edge(CLOSURE, True, False)
    CLOCK[0] += 2  # the closure's own code
    phase(timer, FWD, 4)
    phase(timer, BWD, 8)
    timer.edge(CLOSURE, False, False)
    CLOCK[0] += 2  # the optimizer's update
    timer.edge(OPT, False, False)
    timer.step_end(0, 0.0, True)
    rows = [[None] * 5]
    assert timer.resolve(rows, 0) == 1
    assert rows[0] == [1.0, 4.0, 8.0, 3.0, 18.0]


def test_relabel_moves_time_to_the_final_phase() -> None:
    # A frozen teacher: its batch and forward began as evaluation, then a
    # training event showed they were part of the step.
    timer = make_timer()
    timer.step_begin(0, 0.0)
    phase(timer, DATA, 1)
    phase(timer, FWD, 2, is_eval=True)
    timer.relabel(["Dataloader", "Forward"])
    phase(timer, FWD, 4)
    timer.step_end(0, 0.0, True)
    rows = [[None] * 5]
    timer.resolve(rows, 0)
    assert rows[0][:4] == [1.0, 6.0, 0.0, 0.0]
