"""Step boundaries: the rules in perfrun/runtime/steps.py, on hand-written
event sequences.

Each test plays a training (or inference) loop into a PhaseClock the way the
torch hooks would, with a fake clock moved by hand, and checks the step rows
the tracker produced. Durations are small integers, so every number below is
exact and compared with `==`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Optional

import pytest

from perfrun.analysis.summary import perf_summary
from perfrun.runtime.clock import PhaseClock
from perfrun.runtime.events import EVAL_MODE
from perfrun.runtime.steps import (
    BWD,
    CLOSURE,
    DATA,
    FWD,
    MISSING,
    NOGRAD_STREAK,
    OPT,
    ZERO,
    StepTracker,
)
from perfrun.store.stepfile import COL, GPU_COLUMNS, PHASES, STEP_COLUMNS

# What `ident` names in the hooks (id() of the module or optimizer).
MODEL, LOSS, OPTIM, SCALER = "model", "loss", "optimizer", "scaler"


class FakeTime:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Script:
    """Plays a script's calls into a PhaseClock the way perfrun's hooks do."""

    def __init__(
        self,
        *,
        optimizer: bool = True,
        step_on: str = "auto",
        on_begin: Any = None,
        on_end: Any = None,
    ) -> None:
        self.time = FakeTime()
        self.tracker = StepTracker(step_on, on_begin, on_end)
        # The hooks set this when an optimizer is constructed.
        self.tracker.optimizer_seen = optimizer
        self.clock = PhaseClock(self.tracker, now=self.time)

    @property
    def now(self) -> float:
        return self.time.t

    def run(self, seconds: float) -> None:
        """Untimed Python: loop body code, logging, a hand-written update."""
        self.time.t += seconds

    @contextmanager
    def phase(self, kind: int, ident: object = None, grad: Optional[bool] = True) -> Iterator[None]:
        self.clock.enter(kind, grad, ident)
        try:
            yield
        finally:
            self.clock.exit()

    def call(self, kind: int, seconds: float, ident: object = None,
             grad: Optional[bool] = True) -> None:
        with self.phase(kind, ident, grad):
            self.run(seconds)

    def forward(self, seconds: float, ident: object = MODEL, grad: Optional[bool] = True) -> None:
        self.call(FWD, seconds, ident, grad)

    def backward(self, seconds: float) -> None:
        self.call(BWD, seconds)

    def zero_grad(self, seconds: float, ident: object = OPTIM) -> None:
        self.call(ZERO, seconds, ident)

    def step(self, seconds: float, ident: object = OPTIM) -> None:
        self.call(OPT, seconds, ident)

    def fetch(self, seconds: float, grad: bool = True, samples: int = 0,
              it: object = None) -> None:
        """DataLoader.__next__ returning a batch of `samples` (from iterator
        `it`: the hooks name it by its id)."""
        self.call(DATA, seconds, it, grad)
        if samples and self.tracker.open and self.clock.depth() == 0:
            self.tracker.add_samples(samples)

    def exhausted(self, seconds: float, grad: bool = True, it: object = None) -> None:
        """DataLoader.__next__ raising StopIteration after `seconds`."""
        self.clock.enter(DATA, grad, it)
        self.run(seconds)
        t1 = self.now
        top = self.clock.depth() == 1
        t0, is_eval = self.clock.abort()
        if top:
            self.tracker.stop_iteration(t0, t1, is_eval)

    def new_iterator(self, seconds: float) -> None:
        """DataLoader.__iter__ (worker start-up) taking `seconds`."""
        t0 = self.now
        self.run(seconds)
        if not self.clock.stack:
            self.tracker.excluded(t0, self.now)

    def finish(self) -> list[list]:
        self.clock.unwind()
        self.tracker.finish(self.now)
        return self.tracker.rows


def row(
    start: float,
    end: float,
    *,
    dataloader: float = 0.0,
    forward: float = 0.0,
    backward: float = 0.0,
    optimization: float = 0.0,
    excluded: float = 0.0,
    calls: Sequence[int] = (0, 0, 0, 0),
    samples: int = 0,
) -> list[Any]:
    """The row the tracker should have written (GPU columns left empty)."""
    return [
        start,
        end,
        dataloader,
        forward,
        backward,
        optimization,
        excluded,
        *calls,
        samples,
        *([MISSING] * len(GPU_COLUMNS)),
    ]


def step_time(r: Sequence[Any]) -> float:
    return r[COL["end"]] - r[COL["start"]] - r[COL["excluded"]]


def others(r: Sequence[Any]) -> float:
    """Unclamped, so a phase counted outside its step shows as negative."""
    return step_time(r) - sum(r[COL[p]] for p in PHASES)


def assert_contiguous(rows: Sequence[Sequence[Any]]) -> None:
    for prev, nxt in zip(rows, rows[1:]):
        assert prev[COL["end"]] == nxt[COL["start"]]


# -- one optimizer step per batch ---------------------------------------------


def train_batch(s: Script, samples: int = 32, it: object = None, grad: Any = True) -> None:
    """fetch 1 (from iterator `it`), zero_grad 1, forward 4 (the model's
    `grad`: events.py) + loss 1, backward 8, step 2, body 3: a 20 s step."""
    s.fetch(1, samples=samples, it=it)
    s.zero_grad(1)
    s.forward(4, grad=grad)
    s.forward(1, LOSS)
    s.backward(8)
    s.step(2)
    s.run(3)


def train_row(start: float, *, excluded: float = 0.0, samples: int = 32) -> list[Any]:
    return row(
        start,
        start + 20 + excluded,
        dataloader=1,
        forward=5,
        backward=8,
        optimization=3,
        excluded=excluded,
        calls=(1, 2, 1, 2),
        samples=samples,
    )


@pytest.mark.parametrize("n", [1, 2, 5])
def test_training_loop_with_dataloader_is_one_step_per_batch(n: int) -> None:
    s = Script()
    s.run(5)  # model and optimizer set-up
    s.new_iterator(2)
    for _ in range(n):
        train_batch(s)
    s.exhausted(1)
    s.run(5)  # saving, tear-down
    rows = s.finish()

    assert rows == [train_row(7 + 20 * i) for i in range(n)]
    assert all(len(r) == len(STEP_COLUMNS) for r in rows)
    assert_contiguous(rows)
    for r in rows:
        assert step_time(r) == 20
        assert others(r) == 3
        assert r[COL["forward_calls"]] == 2
    t = s.tracker
    assert (t.init_calls, t.init_time, t.stop_calls, t.stop_time) == (1, 2.0, 1, 1.0)
    assert (t.eval_spans, t.eval_time) == (0, 0.0)


# Three orders of the same loop without a DataLoader: the leading event is
# the first phase of the iteration. Each body is 16 s of phases plus 3 s of
# untimed code (making the batch, logging).
NO_LOADER_BODIES = {
    "forward first": [
        (FWD, MODEL, 4),
        (FWD, LOSS, 1),
        (ZERO, OPTIM, 1),
        (BWD, None, 8),
        (OPT, OPTIM, 2),
    ],
    "zero_grad first": [
        (ZERO, OPTIM, 1),
        (FWD, MODEL, 4),
        (FWD, LOSS, 1),
        (BWD, None, 8),
        (OPT, OPTIM, 2),
    ],
    "zero_grad last": [
        (FWD, MODEL, 4),
        (FWD, LOSS, 1),
        (BWD, None, 8),
        (OPT, OPTIM, 2),
        (ZERO, OPTIM, 1),
    ],
}


def play_no_loader(s: Script, body: list[tuple[int, Optional[str], int]], n: int) -> None:
    s.run(10)
    for _ in range(n):
        for kind, ident, seconds in body:
            s.call(kind, seconds, ident)
        s.run(3)
    s.run(6)


@pytest.mark.parametrize("order", sorted(NO_LOADER_BODIES))
def test_training_loop_without_dataloader(order: str) -> None:
    s = Script()
    play_no_loader(s, NO_LOADER_BODIES[order], 4)
    rows = s.finish()

    assert len(rows) == 4
    assert rows[:3] == [
        row(10 + 19 * i, 29 + 19 * i, forward=5, backward=8, optimization=3, calls=(0, 2, 1, 2))
        for i in range(3)
    ]
    assert_contiguous(rows)
    assert [others(r) for r in rows[:3]] == [3, 3, 3]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        # Ends where optimizer.step ended; the 3 s of body code and the 6 s
        # after the loop are in no step.
        ("forward first", row(67, 83, forward=5, backward=8, optimization=3, calls=(0, 2, 1, 2))),
        ("zero_grad first", row(67, 83, forward=5, backward=8, optimization=3, calls=(0, 2, 1, 2))),
        # The zero_grad after the last optimizer.step falls after the step's
        # end, so it is not part of the step.
        ("zero_grad last", row(67, 82, forward=5, backward=8, optimization=2, calls=(0, 2, 1, 1))),
    ],
)
def test_last_step_ends_at_its_closing_event(order: str, expected: list[Any]) -> None:
    s = Script()
    play_no_loader(s, NO_LOADER_BODIES[order], 4)
    rows = s.finish()
    assert rows[-1] == expected
    assert others(rows[-1]) == 0


def test_unclosed_trailing_step_is_dropped() -> None:
    s = Script()
    for _ in range(2):
        s.forward(4)
        s.forward(1, LOSS)
        s.backward(8)
        s.step(2)
    # An iteration cut short before its optimizer step.
    s.forward(4)
    s.forward(1, LOSS)
    s.run(10)
    rows = s.finish()
    assert rows == [
        row(0, 15, forward=5, backward=8, optimization=2, calls=(0, 2, 1, 1)),
        row(15, 30, forward=5, backward=8, optimization=2, calls=(0, 2, 1, 1)),
    ]
    assert s.tracker.open is False


def test_nothing_closes_before_the_first_optimizer_step() -> None:
    s = Script()
    s.forward(4)
    s.backward(8)
    rows = s.finish()
    assert rows == []


# -- no optimizer ----------------------------------------------------------------


@pytest.mark.parametrize("loader", [False, True])
def test_hand_written_sgd_is_one_step_per_iteration(loader: bool) -> None:
    # No optimizer object: the update is plain tensor code (untimed, 5 s),
    # so it lands in Others.
    s = Script(optimizer=False)
    for _ in range(3):
        if loader:
            s.fetch(1, samples=16)
        s.forward(4)
        s.forward(1, LOSS)
        s.backward(8)
        s.run(5)
    if loader:
        s.exhausted(1)
    rows = s.finish()

    d, calls, samples = (1, (1, 2, 1, 0), 16) if loader else (0, (0, 2, 1, 0), 0)
    full = [
        row(
            i * (18 + d),
            (i + 1) * (18 + d),
            dataloader=d,
            forward=5,
            backward=8,
            calls=calls,
            samples=samples,
        )
        for i in range(3)
    ]
    if loader:
        # StopIteration ends the last iteration, update included.
        assert rows == full
        assert [others(r) for r in rows] == [5, 5, 5]
    else:
        # Nothing follows the last iteration: it ends with its backward.
        assert rows == full[:2] + [row(36, 49, forward=5, backward=8, calls=calls)]
        assert [others(r) for r in rows] == [5, 5, 0]


def test_backward_without_optimizer_makes_no_grad_forwards_evaluation() -> None:
    s = Script(optimizer=False)
    for _ in range(2):
        s.forward(4)
        s.backward(8)
        s.run(2)
        s.forward(3, grad=False)  # validation under torch.no_grad
        s.run(1)
    rows = s.finish()
    assert rows == [
        row(0, 18, forward=4, backward=8, excluded=3, calls=(0, 1, 1, 0)),
        row(18, 30, forward=4, backward=8, calls=(0, 1, 1, 0)),
    ]
    assert (s.tracker.eval_spans, s.tracker.eval_time, s.tracker.eval_forward_calls) == (2, 6.0, 2)


# -- gradient accumulation, step_on ----------------------------------------------


def accumulate(s: Script, k: int, groups: int, loader: bool = True) -> None:
    """`groups` optimizer steps of `k` micro-batches each. A micro-batch is
    fetch 1 (with a loader), forward 4 + loss 1, backward 8, body 1; each
    optimizer step is step 2, zero_grad 1, body 2."""
    if loader:
        s.new_iterator(2)
    for _ in range(groups):
        for _ in range(k):
            if loader:
                s.fetch(1, samples=8)
            s.forward(4)
            s.forward(1, LOSS)
            s.backward(8)
            s.run(1)
        s.step(2)
        s.zero_grad(1)
        s.run(2)
    if loader:
        s.exhausted(1)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_gradient_accumulation_is_one_step_per_optimizer_step(k: int) -> None:
    s = Script()
    accumulate(s, k, 3)
    rows = s.finish()
    length = 15 * k + 5
    assert rows == [
        row(
            2 + length * i,
            2 + length * (i + 1),
            dataloader=k,
            forward=5 * k,
            backward=8 * k,
            optimization=3,
            calls=(k, 2 * k, k, 2),
            samples=8 * k,
        )
        for i in range(3)
    ]
    assert [others(r) for r in rows] == [k + 2] * 3


@pytest.mark.parametrize("step_on", ["auto", "optimizer"])
def test_step_on_optimizer_on_accumulation(step_on: str) -> None:
    s = Script(step_on=step_on)
    accumulate(s, 4, 2)
    rows = s.finish()
    assert [(r[0], r[1]) for r in rows] == [(2, 67), (67, 132)]
    assert [r[COL["dataloader_calls"]] for r in rows] == [4, 4]


@pytest.mark.parametrize("step_on", ["forward", "backward", "dataloader"])
def test_step_on_per_micro_batch_on_accumulation(step_on: str) -> None:
    # With a DataLoader every fetch leads, and each of these modes closes
    # within the micro-batch: one step per micro-batch, the optimizer's
    # work in the step of the micro-batch it follows.
    s = Script(step_on=step_on)
    accumulate(s, 4, 2)
    rows = s.finish()
    micro = dict(dataloader=1, forward=5, backward=8, samples=8)
    expected = []
    t = 2
    for _ in range(2):
        for j in range(4):
            if j < 3:
                expected.append(row(t, t + 15, calls=(1, 2, 1, 0), **micro))
                t += 15
            else:
                expected.append(row(t, t + 20, optimization=3, calls=(1, 2, 1, 2), **micro))
                t += 20
    assert rows == expected


@pytest.mark.parametrize(
    ("step_on", "count", "last", "last_others"),
    [
        # Each mode ends the last step at its own closing event.
        (
            "optimizer",
            2,
            row(61, 119, forward=20, backward=32, optimization=2, calls=(0, 8, 4, 1)),
            4,
        ),
        ("forward", 8, row(103, 108, forward=5, calls=(0, 2, 0, 0)), 0),
        ("backward", 8, row(103, 116, forward=5, backward=8, calls=(0, 2, 1, 0)), 0),
        # No fetch ever closes a step: nothing is complete.
        ("dataloader", 0, None, None),
    ],
)
def test_step_on_without_dataloader(
    step_on: str, count: int, last: Optional[list], last_others: Optional[float]
) -> None:
    s = Script(step_on=step_on)
    accumulate(s, 4, 2, loader=False)
    rows = s.finish()
    assert len(rows) == count
    assert_contiguous(rows)
    if last is not None:
        assert rows[-1] == last
        assert others(rows[-1]) == last_others


def test_unknown_step_on_is_refused() -> None:
    with pytest.raises(ValueError, match="step_on"):
        StepTracker("epoch")


# -- LBFGS, GAN, GradScaler -------------------------------------------------------


def lbfgs_step(s: Script, ident: object = OPTIM) -> None:
    """optimizer.step(closure): 1 s of its own, the closure three times
    (zero_grad 1, forward 4 + loss 1, backward 8), 1 s of its own: 44 s."""
    with s.phase(OPT, ident):
        s.run(1)
        for _ in range(3):
            s.zero_grad(1)
            s.forward(4)
            s.forward(1, LOSS)
            s.backward(8)
        s.run(1)


def test_lbfgs_without_dataloader_is_one_step_per_optimizer_step() -> None:
    s = Script()
    s.run(5)
    for _ in range(3):
        s.run(1)  # making the batch: the end of the previous step
        lbfgs_step(s)
    rows = s.finish()
    lbfgs = dict(forward=15, backward=24, optimization=5, calls=(0, 6, 3, 4))
    assert rows == [
        row(6, 51, **lbfgs),
        row(51, 96, **lbfgs),
        row(96, 140, **lbfgs),
    ]
    # The closure's phases are not counted twice: the phases of the last
    # step add up to the optimizer.step call's wall time exactly.
    assert sum(rows[-1][COL[p]] for p in PHASES) == 44
    assert [others(r) for r in rows] == [1, 1, 0]


def test_lbfgs_with_dataloader_is_one_step_per_batch() -> None:
    s = Script()
    s.new_iterator(2)
    for _ in range(3):
        s.fetch(1, samples=4)
        lbfgs_step(s)
        s.run(1)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(
            2 + 46 * i,
            48 + 46 * i,
            dataloader=1,
            forward=15,
            backward=24,
            optimization=5,
            calls=(1, 6, 3, 4),
            samples=4,
        )
        for i in range(3)
    ]
    assert [others(r) for r in rows] == [1, 1, 1]


def test_lbfgs_subclass_calling_super_step_counts_one_optimizer_call() -> None:
    # Both MyLBFGS.step and LBFGS.step are wrapped; the closure still counts
    # as forward and backward.
    s = Script()
    for _ in range(2):
        with s.phase(OPT, "my_lbfgs"):
            s.run(1)
            lbfgs_step(s, "my_lbfgs")
    rows = s.finish()
    assert rows == [
        row(0, 45, forward=15, backward=24, optimization=6, calls=(0, 6, 3, 4)),
        row(45, 90, forward=15, backward=24, optimization=6, calls=(0, 6, 3, 4)),
    ]


def gan_batch(s: Script, loader: bool) -> None:
    """Discriminator then generator, each with its own optimizer."""
    if loader:
        s.fetch(1, samples=64)
    s.zero_grad(1, "opt_d")
    s.forward(2, "D")
    s.forward(3, "G")
    s.forward(2, "D")
    s.forward(1, LOSS)
    s.backward(4)
    s.step(2, "opt_d")
    s.zero_grad(1, "opt_g")
    s.forward(2, "D")
    s.forward(1, LOSS)
    s.backward(4)
    s.step(2, "opt_g")
    s.run(2)


def test_gan_with_dataloader_is_one_step_per_batch() -> None:
    s = Script()
    for _ in range(3):
        gan_batch(s, loader=True)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(
            28 * i,
            28 * (i + 1),
            dataloader=1,
            forward=11,
            backward=8,
            optimization=6,
            calls=(1, 6, 2, 4),
            samples=64,
        )
        for i in range(3)
    ]
    assert [others(r) for r in rows] == [2, 2, 2]


def test_gan_without_dataloader_leads_with_the_first_optimizer_zero_grad() -> None:
    s = Script()
    for _ in range(3):
        gan_batch(s, loader=False)
    rows = s.finish()
    gan = dict(forward=11, backward=8, optimization=6, calls=(0, 6, 2, 4))
    assert rows == [row(0, 27, **gan), row(27, 54, **gan), row(54, 79, **gan)]


def test_grad_scaler_step_around_optimizer_step_is_one_call() -> None:
    s = Script()
    for _ in range(2):
        s.fetch(1)
        s.zero_grad(1)
        s.forward(4)
        s.forward(1, LOSS)
        s.backward(8)
        with s.phase(OPT, SCALER):  # GradScaler.step(optimizer)
            s.run(1)
            s.step(2)  # optimizer.step, nested
            s.run(1)
        s.zero_grad(1, SCALER)  # GradScaler.update
        s.run(1)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(
            21 * i,
            21 * (i + 1),
            dataloader=1,
            forward=5,
            backward=8,
            optimization=6,
            calls=(1, 2, 1, 3),
        )
        for i in range(2)
    ]


# -- inference ----------------------------------------------------------------------


def test_inference_with_dataloader_is_one_step_per_batch() -> None:
    s = Script(optimizer=False)
    s.new_iterator(3)
    for _ in range(4):
        s.fetch(2, samples=128)
        s.forward(5, grad=False)
        s.run(1)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(3 + 8 * i, 11 + 8 * i, dataloader=2, forward=5, calls=(1, 1, 0, 0), samples=128)
        for i in range(4)
    ]
    assert s.tracker.eval_spans == 0


def test_inference_without_dataloader_is_one_step_per_forward() -> None:
    s = Script(optimizer=False)
    for _ in range(4):
        s.forward(5, grad=False)
        s.run(1)  # post-processing
    rows = s.finish()
    assert rows == [row(6 * i, 6 * (i + 1), forward=5, calls=(0, 1, 0, 0)) for i in range(3)] + [
        row(18, 23, forward=5, calls=(0, 1, 0, 0))
    ]
    assert s.tracker.eval_spans == 0


# -- evaluation, epochs, iterator creation ---------------------------------------------


def eval_pass(s: Script, batches: int) -> None:
    """A validation loop under torch.no_grad: iterator 2, then per batch
    fetch 1, forward 3, body 1, and the exhausted fetch 1."""
    s.new_iterator(2)
    for _ in range(batches):
        s.fetch(1, grad=False, samples=16)
        s.forward(3, grad=False)
        s.run(1)
    s.exhausted(1, grad=False)


def test_eval_pass_between_training_steps_is_excluded() -> None:
    s = Script()
    s.new_iterator(2)
    for i in range(4):
        train_batch(s)
        if i == 1:
            eval_pass(s, 2)  # 2 s iterator creation + an 11 s evaluation span
    s.exhausted(1)
    rows = s.finish()

    assert rows == [
        train_row(2),
        train_row(22, excluded=13),
        train_row(55),
        train_row(75),
    ]
    assert [step_time(r) for r in rows] == [20, 20, 20, 20]
    assert [others(r) for r in rows] == [3, 3, 3, 3]
    t = s.tracker
    assert (t.eval_spans, t.eval_time, t.eval_forward_calls) == (1, 11.0, 2)
    assert (t.init_calls, t.init_time, t.stop_calls, t.stop_time) == (2, 4.0, 2, 2.0)
    summary = perf_summary(rows)
    assert summary.steps == 4
    assert (summary.batch_cost.avg, summary.batch_cost.max) == (20.0, 20.0)


def test_a_new_epochs_iterator_at_the_old_ones_address_is_not_fetching_ahead() -> None:
    """Each epoch's DataLoader iterator is freed when its loop ends, and
    the next is often made at the same address: the same id, which the
    hooks name it by. The fetch that raised StopIteration and the new
    iterator's first fetch are not "two fetches in a row" of one iterator
    (before: taken for a loader fetching ahead, the epoch's batches each
    counted in the step after their own, its first step none, and the run
    had no samples/s)."""
    s = Script()
    it = object()  # one id for every epoch's iterator
    for _epoch in range(3):
        s.new_iterator(2)
        for _ in range(3):
            train_batch(s, it=it)
        s.exhausted(1, it=it)
    rows = s.finish()
    assert [r[COL["samples"]] for r in rows] == [32] * 9
    assert not s.tracker.ahead


def eval_mode_pass(s: Script, batches: int) -> None:
    """A test loop written with `model.eval()` and no `torch.no_grad()` (as
    PyG's tutorials write it): gradients on, the model in eval mode;
    iterator 2, then per batch fetch 1, forward 3, body 1, and the
    exhausted fetch 1."""
    s.new_iterator(2)
    for _ in range(batches):
        s.fetch(1, samples=16)
        s.forward(3, grad=EVAL_MODE)
        s.run(1)
    s.exhausted(1)


def test_an_eval_mode_pass_with_gradients_on_is_evaluation() -> None:
    """Two epochs, each a test pass over two loaders after its training
    batches: the passes are evaluation as if under no_grad (before, their
    batches were the next epoch's first step's: 5 fetches, 5 forwards and
    96 samples more)."""
    s = Script()
    for _epoch in range(2):
        s.new_iterator(2)
        for _ in range(2):
            train_batch(s)
        s.exhausted(1)
        eval_mode_pass(s, 2)
        eval_mode_pass(s, 1)
    rows = s.finish()
    assert [r[COL["samples"]] for r in rows] == [32] * 4
    assert [step_time(r) for r in rows] == [20] * 4
    assert [r[COL["dataloader_calls"]] for r in rows] == [1] * 4
    t = s.tracker
    # Both loaders' passes, one after the other: one span an epoch.
    assert (t.eval_batches, t.eval_forward_calls, t.eval_passes) == (6, 6, 2)


def test_a_model_left_in_eval_mode_that_trains_keeps_its_steps() -> None:
    """A loop that evaluated with `model.eval()` and never called
    `model.train()` again: its forwards run in eval mode with gradients on
    and backward follows each. They are training, step for step, as
    before the mode was looked at."""
    def steps(grad: Any) -> list[list[Any]]:
        s = Script()
        relabels: list[list[str]] = []
        s.tracker.on_relabel = relabels.append
        s.new_iterator(2)
        for _ in range(4):
            train_batch(s, grad=grad)
        s.exhausted(1)
        t = s.tracker
        assert t.eval_spans == t.eval_batches == t.eval_forward_calls == 0
        # Each step's forward was held back, then given back.
        assert relabels == ([] if grad is True else [["Forward"]] * 4)
        return s.finish()

    assert steps(EVAL_MODE) == steps(True)


def test_without_a_training_dataloader_an_eval_mode_forward_stays_training() -> None:
    """No loader leads the steps (a replay buffer, tensors sliced by hand):
    a forward in eval mode with gradients on is counted as it always was,
    one step per iteration."""
    def steps(grad: Any) -> list[list[Any]]:
        s = Script()
        for _ in range(4):
            s.zero_grad(1)
            s.forward(4, grad=grad)
            s.backward(8)
            s.step(2)
            s.run(3)
        return s.finish()

    assert steps(EVAL_MODE) == steps(True)
    assert len(steps(EVAL_MODE)) == 4


def test_eval_pass_inside_a_step_is_excluded() -> None:
    # Evaluation over a no-grad loader before the optimizer step (the step
    # has not closed yet): a no-grad fetch makes the span evaluation at once.
    s = Script()
    for i in range(2):
        s.fetch(1)
        s.forward(4)
        s.backward(8)
        if i == 0:
            s.fetch(1, grad=False)
            s.forward(3, grad=False)
            s.run(1)
            s.exhausted(1, grad=False)
        s.step(2)
        s.run(1)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(
            0,
            22,
            dataloader=1,
            forward=4,
            backward=8,
            optimization=2,
            excluded=6,
            calls=(1, 1, 1, 1),
        ),
        row(22, 38, dataloader=1, forward=4, backward=8, optimization=2, calls=(1, 1, 1, 1)),
    ]
    t = s.tracker
    assert (t.eval_time, t.eval_passes, t.eval_batches, t.eval_forward_calls) == (6, 1, 1, 1)


def test_no_grad_forward_before_the_optimizer_step_is_part_of_the_step() -> None:
    # No-grad forwards between backward and the optimizer step, with no
    # loader of their own: the optimizer step after them says they were part
    # of the step (a target network, a metric on the training batch), so they
    # count as Forward, not as an evaluation pass.
    s = Script()
    for i in range(2):
        s.fetch(1)
        s.forward(4)
        s.backward(8)
        if i == 0:
            s.forward(3, grad=False)
            s.run(1)
            s.forward(3, grad=False)
        s.step(2)
        s.run(1)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(0, 23, dataloader=1, forward=10, backward=8, optimization=2, calls=(1, 3, 1, 1)),
        row(23, 39, dataloader=1, forward=4, backward=8, optimization=2, calls=(1, 1, 1, 1)),
    ]
    t = s.tracker
    assert (t.eval_time, t.eval_spans, t.eval_passes, t.eval_forward_calls) == (0, 0, 0, 0)


def test_no_grad_forward_is_not_evaluation_before_training_is_known() -> None:
    s = Script(optimizer=False)
    s.forward(3, grad=False)
    assert s.tracker.eval_spans == 0
    assert s.tracker.open


def test_epochs_count_nothing_between_them() -> None:
    s = Script()
    s.run(5)
    for _ in range(2):
        s.new_iterator(2)
        for _ in range(3):
            train_batch(s)
        s.exhausted(1)
        s.run(4)  # scheduler.step(), logging
        eval_pass(s, 1)  # 2 s iterator creation, 6 s span
        s.run(3)  # checkpoint
    rows = s.finish()

    assert rows == [train_row(s0) for s0 in (7, 27, 47, 85, 105, 125)]
    assert sum(step_time(r) for r in rows) == 120
    t = s.tracker
    assert (t.init_calls, t.init_time) == (4, 8.0)
    assert (t.stop_calls, t.stop_time) == (4, 4.0)
    assert (t.eval_spans, t.eval_time) == (2, 12.0)


def test_two_validation_loaders_are_one_evaluation_span() -> None:
    # The second loader's iterator is created inside the span (an evaluation
    # fetch follows it), so the span covers it and it is subtracted once.
    s = Script()
    s.new_iterator(2)
    train_batch(s)
    eval_pass(s, 1)  # iterator 2 before the span, span 24..30
    eval_pass(s, 1)  # iterator 30..32 inside the span, span ends at 38
    train_batch(s)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [train_row(2, excluded=16), train_row(38)]
    t = s.tracker
    assert (t.eval_spans, t.eval_time) == (1, 14.0)
    assert (t.init_calls, t.init_time) == (3, 6.0)


def test_training_iterator_after_evaluation_is_not_evaluation() -> None:
    # `next(iter(loader))` each iteration, with an evaluation pass after the
    # first: the training iterator created after it is excluded from the
    # step but is no evaluation time.
    s = Script()
    for i in range(3):
        s.new_iterator(2)
        train_batch(s)
        if i == 0:
            eval_pass(s, 1)  # iterator 22..24, span 24..30
    rows = s.finish()
    assert rows == [
        train_row(2, excluded=10),
        train_row(32, excluded=2),
        row(
            54,
            71,
            dataloader=1,
            forward=5,
            backward=8,
            optimization=3,
            calls=(1, 2, 1, 2),
            samples=32,
        ),
    ]
    assert [step_time(r) for r in rows] == [20, 20, 17]
    assert (s.tracker.eval_spans, s.tracker.eval_time) == (1, 6.0)


def test_iterator_created_inside_a_step_is_excluded() -> None:
    # `batch = next(iter(loader))` every iteration: the worker start-up
    # falls inside the previous step and is not part of it.
    s = Script()
    for _ in range(3):
        s.new_iterator(2)
        train_batch(s)
    rows = s.finish()
    assert rows == [train_row(2, excluded=2), train_row(24, excluded=2)] + [
        row(
            46,
            63,
            dataloader=1,
            forward=5,
            backward=8,
            optimization=3,
            calls=(1, 2, 1, 2),
            samples=32,
        )
    ]
    assert [step_time(r) for r in rows] == [20, 20, 17]
    assert s.tracker.init_time == 6


def test_exhausted_loader_before_the_optimizer_step_keeps_the_step_open() -> None:
    # Accumulation over 2 batches with 3 batches in the loader: the third
    # batch's step never reaches an optimizer step and is dropped.
    s = Script()
    for i in range(3):
        s.fetch(1)
        s.forward(4)
        s.backward(8)
        if i % 2 == 1:
            s.step(2)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(0, 28, dataloader=2, forward=8, backward=16, optimization=2, calls=(2, 2, 2, 1))
    ]
    assert (s.tracker.stop_calls, s.tracker.stop_time) == (1, 1.0)


# -- callbacks -------------------------------------------------------------------------


def test_callbacks_see_every_step_begin_and_end() -> None:
    events: list[tuple[Any, ...]] = []
    s = Script(
        on_begin=lambda i, t: events.append(("begin", i, t)),
        on_end=lambda i, t, committed: events.append(("end", i, t, committed)),
    )
    for _ in range(2):
        s.new_iterator(2)
        for _ in range(2):
            train_batch(s)
        s.exhausted(1)
        s.run(4)
    s.finish()
    assert len(s.tracker.rows) == 4
    assert events == [
        ("begin", 0, 2.0),
        ("end", 0, 22.0, True),
        ("begin", 1, 22.0),
        ("end", 1, 42.0, True),
        # The exhausted fetch opened a step it then cancelled.
        ("begin", 2, 42.0),
        ("end", 2, 42.0, False),
        ("begin", 2, 49.0),
        ("end", 2, 69.0, True),
        ("begin", 3, 69.0),
        ("end", 3, 89.0, True),
        ("begin", 4, 89.0),
        ("end", 4, 89.0, False),
    ]
    assert s.tracker.current_index == 4


def test_finish_reports_the_last_step_at_its_close() -> None:
    events: list[tuple[Any, ...]] = []
    s = Script(
        on_begin=lambda i, t: events.append(("begin", i, t)),
        on_end=lambda i, t, committed: events.append(("end", i, t, committed)),
    )
    for _ in range(2):
        s.forward(4)
        s.backward(8)
        s.step(2)
        s.run(1)
    s.finish()
    assert events == [
        ("begin", 0, 0.0),
        ("end", 0, 15.0, True),
        ("begin", 1, 15.0),
        ("end", 1, 29.0, True),
    ]


def test_samples_of_evaluation_batches_are_not_training_samples() -> None:
    s = Script()
    train_batch(s, samples=32)
    eval_pass(s, 3)
    train_batch(s, samples=32)
    s.exhausted(1)
    rows = s.finish()
    assert [r[COL["samples"]] for r in rows] == [32, 32]


# -- evaluation loops that fetch with gradients on ---------------------------------


def grad_fetch_eval_pass(s: Script, batches: int, loaders: int = 1) -> None:
    """An evaluation loop as HF Trainer and accelerate's docs write it: the
    fetch runs with gradients on, only the forward is under no_grad.
    iterator 2; per batch `loaders` fetches of 1 (zipped loaders), forward 3,
    body 1; then the exhausted fetch 1."""
    s.new_iterator(2)
    for _ in range(batches):
        for _ in range(loaders):
            s.fetch(1, grad=True, samples=16)
        s.forward(3, grad=False)
        s.run(1)
    s.exhausted(1, grad=True)


def test_eval_pass_with_grad_enabled_fetches_is_one_pass_outside_the_steps() -> None:
    relabels: list[list[str]] = []
    s = Script()
    s.tracker.on_relabel = relabels.append
    s.new_iterator(2)
    for i in range(4):
        train_batch(s)
        if i == 1:
            grad_fetch_eval_pass(s, 2)
    s.exhausted(1)
    rows = s.finish()
    # The first evaluation fetch ends step 1 (the loop body asked for a
    # batch); step 2 then holds the evaluation span (44..55: both batches
    # and the exhausted fetch), excluded, and one training batch.
    assert rows == [
        train_row(2),
        train_row(22, excluded=2),
        train_row(44, excluded=11),
        train_row(75),
    ]
    assert [step_time(r) for r in rows] == [20, 20, 20, 20]
    assert [r[COL["samples"]] for r in rows] == [32, 32, 32, 32]
    t = s.tracker
    assert (t.eval_passes, t.eval_batches, t.eval_forward_calls) == (1, 2, 2)
    assert t.eval_time == 11.0
    # The first batch's forward came before the step's optimizer step, so
    # its span was provisional until the next fetch: then the last two
    # ranges (fetch and forward) are named Eval; the second batch's fetch is
    # renamed as soon as its forward is seen.
    assert relabels == [["Eval", "Eval"], ["Eval"]]


def test_two_eval_passes_with_grad_fetches_count_as_two() -> None:
    s = Script()
    for i in range(5):
        train_batch(s)
        if i in (1, 3):
            grad_fetch_eval_pass(s, 3)
    s.exhausted(1)
    rows = s.finish()
    assert len(rows) == 5
    assert [step_time(r) for r in rows] == [20] * 5
    assert [r[COL["dataloader_calls"]] for r in rows] == [1] * 5
    t = s.tracker
    assert (t.eval_passes, t.eval_batches, t.eval_forward_calls) == (2, 6, 6)


def test_zipped_eval_loaders_with_grad_fetches_move_both_batches() -> None:
    s = Script()
    for i in range(3):
        train_batch(s)
        if i == 0:
            grad_fetch_eval_pass(s, 2, loaders=2)
    s.exhausted(1)
    rows = s.finish()
    assert [step_time(r) for r in rows] == [20] * 3
    assert [r[COL["samples"]] for r in rows] == [32] * 3
    t = s.tracker
    assert (t.eval_passes, t.eval_batches) == (1, 4)


def test_single_batch_eval_with_grad_fetch_ends_with_its_exhausted_fetch() -> None:
    s = Script()
    for i in range(3):
        train_batch(s)
        if i == 0:
            grad_fetch_eval_pass(s, 1)
    s.exhausted(1)
    rows = s.finish()
    assert [step_time(r) for r in rows] == [20] * 3
    assert (s.tracker.eval_passes, s.tracker.eval_batches) == (1, 1)


def test_frozen_teacher_forward_under_no_grad_is_part_of_the_step() -> None:
    # Distillation: fetch, teacher under no_grad, student with gradients,
    # backward, step. The teacher's forward and the batch are training.
    relabels: list[list[str]] = []
    s = Script()
    s.tracker.on_relabel = relabels.append
    for _ in range(3):
        s.fetch(1, samples=32)
        s.forward(2, ident="teacher", grad=False)
        s.forward(4)
        s.backward(8)
        s.step(2)
        s.run(3)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(0, 20, dataloader=1, forward=6, backward=8, optimization=2,
            calls=(1, 2, 1, 1), samples=32),
        row(20, 40, dataloader=1, forward=6, backward=8, optimization=2,
            calls=(1, 2, 1, 1), samples=32),
        row(40, 60, dataloader=1, forward=6, backward=8, optimization=2,
            calls=(1, 2, 1, 1), samples=32),
    ]
    t = s.tracker
    assert (t.eval_spans, t.eval_passes, t.eval_batches, t.eval_forward_calls) == (0, 0, 0, 0)
    assert relabels == [["Dataloader", "Forward"]] * 3


def test_no_grad_forwards_in_every_step_become_the_steps_own() -> None:
    """A DQN: the action chosen under no_grad, the environment's step, the
    targets under no_grad, then the Q-network's update. Left out as
    evaluation, every step would miss a third of its time; after
    NOGRAD_STREAK steps that each held such a span they count as Forward,
    and the steps from `nograd_from` on are whole."""
    s = Script()
    for _ in range(8):
        # No gradients, the networks in training mode (grad None: events.py).
        s.forward(1, ident="q", grad=None)  # the action
        s.run(2)  # the environment
        s.forward(1, ident="target", grad=None)  # the targets
        s.forward(3, ident="q")
        s.backward(5)
        s.zero_grad(1)
        s.step(2)
    rows = s.finish()
    t = s.tracker
    assert NOGRAD_STREAK == 3 and t.nograd_from == 4
    # The first steps leave the span out, as evaluation (in the warm-up).
    assert rows[0] == row(4, 19, forward=3, backward=5, optimization=3, excluded=4,
                          calls=(0, 1, 1, 2))
    # From step 4 on, the whole iteration: 3 forwards, the environment in Others.
    for i, r in enumerate(rows[4:], start=4):
        assert r == row(15 * i, 15 * i + 15, forward=5, backward=5, optimization=3,
                        calls=(0, 3, 1, 2)), (i, r)
    assert (t.eval_spans, t.eval_forward_calls) == (4, 8)  # before step 0, steps 0-2
    assert_contiguous(rows)


def test_no_grad_forwards_in_training_mode_are_counted_apart_in_evaluation() -> None:
    """A PPO: a rollout of no-grad forwards (training mode) every 4
    updates stays evaluation, its forwards counted as training mode's; a
    teacher's forward given back to its step is no longer counted."""
    s = Script()
    for _ in range(3):
        for _ in range(5):
            s.forward(1, grad=None)  # the rollout
            s.run(1)
        for _ in range(4):
            s.zero_grad(1)
            s.forward(2)
            s.backward(3)
            s.step(1)
    s.fetch(1, samples=8)
    s.forward(2, ident="teacher", grad=None)  # a teacher in training mode, mid-step
    s.forward(2)
    s.backward(3)
    s.step(1)
    s.finish()
    t = s.tracker
    assert t.nograd_from is None
    assert (t.eval_passes, t.eval_forward_calls, t.eval_train_mode) == (3, 15, 15)


def test_a_validation_in_eval_mode_after_every_step_stays_evaluation() -> None:
    """PyG's full-batch loop: one optimizer step an epoch, then `test()`
    with the model in eval mode (grad False: events.py), every epoch."""
    s = Script()
    for _ in range(8):
        s.zero_grad(1)
        s.forward(4)
        s.backward(8)
        s.step(2)
        s.forward(3, grad=False)
        s.forward(3, grad=False)
    rows = s.finish()
    assert s.tracker.nograd_from is None and s.tracker.eval_forward_calls == 16
    assert all(r[COL["forward_calls"]] == 1 for r in rows)


def test_an_occasional_no_grad_pass_stays_evaluation() -> None:
    """A validation forward every other step, the model even left in
    training mode: never in NOGRAD_STREAK steps in a row, so evaluation."""
    s = Script()
    for i in range(12):
        s.zero_grad(1)
        s.forward(4)
        s.backward(8)
        s.step(2)
        if i % 2 == 0:
            s.forward(5, grad=None)  # even in training mode
    rows = s.finish()
    assert s.tracker.nograd_from is None and s.tracker.eval_spans == 6
    assert all(r[COL["forward_calls"]] == 1 for r in rows)


def test_a_validation_loader_every_step_stays_evaluation() -> None:
    """A no-grad fetch and forward after every step: a validation loader's
    pass, evaluation whatever its period."""
    s = Script()
    for _ in range(6):
        s.fetch(1, samples=32)
        s.forward(4)
        s.backward(8)
        s.step(2)
        s.fetch(1, grad=False, samples=32)
        s.forward(3, grad=False)
    rows = s.finish()
    assert s.tracker.nograd_from is None and s.tracker.eval_forward_calls == 6
    assert all(r[COL["forward_calls"]] == 1 for r in rows)


def test_eval_forward_right_after_the_optimizer_step_is_evaluation() -> None:
    # No loader: a validation forward after the optimizer step, then the
    # next step. The step had closed, so the forward is evaluation at once.
    s = Script()
    for i in range(3):
        s.zero_grad(1)
        s.forward(4)
        s.backward(8)
        s.step(2)
        if i == 0:
            s.forward(5, grad=False)
        s.run(1)
    rows = s.finish()
    assert [step_time(r) for r in rows] == [16, 16, 15]
    assert rows[0][COL["excluded"]] == 5
    assert (s.tracker.eval_passes, s.tracker.eval_forward_calls) == (1, 1)


# -- perfrun's own work at a step boundary -----------------------------------------


def test_own_work_at_a_step_boundary_is_excluded_from_the_step_and_its_phase() -> None:
    # The profiler stops and exports its trace inside the fetch that begins
    # step 2 (in the step-begin callback): 50 s of perfrun's own work.
    s = Script()

    def on_begin(index: int, t: float) -> None:
        if index == 2:
            s.run(50)
            s.tracker.own_work(t, s.now)

    s.tracker.on_begin = on_begin
    for _ in range(4):
        train_batch(s)
    s.exhausted(1)
    rows = s.finish()
    assert rows[2] == train_row(40, excluded=50)
    assert [step_time(r) for r in rows] == [20] * 4
    assert [r[COL["dataloader"]] for r in rows] == [1] * 4
    assert (s.tracker.own_calls, s.tracker.own_time) == (1, 50.0)


def test_own_work_in_a_fetch_that_ends_the_data_does_not_count_as_end_of_data() -> None:
    s = Script()

    def on_begin(index: int, t: float) -> None:
        if index == 2:
            s.run(50)
            s.tracker.own_work(t, s.now)

    s.tracker.on_begin = on_begin
    for _ in range(2):
        train_batch(s)
    s.exhausted(1)  # begins step 2, whose own work runs, then StopIteration
    rows = s.finish()
    assert [step_time(r) for r in rows] == [20, 20]
    assert (s.tracker.stop_calls, s.tracker.stop_time) == (1, 1.0)


# -- closures -------------------------------------------------------------------------


def test_closure_code_outside_its_phases_is_others_not_optimization() -> None:
    # Lightning's automatic optimization: optimizer.step(closure), the closure
    # runs the training step's Python (2), forward 4, backward 8, and hooks (1);
    # the optimizer's own update is 2.
    s = Script()
    for _ in range(2):
        s.fetch(1, samples=32)
        with s.phase(OPT, OPTIM):
            with s.phase(CLOSURE):
                s.run(2)
                s.forward(4)
                s.backward(8)
                s.run(1)
            s.run(2)
        s.run(3)
    s.exhausted(1)
    rows = s.finish()
    assert rows == [
        row(0, 21, dataloader=1, forward=4, backward=8, optimization=2,
            calls=(1, 1, 1, 1), samples=32),
        row(21, 42, dataloader=1, forward=4, backward=8, optimization=2,
            calls=(1, 1, 1, 1), samples=32),
    ]
    assert [others(r) for r in rows] == [6, 6]


def test_step_indexes_do_not_depend_on_the_writer_taking_rows() -> None:
    """The flush thread's `take` drops written rows from the buffer and then
    advances `base`, two statements apart: a step boundary on the script's
    thread in between must still get its true index (the profiler window,
    the FLOP step and --stop-after are scheduled by it)."""
    begun: list[int] = []
    ended: list[int] = []
    tracker = StepTracker("auto", lambda i, t: begun.append(i),
                          lambda i, t, committed: committed and ended.append(i))
    clock = PhaseClock(tracker, now=iter(range(10_000)).__next__)
    for step in range(6):
        for kind in (DATA, FWD, BWD, OPT):
            clock.enter(kind)
            clock.exit()
        if step == 2:
            # The writer halfway through take(2): rows gone, base not yet moved.
            del tracker.buf[: 2 * len(STEP_COLUMNS)]
        elif step == 3:
            tracker.base += 2
    assert begun == list(range(6))
    assert ended == list(range(5))
    assert tracker.committed == 5 == tracker.base + tracker.held


# -- many optimizer steps on one batch ------------------------------------------------


def train_layer(s: Script, optimizer: str, steps: int) -> None:
    """Forward-forward training: a layer's own loop over the one batch,
    its forward called as `self.forward(x)` (untimed: 3), then zero_grad 1,
    backward 4, step 2."""
    for _ in range(steps):
        s.run(3)
        s.zero_grad(1, optimizer)
        s.backward(4)
        s.step(2, optimizer)


@pytest.mark.parametrize("step_on", ["auto", "optimizer"])
def test_many_optimizer_steps_on_one_fetched_batch_are_each_a_step(step_on: str) -> None:
    s = Script(step_on=step_on)
    s.fetch(5, samples=2000)
    train_layer(s, "layer0", 6)
    train_layer(s, "layer1", 4)
    s.fetch(1, samples=400)  # the test set, fetched once
    s.forward(2, grad=False)
    rows = s.finish()
    # One step per optimizer step: the first holds the fetch; each trained
    # on the whole batch, so each counts its samples.
    assert len(rows) == 10
    assert_contiguous(rows)
    assert rows[0] == row(0, 5 + 10 + 3, dataloader=5, backward=4, optimization=3,
                          calls=(1, 0, 1, 2), samples=2000)
    for r in rows[1:-1]:
        assert r[COL["end"]] - r[COL["start"]] == 10
        assert r[2:12] == [0, 0, 4, 3, 0, 0, 0, 1, 2, 2000]
    # The last step ends at its optimizer step.
    assert rows[-1][2:12] == [0, 0, 4, 3, 0, 0, 0, 1, 2, 2000]
    assert rows[-1][COL["end"]] == 5 + 10 * 10


def test_a_gan_on_one_batch_is_split_only_where_an_optimizer_repeats() -> None:
    # Both halves of a GAN step, twice per fetch: the second round begins
    # with the discriminator's zero_grad again.
    s = Script()
    for _ in range(3):
        s.fetch(1, samples=64)
        for _ in range(2):
            s.zero_grad(1, "opt_d")
            s.forward(2, "D")
            s.backward(4)
            s.step(2, "opt_d")
            s.zero_grad(1, "opt_g")
            s.forward(2, "D")
            s.backward(4)
            s.step(2, "opt_g")
    rows = s.finish()
    assert len(rows) == 6
    assert_contiguous(rows)
    assert [r[COL["optimization_calls"]] for r in rows] == [4] * 6
    assert [r[COL["samples"]] for r in rows] == [64] * 6


# -- one-ahead prefetch -----------------------------------------------------------------


def prefetching_epoch(s: Script, it: str, batches: int, accumulate: int) -> None:
    """accelerate's DataLoaderShard: fetch batch 0 and batch 1, yield batch
    0; then each yield fetches the next batch first; the last batch is
    yielded after the fetch that ends the data. `accumulate` micro-batches
    (forward 2, backward 3) per optimizer step (2)."""
    s.new_iterator(1)
    s.fetch(1, samples=8, it=it)
    for i in range(batches):
        if i + 1 < batches:
            s.fetch(1, samples=8, it=it)
        else:
            s.exhausted(1, it=it)
        s.forward(2)
        s.backward(3)
        if (i + 1) % accumulate == 0:
            s.step(2)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_one_ahead_prefetch_counts_each_batch_in_the_step_that_trains_on_it(
    accumulate: int,
) -> None:
    s = Script()
    prefetching_epoch(s, "epoch0", 6, accumulate)
    prefetching_epoch(s, "epoch1", 6, accumulate)
    rows = s.finish()
    assert len(rows) == 2 * 6 // accumulate
    assert [r[COL["samples"]] for r in rows] == [8 * accumulate] * len(rows)
    # The fetches' calls stay where they ran: the epoch's first step
    # fetched one batch ahead, its last one fewer.
    calls = [r[COL["dataloader_calls"]] for r in rows]
    per_epoch = 6 // accumulate
    assert calls[0] == accumulate + 1 and calls[per_epoch - 1] == accumulate - 1
    assert sum(calls) == 2 * 6


def test_zipped_loaders_are_no_prefetch() -> None:
    # Two loaders fetched back to back every step: two iterators, each
    # batch trained on in the step that fetched it.
    s = Script()
    for _ in range(4):
        s.fetch(1, samples=8, it="images")
        s.fetch(1, samples=4, it="labels")
        s.forward(2)
        s.backward(3)
        s.step(2)
    rows = s.finish()
    assert [r[COL["samples"]] for r in rows] == [12] * 4
