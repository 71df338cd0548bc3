"""GPU time per phase from CUDA events, and NVTX ranges per step and phase.

CUDA events are recorded on the current stream at each top-level phase edge
and at step boundaries; they are read later, from the flush thread, once
`query()` says they completed, so the step itself never synchronises.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Optional

PHASE_NAMES = ("Dataloader", "Forward", "Backward", "Optimization", "Optimization")


class CudaPhaseTimer:
    def __init__(self, torch: Any) -> None:
        self._event_cls = torch.cuda.Event
        self._pool: list[Any] = []
        self._open: Optional[Any] = None
        self._phases: list[tuple[int, Any, Any]] = []
        self._step_start: Optional[Any] = None
        # (row index, start event, end event, [(kind, start, end), ...])
        self._pending: deque = deque()

    def _record(self) -> Any:
        ev = self._pool.pop() if self._pool else self._event_cls(enable_timing=True)
        ev.record()
        return ev

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        if is_eval:
            return
        if enter:
            self._open = self._record()
        elif self._open is not None:
            self._phases.append((kind, self._open, self._record()))
            self._open = None

    def step_begin(self, index: int, t: float) -> None:
        self._step_start = self._record()
        self._phases = []

    def step_end(self, index: int, t: float, committed: bool) -> None:
        start, phases = self._step_start, self._phases
        self._step_start, self._phases = None, []
        if not committed or start is None:
            return
        self._pending.append((index, start, self._record(), phases))

    def resolve(self, rows: list[list], col_base: int) -> int:
        """Fill the GPU columns of every step whose events have completed.
        Returns the index of the first unresolved row (all rows before it are
        final)."""
        pending = self._pending
        while pending:
            index, start, end, phases = pending[0]
            if not end.query():
                return index
            pending.popleft()
            row = rows[index]
            sums = [0.0, 0.0, 0.0, 0.0]
            for kind, a, b in phases:
                sums[min(kind, 3)] += a.elapsed_time(b) / 1000.0
                self._pool.append(a)
                self._pool.append(b)
            for i in range(4):
                row[col_base + i] = sums[i]
            row[col_base + 4] = start.elapsed_time(end) / 1000.0
            self._pool.append(start)
            self._pool.append(end)
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
