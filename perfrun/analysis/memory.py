"""Host memory over the run: each process's resident set at the steps it was
sampled (the rank files' `memory` sections, runtime/memory.py), the Memory
Summary's rows, and the rule that decides memory creep. Pure functions over
plain data.

Creep is memory that grows *steadily* over the steady steps: a loss kept with
its graph (`total_loss += loss`), a cache that fills in `__getitem__`, pages
of a dataset's Python objects copied into each DataLoader worker as it reads
them (copy-on-read: every access writes the object's reference count). A
run that allocates once and stays flat, or jumps once (a bigger batch, an
evaluation), is not creep. The rule asks for all of:

* at least CREEP_MIN_POINTS samples over at least CREEP_MIN_STEPS steady
  steps (the first CREEP_SKIP of the run, and the warm-up, are left out:
  allocators, caches and workers fill up there);
* growth, by the least-squares line, of at least CREEP_MIN_BYTES and
  CREEP_MIN_FRACTION of where the line starts;
* a straight line that explains it (R² at least CREEP_MIN_R2), and growth
  in each third of the span (each third's own slope at least
  CREEP_THIRD_SHARE of the whole's): steady, not one jump.

A short run has fewer samples (one a flush, every 2 s): a DataLoader worker
of a 10-second epoch is read four or five times, and one whose cache fills
from 50 to 194 MiB over it is creep all the same. From CREEP_SHORT_POINTS
samples up to CREEP_MIN_POINTS the rule asks for more growth, and for it
between every two samples rather than in each third:

* growth of at least CREEP_MIN_BYTES and CREEP_SHORT_FRACTION of where the
  line starts (a quarter more: so few points cannot tell a few per cent
  from noise);
* R² at least CREEP_MIN_R2, and a rise from each sample to the next of at
  least CREEP_THIRD_SHARE of the line's over that span: one jump between
  two samples, flat on either side, is not creep.

Below CREEP_SHORT_POINTS steady samples, or over fewer than CREEP_MIN_STEPS
steps, nothing is said either way (`judged`): one reading is neither flat
nor growing.

Its figures: the slope per 1,000 steps, and the step at which, at that slope,
the process would reach the memory the rank may use (the cgroup's limit, or
the machine's memory).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from perfrun.store.schema import as_int

CREEP_MIN_POINTS = 8
CREEP_MIN_STEPS = 20
CREEP_SKIP = 0.1
CREEP_MIN_BYTES = 32 << 20
CREEP_MIN_FRACTION = 0.05
CREEP_MIN_R2 = 0.8
CREEP_THIRD_SHARE = 0.25
CREEP_SHORT_POINTS = 3
CREEP_SHORT_FRACTION = 0.25


@dataclass(frozen=True)
class Creep:
    """Steady growth: `slope` bytes a step from `first_step` to `last_step`
    (the line's values there: `first`, `last`), how straight (`r2`), and
    the step at which the line meets `limit` (None without a limit)."""

    slope: float
    first_step: int
    last_step: int
    first: float
    last: float
    r2: float
    full_at: Optional[int]
    limit: Optional[int]

    @property
    def per_1000_steps(self) -> float:
        return self.slope * 1000.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "slope_bytes_per_step": self.slope,
            "per_1000_steps": self.per_1000_steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "first": self.first,
            "last": self.last,
            "r2": self.r2,
            "full_at_step": self.full_at,
            "limit": self.limit,
        }


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares: slope, intercept, R² (1.0 for a flat exact fit)."""
    n = len(xs)
    mx = sum(xs) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0:
        return 0.0, my, 0.0
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 1.0
    return slope, my - slope * mx, r2


class StepStarts:
    """The start times of a step table's rows, read where a bisection looks
    (about 20 rows a reading), so placing a few hundred readings in a
    memory-mapped table of a million steps reads a few pages of it."""

    def __init__(self, table: Any, start: int, end: int) -> None:
        self.table = table
        self.start = start
        self.end = end

    def __len__(self) -> int:
        return int(self.table.shape[0])

    def __getitem__(self, k: int) -> float:
        return float(self.table[k, self.start])

    @property
    def last_end(self) -> float:
        return float(self.table[-1, self.end]) if len(self) else float("-inf")


def placed(points: Sequence[Sequence[int]], starts: Sequence[float],
           last_end: float) -> list[tuple[int, int]]:
    """Each (milliseconds, bytes) reading as (the step running then, bytes),
    by the step rows' own start times (seconds on the same clock; `starts`
    sorted, `last_end` the last step's end): readings before the first step
    began or after the last one ended (start-up, the script's epilogue: its
    final metrics, its checkpoint) are no step's."""
    out = []
    for p in points:
        if len(p) != 2:
            continue
        t = p[0] / 1000.0
        k = bisect_right(starts, t) - 1
        if k >= 0 and t <= last_end:
            out.append((k, int(p[1])))
    return out


def steady_start(warmup: int, last_step: int) -> int:
    """The first steady step for memory: past the warm-up and the run's
    first CREEP_SKIP (allocators, caches and workers fill up there)."""
    return max(warmup, int(last_step * CREEP_SKIP))


def steady_points(points: Sequence[Sequence[int]], warmup: int, last_step: int) -> list[
        tuple[int, int]]:
    """The (step, bytes) points from steady_start on."""
    start = steady_start(warmup, last_step)
    return [(int(p[0]), int(p[1])) for p in points
            if len(p) == 2 and start <= p[0] <= last_step]


def judged(points: Sequence[tuple[int, int]]) -> bool:
    """Whether `points` ((step, bytes), the steady ones) are enough for a
    verdict, creep or flat: CREEP_SHORT_POINTS over CREEP_MIN_STEPS steps."""
    return (len(points) >= CREEP_SHORT_POINTS
            and points[-1][0] - points[0][0] >= CREEP_MIN_STEPS)


def creep(points: Sequence[tuple[int, int]], limit: Optional[int] = None) -> Optional[Creep]:
    """Steady growth over `points` ((step, bytes), the steady ones), or None
    (see the module's rule). Several points at one step (a slow step, or a
    process sampled before the first step) are kept: the line weighs time."""
    if not judged(points):
        return None
    short = len(points) < CREEP_MIN_POINTS
    xs = [float(s) for s, _ in points]
    ys = [float(b) for _, b in points]
    slope, intercept, r2 = _line(xs, ys)
    first = intercept + slope * xs[0]
    last = intercept + slope * xs[-1]
    growth = last - first
    fraction = CREEP_SHORT_FRACTION if short else CREEP_MIN_FRACTION
    if growth < CREEP_MIN_BYTES or growth < fraction * max(first, 1.0):
        return None
    if r2 < CREEP_MIN_R2:
        return None
    if short:
        # Every two samples in turn (two at one step say nothing of a slope).
        for k in range(len(points) - 1):
            dx = xs[k + 1] - xs[k]
            if dx > 0 and ys[k + 1] - ys[k] < CREEP_THIRD_SHARE * slope * dx:
                return None
    else:
        k = len(points) // 3
        for part in (slice(0, k + 1), slice(k, 2 * k + 1), slice(2 * k, None)):
            px, py = xs[part], ys[part]
            if len(px) < 2 or px[-1] <= px[0]:
                return None
            if _line(px, py)[0] < CREEP_THIRD_SHARE * slope:
                return None
    full_at = None
    if limit and slope > 0:
        full_at = int(xs[-1] + max(0.0, limit - ys[-1]) / slope)
    return Creep(slope, int(xs[0]), int(xs[-1]), first, last, r2, full_at, limit)


@dataclass(frozen=True)
class ProcessMemory:
    """One process's resident set over the run: the rank's own, or one of
    its children (`pid`, and what it is)."""

    rank: int
    pid: Optional[int]
    label: str
    #: What it is, without its pid: "rank", "DataLoader 0 worker", ...
    kind: str
    #: "rss" (resident set) or "uss" (private memory: a forked child's own).
    measure: str
    first: Optional[int]
    peak: int
    last: Optional[int]
    samples: int
    creep: Optional[Creep]
    #: (step, bytes): the readings placed in the steps they were taken in
    #: (at most runtime/memory.MAX_POINTS), for the page's chart.
    points: tuple[tuple[int, int], ...] = ()
    #: The readings in the steady steps, which the creep rule reads, and
    #: whether they are enough for a verdict (`judged`): without one, the
    #: process is neither flat nor creeping.
    steady: int = 0
    judged: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "label": self.label,
            "kind": self.kind,
            "measure": self.measure,
            "first": self.first,
            "peak": self.peak,
            "last": self.last,
            "samples": self.samples,
            "creep": self.creep.to_dict() if self.creep is not None else None,
            "steady_samples": self.steady,
            "judged": self.judged,
            "points": [list(p) for p in self.points],
        }


@dataclass
class MemorySummary:
    """Host memory of the ranks and their children; `limit` the memory the
    reference rank may use; `devices`: each rank's GPU memory
    (analysis/allocator.DeviceMemory), on CUDA runs."""

    processes: list[ProcessMemory] = field(default_factory=list)
    limit: Optional[int] = None
    devices: list[Any] = field(default_factory=list)

    @property
    def creeping(self) -> list[ProcessMemory]:
        return [p for p in self.processes if p.creep is not None]

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "processes": [p.to_dict() for p in self.processes],
                "devices": [d.to_dict() for d in self.devices]}


def _process(rank: int, pid: Optional[int], kind: str, label: str, raw: Mapping[str, Any],
             warmup: int, steps: tuple[Sequence[float], float],
             limit: Optional[int]) -> Optional[ProcessMemory]:
    readings = [p for p in raw.get("points") or [] if isinstance(p, list) and len(p) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in p)]
    if not readings:
        return None
    points = placed(readings, *steps)
    steady = steady_points(points, warmup, max(0, len(steps[0]) - 1))
    return ProcessMemory(
        rank=rank,
        pid=pid,
        label=label,
        kind=kind,
        measure="uss" if raw.get("measure") == "uss" else "rss",
        first=steady[0][1] if steady else None,
        peak=max(as_int(raw.get("peak")) or 0, max(b for _, b in readings)),
        last=points[-1][1] if points else readings[-1][1],
        samples=len(readings),
        creep=creep(steady, limit),
        points=tuple(points),
        steady=len(steady),
        judged=judged(steady),
    )


def memory_summary(
    ranks: Sequence[tuple[int, Mapping[str, Any], tuple[Sequence[float], float]]],
    warmup: int,
    workers: Mapping[int, str] = {},
) -> Optional[MemorySummary]:
    """From (rank, its `memory` section, (its steps' start times, its last
    step's end)) per rank: a row per process. `workers`: the pids known to be
    DataLoader workers, with what to call them."""
    out = MemorySummary()
    for rank, section, steps in ranks:
        if not isinstance(section, Mapping):
            continue
        limit = as_int(section.get("limit"))
        if out.limit is None:
            out.limit = limit
        main = section.get("process")
        if isinstance(main, Mapping):
            row = _process(rank, None, "rank", f"rank {rank}", main, warmup, steps, limit)
            if row is not None:
                out.processes.append(row)
        children = section.get("children")
        if isinstance(children, Mapping):
            for key, raw in children.items():
                pid = as_int(key) if str(key).isdigit() else None
                if not isinstance(raw, Mapping):
                    continue
                kind = (workers.get(pid) if pid is not None else None) or str(
                    raw.get("name") or "child process")
                label = f"rank {rank} {kind} (pid {pid})"
                row = _process(rank, pid, kind, label, raw, warmup, steps, limit)
                if row is not None:
                    out.processes.append(row)
    return out if out.processes else None
