"""GPU time per phase from CUDA events, and NVTX ranges per step and phase.

CUDA events are recorded at each phase edge and at step boundaries; they are
read later, from the flush thread, once `query()` says they completed, so the
step itself never synchronises.

Three things keep the timer out of the script's way:

* The device: events are recorded on the current stream *of the device the
  script works on* (see `work_device`), never on "the current device", which
  in a DDP script that moves its model with `.to(f"cuda:{local_rank}")` and
  never calls `set_device` is GPU 0 for every rank: timing GPU 0's idle
  stream, and creating a context there, on every rank. Events are pooled
  per device, since an event belongs to the device it was first recorded on.
* CUDA graphs: an event recorded while the current stream is capturing
  becomes a node of the user's graph, and, under the default "global"
  capture mode, an event query from any other thread invalidates the
  capture. So no event is recorded while a capture is underway (the step's
  GPU values stay unknown), and the flush thread queries nothing while one
  is (see `CudaPhaseTimer.resolve` and `guard_captures`).
* Faults: a listener that raised would skip the phase clock's own
  bookkeeping. Every entry point catches its own faults, reports them through
  `on_fault` and switches the timer off.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Optional

from .steps import WIDTH

# By phase kind (runtime/steps.py); a closure's range is "Closure".
PHASE_NAMES = ("Dataloader", "Forward", "Backward", "Optimization", "Optimization", "Closure")
_KIND_OF_NAME = {"Dataloader": 0, "Forward": 1}

FaultCallback = Callable[[str, BaseException], None]


def work_device(torch: Any, roots: Any = None, local_rank: int = 0) -> int:
    """The CUDA device the script works on, the one perfrun times.

    The rule, first match wins:
    1. the device of the first CUDA parameter of the script's root modules
       (the outermost modules it calls, RootTracker): that is where its
       forward and backward run, whatever the current device says;
    2. LOCAL_RANK, when the script never chose a device (the current one is
       still 0) and that many devices are visible: a DDP script that moves
       tensors with `.to(f"cuda:{local_rank}")` before any model is called;
    3. the current device.
    Only ever called once the script has initialised CUDA.
    """
    if roots is not None:
        for module in roots.alive():
            params = getattr(module, "parameters", None)
            if params is None:
                continue
            try:
                first = next(iter(params()), None)
            except Exception:
                continue
            if first is not None and getattr(first, "is_cuda", False):
                return int(first.get_device())
    current = int(torch.cuda.current_device())
    if current == 0 and 0 < local_rank < int(torch.cuda.device_count()):
        return local_rank
    return current


def guard_captures(torch: Any, timer: CudaPhaseTimer) -> Callable[[], None]:
    """Count the CUDA graph captures underway in every thread into
    `timer.captures`, serialised with the flush thread's queries by
    `timer.lock`: a capture cannot begin while a query runs, and no query
    runs until it ended. `torch.cuda.graph`, `make_graphed_callables` and
    torch.compile's CUDA graphs all begin and end their captures through
    `torch.cuda.CUDAGraph`. Returns the undo."""
    cls = torch.cuda.CUDAGraph
    begin, end = cls.capture_begin, cls.capture_end
    lock = timer.lock

    def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            timer.captures += 1
        try:
            return begin(graph, *args, **kwargs)
        except BaseException:
            with lock:
                timer.captures = max(0, timer.captures - 1)
            raise

    def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(graph, *args, **kwargs)
        finally:
            with lock:
                timer.captures = max(0, timer.captures - 1)

    cls.capture_begin, cls.capture_end = capture_begin, capture_end

    def undo() -> None:
        if cls.capture_begin is capture_begin:
            cls.capture_begin, cls.capture_end = begin, end

    return undo


def _never() -> bool:
    return False


class CudaPhaseTimer:
    """GPU time per phase, exclusive of the phases nested in it (forward
    and backward inside an optimizer step's closure), as the CPU side counts
    it.

    `device_of` names the device to time, asked at each step's begin (the
    script may move its model); `first_row` is the index of the first step
    the timer sees: the rows before it are final as they are.
    """

    def __init__(
        self,
        torch: Any,
        device_of: Optional[Callable[[], int]] = None,
        on_fault: Optional[FaultCallback] = None,
        first_row: int = 0,
    ) -> None:
        cuda = torch.cuda
        self._event_cls = cuda.Event
        self._stream_of = cuda.current_stream
        self._is_capturing: Callable[[], bool] = getattr(
            cuda, "is_current_stream_capturing", _never
        )
        self._device_of = device_of if device_of is not None else cuda.current_device
        self.on_fault = on_fault
        self.off = False
        # Events by device: an event is bound to the device it was first
        # recorded on, and recording it on another raises.
        self._pools: dict[int, list[Any]] = {}
        self.device: Optional[int] = None  # of the open step
        self.devices: set[int] = set()
        # Open phases: [kind, is_eval, start event, [(start, end) of children]].
        self._stack: list[list[Any]] = []
        # Ended phases of the open step: [kind, is_eval, start, end, children].
        self._phases: list[list[Any]] = []
        self._top: list[int] = []  # indices into _phases of top-level ones
        self._step_start: Optional[Any] = None
        self._spoiled = False  # the open step met a capture: its GPU values are unknown
        self.unknown = 0  # committed steps left without GPU values (captures)
        # (row index, device, start event, end event, phases)
        self._pending: deque = deque()
        # Rows from this index on may still get events queued: a row is
        # committed (StepTracker._commit) before its step-end callback
        # queues its events, and a flush in between must not take it as
        # final. Advanced only after the row's events are queued.
        self._next = first_row
        # Captures: `capturing` is what the main thread saw at its last
        # edge; `captures` counts those begun through torch.cuda.CUDAGraph
        # (guard_captures), in any thread; `lock` serialises them with the
        # flush thread's queries.
        self.capturing = False
        self.captures = 0
        self.lock = threading.Lock()

    def _fault(self, exc: BaseException) -> None:
        """Switch off for good: the events already queued are dropped and
        every entry point returns at once."""
        self.off = True
        self._pending.clear()
        if self.on_fault is not None:
            try:
                self.on_fault("cuda", exc)
            except Exception:
                pass

    def _record(self) -> Any:
        if self.captures or self._is_capturing():
            self.capturing = True
            self._spoiled = True
            return None
        self.capturing = False
        device = self.device
        if device is None:
            device = self.device = int(self._device_of())
            self.devices.add(device)
        pool = self._pools.get(device)
        ev = pool.pop() if pool else self._event_cls(enable_timing=True)
        ev.record(self._stream_of(device))
        return ev

    def _recycle(self, device: Optional[int], events: list[Any]) -> None:
        if device is None:
            return
        pool = self._pools.setdefault(device, [])
        pool.extend(e for e in events if e is not None)

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        if self.off:
            return
        try:
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
        except Exception as exc:
            self._fault(exc)

    def relabel(self, names: list[str]) -> None:
        """The step tracker renamed the last top-level phases (see
        StepTracker.on_relabel): count their GPU time where it now says."""
        if not names or self.off:
            return
        try:
            for index, name in zip(self._top[-len(names):], names[-len(self._top):]):
                phase = self._phases[index]
                phase[1] = name == "Eval"
                if name in _KIND_OF_NAME:
                    phase[0] = _KIND_OF_NAME[name]
        except Exception as exc:
            self._fault(exc)

    def step_begin(self, index: int, t: float) -> None:
        if self.off:
            return
        try:
            self._phases = []
            self._top = []
            self._spoiled = False
            self.device = int(self._device_of())
            self.devices.add(self.device)
            self._step_start = self._record()
        except Exception as exc:
            self._fault(exc)

    def step_end(self, index: int, t: float, committed: bool) -> None:
        if self.off:
            return
        try:
            start, phases = self._step_start, self._phases
            self._step_start, self._phases, self._top = None, [], []
            if not committed:
                return
            end = self._record() if start is not None and not self._spoiled else None
            if end is None or self._spoiled:
                # A capture during the step (or a step begun before the
                # timer was): its GPU values stay unknown.
                self.unknown += 1
                events = [start, end]
                for phase in phases:
                    events += [phase[2], phase[3]]
                self._recycle(self.device, events)
            else:
                self._pending.append((index, self.device, start, end, phases))
            self._next = index + 1
        except Exception as exc:
            self._fault(exc)

    def resolve(self, rows: Any, col_base: int, base: int = 0) -> int:
        """Fill the GPU columns of every step whose events have completed.
        `rows` holds the steps from index `base` on (those before it are
        written and gone): the tracker's packed buffer (an array of
        steps.WIDTH floats a step), or a list of row lists. Returns the
        index of the first row that may still change (all rows before it
        are final). Called from the flush thread: it queries
        nothing while a CUDA graph capture is underway. A capture begun
        through torch.cuda.CUDAGraph is known the moment it begins
        (guard_captures); one begun by other means only at the main
        thread's next phase edge."""
        packed = not isinstance(rows, list)
        held = len(rows) // WIDTH if packed else len(rows)
        if self.off:
            return base + held
        # Read before looking at the queue: the main thread queues a row's
        # events before it advances `_next`.
        limit = self._next
        pending = self._pending
        try:
            with self.lock:
                if self.captures or self.capturing:
                    return min(pending[0][0], limit) if pending else limit
                while pending:
                    index, device, start, end, phases = pending[0]
                    if index >= limit:
                        break
                    if not end.query():
                        return index
                    pending.popleft()
                    if packed:
                        row, at = rows, (index - base) * WIDTH + col_base
                    else:
                        row, at = rows[index - base], col_base
                    sums = [0.0, 0.0, 0.0, 0.0]
                    used = [start, end]
                    for kind, is_eval, a, b, children in phases:
                        if not is_eval and kind < len(PHASE_NAMES) - 1:
                            own = a.elapsed_time(b) - sum(
                                c.elapsed_time(d) for c, d in children
                            )
                            sums[min(kind, 3)] += own / 1000.0
                        used += [a, b]
                    for i in range(4):
                        row[at + i] = sums[i]
                    row[at + 4] = start.elapsed_time(end) / 1000.0
                    self._recycle(device, used)
        except Exception as exc:
            self._fault(exc)
            return base + held
        return limit

    def synchronize(self, torch: Any) -> None:
        """At the end of the run: wait for the devices timed, so their last
        events can be read."""
        if self.off or self.captures:
            return
        for device in sorted(self.devices):
            torch.cuda.synchronize(device)


class NvtxRanges:
    """A `ProfileStep` process range per step and a pushed range per phase,
    in the `perfrun` domain.

    The step's index is the range's payload, not part of its message: the
    nvtx package registers each distinct message once and caches it for the
    life of the process (`Domain.get_registered_string`, unbounded), so a
    message per step would grow that cache, and the registered-string table
    of the tool, by one entry a step. Every range here reuses one of a fixed
    set of attribute objects; only the step's payload changes. Without a
    tool attached the domain is nvtx's no-op stand-in and the attributes are
    None."""

    def __init__(self, nvtx: Any) -> None:
        self.domain = nvtx.get_domain("perfrun")
        attrs = self.domain.get_event_attributes
        self._phase = [attrs(message=name) for name in PHASE_NAMES]
        self._eval = attrs(message="Eval")
        self._step_attrs = attrs(message="ProfileStep", payload=0)
        self._step: Any = None

    @property
    def attached(self) -> bool:
        """Whether a tool (nsys) listens: only then do the ranges exist."""
        return self._phase[0] is not None

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        if enter:
            self.domain.push_range(self._eval if is_eval else self._phase[kind])
        else:
            self.domain.pop_range()

    def step_begin(self, index: int, t: float) -> None:
        attrs = self._step_attrs
        if attrs is not None:
            attrs.payload = index
        self._step = self.domain.start_range(attrs)

    def step_end(self, index: int, t: float, committed: bool) -> None:
        if self._step is not None:
            self.domain.end_range(self._step)
            self._step = None
