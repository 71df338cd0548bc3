"""The CUDA phase timer's bookkeeping, with a stand-in for torch.cuda.

A real CUDA event cannot exist on this machine's CPU-only torch, so
`FakeEvent` records a time from a hand-moved clock and answers
`elapsed_time` in milliseconds as the real one does; like the real one it is
bound to the device it was first recorded on, and its `query()` fails while a
global-mode graph capture is underway. What is tested is perfrun's own logic:
a phase's GPU time excludes the phases nested in it (forward and backward
inside an optimizer step's closure), a closure's own time and evaluation go
to no column, a relabel moves a phase's time to the column the step tracker
finally chose, events go to the device the script works on and are pooled
per device, nothing is recorded or queried during a capture, a row is not
final before its events are queued, and a fault switches the timer off
without raising. NVTX ranges are checked against the installed nvtx package
(a no-op without a tool attached) and a stand-in domain that caches
messages as nvtx's Domain does. The real events are checked on a GPU by the
project's GPU check.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, Optional

from perfrun.runtime.gpu import CudaPhaseTimer
from perfrun.runtime.steps import BWD, CLOSURE, DATA, FWD, OPT

CLOCK = [0.0]


class FakeStream:
    def __init__(self, device: int) -> None:
        self.device = device


class FakeEvent:
    """torch.cuda.Event as far as the timer uses it: bound to the device of
    the first stream it is recorded on (recording it on another raises, as
    ATen's CUDAEvent does), `query()` an event query, which fails while a
    global-mode capture is underway anywhere in the process."""

    cuda: FakeCuda

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0
        self.device: Optional[int] = None
        self.cuda.created += 1

    def record(self, stream: Optional[FakeStream] = None) -> None:
        cuda = self.cuda
        device = cuda.current if stream is None else stream.device
        if self.device is None:
            self.device = device
        elif self.device != device:
            raise RuntimeError(
                f"Event device {self.device} does not match recording stream's device {device}."
            )
        if cuda.capturing:
            cuda.recorded_in_capture += 1
        cuda.recorded.append(device)
        self.t = CLOCK[0]

    def query(self) -> bool:
        cuda = self.cuda
        cuda.queries += 1
        if cuda.capturing:
            cuda.broken_captures += 1
            raise RuntimeError("operation not permitted when stream is capturing")
        return cuda.complete

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1e3


class FakeGraph:
    """torch.cuda.CUDAGraph's capture calls: the stream capture they begin
    and end is the stand-in's `capturing` flag."""

    cuda: FakeCuda

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        self.cuda.capturing = True

    def capture_end(self) -> None:
        self.cuda.capturing = False


class FakeCuda:
    """The slice of `torch.cuda` perfrun calls, with counters a test reads.
    `driver_calls` counts the calls that would initialise the driver
    (`is_available`): perfrun must make none."""

    def __init__(self, device: int = 0, count: int = 1) -> None:
        self.current = device
        self.count = count
        self.capturing = False
        self.complete = True
        self.initialized = True
        self.driver_calls = 0
        self.queries = 0
        self.created = 0
        self.broken_captures = 0
        self.recorded_in_capture = 0
        self.recorded: list[int] = []
        # cudaProfilerStart/Stop, with the device current when called.
        self.profiler_calls: list[tuple[str, int]] = []
        self.Event = type("Event", (FakeEvent,), {"cuda": self})
        self.CUDAGraph = type("CUDAGraph", (FakeGraph,), {"cuda": self})
        self.profiler = SimpleNamespace(
            start=lambda: self.profiler_calls.append(("start", self.current)),
            stop=lambda: self.profiler_calls.append(("stop", self.current)),
        )

    def is_available(self) -> bool:
        self.driver_calls += 1
        return True

    def get_device_name(self, device: Optional[int] = None) -> str:
        return f"Fake GPU {self.current if device is None else device}"

    def get_device_properties(self, device: int) -> Any:
        return SimpleNamespace(uuid=f"0000000{device}-0000-0000-0000-000000000000")

    def synchronize(self, device: Optional[int] = None) -> None:
        pass

    @contextmanager
    def device(self, device: int) -> Iterator[None]:
        before, self.current = self.current, device
        try:
            yield
        finally:
            self.current = before

    def current_device(self) -> int:
        return self.current

    def set_device(self, device: int) -> None:
        self.current = device

    def device_count(self) -> int:
        return self.count

    def current_stream(self, device: Optional[int] = None) -> FakeStream:
        return FakeStream(self.current if device is None else device)

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def is_initialized(self) -> bool:
        return self.initialized


def fake_torch(device: int = 0, count: int = 1) -> Any:
    cuda = FakeCuda(device, count)
    return SimpleNamespace(cuda=cuda, version=SimpleNamespace(cuda="12.4", hip=None))


def make_timer(**kwargs: Any) -> CudaPhaseTimer:
    CLOCK[0] = 0.0
    return CudaPhaseTimer(fake_torch(), **kwargs)


def phase(timer: CudaPhaseTimer, kind: int, seconds: float, is_eval: bool = False) -> None:
    timer.edge(kind, True, is_eval)
    CLOCK[0] += seconds
    timer.edge(kind, False, is_eval)


def test_nested_phases_are_subtracted_from_their_parent() -> None:
    timer = make_timer()
    timer.step_begin(0, 0.0)
    phase(timer, DATA, 1)
    timer.edge(OPT, True, False)
    CLOCK[0] += 1
    timer.edge(CLOSURE, True, False)
    CLOCK[0] += 2  # the closure's own code
    phase(timer, FWD, 4)
    phase(timer, BWD, 8)
    timer.edge(CLOSURE, False, False)
    CLOCK[0] += 2  # the optimizer's update
    timer.edge(OPT, False, False)
    timer.step_end(0, 0.0, True)
    rows = [[None] * 5]
    assert timer.resolve(rows, 0) == 1
    assert rows[0] == [1.0, 4.0, 8.0, 3.0, 18.0]


def test_relabel_moves_time_to_the_final_phase() -> None:
    # A frozen teacher: its batch and forward began as evaluation, then a
    # training event showed they were part of the step.
    timer = make_timer()
    timer.step_begin(0, 0.0)
    phase(timer, DATA, 1)
    phase(timer, FWD, 2, is_eval=True)
    timer.relabel(["Dataloader", "Forward"])
    phase(timer, FWD, 4)
    timer.step_end(0, 0.0, True)
    rows = [[None] * 5]
    timer.resolve(rows, 0)
    assert rows[0][:4] == [1.0, 6.0, 0.0, 0.0]


def run_step(timer: CudaPhaseTimer, index: int, seconds: float = 1.0) -> None:
    timer.step_begin(index, 0.0)
    phase(timer, FWD, seconds)
    phase(timer, BWD, seconds)
    timer.step_end(index, 0.0, True)


def test_events_follow_the_device_of_each_step_and_are_pooled_per_device() -> None:
    # The script's device changes (set_device(1)) between steps: events
    # pooled on device 0 must not be recorded on device 1 (they would raise).
    torch = fake_torch(device=0, count=2)
    cuda = torch.cuda
    faults: list[BaseException] = []
    timer = CudaPhaseTimer(torch, on_fault=lambda where, exc: faults.append(exc))
    rows = [[None] * 5 for _ in range(6)]
    for i in range(3):
        run_step(timer, i)
        timer.resolve(rows, 0)
    cuda.set_device(1)
    cuda.recorded.clear()
    for i in range(3, 6):
        run_step(timer, i)
        assert timer.resolve(rows, 0) == i + 1
    assert faults == [] and not timer.off
    assert set(cuda.recorded) == {1}
    assert rows[5] == [0.0, 1.0, 1.0, 0.0, 2.0]
    assert timer.devices == {0, 1}


def test_device_of_names_the_stream_events_are_recorded_on() -> None:
    torch = fake_torch(device=0, count=4)
    timer = CudaPhaseTimer(torch, device_of=lambda: 2)
    run_step(timer, 0)
    assert set(torch.cuda.recorded) == {2}


def test_a_row_is_not_final_before_its_events_are_queued() -> None:
    # StepTracker._commit appends the row, then calls the step-end
    # listeners: a flush in between must leave the row for later.
    timer = make_timer()
    rows: list[list[Any]] = []
    timer.step_begin(0, 0.0)
    phase(timer, FWD, 2)
    rows.append([None] * 5)  # committed ...
    assert timer.resolve(rows, 0) == 0  # ... but not final yet
    timer.step_end(0, 0.0, True)
    assert timer.resolve(rows, 0) == 1
    assert rows[0] == [0.0, 2.0, 0.0, 0.0, 2.0]


def test_rows_before_the_timer_started_are_final() -> None:
    timer = make_timer(first_row=3)
    rows = [[None] * 5 for _ in range(3)]
    assert timer.resolve(rows, 0) == 3


def test_nothing_is_recorded_or_queried_during_a_capture() -> None:
    torch = fake_torch()
    cuda = torch.cuda
    timer = CudaPhaseTimer(torch)
    rows = [[None] * 5 for _ in range(3)]
    run_step(timer, 0)
    cuda.complete = False  # step 0's events still running on the GPU
    timer.step_begin(1, 0.0)
    phase(timer, FWD, 1)
    cuda.capturing = True  # torch.cuda.graph(...) around the next forward
    phase(timer, FWD, 1)
    # The flush thread, mid-capture: it must not query (that would
    # invalidate a global-mode capture).
    assert timer.resolve(rows, 0) == 0
    cuda.capturing = False
    timer.step_end(1, 0.0, True)
    run_step(timer, 2)
    cuda.complete = True
    assert timer.resolve(rows, 0) == 3
    assert cuda.recorded_in_capture == 0 and cuda.broken_captures == 0
    assert rows[0][4] == 2.0 and rows[2][4] == 2.0
    assert rows[1] == [None] * 5  # unknown, not wrong
    assert timer.unknown == 1


def test_captures_begun_anywhere_stop_the_queries() -> None:
    # A capture in another thread: the main thread's edges cannot see it,
    # the counter kept around torch.cuda.CUDAGraph does.
    from perfrun.runtime.gpu import guard_captures

    torch = fake_torch()
    cuda = torch.cuda
    timer = CudaPhaseTimer(torch)
    original = cuda.CUDAGraph.capture_begin
    undo = guard_captures(torch, timer)
    rows = [[None] * 5]
    run_step(timer, 0)
    graph = cuda.CUDAGraph()
    graph.capture_begin()
    assert timer.captures == 1
    assert timer.resolve(rows, 0) == 0 and cuda.queries == 0
    graph.capture_end()
    assert timer.captures == 0
    assert timer.resolve(rows, 0) == 1 and cuda.broken_captures == 0
    undo()
    assert cuda.CUDAGraph.capture_begin is original


def test_a_fault_switches_the_timer_off_without_raising() -> None:
    torch = fake_torch()
    faults: list[str] = []
    timer = CudaPhaseTimer(torch, on_fault=lambda where, exc: faults.append(where))
    run_step(timer, 0)

    def broken(self: Any, stream: Any = None) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    torch.cuda.Event.record = broken
    run_step(timer, 1)  # raises nothing
    run_step(timer, 2)
    assert timer.off and faults == ["cuda"]
    assert timer.resolve([[None] * 5] * 3, 0) == 3


class CachingDomain:
    """nvtx's Domain as far as message registration goes: every distinct
    message is registered once and kept for the life of the process
    (`get_registered_string` is an unbounded lru_cache there)."""

    def __init__(self) -> None:
        self.registered: dict[str, object] = {}
        self.ranges: list[tuple[str, Any]] = []

    def get_registered_string(self, message: str) -> object:
        return self.registered.setdefault(message, object())

    def get_event_attributes(self, message: Optional[str] = None, payload: Any = None) -> Any:
        if message is not None:
            self.get_registered_string(message)
        return SimpleNamespace(message=message, payload=payload)

    def start_range(self, attributes: Any = None, **kwargs: Any) -> int:
        if attributes is None:
            attributes = self.get_event_attributes(**kwargs)
        self.ranges.append((attributes.message, attributes.payload))
        return len(self.ranges)

    def end_range(self, range_id: int) -> None:
        pass

    def push_range(self, attributes: Any = None) -> None:
        pass

    def pop_range(self) -> None:
        pass


def test_nvtx_step_ranges_register_one_message() -> None:
    from perfrun.runtime.gpu import NvtxRanges

    domain = CachingDomain()
    ranges = NvtxRanges(SimpleNamespace(get_domain=lambda name: domain))
    size = len(domain.registered)
    for i in range(10_000):
        ranges.step_begin(i, 0.0)
        ranges.edge(FWD, True, False)
        ranges.edge(FWD, False, False)
        ranges.step_end(i, 0.0, True)
    assert len(domain.registered) == size
    assert domain.ranges[-1] == ("ProfileStep", 9_999)


def test_nvtx_ranges_with_the_installed_package() -> None:
    # Without a tool attached nvtx hands out its no-op domain; with one, the
    # lru_cache of Domain.get_registered_string is what must not grow.
    import nvtx
    from nvtx._lib.lib import Domain

    from perfrun.runtime.gpu import NvtxRanges

    cache = Domain.get_registered_string.cache_info
    ranges = NvtxRanges(nvtx)
    size = cache().currsize
    for i in range(10_000):
        ranges.step_begin(i, 0.0)
        ranges.edge(DATA, True, False)
        ranges.edge(DATA, False, False)
        ranges.step_end(i, 0.0, True)
    assert cache().currsize == size


def test_a_capture_cannot_begin_during_a_query() -> None:
    # The flush thread holds the timer's lock while it queries: a capture
    # begun meanwhile waits for the query to end, then stops the next one.
    import threading

    from perfrun.runtime.gpu import guard_captures

    torch = fake_torch()
    timer = CudaPhaseTimer(torch)
    guard_captures(torch, timer)
    graph = torch.cuda.CUDAGraph()
    with timer.lock:  # a query in progress
        thread = threading.Thread(target=graph.capture_begin)
        thread.start()
        thread.join(0.05)
        assert thread.is_alive() and timer.captures == 0
        assert not torch.cuda.capturing
    thread.join(5)
    assert timer.captures == 1 and torch.cuda.capturing
