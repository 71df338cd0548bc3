"""The CUDA caching allocator over the run: peak allocated and reserved
bytes per phase, read from the allocator's own counters; its state when a
step runs out of memory; and, with --memory-snapshot, its recorded history,
in a file PyTorch's memory visualiser opens.

Per-phase peaks. The allocator keeps one peak per counter since its last
reset, no history. To know each phase's own peak, perfrun reads the
counters at every phase edge of a step and resets the peaks there, so each
reading is the peak of the interval that just ended, given to the phase that
was innermost in it (nested phases: a closure's forward is Forward's, not
the optimizer step's). No synchronisation and no per-tensor hook: the
counters are the allocator's host-side bookkeeping.

Why sampled. `torch._C._cuda_memoryStats` builds a dict of a few hundred
entries; at each of a step's 8 or so edges that would be a visible share of
a 5 ms step. One step every SAMPLE_EVERY seconds is read at every edge
(about 20 readings a second whatever the step time: a fixed, small share of
the run); the other steps pay one attribute test an edge. The rows kept are
thinned evenly to at most MAX_ROWS (the interval doubles each time), so a
run of days costs the rank file what a run of minutes does.

The script's own peaks stay its own. A script that prints
`torch.cuda.max_memory_allocated()` (many do, once an epoch) would see
perfrun's resets as a lower peak. `PeakView` wraps the two functions every
Python reader goes through (`torch._C._cuda_memoryStats`, which
`memory_stats`, `max_memory_allocated`, `memory_summary` and the rest call,
and `torch._C._cuda_resetPeakMemoryStats`): the peaks perfrun took away are
held and given back in every reading, until the script resets them itself.

Out of memory. The allocator calls its out-of-memory observers before it
raises, with the lock released, in the thread that asked: perfrun's reads
there where the rank is (step, phase: position.py, as the hang detector
does), the innermost module whose forward is on that thread's Python stack
(backward runs in autograd's own thread: no module there), what was asked
and what the allocator held (allocated, reserved, the largest free block of
its segments). The exception and the exit stay the script's.

Snapshots (--memory-snapshot). The allocator records its alloc/free history
(`_record_memory_history`, Python stacks only) in a ring of
SNAPSHOT_ENTRIES events, sized after the first sampled step to the last
SNAPSHOT_STEPS steps' events; each allocation carries the step and phase it
was made in (`_set_memory_metadata`, where torch has it). The pickle is
written at the first out-of-memory error, else at the end of the run.
Recording costs a few microseconds an allocation (PyTorch's own figure):
opt-in only.

Faults: every entry point catches its own, reports it through `on_fault`
and switches this part off; the script never sees them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from time import perf_counter
from typing import Any, Callable, Optional

#: Seconds between two sampled steps (doubled each time the rows are thinned).
SAMPLE_EVERY = 0.5
#: Sampled steps kept in the rank file at most.
MAX_ROWS = 256
#: Buckets of a sampled step: the four phases, the step's own code between
#: them, evaluation passes inside the step.
BUCKETS = ("dataloader", "forward", "backward", "optimization", "others", "eval")
OTHERS, EVAL = 4, 5
#: Phase kind (steps.KIND_NAMES) to bucket; a closure (5) is the phase it
#: was called in.
_BUCKET_OF_KIND = (0, 1, 2, 3, 3, None)
#: Steps of history a snapshot keeps, and its ring's size before the
#: events a step makes are known (and at most).
SNAPSHOT_STEPS = 3
SNAPSHOT_ENTRIES = 100_000
SNAPSHOT_MAX_ENTRIES = 1_000_000

FaultCallback = Callable[[str, BaseException], None]


def _peaks(stats: Any) -> dict[tuple[str, Optional[str]], int]:
    """Every peak in the allocator's nested stats: (counter, pool) to bytes
    or counts; pool None for the counters without pools."""
    out: dict[tuple[str, Optional[str]], int] = {}
    for name, value in stats.items():
        if not isinstance(value, dict):
            continue
        if "peak" in value:
            out[(name, None)] = value["peak"]
            continue
        for pool, stat in value.items():
            if isinstance(stat, dict) and "peak" in stat:
                out[(name, pool)] = stat["peak"]
    return out


class PeakView:
    """The allocator's peaks as the script would see them without perfrun
    (see the module's docstring). `read_and_reset(device)` is perfrun's:
    the counters as they are, then the peaks reset, what they were held."""

    def __init__(self, torch: Any) -> None:
        c = torch._C
        self._c = c
        self._stats = c._cuda_memoryStats
        self._reset = c._cuda_resetPeakMemoryStats
        self.held: dict[int, dict[tuple[str, Optional[str]], int]] = {}
        stats, reset, held = self._stats, self._reset, self.held

        def memory_stats(device: Any, *args: Any, **kwargs: Any) -> Any:
            out = stats(device, *args, **kwargs)
            mine = held.get(device)
            if mine and isinstance(out, dict):
                for (name, pool), peak in mine.items():
                    stat = out.get(name)
                    if pool is not None and isinstance(stat, dict):
                        stat = stat.get(pool)
                    if isinstance(stat, dict) and stat.get("peak", peak) < peak:
                        stat["peak"] = peak
            return out

        def reset_peaks(device: Any, *args: Any, **kwargs: Any) -> Any:
            held.pop(device, None)
            return reset(device, *args, **kwargs)

        self._wrapped = (memory_stats, reset_peaks)
        c._cuda_memoryStats = memory_stats
        c._cuda_resetPeakMemoryStats = reset_peaks

    def read(self, device: int) -> Any:
        return self._stats(device)

    def read_and_reset(self, device: int) -> Any:
        stats = self._stats(device)
        mine = self.held.setdefault(device, {})
        for key, peak in _peaks(stats).items():
            if mine.get(key, -1) < peak:
                mine[key] = peak
        self._reset(device)
        return stats

    def undo(self) -> None:
        c = self._c
        if c._cuda_memoryStats is self._wrapped[0]:
            c._cuda_memoryStats = self._stats
        if c._cuda_resetPeakMemoryStats is self._wrapped[1]:
            c._cuda_resetPeakMemoryStats = self._reset


def _bytes(stats: Any, name: str, key: str) -> int:
    try:
        return int(stats[name]["all"][key])
    except Exception:
        return 0


def _events(stats: Any) -> int:
    """Allocations and frees so far (the history's events, less segments)."""
    return _bytes(stats, "allocation", "allocated") + _bytes(stats, "allocation", "freed")


class AllocatorPhases:
    """Per-phase peaks on sampled steps (a phase-edge and step listener, as
    gpu.CudaPhaseTimer is). A row per sampled step:
    [step, allocated at its end, reserved at its end, peak allocated per
    bucket (6), peak reserved per bucket (6)], bytes; a bucket the step
    never entered has peak -1."""

    def __init__(self, torch: Any, device_of: Callable[[], int],
                 on_fault: Optional[FaultCallback] = None,
                 every: float = SAMPLE_EVERY, max_rows: int = MAX_ROWS,
                 clock: Callable[[], float] = perf_counter) -> None:
        self.view = PeakView(torch)
        self._device_of = device_of
        self.on_fault = on_fault
        self.every = every
        self.max_rows = max_rows
        self._clock = clock
        self.off = False
        self.device: Optional[int] = None
        self.total: Optional[int] = None
        self.rows: list[list[int]] = []
        self.sampled = 0
        self._next = 0.0  # clock reading from which the next step is sampled
        self._on = False
        self._stack: list[int] = []  # buckets of the open phases
        self._row: list[int] = []
        self._events_at = 0
        #: Allocations and frees in the last sampled step.
        self.events_per_step = 0
        self.on_sampled: Optional[Callable[[Any], None]] = None
        try:
            self.total = int(torch.cuda.get_device_properties(device_of()).total_memory)
        except Exception:
            self.total = None

    def _fault(self, exc: BaseException) -> None:
        self.off = True
        self._on = False
        try:
            self.view.undo()
        except Exception:
            pass
        if self.on_fault is not None:
            try:
                self.on_fault("cuda.memory", exc)
            except Exception:
                pass

    def step_begin(self, index: int, t: float) -> None:
        if self.off or self._clock() < self._next:
            return
        try:
            self._next = self._clock() + self.every
            self.device = device = int(self._device_of())
            stats = self.view.read_and_reset(device)  # the time before the step: no one's
            self._on = True
            self._stack = []
            self._events_at = _events(stats)
            self._row = [index, 0, 0] + [-1] * 12
        except Exception as exc:
            self._fault(exc)

    def _take(self, bucket: int) -> Any:
        """The interval since the last reading is `bucket`'s: fold its peaks
        in; returns the counters read."""
        stats = self.view.read_and_reset(self.device)  # type: ignore[arg-type]
        row = self._row
        a = _bytes(stats, "allocated_bytes", "peak")
        r = _bytes(stats, "reserved_bytes", "peak")
        if a > row[3 + bucket]:
            row[3 + bucket] = a
        if r > row[9 + bucket]:
            row[9 + bucket] = r
        row[1] = _bytes(stats, "allocated_bytes", "current")
        row[2] = _bytes(stats, "reserved_bytes", "current")
        return stats

    def _bucket(self) -> int:
        for bucket in reversed(self._stack):
            if bucket >= 0:
                return bucket
        return OTHERS

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        if not self._on:
            return
        try:
            self._take(self._bucket())
            stack = self._stack
            if enter:
                b = _BUCKET_OF_KIND[kind] if kind < len(_BUCKET_OF_KIND) else None
                stack.append(EVAL if is_eval else (-1 if b is None else b))
            elif stack:
                stack.pop()
        except Exception as exc:
            self._fault(exc)

    def step_end(self, index: int, t: float, committed: bool) -> None:
        if not self._on:
            return
        self._on = False
        try:
            stats = self._take(self._bucket())
            if not committed:
                return
            self.events_per_step = _events(stats) - self._events_at
            self.rows.append(self._row)
            self.sampled += 1
            if len(self.rows) > self.max_rows:
                self.rows = self.rows[::2]
                self.every *= 2
            if self.on_sampled is not None:
                self.on_sampled(self)
        except Exception as exc:
            self._fault(exc)

    def latest(self) -> Optional[dict[str, int]]:
        """The last sampled step's memory, bytes: allocated and reserved at
        its end, its peak allocated (what the tracker points and the
        metrics endpoint give); None before the first sampled step."""
        rows = self.rows
        if not rows:
            return None
        last = rows[-1]
        return {"allocated": last[1], "reserved": last[2], "peak_allocated": max(last[3:9])}

    def summary(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "total": self.total,
            "every": self.every,
            "sampled": self.sampled,
            "events_per_step": self.events_per_step,
            "buckets": list(BUCKETS),
            "rows": [list(r) for r in self.rows],
        }

    def undo(self) -> None:
        self._on = False
        self.view.undo()


def module_on_stack(frame: Any, names: Callable[[Any], Optional[str]]) -> Optional[str]:
    """The innermost torch.nn.Module whose forward is running in the frame's
    thread, by its qualified name in the script's model (`names`), else its
    class."""
    while frame is not None:
        if frame.f_code.co_name == "forward":
            owner = frame.f_locals.get("self")
            cls = type(owner)
            if any(k.__name__ == "Module" and k.__module__ == "torch.nn.modules.module"
                   for k in cls.__mro__):
                name = None
                try:
                    name = names(owner)
                except Exception:
                    pass
                return name or cls.__name__
        frame = frame.f_back
    return None


def largest_free_block(segments: Any, device: int) -> Optional[int]:
    """The largest free block in the allocator's segments on `device` (from
    torch.cuda.memory_snapshot()), or None when it cannot be told."""
    best: Optional[int] = None
    for seg in segments or ():
        if seg.get("device", device) != device:
            continue
        for block in seg.get("blocks") or ():
            if block.get("state") == "inactive":
                size = int(block.get("size", 0))
                if best is None or size > best:
                    best = size
    return best


class OutOfMemory:
    """The allocator's out-of-memory errors in this rank: the first one in
    full (`first`), and how many there were (a script may catch them and
    skip the batch)."""

    def __init__(self, torch: Any, where: Callable[[], dict[str, Any]],
                 module_name: Callable[[Any], Optional[str]],
                 on_fault: Optional[FaultCallback] = None,
                 then: Optional[Callable[[], None]] = None) -> None:
        self.torch = torch
        self.where = where
        self.module_name = module_name
        self.on_fault = on_fault
        self.then = then  # called after the first one is recorded (the snapshot)
        self.count = 0
        self.first: Optional[dict[str, Any]] = None
        self.last: Optional[dict[str, Any]] = None
        self.off = False

    def attach(self) -> None:
        self.torch._C._cuda_attach_out_of_memory_observer(self.observe)

    def observe(self, device: int, requested: int, device_total: int, device_free: int
                ) -> None:
        """Called by the allocator before it raises (no observer can be
        detached: once off, it returns at once)."""
        if self.off:
            return
        try:
            self.count += 1
            record = self.describe(int(device), int(requested), int(device_total),
                                   int(device_free), sys._getframe(1))
            if self.first is None:
                self.first = record
                if self.then is not None:
                    self.then()
            else:
                self.last = record
        except Exception as exc:
            self.off = True
            if self.on_fault is not None:
                try:
                    self.on_fault("cuda.oom", exc)
                except Exception:
                    pass

    def describe(self, device: int, requested: int, device_total: int, device_free: int,
                 frame: Any) -> dict[str, Any]:
        cuda = self.torch.cuda
        where: dict[str, Any] = {}
        try:
            where = self.where()
        except Exception:
            pass
        stats: Any = {}
        try:
            stats = self.torch._C._cuda_memoryStats(device)
        except Exception:
            pass
        segments: Any = None
        try:
            segments = cuda.memory_snapshot(include_traces=False)
        except TypeError:
            segments = cuda.memory_snapshot()
        except Exception:
            pass
        return {
            "step": where.get("step"),
            "phase": where.get("phase"),
            "module": module_on_stack(frame, self.module_name),
            "main_thread": _in_main_thread(),
            "device": device,
            "requested": requested,
            "device_total": device_total,
            "device_free": device_free,
            "allocated": _bytes(stats, "allocated_bytes", "current"),
            "reserved": _bytes(stats, "reserved_bytes", "current"),
            "largest_free_block": largest_free_block(segments, device),
            "unix": round(time.time(), 3),
        }

    def summary(self) -> Optional[dict[str, Any]]:
        if not self.count:
            return None
        return {"count": self.count, "first": self.first, "last": self.last}


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Snapshots:
    """--memory-snapshot: the allocator's history recorded from the moment
    the script initialised CUDA, each allocation tagged with its step and
    phase, dumped once (at the first out-of-memory error, else at the end)."""

    def __init__(self, torch: Any, path: str, on_fault: Optional[FaultCallback] = None) -> None:
        self.torch = torch
        self.path = path
        self.on_fault = on_fault
        self.entries = SNAPSHOT_ENTRIES
        self.written: Optional[dict[str, Any]] = None
        self.off = False
        memory = torch.cuda.memory
        self._tag = getattr(memory, "_set_memory_metadata", None)
        self._index = 0
        self._sized = False
        memory._record_memory_history(enabled="all", context="all", stacks="python",
                                      max_entries=self.entries)

    def _fault(self, exc: BaseException) -> None:
        self.off = True
        if self.on_fault is not None:
            try:
                self.on_fault("cuda.snapshot", exc)
            except Exception:
                pass

    def step_begin(self, index: int, t: float) -> None:
        self._index = index

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        tag = self._tag
        if tag is None or self.off:
            return
        try:
            name = "eval" if is_eval else BUCKETS[_BUCKET_OF_KIND[kind] or 3]
            tag(f"step {self._index} {name}" if enter else f"step {self._index}")
        except Exception as exc:
            self._fault(exc)

    def size_for(self, events_per_step: int) -> None:
        """Keep the last SNAPSHOT_STEPS steps' events, once a step's count is
        known (from a sampled step's counters)."""
        if self._sized or self.off or events_per_step <= 0:
            return
        self._sized = True
        entries = min(SNAPSHOT_MAX_ENTRIES, max(SNAPSHOT_ENTRIES // 10,
                                                events_per_step * SNAPSHOT_STEPS))
        if entries == self.entries:
            return
        try:
            self.torch.cuda.memory._record_memory_history(
                enabled="all", context="all", stacks="python", max_entries=entries)
            self.entries = entries
        except Exception as exc:
            self._fault(exc)

    def dump(self, reason: str) -> None:
        if self.written is not None or self.off:
            return
        try:
            began = perf_counter()
            self.torch.cuda.memory._dump_snapshot(self.path)
            self.written = {
                "file": os.path.basename(self.path),
                "reason": reason,
                "bytes": os.path.getsize(self.path),
                "entries": self.entries,
                "seconds": round(perf_counter() - began, 3),
            }
        except Exception as exc:
            self._fault(exc)
