"""Which steps count: the one rule every statistic is taken over.

A rank records every step, but not every step says how fast the loop runs:

* the warm-up steps pay one-off costs (allocator growth, cuDNN autotuning,
  compilation, the DataLoader's first batches);
* the detailed window's steps run under torch.profiler, and so does the
  profiler's own warm-up step before it: they are slower than the loop
  really is (unless the run was timer-only, when no profiler ran);
* on a run of several ranks, the steps just after the window hold the
  wait for the rank whose trace export ended last (SETTLE_STEPS);
* the one step perfrun counted FLOPs on runs several times slower.

Leaving each out is decided here, once, from a rank's step count and what
its document says (its window, its profiled steps, its FLOP-counted step).
The Perf and Model Summaries, the Ranks table, the straggler verdict, the
gate and the page all take their steps from `Counted`, so they never
disagree on what "the counted steps" are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from perfrun.analysis.flops import counted_step
from perfrun.store.rankfile import RankResult, table_rows

Window = Optional[Sequence[int]]


def rank_window(rank: RankResult) -> Optional[tuple[int, int]]:
    """The rank's detailed-profiler window `[START, END)`, if it had one."""
    window = rank.data.get("window")
    if isinstance(window, (list, tuple)) and len(window) == 2:
        try:
            return int(window[0]), int(window[1])
        except (TypeError, ValueError):
            return None
    return None


def profiled_steps(rank: RankResult) -> Optional[tuple[int, int]]:
    """The steps torch.profiler ran over: the window and, before it, the
    profiler's warm-up step (profiled, its events discarded, and as slow as
    the window's). Files without the field: the window."""
    profiled = rank.data.get("profiled")
    if isinstance(profiled, (list, tuple)) and len(profiled) == 2:
        try:
            return int(profiled[0]), int(profiled[1])
        except (TypeError, ValueError):
            pass
    return rank_window(rank)


#: Steps after the profiled ones left out too when the run has several
#: ranks: each rank ends the window by exporting its trace, which takes
#: longer on some ranks than on others, and the first collective after it
#: makes the ranks that finished first wait for the rest: a wait that is
#: the window's, not the loop's, and would name a false straggler. Two, as
#: on a GPU the wait can surface a step later, at the first synchronisation.
SETTLE_STEPS = 2


def disturbed_steps(rank: RankResult) -> Optional[tuple[int, int]]:
    """The steps the window disturbed: the profiled steps and, on a run of
    several ranks, the SETTLE_STEPS after them (on every rank alike, since
    each rank's files say the same window)."""
    profiled = profiled_steps(rank)
    if profiled is None:
        return None
    world = rank.data.get("world_size")
    if isinstance(world, int) and world > 1:
        return profiled[0], profiled[1] + SETTLE_STEPS
    return profiled


@dataclass(frozen=True)
class Counted:
    """The counted steps of one rank: from `first` (after the warm-up) to
    the last of its `n` steps, less the steps in `[lo, hi)` (the profiled
    steps, clipped to the counted range; empty when none) and `skip` (the
    FLOP-counted step, when it is among them)."""

    n: int
    first: int
    lo: int
    hi: int
    skip: Optional[int] = None

    @property
    def count(self) -> int:
        inside = max(0, self.hi - self.lo)
        return max(0, self.n - self.first) - inside - (self.skip is not None)

    def mask(self) -> Any:
        keep = np.ones(self.n, dtype=bool)
        keep[:self.first] = False
        keep[self.lo:max(self.lo, self.hi)] = False
        if self.skip is not None:
            keep[self.skip] = False
        return keep

    def index(self) -> Any:
        """The counted steps' indices (a step's index is its position in the
        rank's steps: step 0 is the first)."""
        return np.flatnonzero(self.mask())

    def block_mask(self, lo: int, hi: int) -> Any:
        """Which of steps lo..hi - 1 are counted, as a boolean array: the
        part of `mask` a pass over the steps a block at a time needs."""
        index = np.arange(lo, hi)
        keep = (index >= self.first) & ~((index >= self.lo) & (index < max(self.lo, self.hi)))
        if self.skip is not None:
            keep &= index != self.skip
        return keep

    def take(self, table: Any) -> Any:
        """The counted rows of `table` (the rank's steps), column-major: every
        quantity reads whole columns, which in the file's row-major layout
        would be strided reads across all of it."""
        if self.skip is not None:
            return np.asfortranarray(table[self.mask()])
        if self.hi <= self.lo:  # no window inside the counted steps: one slice
            return np.asfortranarray(table[self.first:])
        return np.asfortranarray(np.concatenate([table[self.first:self.lo], table[self.hi:]]))


def counted(n: int, warmup: int, window: Window = None,
            flops_step: Optional[int] = None) -> Counted:
    """The counted steps of a rank of `n` steps: after `warmup`, outside
    `window` ([start, end), None for none), without `flops_step`."""
    first = max(0, warmup)
    start, end = (int(window[0]), int(window[1])) if window else (0, 0)
    lo, hi = max(first, start), min(n, end)
    skip = flops_step
    if skip is not None and (not first <= skip < n or lo <= skip < hi):
        skip = None
    return Counted(n, first, lo, max(lo, hi), skip)


def steps_range(n: int, start: int, stop: int) -> Counted:
    """Steps [start, stop) of a rank of `n` steps as a Counted (the steps
    from `start` less those from `stop` on), so that a pass can gather them
    as it gathers the counted steps."""
    start = max(0, min(start, n))
    return Counted(n, start, max(start, min(stop, n)), n)


def rank_counted(rank: RankResult, warmup: int, window: Window = None,
                 exclude_window: bool = True) -> Counted:
    """The counted steps of `rank`. `window=None` means the rank's own
    profiled steps; `exclude_window=False` keeps them (a timer-only run's
    window ran no profiler)."""
    if window is None:
        window = disturbed_steps(rank)
    return counted(rank.n_steps, warmup, window if exclude_window else None,
                   counted_step(rank.data))


def steady_table(rank: RankResult, warmup: int, window: Window = None,
                 exclude_window: bool = True) -> Any:
    """The rank's counted steps as a table (columns.py): what the analysis
    works on."""
    return rank_counted(rank, warmup, window, exclude_window).take(rank.table)


def steady_rows(rank: RankResult, warmup: int, window: Window = None,
                exclude_window: bool = True) -> list[list[Any]]:
    """steady_table's steps as lists (None for a value not recorded), for
    callers that want a few steps in hand."""
    return table_rows(steady_table(rank, warmup, window, exclude_window))
