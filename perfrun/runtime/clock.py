"""The phase clock: a stack of open phases on the hot path.

A hook reports each edge as one event, a tuple of what it read (below, and a
bare float for a plain exit: see events.py), to
`record`: the PhaseClock's own `event` when something needs each edge the
moment it happens (NVTX ranges, CUDA events, the profiler window,
--stop-after), else the append of the BufferedClock's list, replayed through
the same `event` in batches. Either way an edge costs the hook one clock read,
one tuple and one call, and the hooks have a single code path.

A phase nested in another (LBFGS runs forward and backward inside
`optimizer.step`) is subtracted from its parent, so no time is counted twice;
a phase nested in a phase of the same kind (`GradScaler.step` calling
`optimizer.step`) is one call. Every edge but those folded calls reaches the
listener (NVTX, CUDA events, the window's ranges), nested or not, so the
trace and the timeline show the phases the rows count. Analysis happens
after the run, never here.
"""

from __future__ import annotations

import threading
from time import perf_counter
from typing import Callable, Optional

# The events (events.py, re-exported here): (ENTER, kind, grad, ident, t),
# t (a float: an exit that did not raise), (EXIT, failed, t),
# (FETCHED, samples, t), (STOP, t), (ITER, t0, t), (OPTIM,).
from .events import ENTER, EXIT, FETCHED, ITER, OPTIM, STOP
from .steady import SteadyReplay
from .steps import StepTracker

# Called at each phase edge, nested ones included: (kind, is_enter, is_eval).
EdgeListener = Callable[[int, bool, bool], None]

_NEVER = float("inf")

#: Seconds between replays of buffered edges (BufferedClock): at least
#: REPLAY_INTERVAL, at most REPLAY_INTERVAL_MAX, and in between as long as
#: the script takes to make about REPLAY_EVENTS edges.
REPLAY_INTERVAL = 0.02
REPLAY_INTERVAL_MAX = 1.0
REPLAY_EVENTS = 2048
#: How long past its due time a buffer waits for the script's next edge
#: before the flush thread replays it (BufferedClock.drain_stale).
STALE_AFTER = 0.1


class PhaseClock:
    __slots__ = ("tracker", "stack", "listener", "now", "last", "record")

    def __init__(self, tracker: StepTracker, now: Callable[[], float] = perf_counter) -> None:
        self.tracker = tracker
        # Entries: [kind, t0, child_time, is_eval]. A same-kind nested call
        # is folded into its parent by pushing the parent's entry again, so
        # a phase nested further in still has a real parent to subtract from.
        self.stack: list[list] = []
        self.listener: Optional[EdgeListener] = None
        self.now = now
        # Where the hooks send events: straight to the state machine. And
        # nothing to drain, ever (the hooks compare with the BufferedClock's).
        self.record: Callable[[tuple], None] = self.event
        self.last = _NEVER

    def event(self, ev: tuple | float) -> None:
        """One event (see the codes above; a bare float is an exit that did
        not raise). Enter and exit are written out here rather than called:
        they run at every edge."""
        bare = ev.__class__ is float
        code = EXIT if bare else ev[0]  # type: ignore[index]
        stack = self.stack
        if code == ENTER:
            _, kind, grad, ident, t = ev
            if stack:
                top = stack[-1]
                if top[0] == kind:
                    stack.append(top)
                    return
                is_eval = top[3]
                stack.append([kind, t, 0.0, is_eval])
                listener = self.listener
                if listener is not None:
                    listener(kind, True, is_eval)
                return
            tracker = self.tracker
            is_eval = tracker.begin(kind, t, grad, ident)
            if tracker.resume > t:
                # perfrun's own work ran at this edge (see StepTracker.own_work).
                t = tracker.resume
            # Read only now: the step this edge began may have attached a
            # listener (the CUDA timer and the allocator's peaks, at the step
            # begin where the script's CUDA is first seen), and this edge is
            # that step's first phase.
            listener = self.listener
            if listener is not None:
                listener(kind, True, is_eval)
            stack.append([kind, t, 0.0, is_eval])
        elif code == EXIT:
            if not stack:
                return
            entry = stack.pop()
            if stack and stack[-1] is entry:
                return  # a folded same-kind call
            kind, t0, child, is_eval = entry
            if bare:
                failed, t = False, ev
            else:
                _, failed, t = ev
            duration = t - t0
            if stack:
                stack[-1][2] += duration
            listener = self.listener
            if listener is not None:
                listener(kind, False, is_eval)
            if failed:
                self.tracker.end(kind, t, duration - child, is_eval, failed=True)
            else:
                self.tracker.end(kind, t, duration - child, is_eval)
        elif code == FETCHED:
            self.event((EXIT, False, ev[2]))
            if ev[1]:
                self.fetched(ev[1])
        elif code == STOP:
            self.fetch_stopped_at(ev[1])
        elif code == ITER:
            self.iterator_made(ev[1], ev[2])
        elif code == OPTIM:
            self.optimizer_built()

    def enter(self, kind: int, grad: Optional[bool] = True, ident: object = None) -> None:
        self.event((ENTER, kind, grad, ident, self.now()))

    def enter_at(self, kind: int, t: float, grad: Optional[bool] = True,
                 ident: object = None) -> None:
        self.event((ENTER, kind, grad, ident, t))

    def exit(self, failed: bool = False) -> None:
        """The innermost phase ends; `failed` when the call raised (its time
        still counts, but it completes nothing: see StepTracker.end)."""
        self.event((EXIT, failed, self.now()))

    def exit_at(self, t: float, failed: bool = False) -> None:
        self.event((EXIT, failed, t))

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


def replay_wait(span: float, made: int, interval: float = REPLAY_INTERVAL,
                longest: float = REPLAY_INTERVAL_MAX, events: int = REPLAY_EVENTS) -> float:
    """Seconds from one replay to the next for a script that made `made`
    edges in the `span` seconds before it: what `events` edges take at that
    pace, kept between `interval` and `longest` (BufferedClock's docstring
    says why)."""
    wait = events * span / made if made else longest
    return min(max(wait, interval), longest)


class BufferedClock:
    """The hot path when nothing needs edges live: an edge is one append of
    what the hook read.

    The events are replayed through the PhaseClock in batches: the same
    state machine, run with warm caches rather than once per edge between
    torch's kernels, where it costs several times more. Used only where
    nothing needs a step boundary the moment it happens (no NVTX tool, CUDA
    events, profiler window or --stop-after); results lag the script by at
    most `longest`.

    Through the state machine an event costs about 1 us, a dozen events a
    step; so while nothing listens to step boundaries (`bulk`) the steps
    that repeat the loop's learned pattern are committed in bulk instead
    (steady.py), and only the others go event by event. The replay runs in
    one burst every `interval`, so it moves the mean step time, not the
    median; the interval bounds the burst, the one step that pays it (a
    0.5 s interval once stalled a sub-millisecond step for 50 to 90 ms,
    measured over a 1,000,000-step run).

    A replay also has a cost of its own, whatever it holds: about 0.1 ms
    of its own, cold in the caches torch's kernels just used, and about as
    much again in the kernels that run next (measured on a 4.7 ms MLP step:
    a step with a replay 0.2 ms longer than one without). Every 20 ms that
    was 1.3% of that step and 0.35% of a 32 ms transformer's. So the wait
    after a replay is what the script takes to make about `events` edges,
    from its pace since the last one, kept between `interval` (steps of
    tens of microseconds: the burst stays about 1 ms, as before) and
    `longest` (steps of tens of milliseconds: one replay a second rather
    than one a step). The flush thread saves every 2 s, so a save still
    finds at most a second of steps not yet replayed.
    """

    __slots__ = ("clock", "tracker", "now", "buf", "record", "limit", "interval", "last",
                 "on_fault", "live", "lock", "bulk", "steady", "longest", "events",
                 "replayed")

    def __init__(self, clock: PhaseClock, limit: int = 4096, interval: float = REPLAY_INTERVAL,
                 on_fault: Optional[Callable[[str, BaseException], None]] = None,
                 longest: float = REPLAY_INTERVAL_MAX, events: int = REPLAY_EVENTS) -> None:
        self.clock = clock
        self.tracker = clock.tracker
        self.now = clock.now
        # One list for the whole run, drained in place, so that the hooks
        # bind its `append` once: that is their `record`.
        self.buf: list[tuple | float] = []
        self.record = self.buf.append
        self.limit = limit
        self.interval = interval
        self.longest = max(longest, interval)
        self.events = events
        # When the next drain is due: the hooks compare each enter edge's
        # time with it (one comparison), and drain when it is past.
        self.replayed = self.now()
        self.last = self.replayed + interval
        self.on_fault = on_fault
        self.live = False
        # Replays run on the script's thread, and on the flush thread when
        # the script has stopped making edges (see drain_stale): one at a
        # time. Taken once per replay, never per edge; reentrant, since a
        # step callback may make the clock live in the middle of a replay.
        self.lock = threading.RLock()
        # Steps that repeat the loop's pattern are replayed in bulk
        # (steady.py), calling no step callback: only while none would do
        # anything (the agent says when).
        self.bulk = self.tracker.on_begin is None and self.tracker.on_end is None
        self.steady = SteadyReplay(clock, on_fault)

    def set_live(self, live: bool) -> None:
        """Live: every event goes straight to the state machine from now on
        (the hooks read `record` at each edge), for a run that needs step
        boundaries and phase edges as they happen (NVTX ranges, CUDA events,
        the profiler window, --stop-after); what was buffered is replayed
        first. Not live: buffered again. Safe to call from a step callback
        during a replay: the replay goes on with the events it took, and no
        hook runs before it ends."""
        if live == self.live:
            return
        self.live = live
        if live:
            self.drain()
            self.steady.lead = None  # edges now bypass the replay
            self.record = self.clock.event
            self.last = _NEVER
        else:
            self.record = self.buf.append
            self.replayed = self.now()
            self.last = self.replayed + self.interval

    @property
    def stack(self) -> list[list]:
        self.drain()
        return self.clock.stack

    def event(self, ev: tuple | float) -> None:
        """One event, as the hooks record it (with the checks they make)."""
        self.record(ev)
        if ev.__class__ is float:
            return
        if ev[0] == ENTER and (ev[-1] > self.last or len(self.buf) >= self.limit):  # type: ignore[index]
            self.drain()

    def enter(self, kind: int, grad: Optional[bool] = True, ident: object = None) -> None:
        self.event((ENTER, kind, grad, ident, self.now()))

    def enter_at(self, kind: int, t: float, grad: Optional[bool] = True,
                 ident: object = None) -> None:
        self.event((ENTER, kind, grad, ident, t))

    def exit(self, failed: bool = False) -> None:
        self.record((EXIT, failed, self.now()))

    def exit_at(self, t: float, failed: bool = False) -> None:
        self.record((EXIT, failed, t))

    def fetch_stopped(self) -> None:
        self.record((STOP, self.now()))

    def fetched(self, samples: int) -> None:
        """Samples of the fetch that just ended (the hooks send both in one
        FETCHED event instead)."""
        if samples:
            self.drain()
            self.steady.lead = None
            self.clock.fetched(samples)

    def iterator_made(self, t0: float, t1: float) -> None:
        self.record((ITER, t0, t1))

    def optimizer_built(self) -> None:
        self.record((OPTIM,))

    def drain(self) -> None:
        with self.lock:
            self._replay()

    def drain_stale(self) -> None:
        """From the flush thread: replay what the script buffered if it has
        made no edge since the replay fell due. The script may sit in one
        long phase, sleep, or be about to be killed; its finished steps must
        still reach the results within the flush interval, not wait for its
        next edge. Not live: while live there is nothing buffered, and the
        state machine belongs to the script's thread alone."""
        if self.live or not self.buf or self.now() <= self.last + STALE_AFTER:
            return
        with self.lock:
            if not self.live:
                self._replay()

    def next_due(self, replayed: int) -> float:
        """When the replay after this one (of `replayed` events) is due: in
        the time the script took to make about `events` edges at its pace
        since the last replay, kept between `interval` and `longest`."""
        now = self.now()
        span = now - self.replayed
        self.replayed = now
        return now + replay_wait(span, replayed, self.interval, self.longest, self.events)

    def _replay(self) -> None:
        buf = self.buf
        events = buf[:]
        del buf[: len(events)]
        if not self.live:
            self.last = self.next_due(len(events))
        if self.bulk:
            self.steady.replay(events)
            return
        event = self.clock.event
        for ev in events:
            try:
                event(ev)
            except Exception as exc:
                if self.on_fault is not None:
                    self.on_fault("replay", exc)

    def depth(self) -> int:
        self.drain()
        return self.clock.depth()

    def unwind(self) -> None:
        with self.lock:
            self._replay()
            self.clock.unwind()
