"""The phase clock: a stack of open phases on the hot path.

Each phase edge is one clock read and a few list operations. A phase nested
in another (LBFGS runs forward and backward inside `optimizer.step`) is
subtracted from its parent, so no time is counted twice; a phase nested in a
phase of the same kind (`GradScaler.step` calling `optimizer.step`) is one
call. Analysis happens after the run, never here.
"""

from __future__ import annotations

from time import perf_counter
from typing import Callable, Optional

from .steps import StepTracker

# Called at each top-level phase edge: (kind, is_enter, is_eval).
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
        stack = self.stack
        if stack:
            top = stack[-1]
            if top[0] == kind:
                stack.append(top)
                return
            stack.append([kind, self.now(), 0.0, top[3]])
            return
        t = self.now()
        is_eval = self.tracker.begin(kind, t, grad, ident)
        if self.listener is not None:
            self.listener(kind, True, is_eval)
        stack.append([kind, t, 0.0, is_eval])

    def exit(self, failed: bool = False) -> None:
        """The innermost phase ends; `failed` when the call raised (its time
        still counts, but it completes nothing: see StepTracker.end)."""
        t = self.now()
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
        elif self.listener is not None:
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
        if not self.stack and self.listener is not None:
            self.listener(kind, False, is_eval)
        return (t0, is_eval)

    def depth(self) -> int:
        return len(self.stack)

    def unwind(self) -> None:
        """Close every open phase (an exception escaped a hooked call whose
        exit we never saw, or the run is ending inside a phase)."""
        while self.stack:
            self.exit()
