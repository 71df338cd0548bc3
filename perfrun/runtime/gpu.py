"""GPU time per phase from CUDA events, and NVTX ranges per step and phase.

CUDA events are recorded on the current stream at each top-level phase edge
and at step boundaries; they are read later, from the flush thread, once
`query()` says they completed, so the step itself never synchronises.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

# By phase kind (runtime/steps.py); a closure's range is "Closure".
PHASE_NAMES = ("Dataloader", "Forward", "Backward", "Optimization", "Optimization", "Closure")
_KIND_OF_NAME = {"Dataloader": 0, "Forward": 1}


class CudaPhaseTimer:
    """GPU time per phase, exclusive of the phases nested in it (forward
    and backward inside an optimizer step's closure), as the CPU side counts
    it."""

    def __init__(self, torch: Any) -> None:
        self._event_cls = torch.cuda.Event
        self._pool: list[Any] = []
        # Open phases: [kind, is_eval, start event, [(start, end) of children]].
        self._stack: list[list[Any]] = []
        # Ended phases of the open step: [kind, is_eval, start, end, children].
        self._phases: list[list[Any]] = []
        self._top: list[int] = []  # indices into _phases of top-level ones
        self._step_start: Optional[Any] = None
        # (row index, start event, end event, phases)
        self._pending: deque = deque()

    def _record(self) -> Any:
        ev = self._pool.pop() if self._pool else self._event_cls(enable_timing=True)
        ev.record()
        return ev

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        if enter:
            self._stack.append([kind, is_eval, self._record(), []])
        elif self._stack:
            kind, is_eval, start, children = self._stack.pop()
            end = self._record()
            if self._stack:
                self._stack[-1][3].append((start, end))
            else:
                self._top.append(len(self._phases))
            self._phases.append([kind, is_eval, start, end, children])

    def relabel(self, names: list[str]) -> None:
        """The step tracker renamed the last top-level phases (see
        StepTracker.on_relabel): count their GPU time where it now says."""
        if not names:
            return
        for index, name in zip(self._top[-len(names):], names[-len(self._top):]):
            phase = self._phases[index]
            phase[1] = name == "Eval"
            if name in _KIND_OF_NAME:
                phase[0] = _KIND_OF_NAME[name]

    def step_begin(self, index: int, t: float) -> None:
        self._step_start = self._record()
        self._phases = []
        self._top = []

    def step_end(self, index: int, t: float, committed: bool) -> None:
        start, phases = self._step_start, self._phases
        self._step_start, self._phases, self._top = None, [], []
        if not committed or start is None:
            return
        self._pending.append((index, start, self._record(), phases))

    def resolve(self, rows: list[list], col_base: int) -> int:
        """Fill the GPU columns of every step whose events have completed.
        Returns the index of the first unresolved row (all rows before it are
        final)."""
        pending = self._pending
        pool = self._pool
        while pending:
            index, start, end, phases = pending[0]
            if not end.query():
                return index
            pending.popleft()
            row = rows[index]
            sums = [0.0, 0.0, 0.0, 0.0]
            for kind, is_eval, a, b, children in phases:
                if not is_eval and kind < len(PHASE_NAMES) - 1:
                    own = a.elapsed_time(b) - sum(c.elapsed_time(d) for c, d in children)
                    sums[min(kind, 3)] += own / 1000.0
                pool.append(a)
                pool.append(b)
            for i in range(4):
                row[col_base + i] = sums[i]
            row[col_base + 4] = start.elapsed_time(end) / 1000.0
            pool.append(start)
            pool.append(end)
        return len(rows)


class NvtxRanges:
    """`ProfileStep#N` process ranges and a pushed range per phase, in the
    `perfrun` domain."""

    def __init__(self, nvtx: Any) -> None:
        self.domain = nvtx.get_domain("perfrun")
        attrs = self.domain.get_event_attributes
        self._phase = [attrs(message=name) for name in PHASE_NAMES]
        self._eval = attrs(message="Eval")
        self._attrs = attrs
        self._step: Any = None

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        if enter:
            self.domain.push_range(self._eval if is_eval else self._phase[kind])
        else:
            self.domain.pop_range()

    def step_begin(self, index: int, t: float) -> None:
        self._step = self.domain.start_range(self._attrs(message=f"ProfileStep#{index}"))

    def step_end(self, index: int, t: float, committed: bool) -> None:
        if self._step is not None:
            self.domain.end_range(self._step)
            self._step = None
