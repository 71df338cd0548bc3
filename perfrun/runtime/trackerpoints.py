"""perfrun's figures as the points of a series in the script's experiment
tracker: steps gathered into blocks of N, one point a block.

Why blocks and not every step: a tracker is a service (W&B, an MLflow
server) or a file a dashboard reads (TensorBoard), made for a loss curve
of a few thousand points, while a fast loop makes thousands of steps a
second. A point is the aggregate of the steps since the one before: times
are means over the block (so the phases still add up to the step), rates
are the block's work over its time. N is `--tracker-every`, or by default
chosen from the step time so that a point covers about TARGET_SECONDS of
training, rounded to 1, 2 or 5 times a power of ten so the points fall on
round step numbers; it only grows (never shrinks) if the steps get faster,
so a loop that runs faster after its first compiled steps does not flood
the tracker either.

Pure functions over the step rows (steps.WIDTH floats a row, laid out as
stepfile.STEP_COLUMNS) and numbers: the flush thread calls them with a
copy of each batch of saved rows, and the tests with rows made by hand.
numpy does the sums, so a flush of tens of thousands of fast steps costs
the flush thread a few milliseconds, not a Python loop over every row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..store.stepfile import COL, STEP_COLUMNS

#: Seconds of training one point covers when N is chosen by perfrun: a
#: tracker's charts draw a few hundred to a few thousand points a line, and
#: a point every 10 s is 360 an hour, 8,640 a day.
TARGET_SECONDS = 10.0
#: N grows when a batch of steps shows it would give points this many
#: times more often than the target (the steps got faster).
WIDEN_FACTOR = 5
#: Steps after the first that N is chosen from (the first step pays the
#: script's setup and says nothing of the loop).
CHOOSE_FROM = 3
#: Every key perfrun logs starts so, apart from the script's own.
PREFIX = "perfrun/"
WIDTH = len(STEP_COLUMNS)

# The per-step values a block sums, in this order.
_SUMS = ("steps", "step", "dataloader", "forward", "backward", "optimization", "samples",
         "samples_known", "gpu", "gpu_known")
_S = {name: i for i, name in enumerate(_SUMS)}


def every_for(step_seconds: float, target: float = TARGET_SECONDS) -> int:
    """The smallest N of 1, 2, 5, 10, 20, 50, ... whose steps take at
    least `target` seconds at `step_seconds` a step."""
    if not step_seconds > 0 or not math.isfinite(step_seconds):
        return 1
    want = target / step_seconds
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale >= want:
                return m * scale
        scale *= 10


def per_step(rows: Any) -> Any:
    """The values each step adds to its block, one row a step (`_SUMS`):
    its time (end - start - excluded, as the report counts it), each
    phase's, its samples and whether it knew them, its GPU time and
    whether it had one. `rows`: a (k, WIDTH) float array."""
    out = np.zeros((rows.shape[0], len(_SUMS)))
    out[:, _S["steps"]] = 1.0
    out[:, _S["step"]] = rows[:, COL["end"]] - rows[:, COL["start"]] - np.nan_to_num(
        rows[:, COL["excluded"]])
    for phase in ("dataloader", "forward", "backward", "optimization"):
        out[:, _S[phase]] = np.nan_to_num(rows[:, COL[phase]])
    samples = rows[:, COL["samples"]]
    known = np.isfinite(samples)
    out[:, _S["samples"]] = np.where(known, samples, 0.0)
    out[:, _S["samples_known"]] = known
    gpu = rows[:, COL["gpu_step"]]
    has = np.isfinite(gpu)
    out[:, _S["gpu"]] = np.where(has, gpu, 0.0)
    out[:, _S["gpu_known"]] = has
    return out


@dataclass
class Point:
    """One block's aggregate: `step` is the index of its last step (the
    step a script's own `global_step` names when it logs after that step),
    `first` of its first; `sums` the `_SUMS` over the block."""

    first: int
    step: int
    sums: Sequence[float]

    @property
    def steps(self) -> int:
        return int(self.sums[_S["steps"]])

    @property
    def seconds(self) -> float:
        return float(self.sums[_S["step"]])


def figures(point: Point, flops_per_step: Optional[float] = None) -> dict[str, float]:
    """What a point logs, by key: times in milliseconds (means over the
    block's steps), steps/s and samples/s over the block's time, the
    Reader Ratio of the block, achieved TFLOP/s where one step's FLOPs are
    known. A figure that is unknown is left out, never logged as 0."""
    s = point.sums
    n = s[_S["steps"]]
    seconds = s[_S["step"]]
    if n <= 0:
        return {}
    ms = 1000.0 / n
    out = {
        "step_time_ms": seconds * ms,
        "dataloader_ms": s[_S["dataloader"]] * ms,
        "forward_ms": s[_S["forward"]] * ms,
        "backward_ms": s[_S["backward"]] * ms,
        "optimization_ms": s[_S["optimization"]] * ms,
    }
    phases = sum(s[_S[p]] for p in ("dataloader", "forward", "backward", "optimization"))
    out["other_ms"] = max(0.0, seconds - phases) * ms
    if seconds > 0:
        out["reader_ratio_pct"] = 100.0 * s[_S["dataloader"]] / seconds
        out["ips"] = n / seconds
        if s[_S["samples_known"]] == n and s[_S["samples"]] > 0:
            out["samples_per_s"] = s[_S["samples"]] / seconds
        if flops_per_step:
            out["tflops"] = flops_per_step * n / seconds / 1e12
    if s[_S["gpu_known"]] == n:
        out["gpu_ms"] = s[_S["gpu"]] * ms
    return {PREFIX + k: float(v) for k, v in out.items() if math.isfinite(v)}


@dataclass
class Blocks:
    """Steps gathered into the blocks [kN, (k+1)N) of their indexes, a
    Point each as its last step arrives. `every`: N, or None to choose it
    from the steps (`auto`); N may grow later, never shrink."""

    every: Optional[int] = None
    auto: bool = field(init=False)
    _first: Optional[int] = field(default=None, init=False)
    _acc: Any = field(default=None, init=False)
    _held: list[tuple[int, Any]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.auto = self.every is None

    def add(self, rows: Any, first: int) -> list[Point]:
        """Steps `first`, `first`+1, ... (a (k, WIDTH) array, in order, each
        once): the points of the blocks they complete."""
        if rows.shape[0] == 0:
            return []
        values = per_step(rows)
        if self.auto:
            self._choose(values, first)
            if self.every is None:
                self._held.append((first, values))
                return []
        out: list[Point] = []
        if self._held:
            held, self._held = self._held, []
            for at, v in held:
                out.extend(self._sum(v, at))
        out.extend(self._sum(values, first))
        return out

    def close(self) -> Optional[Point]:
        """The steps since the last point, as one point (the run or the
        tracker's run is closing); the next block starts afresh."""
        held, self._held = self._held, []
        for at, v in held:  # too few steps to choose N from: all in one point
            part = v.sum(axis=0)
            if self._acc is None:
                self._acc, self._first = part, at
            else:
                self._acc = self._acc + part
        if self._acc is None or self._first is None:
            return None
        acc, first = self._acc, self._first
        self._acc = self._first = None
        return Point(first, first + int(acc[_S["steps"]]) - 1, acc.tolist())

    def _choose(self, values: Any, first: int) -> None:
        """Pick N from these steps' median time (after the run's first
        step), or widen it when the steps got WIDEN_FACTOR times faster."""
        times = values[:, _S["step"]]
        if first == 0:
            times = times[1:]
        if self.every is None:
            pending = sum(v.shape[0] for _, v in self._held) + times.size
            if pending < CHOOSE_FROM:
                return
            if self._held:
                older = [v[:, _S["step"]][1:] if at == 0 else v[:, _S["step"]]
                         for at, v in self._held]
                times = np.concatenate([*older, times])
            self.every = every_for(float(np.median(times)))
            return
        if times.size >= CHOOSE_FROM:
            wider = every_for(float(np.median(times)))
            if wider >= WIDEN_FACTOR * self.every:
                self.every = wider

    def _sum(self, values: Any, first: int) -> list[Point]:
        """Add the steps to the open block; close each block whose last
        step (index N*k - 1) is among them."""
        every = self.every or 1
        out: list[Point] = []
        k = values.shape[0]
        lo = 0
        while lo < k:
            index = first + lo
            end = (index // every + 1) * every  # the next block's first step
            hi = min(k, lo + end - index)
            part = values[lo:hi].sum(axis=0)
            if self._acc is None:
                self._acc, self._first = part, index
            else:
                self._acc = self._acc + part
            if first + hi == end:
                acc, start = self._acc, self._first
                self._acc = self._first = None
                out.append(Point(int(start), end - 1, acc.tolist()))
            lo = hi
        return out


def rows_of(buf: Any, count: int, chunk: int = 512) -> Any:
    """The first `count` rows of a packed array('d') of steps as a (count,
    WIDTH) float array of their own, copied `chunk` rows at a time: the
    source is the step tracker's buffer, which the script's thread appends
    to, so it is never exported (a view would stop it from growing), and
    each copy holds the GIL for microseconds, as the step writer's do."""
    parts = [np.frombuffer(buf[lo * WIDTH:min(count, lo + chunk) * WIDTH], dtype=np.float64)
             for lo in range(0, count, chunk)]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return flat.reshape(-1, WIDTH)


def run_figures(rows: Any, warmup: int, flops_per_step: Optional[float] = None
                ) -> dict[str, float]:
    """A rank's own summary of its steps after `warmup`: medians of the
    step and each phase, the Reader Ratio, steps/s and samples/s over the
    steps' time, achieved TFLOP/s at the median step. What a W&B run gets
    as its summary when it closes (an offline W&B run cannot be reopened
    once the process ends, so the report's own figures cannot reach it)."""
    rows = rows[warmup:]
    if rows.shape[0] == 0:
        return {}
    values = per_step(rows)
    step = values[:, _S["step"]]
    total = float(step.sum())
    out = {"steps": float(rows.shape[0]),
           "step_time_ms": float(np.median(step)) * 1000.0}
    for phase in ("dataloader", "forward", "backward", "optimization"):
        out[f"{phase}_ms"] = float(np.median(values[:, _S[phase]])) * 1000.0
    if total > 0:
        out["reader_ratio_pct"] = 100.0 * float(values[:, _S["dataloader"]].sum()) / total
        out["ips"] = rows.shape[0] / total
        if values[:, _S["samples_known"]].all() and values[:, _S["samples"]].sum() > 0:
            out["samples_per_s"] = float(values[:, _S["samples"]].sum()) / total
    median = float(np.median(step))
    if flops_per_step and median > 0:
        out["tflops"] = flops_per_step / median / 1e12
    return {PREFIX + "summary/" + k: v for k, v in out.items() if math.isfinite(v)}
