"""Where a rank is now: its step, its phase, and since when.

Read by the flush thread (every flush interval) for the rank file's
`position`, which `perfrun status`, `perfrun watch` and the launcher's hang
detector read. It must cost the training thread nothing, so it never runs
the state machine: it reads the phase clock's stack and the tracker's open
step, which the training thread keeps up to date, as they are at that moment
(copies of lists, safe under the GIL).

In timer-only mode the hooks append edges to the BufferedClock's list and
the state machine sees them up to half a second later; a rank stuck in a
phase stops draining, so the stack alone would show where it was before.
The edges still in the buffer are therefore walked here too, read-only:
enters push, exits pop, and a top-level enter of the step's leading kind
starts a new step. That mirrors the state machine's common case only
(evaluation spans and relabelled phases are not replayed), so the step
index can be off by the steps of an evaluation pass still in the buffer;
what the rank is doing (the top of the stack) is exact.

No torch: unit-tested on hand-written events (tests/test_position.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from .events import ENTER, EXIT, FETCHED, STOP
from .steps import KIND_NAMES

# The report's phase for each kind (steps._COLUMN): zero_grad is counted in
# Optimization; a closure is inside the optimizer step that called it.
_PHASE_OF = {0: "dataloader", 1: "forward", 2: "backward", 3: "optimization",
             4: "optimization", 5: None}


def phase_name(kinds: Sequence[int]) -> Optional[str]:
    """The report's phase of the innermost phase that has one (kinds from
    the bottom of the stack to its top); None for an empty stack."""
    for kind in reversed(kinds):
        name = _PHASE_OF.get(kind)
        if name is not None:
            return name
    return None


def locate(
    stack: Sequence[Sequence[Any]],
    pending: Sequence[Any],
    step: int,
    step_open: bool,
    step_start: Optional[float],
    lead_kind: int,
) -> dict[str, Any]:
    """The position as perf_counter readings: `step` (index), `kinds` (the
    open phases' kinds, outermost first), `since` (when the innermost one
    began, or the last phase ended when none is open) and `step_since`."""
    kinds = [int(e[0]) for e in stack]
    times = [float(e[1]) for e in stack]
    since: Optional[float] = times[-1] if times else step_start
    for ev in pending:
        if ev.__class__ is float:  # a bare exit (events.py)
            if kinds:
                kinds.pop()
                times.pop()
            since = ev
            continue
        code = ev[0]
        if code == ENTER:
            kind, t = int(ev[1]), float(ev[-1])
            if not kinds and (kind == lead_kind or lead_kind < 0):
                if step_open:
                    step += 1
                step_open = True
                step_start = t
                if lead_kind < 0:
                    lead_kind = kind
            kinds.append(kind)
            times.append(t)
            since = t
        elif code in (EXIT, FETCHED, STOP):
            if kinds:
                kinds.pop()
                times.pop()
            since = float(ev[-1])
    return {
        "step": step,
        "open": step_open,
        "kinds": kinds,
        "since": since,
        "step_since": step_start if step_open else None,
    }


def describe(kinds: Sequence[int], step_open: bool) -> str:
    """The phase as shown: a report phase, `others` (inside a step, between
    phases: the loop's own code), or `outside steps`."""
    name = phase_name(kinds)
    if name is not None:
        return name
    if kinds:
        return KIND_NAMES[kinds[-1]]
    return "others" if step_open else "outside steps"

