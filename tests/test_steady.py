"""Steps replayed in bulk (runtime/steady.py) are the steps the state
machine commits, to the byte.

Event streams, generated here and recorded from real torch loops, are
replayed twice: event by event through the PhaseClock, and through a
BufferedClock that replays in bulk, drained at random points, with the
writer taking rows in between. Rows, counters and the machine's state
after the stream must be the same."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from perfrun.runtime.clock import BufferedClock, PhaseClock
from perfrun.runtime.events import ENTER, EXIT, FETCHED, ITER, OPTIM, STOP
from perfrun.runtime.steps import BWD, CLOSURE, DATA, FWD, OPT, WIDTH, ZERO, StepTracker

MODEL, LOSS, TEACHER, OPTIMIZER = 101, 102, 103, 201

# -- generated streams ------------------------------------------------------------


class Stream:
    """Events as the hooks record them, at times that move by random
    amounts (random low bits: the sums must agree to the last one). An exit
    that did not raise is a bare float, as the hooks record it, or with
    probability `full` the tuple (EXIT, False, t): both mean the same."""

    def __init__(self, rng: random.Random, full: float = 0.0) -> None:
        self.rng = rng
        self.full = full
        self.t = 1000.0 + rng.random()
        self.events: list[Any] = []

    def tick(self) -> float:
        self.t += self.rng.uniform(1e-5, 2e-3)
        return self.t

    def phase(self, kind: int, ident: Any = None, grad: bool | None = True,
              inner: Callable[[], None]
              | None = None, failed: bool = False) -> None:
        self.events.append((ENTER, kind, grad, ident, self.tick()))
        if inner is not None:
            inner()
        t = self.tick()
        if failed or (self.full and self.rng.random() < self.full):
            self.events.append((EXIT, failed, t))
        else:
            self.events.append(t)

    def fetch(self, samples: int = 8, grad: bool = True) -> None:
        self.events.append((ENTER, DATA, grad, None, self.tick()))
        self.events.append((FETCHED, samples, self.tick()))

    def end_of_data(self) -> None:
        self.events.append((ENTER, DATA, True, None, self.tick()))
        self.events.append((STOP, self.tick()))

    def new_iterator(self) -> None:
        t0 = self.tick()
        self.events.append((ITER, t0, self.tick()))


def train_step(s: Stream, samples: int = 8, loader: bool = True) -> None:
    if loader:
        s.fetch(samples)
    s.phase(ZERO, OPTIMIZER)
    s.phase(FWD, MODEL)
    s.phase(FWD, LOSS)
    s.phase(BWD)
    s.phase(OPT, OPTIMIZER)


def accumulate(s: Stream) -> None:
    for _ in range(2):
        s.fetch()
        s.phase(FWD, MODEL)
        s.phase(BWD)
    s.phase(OPT, OPTIMIZER)
    s.phase(ZERO, OPTIMIZER)


def teacher(s: Stream) -> None:
    s.fetch()
    s.phase(FWD, TEACHER, grad=False)
    s.phase(FWD, MODEL)
    s.phase(BWD)
    s.phase(OPT, OPTIMIZER)


def act(s: Stream) -> None:
    """A DQN's iteration: the action and the targets under no_grad by
    networks in training mode (grad None), then the update."""
    s.phase(FWD, MODEL, grad=None)
    s.phase(FWD, TEACHER, grad=None)
    train_step(s, loader=False)


def lbfgs(s: Stream) -> None:
    s.fetch()

    def closure_body() -> None:
        s.phase(ZERO, OPTIMIZER)
        s.phase(FWD, MODEL)
        s.phase(BWD)

    s.phase(OPT, OPTIMIZER, inner=lambda: s.phase(CLOSURE, inner=closure_body))


def failing_forward(s: Stream) -> None:
    s.fetch()
    s.phase(FWD, MODEL, failed=True)
    s.phase(FWD, MODEL)
    s.phase(BWD)
    s.phase(OPT, OPTIMIZER)


def eval_pass(s: Stream) -> None:
    s.new_iterator()
    for _ in range(s.rng.randint(1, 4)):
        grad_fetch = s.rng.random() < 0.5  # HF: fetch with grad on, forward under no_grad
        s.fetch(4, grad=grad_fetch)
        s.phase(FWD, MODEL, grad=False)
    s.end_of_data()
    s.new_iterator()


def epoch_end(s: Stream) -> None:
    train_step(s, samples=3)  # the last, short batch
    s.end_of_data()
    s.new_iterator()


REGIMES = [
    lambda s: train_step(s),
    lambda s: train_step(s, loader=False),
    accumulate,
    teacher,
    act,
    lbfgs,
    failing_forward,
    eval_pass,
    epoch_end,
    lambda s: s.events.append((OPTIM,)),
]


def generated(seed: int) -> list[Any]:
    rng = random.Random(seed)
    # Bare exits, as the hooks record them; a few spelt in full among them;
    # all spelt in full.
    s = Stream(rng, full=(0.0, 0.02, 1.0)[seed % 3])
    s.events.append((OPTIM,))
    s.new_iterator()
    while len(s.events) < 3000:
        regime = rng.choice(REGIMES)
        # Mostly long runs of one kind of step (a pattern to learn), with
        # short ones and switches in between.
        for _ in range(rng.choice((1, 2, 3, 40, 120))):
            regime(s)
    return s.events


# -- the two replays ----------------------------------------------------------------


def settled(tracker: StepTracker, clock: PhaseClock) -> tuple:
    """What the machine holds besides its rows, compared exactly."""
    return (
        tracker.shape(), tracker.start, tracker.fetch_start, tracker.opened,
        tracker.eval_time, tracker.eval_spans, tracker.eval_passes, tracker.eval_batches,
        tracker.eval_forward_calls, tracker.init_calls, tracker.init_time,
        tracker.stop_calls, tracker.stop_time, tracker.own_calls,
        tracker.step_nograd, tracker.nograd_steps, tracker.nograd_from,
        tracker.committed, tracker.committed == tracker.base + tracker.held, tracker.base,
        [list(e) for e in clock.stack],
    )


def make_tracker(step_on: str, fixed: int | None) -> StepTracker:
    tracker = StepTracker(step_on)
    tracker.origin = 999.5
    tracker.fixed_samples = fixed
    return tracker


def by_event(events: list[Any], step_on: str = "auto", fixed: int | None = None,
             ) -> tuple[bytes, tuple]:
    clock = PhaseClock(make_tracker(step_on, fixed))
    for ev in events:
        clock.event(ev)
    before_finish = settled(clock.tracker, clock)
    clock.unwind()
    clock.tracker.finish(clock.now())
    return clock.tracker.buf.tobytes(), before_finish


def in_bulk(events: list[Any], rng: random.Random, step_on: str = "auto",
            fixed: int | None = None) -> tuple[bytes, tuple, Any]:
    inner = PhaseClock(make_tracker(step_on, fixed))
    clock = BufferedClock(inner, interval=float("inf"))
    assert clock.bulk
    tracker = inner.tracker
    taken = bytearray()
    i = 0
    while i < len(events):
        n = rng.choice((1, 2, 5, 13, 60, 400, 1500))
        for ev in events[i:i + n]:
            clock.record(ev)
        i += n
        clock.drain()
        if rng.random() < 0.3 and tracker.held:
            k = rng.randint(1, tracker.held)
            taken += tracker.buf[:k * WIDTH].tobytes()
            tracker.take(k)
    before_finish = settled(tracker, inner)
    clock.unwind()
    tracker.finish(inner.now())
    return bytes(taken) + tracker.buf.tobytes(), before_finish, clock.steady


@pytest.mark.parametrize("seed", range(12))
def test_generated_streams_replay_in_bulk_to_the_same_bytes(seed: int) -> None:
    events = generated(seed)
    step_on = ("auto", "auto", "auto", "forward", "backward", "optimizer")[seed % 6]
    fixed = 16 if seed % 4 == 3 else None
    rows, state = by_event(events, step_on, fixed)
    bulk_rows, bulk_state, steady = in_bulk(events, random.Random(seed), step_on, fixed)
    assert len(rows) % (WIDTH * 8) == 0 and len(rows) > 100 * WIDTH * 8
    assert bulk_rows == rows
    # (base differs: the bulk replay's writer took rows; the rest is equal.)
    assert bulk_state[:-2] == state[:-2] and bulk_state[-1] == state[-1]


def test_steps_replayed_in_bulk_break_a_run_of_no_grad_steps() -> None:
    """A steady loop with a DQN iteration every 60 steps: never three steps
    in a row with no-grad forwards, in bulk as event by event (the steps
    committed in bulk end the run as the state machine's do)."""
    s = Stream(random.Random(5))
    s.events.append((OPTIM,))
    for _ in range(4):
        for _ in range(60):
            train_step(s, loader=False)
        act(s)
    rows, state = by_event(s.events)
    inner = CountingClock(make_tracker("auto", None))
    clock = BufferedClock(inner, interval=float("inf"))
    for ev in s.events:
        clock.record(ev)
    clock.drain()
    assert inner.seen < len(s.events) / 2  # the steady loop went in bulk
    assert settled(inner.tracker, inner)[:-2] == state[:-2]
    assert inner.tracker.nograd_from is None and inner.tracker.nograd_steps <= 1
    inner.unwind()
    inner.tracker.finish(inner.now())
    assert inner.tracker.buf.tobytes() == rows


class CountingClock(PhaseClock):
    """A PhaseClock that counts the events it replays one by one."""

    __slots__ = ("seen",)

    def __init__(self, tracker: StepTracker) -> None:
        super().__init__(tracker)
        self.seen = 0

    def event(self, ev: tuple) -> None:
        self.seen += 1
        super().event(ev)


def test_a_steady_loop_is_replayed_in_bulk_and_others_event_by_event() -> None:
    """The point of it: a plain loop's steps skip the state machine, and
    steps that do not qualify (nested phases: LBFGS) never use a pattern."""
    plain = Stream(random.Random(1))
    plain.events.append((OPTIM,))
    for _ in range(500):
        train_step(plain)
    inner = CountingClock(make_tracker("auto", None))
    clock = BufferedClock(inner, interval=float("inf"))
    for start in range(0, len(plain.events), 150):
        for ev in plain.events[start:start + 150]:
            clock.record(ev)
        clock.drain()
    assert inner.tracker.held == 499  # the last step is still open
    # 12 events a step, batches of 150 events: the state machine sees the
    # step each batch ends in, and the one after it, while the rest are
    # committed in bulk.
    assert inner.seen < len(plain.events) / 3, inner.seen
    assert clock.steady.pattern is not None and clock.steady.pattern.k == 12

    nested = Stream(random.Random(2))
    nested.events.append((OPTIM,))
    for _ in range(300):
        lbfgs(nested)
    rows, _state, steady = in_bulk(nested.events, random.Random(0))
    assert steady.pattern is None and steady.misses > 0
    assert rows == by_event(nested.events)[0]


# -- streams recorded from real torch loops ------------------------------------------

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "workloads"))


def recorded(loop: Callable[[], None]) -> list[Any]:
    """The events perfrun's hooks record while `loop` runs, none replayed."""
    from types import SimpleNamespace

    from perfrun.runtime import hooks
    from perfrun.runtime.hooks import HookState
    from perfrun.runtime.modules import RootTracker

    tracker = StepTracker("auto")
    phase_clock = PhaseClock(tracker)
    clock = BufferedClock(phase_clock, limit=1 << 30, interval=float("inf"))
    faults: list[Any] = []
    agent = SimpleNamespace(
        hooks_state=HookState(), tracker=tracker, phase_clock=phase_clock, clock=clock,
        record_fault=lambda where, exc: faults.append((where, exc)), roots=RootTracker(),
        count_samples=True, note_dataloader=lambda loader, grad=True: None,
        note_once=lambda note: None,
    )
    undo = hooks.install(torch, agent)
    try:
        loop()
    finally:
        hooks.uninstall(undo)
    assert faults == []
    return list(clock.buf)


def real_loops() -> dict[str, Callable[[], None]]:
    import loader_mlp

    def plain() -> None:
        loader, model, loss_fn, optimizer = loader_mlp.build(300, shuffle=False)
        for _epoch in range(2):
            for xb, yb in loader:
                optimizer.zero_grad()
                loss_fn(model(xb), yb).backward()
                optimizer.step()
            with torch.no_grad():
                for xb, _yb in loader:
                    model(xb)
                    break

    def accumulation() -> None:
        loader, model, loss_fn, optimizer = loader_mlp.build(200, shuffle=False)
        for i, (xb, yb) in enumerate(loader):
            loss_fn(model(xb), yb).backward()
            if i % 4 == 3:
                optimizer.step()
                optimizer.zero_grad()

    def no_loader() -> None:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(16, 8)
        for _ in range(200):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()

    return {"plain": plain, "accumulation": accumulation, "no_loader": no_loader}


@pytest.mark.parametrize("name", ["plain", "accumulation", "no_loader"])
def test_streams_recorded_from_real_loops_replay_in_bulk_to_the_same_bytes(name: str) -> None:
    events = recorded(real_loops()[name])
    assert any(ev.__class__ is float for ev in events)  # the hooks' bare exits
    rows, state = by_event(events)
    assert len(rows) >= 40 * WIDTH * 8
    for seed in range(3):
        bulk_rows, bulk_state, steady = in_bulk(events, random.Random(seed))
        assert bulk_rows == rows
        assert bulk_state[:-2] == state[:-2]
        assert steady.pattern is not None
