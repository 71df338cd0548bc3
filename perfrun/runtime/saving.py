"""The rank's saves (a part of runtime/agent.py's Agent, kept apart): the
flush thread and the observers it makes, the steps appended to the step
file as they become final, the rank file's document, and what a full disk
leaves.

Why a part of its own: when and what a rank writes, and that what it
writes is consistent (the rank file never counts a step its step file
lacks, the step file never holds a step the rank file says was lost) is
one concern; the agent's file holds the rank's lifecycle. Everything here
runs on the agent's own state, so it is a base class of Agent, as
cudaside.CudaSide is.
"""

from __future__ import annotations

import os
import platform
import threading
from time import perf_counter, thread_time
from typing import Any, Callable, Optional

from ..store.files import Reserve
from ..store.rankfile import environment, rank_document, write_rank_file
from ..store.stepfile import COL, STEP_COLUMNS, StepWriter
from .device import DeviceSampler
from .memory import HostMemory
from .position import describe, locate
from .steps import WIDTH

_GPU_COL = COL["gpu_dataloader"]


class Saving:
    """Agent's methods for saving (see the module's docstring). Attributes
    are the agent's own (Agent.__init__)."""

    payload: dict[str, Any]
    settings: Any
    identity: Any
    status: str
    exit: dict[str, Any]
    t0: float
    t0_unix: float
    torch: Any
    torch_version: Optional[str]
    tracker: Any
    phase_clock: Any
    clock: Any
    window: Any
    module_ranges: Any
    pipeline: Any
    gpu_timer: Any
    allocator: Any
    oom: Any
    snapshots: Any
    cuda: dict[str, Any]
    loaders: dict[Any, Any]
    faults: dict[str, Any]
    notes: list[str]
    path: str
    step_writer: Optional[StepWriter]
    reserve: Optional[Reserve]
    sampler: Optional[DeviceSampler]
    host_memory: Optional[HostMemory]
    _pid: int
    _platform: Optional[str]
    _settings_doc: Any
    _cuda_uuids: Any
    _cuda_later: bool
    _row_consumers: list[Callable[[Any, int, int], None]]
    _unsaved: Optional[OSError]
    _flushes: list[Any]
    _flush_cpu: float
    _write_lock: threading.Lock
    _final_saved: bool
    _stop: threading.Event
    # Called here, defined by Agent or CudaSide: record_fault, _gpu_fault,
    # _cuda_from_flush, _flops_record.

    def _observers(self) -> None:
        """What watches the rank from beside the script, made by the flush
        thread as it starts rather than at the script's `import torch`
        (psutil's and NVML's imports and first readings, the platform: tens
        of milliseconds the script would otherwise wait for). Their first
        readings are then taken within a millisecond of what they would
        have been."""
        try:
            self._platform = platform.platform()
        except Exception as exc:
            self.record_fault("platform", exc)
        try:
            sampler = DeviceSampler(self.notes, job_pid=self.payload.get("launcher_pid"))
            self.sampler = sampler
            # CUDA may have started before the sampler existed
            # (cudaside.py keeps its devices' UUIDs for this).
            uuids = self._cuda_uuids
            if uuids is not None:
                sampler.use_cuda_uuids(uuids)
        except Exception as exc:
            self.record_fault("device", exc)
        try:
            self.host_memory = HostMemory()
        except Exception as exc:
            self.record_fault("memory", exc)

    def _flush_loop(self) -> None:
        self._observers()
        interval = self.settings.flush_interval
        while not self._stop.wait(interval):
            try:
                if self._cuda_later:
                    self._cuda_from_flush()
                if self.sampler is not None:
                    self.sampler.sample()
                if self.host_memory is not None:
                    self.host_memory.sample(perf_counter() - self.t0)
                self.clock.drain_stale()
                self.write()
            except OSError:
                pass  # the disk is full or gone: the steps stay held, the final save says
            except Exception as exc:
                self.record_fault("flush", exc)
            self._flush_cpu = thread_time()

    def _append_ready(self, final: bool) -> None:
        """Append the steps that are final to the step file and let the
        tracker drop them: what the rank holds stays what it has not yet
        written, and a flush costs what is new."""
        writer = self.step_writer
        if writer is None:
            return
        tracker = self.tracker
        buf = tracker.buf
        base = tracker.base
        held = len(buf) // WIDTH
        ready = base + held
        timer = self.gpu_timer
        if timer is not None:
            try:
                ready = timer.resolve(buf, _GPU_COL, base)
            except Exception as exc:
                self._gpu_fault("cuda", exc)
            if final:
                ready = base + held
        k = ready - base
        if k <= 0:
            return
        before = writer.written
        try:
            writer.append_held(buf, k)
        finally:
            done = writer.written - before
            if done > 0 and self._row_consumers:
                self._feed_consumers(buf, done, base)
            # Only the script's own thread adds rows (at the end), so the
            # rows written, all or (a write failed) some, are the first.
            tracker.take(done)

    def add_row_consumer(self, consumer: Callable[[Any, int, int], None]) -> None:
        """Let `consumer(buf, count, first)` read each step once it is final
        and saved: rows 0..count-1 of the packed buffer `buf` (steps.WIDTH
        floats a row, laid out as STEP_COLUMNS), step indexes first.. on.
        It runs in the flush thread, never in the script's: it must copy
        what it keeps (the rows are dropped after it returns) and return
        quickly (anything slow, such as a network call, belongs on a thread
        of its own). One that raises is recorded as a fault and not called
        again."""
        self._row_consumers.append(consumer)

    def _feed_consumers(self, buf: Any, count: int, first: int) -> None:
        for consumer in list(self._row_consumers):
            try:
                consumer(buf, count, first)
            except Exception as exc:
                self._row_consumers.remove(consumer)
                name = getattr(consumer, "__qualname__", type(consumer).__name__)
                self.record_fault(f"rows.{name}", exc)

    def _replayed_to(self) -> float:
        """Seconds since the rank began up to which its steps are replayed
        into the tracker (the buffered clock's last replay; now, for a live
        clock): a save holds the steps before it, and a kill loses the ones
        after it as well as those after the save."""
        clock = self.clock
        replayed = getattr(clock, "replayed", None)
        if replayed is None or getattr(clock, "live", True) or not clock.buf:
            return perf_counter() - self.t0
        return float(replayed) - self.t0

    def document(self) -> dict[str, Any]:
        writer = self.step_writer
        device = self.sampler.summary() if self.sampler is not None else None
        tracker = self.tracker
        window = self.window
        return rank_document(
            self.identity,
            self.status,
            self.exit,
            self.t0_unix,
            round(perf_counter() - self.t0, 6),
            environment(self._pid, self.payload.get("command"), torch=self.torch_version,
                        platform=self._platform),
            self._settings_doc,
            window=list(self.settings.scheduler) if self.settings.scheduler else None,
            profiled=[window.start - window.warm, window.end] if window is not None else None,
            window_summary=window.result if window is not None else None,
            nsys_capture=window.capture if window is not None else None,
            module_hook_calls=(
                self.module_ranges.calls if self.module_ranges is not None else None
            ),
            distributed=self.roots.distributed,
            torch_imported=self.torch is not None,
            gpu=self.gpu_timer is not None,
            cuda=self.cuda,
            extra={
                "dataloader_init": {"calls": tracker.init_calls, "time": tracker.init_time},
                "stop_iteration": {"calls": tracker.stop_calls, "time": tracker.stop_time},
                "eval": {
                    "calls": tracker.eval_passes,
                    "passes": tracker.eval_passes,
                    "batches": tracker.eval_batches,
                    "forward_calls": tracker.eval_forward_calls,
                    "train_mode_forward_calls": tracker.eval_train_mode,
                    "time": tracker.eval_time,
                },
                "profiler": {"calls": tracker.own_calls, "time": tracker.own_time},
                "flush": {
                    "calls": self._flushes[0],
                    "time": round(self._flushes[1], 6),
                    "max": round(self._flushes[2], 6),
                    "gap": round(self._flushes[4], 6),
                    "thread_cpu": round(self._flush_cpu, 6),
                    "replayed": round(self._replayed_to(), 6),
                    "bytes": writer.bytes if writer is not None else 0,
                },
            },
            dataloaders=list(self.loaders.values()),
            flops=self._flops_record(),
            device=device,
            memory=self._memory_record(),
            faults=[{"where": w, "count": c, "error": e} for w, (c, e) in self.faults.items()],
            notes=list(self.notes),
            position=self._position_or_none(),
            steps={
                "columns": list(STEP_COLUMNS),
                "file": os.path.basename(writer.path) if writer is not None else None,
                "count": writer.written if writer is not None else 0,
            },
            unsaved=self._unsaved_record(),
        )

    def _unsaved_record(self) -> Optional[dict[str, Any]]:
        """The steps held that the last save could not write, and why."""
        exc = self._unsaved
        if exc is None:
            return None
        return {"steps": len(self.tracker.buf) // WIDTH, "errno": exc.errno,
                "error": exc.strerror or str(exc)}

    def _memory_record(self) -> Optional[dict[str, Any]]:
        """Host memory (memory.py) and, on a CUDA run, the allocator's
        sampled steps, out-of-memory errors and snapshot (allocator.py)."""
        memory = self.host_memory.summary() if self.host_memory is not None else None
        cuda: dict[str, Any] = {}
        try:
            if self.allocator is not None:
                cuda.update(self.allocator.summary())
            if self.oom is not None and self.oom.count:
                cuda["oom"] = self.oom.summary()
            if self.snapshots is not None and self.snapshots.written is not None:
                cuda["snapshot"] = self.snapshots.written
        except Exception as exc:
            self.record_fault("cuda.memory", exc)
        if cuda:
            memory = dict(memory or {"children": {}})
            memory["cuda"] = cuda
        return memory

    def position(self) -> dict[str, Any]:
        """Where the rank is now, for `perfrun status` and the hang detector:
        read from the flush thread without running the state machine
        (position.py), so the training thread pays nothing for it."""
        tracker = self.tracker
        clock = self.clock
        pending = list(clock.buf)
        where = locate(
            list(self.phase_clock.stack), pending, tracker.current_index, tracker.open,
            tracker.start if tracker.open else None, tracker.first_kind,
        )
        now = perf_counter()

        def unix(t: Optional[float]) -> Optional[float]:
            return None if t is None else round(self.t0_unix + (t - self.t0), 6)

        return {
            "step": where["step"],
            "phase": describe(where["kinds"], where["open"]),
            "since_unix": unix(where["since"]),
            "step_since_unix": unix(where["step_since"]),
            "written_unix": unix(now),
            "buffered": not clock.live,
        }

    def _position_or_none(self) -> Optional[dict[str, Any]]:
        """The position must never cost the save: a fault is recorded and
        the field left null."""
        try:
            return self.position()
        except Exception as exc:
            self.record_fault("position", exc)
            return None

    def write(self, final: bool = False) -> None:
        """Save: the new steps appended first, then the rank file rewritten
        (a few kilobytes, whatever the run's length), so the rank file never
        counts a step its step file lacks.

        Steps that cannot be written (a full disk) stay held for the next
        save, and the rank file says how many and why (`unsaved`); the
        final save first gives back the space held for it, so that how
        the run ended and how far its results got is written all the same.
        After the final save only another final one writes (the flush
        thread's late round would find room the reserve gave back and
        append steps the final rank file says were not saved)."""
        with self._write_lock:
            if self._final_saved and not final:
                return
            self._final_saved = self._final_saved or final
            began = perf_counter()
            try:
                self._append_ready(final)
                self._unsaved = None
            except OSError as exc:
                self._unsaved = exc
            if self.pipeline is not None:
                try:
                    self.pipeline.flush(final)
                except Exception as exc:
                    self.record_fault("pipeline", exc)
            if final and self.step_writer is not None:
                try:
                    self.step_writer.sync()
                except OSError as exc:
                    self._unsaved = self._unsaved or exc
            if final and self.reserve is not None:
                self.reserve.release()
            write_rank_file(self.path, self.document(), durable=final)
            took = perf_counter() - began
            flushes = self._flushes
            if flushes[3] is not None and began - flushes[3] > flushes[4]:
                flushes[4] = began - flushes[3]
            flushes[3] = began
            flushes[0] += 1
            flushes[1] += took
            if took > flushes[2]:
                flushes[2] = took
