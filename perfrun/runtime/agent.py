"""The in-process lifecycle: start in a rank, hook torch when the script
imports it, flush results during the run (saving.py: what a save writes),
save them at exit, on SIGTERM, just before the script replaces itself with
another program (os.exec*: no exit handler runs then, and the new program
is not measured), or just before it leaves by os._exit
(lite.watch_os_exit: no exit handler either).

Started by the boot `sitecustomize` before the script runs. Everything here
must leave the script's behaviour alone: perfrun's own faults are recorded in
the results and reported by the launcher after the run.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from time import perf_counter
from typing import Any, Callable, Optional

from ..settings import Settings
from ..store.files import Reserve
from ..store.layout import (
    rank_filename,
    rank_stem,
    reserve_path,
    stack_path,
    steps_path,
)
from ..store.rankfile import (
    hostname,
    rank_identity,
    write_rank_file,
)
from ..store.stepfile import STEP_COLUMNS, StepWriter
from . import hooks
from .clock import BufferedClock, PhaseClock
from .cudaside import CudaSide
from .device import DeviceSampler, nvtx_tool_possible
from .hooks import OFF, HookState
from .lifeline import STACK_SIGNAL, ended_status, say_unsaved
from .memory import HostMemory
from .modules import ModuleRanges, RootTracker
from .saving import Saving
from .steps import StepTracker

#: Disk space a rank holds back for its final save (store.files.Reserve):
#: its rank file is a few kilobytes, a few hundred with a detailed
#: window's tables.
RESERVE = 256 * 1024
#: What it holds on a disk too full for RESERVE: room for a rank file
#: without a window's tables, which says how many steps were not saved.
RESERVE_LEAST = 16 * 1024


class Agent(CudaSide, Saving):
    def __init__(
        self,
        payload: dict[str, Any],
        t0: Optional[float] = None,
        t0_unix: Optional[float] = None,
    ) -> None:
        self.settings = Settings.from_json(json.dumps(payload))
        # As the rank file gives them: made once (the settings are frozen),
        # not at every save, where it cost half a millisecond of the GIL.
        self._settings_doc = json.loads(self.settings.to_json())
        # platform.platform() runs `uname -p` and reads python's binary
        # (5-10 ms): taken by the flush thread (_observers), not on the
        # script's thread at `import torch`.
        self._platform: Optional[str] = None
        self.payload = payload
        self.identity = rank_identity(os.environ)
        self.rank = self.identity["rank"]
        self.local_rank = self.identity["local_rank"]
        self.world_size = self.identity["world_size"]
        self.restart = self.identity["restart"]
        self.run_dir = payload["run_dir"]
        self.path = os.path.join(self.run_dir, rank_filename(self.rank, self.restart))
        # The rank's clock starts at boot, before the script ran.
        self.t0 = perf_counter() if t0 is None else t0
        self.t0_unix = time.time() if t0_unix is None else t0_unix
        self.hooks_state = HookState()
        self.tracker = StepTracker(self.settings.step_on, self._step_begin, self._step_end)
        self.tracker.on_relabel = self._relabel
        # --batch-size: every step's samples, written as the step commits
        # (a committed step may be taken by the writer at any moment).
        self.tracker.fixed_samples = self.settings.batch_size
        self.tracker.origin = self.t0
        self.phase_clock = PhaseClock(self.tracker)
        # What the hooks report edges to: a buffer replayed through the
        # phase clock in batches, made live (every edge straight to the
        # state machine) while something needs step boundaries and phase
        # edges the moment they happen (see _update_listener).
        self.clock = BufferedClock(self.phase_clock, on_fault=self.record_fault)
        self.count_samples = self.settings.batch_size is None
        # The first step index not to run (--stop-after, --stop-after-window),
        # decided once rather than at every step.
        stops = [self.settings.stop_after]
        if self.settings.stop_after_window and self.settings.scheduler is not None:
            stops.append(self.settings.scheduler[1])
        self._stop_at = min((s for s in stops if s is not None), default=float("inf"))
        self.clock.set_live(self._stop_at != float("inf"))
        self.faults: dict[str, list[Any]] = {}
        self.notes: list[str] = []
        self.loaders: dict[int, dict[str, Any]] = {}
        self.status = "running"
        self.exit: dict[str, Any] = {"exception": None, "signal": None}
        self.torch: Any = None
        self.torch_version: Optional[str] = None
        self.cuda: dict[str, Any] = {}
        self.gpu_timer: Any = None
        self.nvtx: Any = None
        self.window: Any = None
        self.roots = RootTracker()
        self.module_ranges: Any = None
        self._cuda_possible = False
        self._gpu_undo: Optional[Callable[[], None]] = None
        self._begin_listeners: list[Callable[[int, float], None]] = []
        self._end_listeners: list[Callable[[int, float, bool], None]] = []
        self._undo: list[Any] = []
        self.step_writer: Optional[StepWriter] = None
        self.reserve: Optional[Reserve] = None
        # Why the last save could not write the steps it held (a full
        # disk): they stay held for the next save, and the rank file says
        # how many and why.
        self._unsaved: Optional[OSError] = None
        # Saves so far: count, total seconds, longest (reported in the
        # rank file, so a user can see what perfrun's flushing costs), when
        # the last one began and the longest time between two that began
        # one after the other (what bounds the steps a kill can cost).
        self._flushes = [0, 0.0, 0.0, None, 0.0]
        # The flush thread's CPU time so far (its samplers, saves and the
        # observers it made), read by itself after each round: the most it
        # can have taken from the script's thread, through the GIL.
        self._flush_cpu = 0.0
        self._write_lock = threading.Lock()
        # Set by the final save: a flush that takes the lock after it (the
        # flush thread was past its wait as the run ended) writes nothing,
        # so the step file never holds rows the rank file does not count.
        self._final_saved = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._finished = False
        self._pid = os.getpid()
        self.sampler: Optional[DeviceSampler] = None
        self.host_memory: Optional[HostMemory] = None
        # The CUDA devices' UUIDs, once the script initialised CUDA (for
        # a sampler made after that).
        self._cuda_uuids: Optional[list[str]] = None
        # The CUDA allocator (allocator.py): per-phase peaks on sampled
        # steps (default mode), out-of-memory errors, --memory-snapshot.
        self.allocator: Any = None
        self.oom: Any = None
        self.snapshots: Any = None
        self.flops: Any = None  # the FLOP counter (flops.py), default mode only
        self.pipeline: Any = None  # the fetches' stages (pipeline.py), default mode only
        self.trackers: Any = None  # the script's experiment trackers (trackers.py)
        # What else reads each step once it is final (see add_row_consumer).
        self._row_consumers: list[Callable[[Any, int, int], None]] = []
        self._cuda_later = False
        self.metrics: Any = None  # the Prometheus endpoint (metrics.py), --metrics-port only
        self._exec_note = ""
        self._stack_file: Any = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        if self.settings.scheduler is not None and not self.settings.timer_only:
            # torch.profiler's backend logs its start and stop on stderr;
            # without perfrun the script would print no such lines.
            os.environ.setdefault("KINETO_LOG_LEVEL", "99")
        self.step_writer = StepWriter(steps_path(self.path), STEP_COLUMNS)
        self.reserve = Reserve(reserve_path(self.run_dir, rank_stem(self.rank, self.restart)),
                               RESERVE, RESERVE_LEAST)
        try:
            self.write()
        except OSError:
            # A disk full from the start: profiling goes on, the steps are
            # held, and the final save (with the reserve's room) says how
            # many were not saved.
            pass
        atexit.register(self._atexit)
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        os.register_at_fork(after_in_child=self._forked)
        self._watch_exec()
        if self.settings.hang_timeout is not None:
            self._stack_dump()

    def _stack_dump(self) -> None:
        """--hang-timeout: on the launcher's signal, write every thread's
        Python stack to the run folder. faulthandler does it from its C
        signal handler, so it works while the main thread is blocked in a
        sleep, a lock or a collective, where a Python handler would never
        run. A handler the script had set still runs after it (chained); one
        it sets later replaces ours (the report then says no stack)."""
        try:
            import faulthandler

            previous = signal.getsignal(STACK_SIGNAL)
            self._stack_file = open(stack_path(self.run_dir, self.rank, self.restart), "w")
            faulthandler.register(
                STACK_SIGNAL, file=self._stack_file, all_threads=True,
                # Chaining the default action would end the rank.
                chain=callable(previous),
            )
        except Exception as exc:
            self.record_fault("hang", exc)

    def _on_torch(self, torch: Any) -> None:
        try:
            self.torch = torch
            self.torch_version = str(getattr(torch, "__version__", "?"))
            self._undo = hooks.install(torch, self)
            hooks.install_excepthook(self.record_fault)
            self._setup_window(torch)
            self._setup_gpu_and_nvtx(torch)
            self._setup_flops(torch)
            self._setup_pipeline(torch)
            self._setup_trackers()
            self._setup_metrics()
            self._thread = threading.Thread(
                target=self._flush_loop, name="perfrun-flush", daemon=True
            )
            self._thread.start()
        except Exception as exc:
            self.record_fault("setup", exc)
        # Saved now, not at the first flush: a rank killed outright in its
        # first seconds (SIGKILL, the out-of-memory killer) imported torch,
        # and its report must not say it never did.
        try:
            self.write()
        except Exception:
            pass

    def _setup_gpu_and_nvtx(self, torch: Any) -> None:
        version = getattr(torch, "version", None)
        # --timer-only keeps no per-step CUDA check: its flush thread looks
        # for CUDA every flush, for the out-of-memory observer (_flush_loop).
        self._cuda_later = bool(self.settings.timer_only and getattr(version, "cuda", None))
        if not self.settings.timer_only:
            # Only whether this torch was built with CUDA (or ROCm): asking
            # `torch.cuda.is_available()` here, right after the script's
            # `import torch`, would initialise the driver (cuInit, NVML)
            # before the script set CUDA_VISIBLE_DEVICES or forked its
            # workers. CUDA is touched only once the script initialised it
            # (see _maybe_start_cuda).
            version = getattr(torch, "version", None)
            self._cuda_possible = bool(
                getattr(version, "cuda", None) or getattr(version, "hip", None)
            )
        if self.settings.use_nvtx and nvtx_tool_possible(os.environ):
            try:
                import nvtx

                from .gpu import NvtxRanges

                self.nvtx = NvtxRanges(nvtx)
                if self.nvtx.attached:
                    # Without a tool the ranges are no-ops: no callback.
                    self._begin_listeners.append(self.nvtx.step_begin)
                    self._end_listeners.append(self.nvtx.step_end)
            except Exception as exc:
                self.notes.append(f"NVTX ranges off: the nvtx package is unavailable ({exc})")
        if self.window is not None or self._nsys_here():
            domain = self.nvtx.domain if self.nvtx is not None else None
            self.module_ranges = ModuleRanges(torch, self.settings.module_depth, domain,
                                              record=self.window is not None,
                                              state=self.hooks_state)
        self._update_listener()

    def _setup_window(self, torch: Any) -> None:
        if self.settings.scheduler is None or self.settings.timer_only:
            return
        from .window import ProfilerWindow

        self.window = ProfilerWindow(self, torch)
        self._begin_listeners.append(self.window.step_begin)
        self._end_listeners.append(self.window.step_end)

    # -- the Prometheus endpoint (metrics.py) --------------------------------------

    def _setup_metrics(self) -> None:
        """--metrics-port: serve this rank's figures on PORT + its local
        rank, tallied by the flush thread (a row consumer) and served from a
        thread of the endpoint's own. A port that cannot be had is a note,
        and the run goes on."""
        port = self.settings.metrics_port
        if port is None:
            return
        try:
            from .metrics import RankMetrics, failure_note

            metrics = RankMetrics(
                {"rank": str(self.rank), "node": hostname(),
                 "job": os.path.basename(os.path.normpath(self.run_dir))},
                self._metrics_readings,
            )
            self.add_row_consumer(metrics.rows)
            port += self.local_rank

            def failed(exc: OSError) -> None:
                self.note_once(failure_note(self.rank, port, exc))

            metrics.serve(port, failed)
            self.metrics = metrics
        except Exception as exc:
            self.record_fault("metrics", exc)

    def _metrics_readings(self) -> dict[str, Any]:
        """What a scrape reads besides the steps, on the endpoint's thread:
        plain reads of what the agent and the flush thread last set."""
        from .stepmetrics import rank_state

        memory = self.host_memory
        process = memory.process if memory is not None else None
        flops = self.flops
        counted = None
        if flops is not None and flops.done and flops.step is not None and flops.reason is None:
            counts = flops.counts
            counted = counts["forward"] + counts["backward"] + counts["optimizer"]
        allocator = self.allocator
        return {
            "state": rank_state(self.status, self.exit),
            "memory": process.last if process is not None else None,
            "flops": counted,
            # The CUDA allocator's last sampled step (allocator.py).
            "gpu_memory": allocator.latest() if allocator is not None else None,
        }

    # -- FLOPs (flops.py) ---------------------------------------------------------

    def _setup_flops(self, torch: Any) -> None:
        """Count the FLOPs of one step, in the default mode only (the
        counted step is several times slower: timer-only promises a cheap
        run). The hooks must hear that step begin as it begins, so the
        clock stays live until it has ended."""
        if self.settings.timer_only or not self.settings.count_flops:
            return
        try:
            from .flops import FlopCounter, counted_step

            sched = self.settings.scheduler
            profiled = (max(0, sched[0] - 1), sched[1]) if sched else None
            self.flops = FlopCounter(torch, self.hooks_state, self.tracker, self.record_fault,
                                     counted_step(profiled, sched[0] if sched else None))
            self._begin_listeners.append(self._flops_step_begin)
            self._end_listeners.append(self._flops_step_end)
            self._update_listener()  # live until the counted step has ended
        except Exception as exc:
            self.flops = None
            self.record_fault("flops", exc)

    def _flops_pending(self) -> bool:
        """Whether the FLOP counter still waits for its step (the clock must
        then be live)."""
        return self.flops is not None and not self.flops.done

    def _flops_step_begin(self, index: int, t: float) -> None:
        # Heard live: the clock stays live while the counter waits (see
        # _update_listener), so the step is counted from its first edge.
        flops = self.flops
        if flops is not None and not flops.done:
            flops.step_begin(index, t)

    def _flops_step_end(self, index: int, t: float, committed: bool) -> None:
        flops = self.flops
        if flops is None or flops.done:
            return
        flops.step_end(index, t, committed)
        if flops.done:
            # New lists, as in _detach_gpu_timer: these are being iterated.
            self._begin_listeners = [f for f in self._begin_listeners
                                     if f != self._flops_step_begin]
            self._end_listeners = [f for f in self._end_listeners
                                   if f != self._flops_step_end]
            self._update_listener()  # the clock may go back to buffering

    def _flops_record(self) -> Optional[dict[str, Any]]:
        if self.flops is None:
            why = ("off (--timer-only)" if self.settings.timer_only
                   else "off (--no-flops)" if not self.settings.count_flops else None)
            return {"counted": False, "step": None, "reason": why} if why else None
        try:
            return self.flops.result()
        except Exception as exc:
            self.record_fault("flops", exc)
            return None

    def _setup_trackers(self) -> None:
        """Log perfrun's figures into the script's own tracker run
        (trackers.py): rank 0's, or every rank's with --tracker-all-ranks."""
        settings = self.settings
        if not settings.tracker or (self.rank != 0 and not settings.tracker_all_ranks):
            return
        try:
            from .trackers import Trackers

            trackers = Trackers(self)
            trackers.install()
            self.trackers = trackers
            self.add_row_consumer(trackers.rows)
        except Exception as exc:
            self.trackers = None
            self.record_fault("tracker", exc)

    def flush_for_tracker(self) -> None:
        """Save the steps up to now, for a tracker run the script is
        closing (trackers.py): its last point must come before the close.
        Edges are replayed only on the main thread, where scripts train
        (elsewhere the flush thread's save has them, a flush later)."""
        if self._finished or os.getpid() != self._pid:
            return
        try:
            if threading.current_thread() is threading.main_thread():
                self.clock.drain()
            self.write()
        except OSError:
            pass  # a full disk: the final save says
        except Exception as exc:
            self.record_fault("tracker.flush", exc)

    def _setup_pipeline(self, torch: Any) -> None:
        """Time each DataLoader fetch stage by stage, in the default mode
        only (timer-only promises the cheapest run)."""
        if self.settings.timer_only:
            return
        try:
            from .pipeline import Pipeline

            pipeline = Pipeline(self.run_dir, rank_stem(self.rank, self.restart),
                                self.record_fault)
            self._undo.extend(pipeline.install(torch))
            self.pipeline = pipeline
        except Exception as exc:
            self.pipeline = None
            self.record_fault("pipeline", exc)

    def _nsys_here(self) -> bool:
        """Is this rank profiled by nsys (all ranks, or one of --nsys-ranks)?"""
        if not self.settings.nsys:
            return False
        chosen = self.settings.nsys_ranks
        return chosen is None or str(self.rank) in {r.strip() for r in chosen.split(",")}

    def _update_listener(self) -> None:
        """Who hears each phase edge, and whether the clock must be live.

        It is live while something acts on edges or step boundaries as they
        happen: NVTX ranges with a tool attached (without one, nvtx's domain
        is a no-op stand-in, so its ranges are left out), the CUDA timer,
        the profiler window, module ranges (--nsys), --stop-after, the FLOP
        counter until its step has ended (it must hear that step begin as
        it begins), and a torch built with CUDA until the script initialised
        it (the step boundary checks for that).
        Otherwise edges are buffered, as in --timer-only: the default mode on
        a CPU run pays what the timer-only mode pays."""
        nvtx = self.nvtx if self.nvtx is not None and self.nvtx.attached else None
        snapshots = self.snapshots if not self.settings.timer_only else None
        edges = [x.edge for x in (nvtx, self.gpu_timer, self.window, self.allocator,
                                  snapshots) if x is not None]
        # Steps replayed in bulk call no step callback (steady.py): only
        # while every callback would do nothing. Set before the drain that
        # going live makes, which replays what was buffered before.
        boundaries = (self._cuda_possible or self.module_ranges is not None
                      or self._stop_at != float("inf"))
        self.clock.bulk = not (self._begin_listeners or self._end_listeners or boundaries)
        self.clock.set_live(bool(edges) or self.window is not None or boundaries
                            or self._flops_pending())
        if not edges:
            self.phase_clock.listener = None
        elif len(edges) == 1:
            self.phase_clock.listener = edges[0]
        else:

            def every(kind: int, enter: bool, is_eval: bool) -> None:
                for edge in edges:
                    edge(kind, enter, is_eval)

            self.phase_clock.listener = every

    # -- step callbacks (from the tracker) ---------------------------------------

    def _step_begin(self, index: int, t: float) -> None:
        if index >= self._stop_at:
            self._request_stop()
        if self._cuda_possible:
            try:
                self._maybe_start_cuda()
            except Exception as exc:
                self._cuda_possible = False
                self.record_fault("cuda", exc)
        for listener in self._begin_listeners:
            listener(index, t)
        ranges = self.module_ranges
        if ranges is not None and self.window is None and index == 1 and not ranges.attached:
            # --nsys without a window: module ranges for the whole run, from
            # the first step on which the model's roots are known.
            try:
                ranges.attach(self.roots.alive())
            except Exception as exc:
                self.record_fault("modules", exc)

    def _step_end(self, index: int, t: float, committed: bool) -> None:
        for listener in self._end_listeners:
            listener(index, t, committed)

    def _relabel(self, names: list[str]) -> None:
        for target in (self.window, self.gpu_timer):
            if target is not None:
                target.relabel(names)

    def _stop_option(self) -> str:
        """The option whose stop ended the script: --stop-after, or
        --stop-after-window when the window's end came first."""
        after = self.settings.stop_after
        if after is not None and after <= self._stop_at:
            return f"--stop-after {after}"
        return "--stop-after-window"

    def _request_stop(self) -> None:
        """--stop-after: end the script cleanly, as `sys.exit(0)` would, at
        the start of the first step past the limit."""
        self.status = "stopped"
        self.hooks_state.block = OFF
        self.tracker.open = False
        raise SystemExit(0)

    # -- called by the hooks ------------------------------------------------------

    def record_fault(self, where: str, exc: BaseException) -> None:
        entry = self.faults.get(where)
        if entry is None:
            self.faults[where] = [1, f"{type(exc).__name__}: {exc}"[:300]]
        else:
            entry[0] += 1

    def note_once(self, note: str) -> None:
        """A note for the report, said once however often its cause recurs
        (hooks.py: training perfrun cannot see, in processes the script
        spawns or on threads other than the script's)."""
        if note not in self.notes:
            self.notes.append(note)

    def note_dataloader(self, loader: Any, grad: bool = True) -> Any:
        """Remember a DataLoader's settings (for the advice), as its iterator
        is about to be made; returns the loader's stages to time the
        iterator with (pipeline.py), None in timer-only. `grad`: whether its
        iterator is made with gradients on; a loader iterated only under
        no_grad is an evaluation loader, not the one steps wait on."""
        key = id(loader)
        known = self.loaders.get(key)
        if known is not None:
            known["training"] = known["training"] or grad
        else:
            known = self.loaders[key] = self._loader_entry(loader, grad)
        pipeline = self.pipeline
        if pipeline is None:
            return None
        stages = pipeline.loader(loader, known)
        pipeline.before_iter(stages)
        return stages

    def attach_iterator(self, stages: Any, it: Any) -> None:
        """Time a loader's new iterator stage by stage (pipeline.py)."""
        if self.pipeline is not None:
            self.pipeline.attach(stages, it)

    @staticmethod
    def _loader_entry(loader: Any, grad: bool) -> dict[str, Any]:
        # A loader given a batch_sampler (accelerate's, a bucketing one) has
        # batch_size None: its samples a batch are the batch sampler's.
        samples = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        return {
            "batch_sampler_size": samples if type(samples) is int else None,
            "training": grad,
            "num_workers": getattr(loader, "num_workers", None),
            "pin_memory": getattr(loader, "pin_memory", None),
            "persistent_workers": getattr(loader, "persistent_workers", None),
            "prefetch_factor": getattr(loader, "prefetch_factor", None),
            "batch_size": getattr(loader, "batch_size", None),
            "dataset": type(getattr(loader, "dataset", None)).__name__,
            "sampler": type(getattr(loader, "sampler", None)).__name__,
            "batch_sampler": type(getattr(loader, "batch_sampler", None)).__name__,
            "collate_fn": getattr(getattr(loader, "collate_fn", None), "__name__", None),
        }

    def finish(self) -> None:
        if self._finished or os.getpid() != self._pid:
            return
        self._finished = True
        self.hooks_state.block = OFF
        self._stop.set()
        try:
            self.clock.unwind()
        except Exception as exc:
            self.record_fault("finish", exc)
        self.tracker.finish(perf_counter())
        if self.status == "stopped" and self.hooks_state.steps_off:
            self.notes.append(stop_caught_note(self._stop_option(), self.tracker.committed,
                                               self.hooks_state.steps_off))
        nograd = self.tracker.nograd_from
        if nograd is not None:
            self.notes.append(
                "a forward under no_grad, of a module in training mode, ran in every step "
                "(an action chosen, targets computed): counted in the steps' Forward from "
                f"step {nograd} on; the steps before it leave it out, as evaluation"
            )
        if self.flops is not None:
            try:
                self.flops.finish()
            except Exception as exc:
                self.record_fault("flops", exc)
        if self.window is not None:
            try:
                self.window.finish()
            except Exception as exc:
                self.record_fault("window", exc)
        timer = self.gpu_timer
        if timer is not None:
            try:
                timer.synchronize(self.torch)
            except Exception:
                pass
            if timer.unknown:
                self.notes.append(
                    f"GPU time unknown for {timer.unknown} steps: a CUDA graph was being "
                    "captured during them (perfrun records no event into a capture)"
                )
        if self.snapshots is not None:
            self.snapshots.dump("end of run")
        last = getattr(sys, "last_value", None)
        if last is not None and self.exit["exception"] is None:
            self.exit["exception"] = type(last).__name__
        if self.status == "running":
            self.status = ended_status(last, self.exit)
        if self.sampler is not None:
            self.sampler.sample()
        if self.host_memory is not None:
            self.host_memory.sample(perf_counter() - self.t0)
        self.write(final=True)
        if self.trackers is not None:
            self._finish_trackers()

    def _finish_trackers(self) -> None:
        """The last figures to the tracker runs still open, after the final
        save (a tracker never holds up the results); the rank file again
        when that had something to say."""
        notes = len(self.notes)
        try:
            self.trackers.finish()
        except Exception as exc:
            self.record_fault("tracker", exc)
        if len(self.notes) != notes or "tracker" in self.faults:
            try:
                write_rank_file(self.path, self.document(), durable=True)
            except OSError:
                pass

    def _atexit(self) -> None:
        try:
            self.finish()
        except Exception as exc:  # never let our exit handler change the exit
            say_unsaved(exc, *self._not_saved())

    def _not_saved(self) -> tuple[int, int]:
        """Steps that ran and are not in the step file, and steps that ran."""
        try:
            ran = self.tracker.committed
            written = self.step_writer.written if self.step_writer is not None else 0
            return max(0, ran - written), ran
        except Exception:
            return 0, 0

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.status == "running":
            self.status = "signalled"
        self.exit["signal"] = signum
        self._atexit()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def before_os_exit(self, status: Any) -> None:
        """The script calls os._exit(status) (lite.watch_os_exit): no exit
        handler will run, so this is the final save, with the status the
        script gave, and every step it recorded up to the call."""
        if self._finished or os.getpid() != self._pid:
            return
        try:
            if type(status) is int:
                self.exit["os_exit"] = status
            self.finish()
        except Exception as exc:
            say_unsaved(exc, *self._not_saved())

    def _watch_exec(self) -> None:
        """Save before os.exec*: the process keeps its pid but not its
        Python, so neither atexit nor the flush thread runs again, and the
        steps since the last flush would be lost. os.execl, execle, execlp,
        execvp and execvpe all end in os.execv or os.execve."""
        for name in ("execv", "execve"):
            original = getattr(os, name, None)
            if original is None or getattr(original, "__perfrun__", False):
                continue
            setattr(os, name, self._exec_wrapper(original))

    def _exec_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        agent = self

        def exec_(path: Any, *args: Any) -> Any:
            agent._before_exec(path)
            try:
                return original(path, *args)
            except BaseException as exc:
                agent._exec_failed(exc)
                raise

        exec_.__perfrun__ = True  # type: ignore[attr-defined]
        exec_.__wrapped__ = original  # type: ignore[attr-defined]
        exec_.__name__ = original.__name__
        exec_.__doc__ = original.__doc__
        return exec_

    def _before_exec(self, path: Any) -> None:
        if self._finished or os.getpid() != self._pid:
            return
        try:
            program = os.fsdecode(path)
        except Exception:
            program = str(path)
        try:
            self.exit["exec"] = program
            self._exec_note = (
                f"rank {self.rank} replaced itself with {os.path.basename(program)} "
                "(os.exec*): what ran after that is not measured"
            )
            self.notes.append(self._exec_note)
            self.finish()
        except Exception as exc:
            say_unsaved(exc, *self._not_saved())

    def _exec_failed(self, exc: BaseException) -> None:
        """The exec did not happen (no such program...): the script goes on,
        no longer measured; say so rather than claim it was replaced."""
        if os.getpid() != self._pid or self.exit.get("exec") is None:
            return
        try:
            program = self.exit.pop("exec")
            self.notes[:] = [n for n in self.notes if n != self._exec_note]
            self.notes.append(
                f"rank {self.rank} tried to replace itself with {program} (os.exec*), "
                f"which failed ({type(exc).__name__}); what ran after that is not measured"
            )
            self.write(final=True)
        except Exception:
            pass

    def _forked(self) -> None:
        # A forked child (DataLoader worker) is not a rank: switch off.
        self.hooks_state.block = OFF
        self._finished = True


_agent: Optional[Agent] = None


def stop_caught_note(option: str, steps: int, after: int) -> str:
    """What the report says when the script caught perfrun's stop (the
    SystemExit(0) it raises, which `except BaseException` or `except
    SystemExit` swallows) and trained on: the hooks are off from the stop,
    so those steps are not in the results, and without this the report
    would read as if the script had stopped where its results do."""
    more = f"{after} more optimizer step" + ("" if after == 1 else "s")
    held = f"{steps} step" + ("" if steps == 1 else "s")
    return (f"{option}: perfrun ended the script after {held} (SystemExit(0)), but the "
            f"script caught it and trained on: {more} ran after the stop, which perfrun did "
            f"not record; the results hold the {held} before it")


def start(payload: dict[str, Any], t0: float, t0_unix: float) -> Agent:
    """Called by the bootstrap (lite.py) once the script has imported torch."""
    global _agent
    _agent = Agent(payload, t0, t0_unix)
    _agent.start()
    return _agent


def current() -> Optional[Agent]:
    return _agent
