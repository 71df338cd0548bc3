"""Replaying a steady loop in bulk.

A training loop repeats itself: step after step the hooks record the same
events (the same phases of the same objects, in the same order, events.py)
and the state machine (steps.py) passes through the same states; only the
times differ. Replaying each event through the state machine costs about
a microsecond, a dozen events a step: most of what perfrun adds to a step
in the buffered modes (scripts/bench_hotpath.py).

So the replay learns the loop. A step qualifies when it ran through the
state machine from one leading event to the next with every phase at the
top level (each enter followed by its own exit: no nesting, no call that
raised, no evaluation) and the machine's shape (StepTracker.shape, and one
phase open) after the second leading event equals its shape after the
first. Its events' signatures are then the loop's *pattern*, and the row it
committed is a known function of their times: each phase column the sum,
in event order, of its phases' exit minus enter times; the rest constant.
The formula is checked on that very step: the row it gives must be the
bytes the state machine wrote, or nothing is learned.

The following steps whose events repeat the pattern exactly are committed
in bulk, list slicing and `map` doing the arithmetic in C: the same
floating-point operations in the same order as the state machine's, so
the rows are the same bytes (tests/test_steady.py replays recorded and
generated event streams both ways). Anything else (another event, an
evaluation pass, the end of an epoch, a batch that ends mid-step) goes
through the state machine event by event, as before.

Used only while nothing listens to step boundaries or phase edges
(BufferedClock.bulk): a step committed in bulk calls no callback.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from operator import add, eq, is_, sub
from typing import Any, Callable, Optional

from .events import ENTER, EXIT, FETCHED, signature, signature_of, time_of, time_of_any
from .steps import _COLUMN, DATA, FWD, MISSING, WIDTH

#: After a step that does not qualify, how many steps pass before the
#: next one is examined; doubled at each miss up to MAX_SKIP, so a loop
#: that never qualifies (nested phases: LBFGS, Lightning's closures) pays
#: almost nothing for the attempt.
MAX_SKIP = 256


class Pattern:
    """One step of a steady loop, from the signatures of its events after
    its leading event up to and including the next step's (`lead`; None
    for a bare exit, events.py): what each position must hold, and the
    row's formula."""

    __slots__ = ("lead", "shape", "k", "checks", "terms", "consts", "template")

    def __init__(self, lead: tuple, shape: tuple, events: list, row: Any) -> None:
        self.lead = lead
        self.shape = shape
        self.k = k = len(events)
        # Each position of a step and what must be there: a bare exit (None)
        # or a tuple event with this signature.
        self.checks = list(enumerate(events))
        # Phase columns: (enter, exit) positions in a step's times, where
        # times[0] is the leading event's and times[j] that of events[j-1].
        terms: list[list[tuple[int, int]]] = [[], [], [], []]
        terms[_COLUMN[lead[1]]].append((0, 1))
        for j in range(1, k - 1, 2):
            terms[_COLUMN[events[j][1]]].append((j + 1, j + 2))
        self.terms = terms
        # Excluded time, calls per column, samples: the row's constants.
        self.consts = tuple(row[6:12])
        # A row with the constants in place, the times and phase columns
        # 0.0 until filled, the columns the state machine leaves MISSING so.
        self.template = array("d", [0.0] * 6 + list(self.consts) + [MISSING] * (WIDTH - 12))

    def count(self, events: list, i: int) -> int:
        """How many whole steps at `events[i:]` repeat the pattern."""
        k = self.k
        m = (len(events) - i) // k
        if m == 0 or self.repeats(events, i, m):
            return m
        s = 0
        while s < m and self.repeats(events, i, 1):
            s += 1
            i += k
        return s

    def repeats(self, events: list, i: int, m: int) -> bool:
        """Whether the `m` steps at `events[i:]` all repeat the pattern:
        checked position by position, each over the m steps at once (a
        strided slice), so that the loops run in C and a bare exit is
        checked without a signature made."""
        k = self.k
        end = i + m * k
        try:
            for j, sig in self.checks:
                seg = events[i + j:end:k]
                if sig is None:
                    if not all(map(is_, map(type, seg), repeat(float))):
                        return False
                elif not all(map(eq, map(signature, seg), repeat(sig))):
                    return False
        except TypeError:
            return False  # a bare exit where the pattern has a tuple
        return True

    def rows(self, times: list, m: int, origin: float) -> array:
        """The rows of `m` steps, packed: `times` holds the leading event's
        time and then those of the m steps' events. Each column is computed
        whole and set into the rows with one strided assignment: no tuple
        or float per value beyond the arithmetic's own."""
        k = self.k
        mk = m * k
        out = self.template * m
        out[0::WIDTH] = array("d", map(sub, times[0:mk:k], repeat(origin, m)))
        out[1::WIDTH] = array("d", map(sub, times[k:mk + 1:k], repeat(origin, m)))
        for column, terms in enumerate(self.terms, start=2):
            if not terms:
                continue  # 0.0, as in the template
            a, b = terms[0]
            acc = list(map(sub, times[b:mk:k], times[a:mk:k]))
            for a, b in terms[1:]:
                acc = list(map(add, acc, map(sub, times[b:mk:k], times[a:mk:k])))
            out[column::WIDTH] = array("d", acc)
        return out


class SteadyReplay:
    """Replays batches of events through `clock` (a PhaseClock), steps that
    repeat the learned pattern in bulk."""

    __slots__ = ("clock", "tracker", "on_fault", "pattern", "lead", "lead_t", "shape",
                 "skip", "misses")

    def __init__(self, clock: Any,
                 on_fault: Optional[Callable[[str, BaseException], None]] = None) -> None:
        self.clock = clock
        self.tracker = clock.tracker
        self.on_fault = on_fault
        self.pattern: Optional[Pattern] = None
        # The signature of the leading event the machine is just past, its
        # time and the machine's shape then; None when mid-step.
        self.lead: Optional[tuple] = None
        self.lead_t = 0.0
        self.shape: Optional[tuple] = None
        self.skip = 0
        self.misses = 0

    def replay(self, events: list) -> None:
        n = len(events)
        i = 0
        while i < n:
            pattern = self.pattern
            if pattern is not None and self.lead == pattern.lead:
                m = pattern.count(events, i)
                if m and self._shape() == pattern.shape:
                    try:
                        self._apply(pattern, events, i, m)
                        i += m * pattern.k
                        continue
                    except Exception as exc:
                        self.pattern = None
                        self._fault(exc)
            i = self._step(events, i)

    # -- internals ------------------------------------------------------------

    def _fault(self, exc: BaseException) -> None:
        if self.on_fault is not None:
            self.on_fault("replay", exc)

    def _shape(self) -> Optional[tuple]:
        """The machine's shape just after a leading event, or None when the
        phase it opened is not the one open phase, started at the step's
        start (perfrun's own work moved it: see StepTracker.own_work)."""
        clock, tracker = self.clock, self.tracker
        stack = clock.stack
        if len(stack) != 1 or clock.listener is not None:
            return None
        kind, t0, child, is_eval = stack[0]
        if t0 != tracker.start or child != 0.0 or is_eval:
            return None
        return (kind, tracker.shape())

    def _step(self, events: list, i: int) -> int:
        """Replay events one by one from `i` through the first that opens a
        step; returns the index after it (or the batch's end)."""
        tracker = self.tracker
        event = self.clock.event
        n = len(events)
        start = i
        opened = tracker.opened
        while i < n:
            try:
                event(events[i])
            except Exception as exc:
                self._fault(exc)
            i += 1
            if tracker.opened != opened:
                break
        else:
            self.lead = None
            return i
        lead, lead_t, shape = self.lead, self.lead_t, self.shape
        try:
            self.lead = signature_of(events[i - 1])
            self.lead_t = tracker.start
            self.shape = self._shape()
            if lead is not None and shape is not None and self.shape == shape and lead == self.lead:
                if self.skip:
                    self.skip -= 1
                else:
                    self._learn(lead, lead_t, shape, events, start, i)
        except Exception as exc:
            self.lead = self.pattern = None
            self._fault(exc)
        return i

    def _learn(self, lead: tuple, lead_t: float, shape: tuple, events: list,
               start: int, end: int) -> None:
        """The step from `lead` (at `lead_t`) through `events[start:end]`
        (ending with the next step's lead) has just been committed: learn it
        as the pattern if it qualifies (see the module's docstring)."""
        pattern = self._qualify(lead, lead_t, shape, events, start, end)
        if pattern is None:
            self.misses += 1
            self.skip = min(MAX_SKIP, 1 << min(self.misses, 8))
        else:
            self.pattern = pattern
            self.misses = 0

    def _qualify(self, lead: tuple, lead_t: float, shape: tuple, events: list,
                 start: int, end: int) -> Optional[Pattern]:
        tracker = self.tracker
        k = end - start
        steps = list(map(signature_of, events[start:end]))
        if k < 2 or k % 2 or not self._top_level(lead, steps):
            return None
        if -1 in (_COLUMN[lead[1]], *(_COLUMN[s[1]] for s in steps[1:-1:2])):
            return None  # a closure's own time is Others: no column
        if lead[1] != DATA and any(s[1] == DATA for s in steps[1:-1:2]):
            return None  # a fetch inside a step led by another event: rare
        buf = tracker.buf
        if len(buf) < WIDTH:
            return None  # the writer took the row already
        row = buf[-WIDTH:]
        pattern = Pattern(lead, shape, steps, row)
        times = [lead_t, *map(time_of_any, events[start:end])]
        if pattern.rows(times, 1, tracker.origin).tobytes() != row.tobytes():
            return None
        return pattern

    def _top_level(self, lead: tuple, sigs: list) -> bool:
        """Every phase of the step at the top level, none raised, none
        evaluation: an exit, then (enter, exit) pairs, then the lead."""
        tracker = self.tracker
        training = tracker.optimizer_seen or tracker.training_seen
        if lead[0] != ENTER or (training and not lead[2] and lead[1] in (FWD, DATA)):
            return False
        for j, sig in enumerate(sigs):
            if j % 2 == 0:
                if sig is None:
                    continue  # a bare exit
                code = sig[0]
                if not (code == FETCHED or (code == EXIT and not sig[1])):
                    return False
            elif sig is None or sig[0] != ENTER or (
                    training and not sig[2] and sig[1] in (FWD, DATA)):
                return False
        return True

    def _apply(self, pattern: Pattern, events: list, i: int, m: int) -> None:
        """Commit the `m` steps at `events[i:]` in bulk and leave the machine
        just past the last one's following lead, as replaying them would."""
        tracker = self.tracker
        k = pattern.k
        mk = m * k
        # times[0] the leading event's, then the m steps' events' in order:
        # set position by position, a bare exit being its own time.
        times = [tracker.start] * (mk + 1)
        for j, sig in pattern.checks:
            seg = events[i + j:i + mk:k]
            times[1 + j::k] = seg if sig is None else list(map(time_of, seg))
        tracker.buf.extend(pattern.rows(times, m, tracker.origin))
        tracker.committed += m
        tracker.nograd_steps = 0  # steps without an evaluation span (steps.py)
        t = times[-1]
        kind = pattern.lead[1]
        tracker.start = t
        if kind == DATA:
            tracker.fetch_start = t
            tracker.fetch_ident = tracker.prev_data = pattern.lead[3]
        else:
            tracker.prev_data = None
        tracker.opened += m
        self.clock.stack[0] = [kind, t, 0.0, False]
        self.lead_t = t
