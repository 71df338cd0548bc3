"""The agent's CUDA side (a part of runtime/agent.py's Agent, kept apart):
the CUDA phase timer once the script has initialised CUDA, the allocator's
parts (per-phase peaks, the out-of-memory observer, --memory-snapshot:
allocator.py), the device the script works on, and how a faulty part is
detached.

Why a part of its own: what happens the moment the script's CUDA exists is
one concern (never before it, never on the wrong device, never at a cost to
a CPU run), and the agent's file holds the rank's lifecycle.
Everything here runs on the agent's own state (its listeners, settings,
faults), so it is a base class of Agent, not an object beside it.
"""

from __future__ import annotations

from typing import Any, Optional

from ..store.layout import memory_snapshot_path, rank_stem


class CudaSide:
    """Agent's methods for CUDA (see the module's docstring). Attributes
    are the agent's own (Agent.__init__)."""

    torch: Any
    settings: Any
    roots: Any
    local_rank: int
    run_dir: str
    rank: int
    restart: int
    tracker: Any
    sampler: Any
    _cuda_uuids: Any
    cuda: dict[str, Any]
    gpu_timer: Any
    allocator: Any
    oom: Any
    snapshots: Any
    _cuda_possible: bool
    _cuda_later: bool
    _gpu_undo: Any
    _begin_listeners: list[Any]
    _end_listeners: list[Any]
    # Called here, defined by Agent: record_fault, _update_listener, position.

    def _maybe_start_cuda(self) -> None:
        """Start the CUDA phase timer once the script itself has
        initialised CUDA. `torch.cuda.is_initialized()` reads a Python flag
        (and the bad-fork flag): no driver call, so it is safe at every step
        begin until then. Before it, perfrun never touches CUDA: no context
        (on the wrong device, before set_device), no driver initialisation
        that would break a later CUDA_VISIBLE_DEVICES or a fork."""
        torch = self.torch
        if not torch.cuda.is_initialized():
            return
        self._cuda_possible = False
        from .gpu import CudaPhaseTimer, guard_captures

        timer = CudaPhaseTimer(
            torch,
            device_of=self.cuda_device,
            on_fault=self._gpu_fault,
            first_row=self.tracker.current_index,
        )
        self.gpu_timer = timer
        self._begin_listeners.append(timer.step_begin)
        self._end_listeners.append(timer.step_end)
        self._update_listener()
        try:
            self._gpu_undo = guard_captures(torch, timer)
        except Exception as exc:
            self.record_fault("cuda.graphs", exc)
        try:
            device = self.cuda_device()
            self.cuda = {
                "version": torch.version.cuda,
                "device": device,
                "name": torch.cuda.get_device_name(device),
                "current_device": torch.cuda.current_device(),
            }
        except Exception:
            pass
        self._start_allocator(torch)
        try:
            count = torch.cuda.device_count()
            uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
            # Kept for a sampler the flush thread makes later (saving.py
            # _observers); given to the one that exists now.
            self._cuda_uuids = uuids
            sampler = self.sampler
            if sampler is not None:
                sampler.use_cuda_uuids(uuids)
        except Exception as exc:
            self.record_fault("device.uuid", exc)

    def _start_allocator(self, torch: Any) -> None:
        """The allocator's parts, once the script has initialised CUDA: the
        out-of-memory observer always (it costs nothing until one happens),
        the sampled per-phase peaks in the default mode, the history with
        --memory-snapshot (its phase tags in the default mode only)."""
        from .allocator import AllocatorPhases, OutOfMemory, Snapshots

        if self.settings.memory_snapshot:
            try:
                path = memory_snapshot_path(self.run_dir, rank_stem(self.rank, self.restart))
                self.snapshots = Snapshots(torch, path, on_fault=self.record_fault)
                if not self.settings.timer_only:
                    self._begin_listeners.append(self.snapshots.step_begin)
            except Exception as exc:
                self.snapshots = None
                self.record_fault("cuda.snapshot", exc)
        try:
            snapshots = self.snapshots
            self.oom = OutOfMemory(
                torch, self.position, self._module_name, on_fault=self.record_fault,
                then=(lambda: snapshots.dump("out of memory")) if snapshots is not None else None,
            )
            self.oom.attach()
        except Exception as exc:
            self.oom = None
            self.record_fault("cuda.oom", exc)
        if not self.settings.timer_only:
            try:
                phases = AllocatorPhases(torch, self.cuda_device, on_fault=self._allocator_fault)
                if self.snapshots is not None:
                    phases.on_sampled = lambda p: self.snapshots.size_for(p.events_per_step)
                self.allocator = phases
                self._begin_listeners.append(phases.step_begin)
                self._end_listeners.append(phases.step_end)
            except Exception as exc:
                self.allocator = None
                self.record_fault("cuda.memory", exc)
            self._update_listener()

    def _cuda_from_flush(self) -> None:
        """--timer-only: once the script has initialised CUDA, the
        out-of-memory observer (and --memory-snapshot's history, without
        phase tags), from the flush thread: the steps pay nothing."""
        torch = self.torch
        if torch is None or not torch.cuda.is_initialized():
            return
        self._cuda_later = False
        self._start_allocator(torch)

    def _allocator_fault(self, where: str, exc: BaseException) -> None:
        """The per-phase peaks faulted and switched themselves off (in the
        script's thread, at an edge): recorded, and no longer called. (The
        snapshot and the observer check their own `off` at each call.)"""
        self.record_fault(where, exc)
        part, self.allocator = self.allocator, None
        if part is None:
            return
        self._begin_listeners = [f for f in self._begin_listeners
                                 if getattr(f, "__self__", None) is not part]
        self._end_listeners = [f for f in self._end_listeners
                               if getattr(f, "__self__", None) is not part]
        self._update_listener()

    def _module_name(self, module: Any) -> Optional[str]:
        """A module's qualified name in the script's model (its roots), for
        the out-of-memory record; called only then."""
        for root in self.roots.alive():
            if root is module:
                return type(root).__name__
            for name, sub in root.named_modules():
                if sub is module:
                    return f"{type(root).__name__}.{name}"
        return None

    def cuda_device(self) -> int:
        """The device the script works on (gpu.work_device); only once the
        script initialised CUDA."""
        from .gpu import work_device

        return work_device(self.torch, self.roots, self.local_rank)

    def _gpu_fault(self, where: str, exc: BaseException) -> None:
        """The CUDA timer faulted (it has switched itself off): record it
        and detach it completely, so no listener of it runs again."""
        self.record_fault(where, exc)
        self._detach_gpu_timer()

    def _detach_gpu_timer(self) -> None:
        timer, self.gpu_timer = self.gpu_timer, None
        if timer is None:
            return
        timer.off = True
        # New lists rather than removal in place: a fault inside the step
        # callbacks happens while these very lists are being iterated.
        self._begin_listeners = [f for f in self._begin_listeners
                                 if getattr(f, "__self__", None) is not timer]
        self._end_listeners = [f for f in self._end_listeners
                               if getattr(f, "__self__", None) is not timer]
        self._update_listener()
        undo, self._gpu_undo = self._gpu_undo, None
        if undo is not None:
            try:
                undo()
            except Exception as exc:
                self.record_fault("cuda.graphs", exc)
