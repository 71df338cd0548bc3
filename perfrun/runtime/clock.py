"""The phase clock: a stack of open phases on the hot path.

Each phase edge is one clock read and a few list operations. A phase nested
in another (LBFGS runs forward and backward inside `optimizer.step`) is
subtracted from its parent, so no time is counted twice; a phase nested in a
phase of the same kind (`GradScaler.step` calling `optimizer.step`) is one
call. Every edge but those folded calls reaches the listener (NVTX, CUDA
events, the window's ranges), nested or not, so the trace and the timeline
show the phases the rows count. Analysis happens after the run, never here.
"""

from __future__ import annotations

from time import perf_counter
from typing import Callable, Optional

from .steps import StepTracker

# Called at each phase edge, nested ones included: (kind, is_enter, is_eval).
EdgeListener = Callable[[int, bool, bool], None]


class PhaseClock:
    __slots__ = ("tracker", "stack", "listener", "now")

    def __init__(self, tracker: StepTracker, now: Callable[[], float] = perf_counter) -> None:
        self.tracker = tracker
        # Entries: [kind, t0, child_time, is_eval]. A same-kind nested call
        # is folded into its parent by pushing the parent's entry again, so
        # a phase nested further in still has a real parent to subtract from.
        self.stack: list[list] = []
        self.listener: Optional[EdgeListener] = None
        self.now = now

    def enter(self, kind: int, grad: bool = True, ident: object = None) -> None:
        self.enter_at(kind, self.now(), grad, ident)

    def enter_at(self, kind: int, t: float, grad: bool = True, ident: object = None) -> None:
        stack = self.stack
        if stack:
            top = stack[-1]
            if top[0] == kind:
                stack.append(top)
                return
            stack.append([kind, t, 0.0, top[3]])
            if self.listener is not None:
                self.listener(kind, True, top[3])
            return
        tracker = self.tracker
        is_eval = tracker.begin(kind, t, grad, ident)
        if tracker.resume > t:
            # perfrun's own work ran at this edge (see StepTracker.own_work).
            t = tracker.resume
        if self.listener is not None:
            self.listener(kind, True, is_eval)
        stack.append([kind, t, 0.0, is_eval])

    def exit(self, failed: bool = False) -> None:
        """The innermost phase ends; `failed` when the call raised (its time
        still counts, but it completes nothing: see StepTracker.end)."""
        self.exit_at(self.now(), failed)

    def exit_at(self, t: float, failed: bool = False) -> None:
        stack = self.stack
        if not stack:
            return
        entry = stack.pop()
        if stack and stack[-1] is entry:
            return  # a folded same-kind call
        kind, t0, child, is_eval = entry
        duration = t - t0
        if stack:
            stack[-1][2] += duration
        if self.listener is not None:
            self.listener(kind, False, is_eval)
        if failed:
            self.tracker.end(kind, t, duration - child, is_eval, failed=True)
        else:
            self.tracker.end(kind, t, duration - child, is_eval)

    def abort(self) -> tuple[float, bool]:
        """Drop the innermost phase without counting it (a fetch that raised
        StopIteration was no batch). Returns its start time and eval flag."""
        entry = self.stack.pop()
        if self.stack and self.stack[-1] is entry:
            return (self.now(), False)
        kind, t0, _child, is_eval = entry
        if self.listener is not None:
            self.listener(kind, False, is_eval)
        return (t0, is_eval)

    # -- DataLoader and optimizer events, as the hooks report them ------------

    def fetch_stopped(self) -> None:
        """The innermost phase, a fetch, raised StopIteration: no batch."""
        self.fetch_stopped_at(self.now())

    def fetch_stopped_at(self, t1: float) -> None:
        if not self.stack:
            return
        top = len(self.stack) == 1
        t0, is_eval = self.abort()
        if top:
            self.tracker.stop_iteration(t0, t1, is_eval)

    def fetched(self, samples: int) -> None:
        """A top-level fetch that just ended returned `samples` samples."""
        if samples and not self.stack and self.tracker.open:
            self.tracker.add_samples(samples)

    def iterator_made(self, t0: float, t1: float) -> None:
        """`iter(DataLoader)` ran from t0 to t1 (worker start-up)."""
        if not self.stack:
            self.tracker.excluded(t0, t1)

    def optimizer_built(self) -> None:
        self.tracker.optimizer_seen = True

    def drain(self) -> None:
        """Nothing is buffered here (see BufferedClock)."""

    def depth(self) -> int:
        return len(self.stack)

    def unwind(self) -> None:
        """Close every open phase (an exception escaped a hooked call whose
        exit we never saw, or the run is ending inside a phase)."""
        while self.stack:
            self.exit()


# Event codes of the buffer.
_ENTER, _EXIT, _STOP, _SAMPLES, _ITER, _OPTIM = range(6)


class BufferedClock:
    """The timer-only hot path: an edge is one clock read and one append.

    The events are replayed through the PhaseClock in batches, every
    `limit` events or `interval` seconds: the same state machine, run with
    warm caches rather than once per edge between torch's kernels, where it
    costs several times more. Used only where nothing needs a step boundary
    the moment it happens (no NVTX ranges, CUDA events, profiler window or
    --stop-after); results lag the script by at most `interval`.
    """

    __slots__ = ("clock", "tracker", "now", "buf", "limit", "interval", "last", "on_fault")

    def __init__(self, clock: PhaseClock, limit: int = 4096, interval: float = 0.5,
                 on_fault: Optional[Callable[[str, BaseException], None]] = None) -> None:
        self.clock = clock
        self.tracker = clock.tracker
        self.now = clock.now
        self.buf: list[tuple] = []
        self.limit = limit
        self.interval = interval
        self.last = self.now() + interval
        self.on_fault = on_fault

    @property
    def stack(self) -> list[list]:
        self.drain()
        return self.clock.stack

    def enter(self, kind: int, grad: bool = True, ident: object = None) -> None:
        t = self.now()
        buf = self.buf
        buf.append((_ENTER, kind, t, grad, ident))
        if t > self.last or len(buf) >= self.limit:
            self.drain()

    def exit(self, failed: bool = False) -> None:
        self.buf.append((_EXIT, self.now(), failed))

    def fetch_stopped(self) -> None:
        self.buf.append((_STOP, self.now()))

    def fetched(self, samples: int) -> None:
        if samples:
            self.buf.append((_SAMPLES, samples))

    def iterator_made(self, t0: float, t1: float) -> None:
        self.buf.append((_ITER, t0, t1))

    def optimizer_built(self) -> None:
        self.buf.append((_OPTIM,))

    def drain(self) -> None:
        buf, self.buf = self.buf, []
        # `last` holds the time of the next drain: one comparison per edge.
        self.last = self.now() + self.interval
        clock = self.clock
        for ev in buf:
            try:
                code = ev[0]
                if code == _ENTER:
                    clock.enter_at(ev[1], ev[2], ev[3], ev[4])
                elif code == _EXIT:
                    clock.exit_at(ev[1], ev[2])
                elif code == _STOP:
                    clock.fetch_stopped_at(ev[1])
                elif code == _SAMPLES:
                    clock.fetched(ev[1])
                elif code == _ITER:
                    clock.iterator_made(ev[1], ev[2])
                else:
                    clock.optimizer_built()
            except Exception as exc:
                if self.on_fault is not None:
                    self.on_fault("replay", exc)

    def unwind(self) -> None:
        self.drain()
        self.clock.unwind()
