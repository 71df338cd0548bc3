"""GPU memory over the run, from the CUDA allocator's sampled steps (the
rank files' `memory.cuda` sections, runtime/allocator.py): the steady peak
per phase and which phase sets it, the fragmentation at the peak, allocated
memory that creeps, and the out-of-memory errors. Pure functions over plain
data.

Steady figures are medians over the sampled steps past the warm-up and the
run's first tenth (memory.steady_start): a step's peak per phase is a
maximum already; the median over steps says what a steady step needs, not
what the one worst step did (the first step, a checkpoint).

Creep is decided by memory.creep over the allocated bytes at the end of each
sampled step: what a step leaves behind. Which phase made what stays cannot
be told from counters (every phase's peak and every edge's reading moves up
by the same bytes a step, and a forward always nets what its backward
frees); the snapshot (--memory-snapshot) tags each live allocation with the
step and phase it was made in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Optional

from perfrun.analysis.memory import Creep, creep, steady_points, steady_start
from perfrun.store.schema import as_int

#: The buckets of a sampled row (runtime/allocator.BUCKETS), as the report
#: names them.
PHASE_TITLES = {"dataloader": "Dataloader", "forward": "Forward", "backward": "Backward",
                "optimization": "Optimization", "others": "Others", "eval": "Evaluation"}
_ROW = 15


@dataclass(frozen=True)
class PhasePeak:
    """A phase's peak over the steady sampled steps: the median step's and
    the highest, allocated and reserved, bytes; `steps`: how many sampled
    steps entered it."""

    phase: str
    allocated: int
    allocated_max: int
    reserved: int
    reserved_max: int
    steps: int

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "allocated": self.allocated,
                "allocated_max": self.allocated_max, "reserved": self.reserved,
                "reserved_max": self.reserved_max, "steps": self.steps}


@dataclass(frozen=True)
class DeviceMemory:
    """One rank's GPU memory: its device and the device's memory (`total`),
    the phases' steady peaks, the step's (`peak_allocated`, the median
    sampled step's highest phase), the phase that sets it, the reserved
    memory not allocated at that peak (`fragmentation`), creep, the
    out-of-memory errors (`oom`, as recorded) and the snapshot written."""

    rank: int
    device: Optional[int]
    total: Optional[int]
    sampled: int
    phases: tuple[PhasePeak, ...]
    peak_allocated: Optional[int]
    peak_reserved: Optional[int]
    peak_phase: Optional[str]
    fragmentation: Optional[int]
    creep: Optional[Creep]
    oom: Optional[Mapping[str, Any]] = None
    snapshot: Optional[Mapping[str, Any]] = None
    #: (step, allocated, reserved) at the end of each sampled step, for the
    #: page's chart.
    points: tuple[tuple[int, int, int], ...] = field(default=())

    @property
    def label(self) -> str:
        return f"rank {self.rank}" + (f" cuda:{self.device}" if self.device is not None else "")

    def share(self, value: Optional[int]) -> Optional[float]:
        """`value` as a share of the device's memory (0..1)."""
        if value is None or not self.total:
            return None
        return value / self.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "device": self.device,
            "total": self.total,
            "sampled": self.sampled,
            "phases": [p.to_dict() for p in self.phases],
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "peak_phase": self.peak_phase,
            "fragmentation": self.fragmentation,
            "creep": self.creep.to_dict() if self.creep is not None else None,
            "oom": dict(self.oom) if self.oom is not None else None,
            "snapshot": dict(self.snapshot) if self.snapshot is not None else None,
            "points": [list(p) for p in self.points],
        }


def _rows(section: Mapping[str, Any]) -> list[list[int]]:
    rows = section.get("rows")
    return [r for r in rows if isinstance(r, list) and len(r) == _ROW
            and all(isinstance(v, int) and not isinstance(v, bool) for v in r)] \
        if isinstance(rows, list) else []


def device_memory(rank: int, section: Mapping[str, Any], warmup: int,
                  last_step: int) -> Optional[DeviceMemory]:
    """A rank's `memory.cuda` section summarised (see the module's rule);
    None when it holds neither a sampled step nor an out-of-memory error."""
    buckets = section.get("buckets")
    if not isinstance(buckets, list) or len(buckets) != 6:
        buckets = list(PHASE_TITLES)
    rows = _rows(section)
    oom = section.get("oom") if isinstance(section.get("oom"), Mapping) else None
    if not rows and oom is None:
        return None
    start = steady_start(warmup, last_step)
    steady = [r for r in rows if start <= r[0] <= last_step] or rows
    phases = []
    for b, name in enumerate(buckets):
        alloc = [r[3 + b] for r in steady if r[3 + b] >= 0]
        res = [r[9 + b] for r in steady if r[9 + b] >= 0]
        if not alloc:
            continue
        phases.append(PhasePeak(str(name), int(median(alloc)), max(alloc),
                                int(median(res)) if res else 0, max(res) if res else 0,
                                len(alloc)))
    peak_allocated = peak_reserved = fragmentation = None
    peak_phase = None
    if steady:
        step_peaks = [max(r[3:9]) for r in steady]
        peak_allocated = int(median(step_peaks))
        peak_reserved = int(median([max(r[9:15]) for r in steady]))
        top = max(phases, key=lambda p: p.allocated, default=None)
        peak_phase = top.phase if top is not None else None
        worst = max(steady, key=lambda r: max(r[3:9]))
        b = max(range(6), key=lambda i: worst[3 + i])
        fragmentation = max(0, worst[9 + b] - worst[3 + b])
    total = as_int(section.get("total"))
    growing = creep(steady_points([r[:2] for r in rows], warmup, last_step), total)
    return DeviceMemory(
        rank=rank,
        device=as_int(section.get("device")),
        total=total,
        sampled=len(rows),
        phases=tuple(phases),
        peak_allocated=peak_allocated,
        peak_reserved=peak_reserved,
        peak_phase=peak_phase,
        fragmentation=fragmentation,
        creep=growing,
        oom=oom,
        snapshot=section.get("snapshot") if isinstance(section.get("snapshot"), Mapping)
        else None,
        points=tuple((r[0], r[1], r[2]) for r in rows),
    )


def devices_memory(ranks: Sequence[tuple[int, Mapping[str, Any], int]],
                   warmup: int) -> list[DeviceMemory]:
    """From (rank, its `memory` section, its last step's index) per rank."""
    out = []
    for rank, memory, last_step in ranks:
        section = memory.get("cuda") if isinstance(memory, Mapping) else None
        if isinstance(section, Mapping):
            row = device_memory(rank, section, warmup, last_step)
            if row is not None:
                out.append(row)
    return out


def oom_line(d: DeviceMemory, size: Any) -> Optional[str]:
    """The first out-of-memory error of a rank in one sentence: where it
    was, what was asked, what the allocator held (`size` formats bytes)."""
    oom = d.oom
    first = oom.get("first") if oom is not None else None
    if not isinstance(first, Mapping):
        return None
    where = []
    if first.get("step") is not None:
        where.append(f"in step {first['step']}")
    if first.get("phase"):
        where.append(f"during {first['phase']}")
    module = first.get("module")
    if module:
        where.append(f"in {module}")
    elif first.get("main_thread") is False:
        where.append("on autograd's thread (no module: backward runs there)")
    line = (f"{d.label}: CUDA out of memory {' '.join(where)}: asked for "
            f"{size(first.get('requested'))} with {size(first.get('allocated'))} allocated, "
            f"{size(first.get('reserved'))} reserved")
    free = first.get("largest_free_block")
    if free is not None:
        line += f" (largest free block {size(free)})"
    line += f", {size(first.get('device_free'))} free of {size(first.get('device_total'))}"
    count = int(oom.get("count") or 1) if oom is not None else 1
    if count > 1:
        line += f"; {count} out-of-memory errors in all"
    return line
