"""Each rank's steps read once: what every figure of a report takes from them.

A report asks many things of a rank's steps: the Ranks table its averages
and its median step, the Perf and Model Summaries and the FLOP rates the
reference rank's statistics, the window its steps inside and around it,
the page each rank's series, medians and spread, the straggler check a
sample of its steps, the fingerprint its batch size. Asked one at a time,
each read the step file again, and the reference's steps were held twice
(the table, then its counted steps): over 64 ranks of 10^6 steps (8.7 GB)
the reads were most of a report's minute, and one rank of 10^7 steps held
2.7 GB.

`read_pass` reads a rank's steps once, a block at a time
(RankResult.blocks: one buffer of a few thousand steps, the rows checked on
the way), and keeps only what the figures are taken over: each step's time,
each phase's and Others' (columns.py), six 1-D arrays: 48 bytes a step,
against the table's 136. Statistics are then taken over exactly the arrays
they were taken over before, so no figure changes by a digit; what is
counted rather than measured (calls, samples, the steps whose phases
overshoot) is tallied block by block, and whatever else wants every block
(the page's series, the straggler check's sample, the batch size) is given
each block as it goes (`sinks`). A report holds one rank's arrays at a time.

A rank of more than ARRAY_STEPS steps would still hold 48 bytes a step
(660 MiB at 10^7 steps, with the selections' copies): its pass keeps a
Digest (analysis/digest.py) of each quantity of each selection instead,
in memory that does not grow with the steps, every figure exact but
medians and percentiles (within digest.RELATIVE_ERROR) and the standard
deviations (merged per block). The selections its figures are asked over
are then named before the pass (`selections`): no step is left to take
another from afterwards. A selection of at most ARRAY_STEPS steps (the
window's) is gathered whole, its figures exact on either path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from perfrun.analysis import columns, digest
from perfrun.analysis.digest import Digest
from perfrun.analysis.selection import Counted
from perfrun.store.rankfile import RankResult
from perfrun.store.stepfile import COL, PHASES, READ_ROWS


@dataclass
class Block:
    """One block of a rank's steps during a pass: steps lo..lo + len - 1,
    their rows (STEP_COLUMNS; valid during the call only: copy what is
    kept) and their times (columns.py)."""

    lo: int
    table: Any
    step: Any
    phases: dict[str, Any]
    others: Any


#: What is given each block of a pass.
Sink = Callable[[Block], None]

#: The most steps a rank may have for its pass to hold every step's times
#: (every figure exact, as before); a longer rank's pass keeps Digests. 2^20:
#: a rank of 10^6 steps is held whole (some 60 MiB), and no report holds
#: more than that of any rank.
ARRAY_STEPS = 1 << 20
#: Steps a digesting pass reads at a time: a few blocks of 12 MiB, fewer
#: calls per step for the digests.
DIGEST_ROWS = 1 << 16


def digested(rank: RankResult) -> bool:
    """Whether `rank`'s pass keeps Digests rather than its steps' times."""
    return rank.n_steps > ARRAY_STEPS


@dataclass
class RankPass:
    """A rank's steps after one pass: every step's time, each phase's and
    Others' (columns.py), and the Quantities of each selection asked for."""

    rank: int
    step: Any
    phases: dict[str, Any]
    others: Any
    #: The Quantities of each selection asked for, by the name it was
    #: asked under.
    counted: dict[str, columns.Quantities] = field(default_factory=dict)
    #: Medians taken: (median of the finite values, whether all were), by
    #: (quantity, selection).
    _medians: dict[tuple[str, Counted], tuple[Optional[float], bool]] = field(
        default_factory=dict, repr=False)
    #: The Quantities asked for, by selection.
    _asked: dict[Counted, columns.Quantities] = field(default_factory=dict, repr=False)
    #: A digesting pass (ARRAY_STEPS): the rank's step count, and what was
    #: gathered of each selection named before it.
    steps_read: Optional[int] = None
    _gathered: dict[Counted, _Gather] = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        if self.steps_read is not None:
            return self.steps_read
        return int(self.step.shape[0])

    @property
    def quantiles(self) -> str:
        """How its medians and percentiles were taken: digest.EXACT, or
        digest.METHOD (within digest.RELATIVE_ERROR)."""
        return digest.EXACT if self.steps_read is None else digest.METHOD

    def median(self, name: str, steps: Counted, finite: bool = False) -> Optional[float]:
        """The median of times(name, steps) as numpy takes it, or with
        `finite` of their finite values only (Stats' and flops.median_time's
        median); None without steps. Several figures ask for the same median
        (the Ranks table's median step, the page's medians, the summaries'
        Stats), and one of 10^7 steps costs a quarter of a second: each is
        taken once, from the Stats of a selection asked for whole when
        there is one."""
        if self.steps_read is not None:
            # A digesting pass: every time is finite (columns.py).
            return digest.median_of(self.times(name, steps))
        key = (name, steps)
        found = self._medians.get(key)
        if found is None:
            asked = self._asked.get(steps)
            if asked is not None and asked.n:
                stats = asked.stats(name)
                found = (stats.median, stats.n == asked.n)
            else:
                times = self.times(name, steps)
                if np.isfinite(times).all():
                    found = (float(np.median(times)) if times.size else None, True)
                else:
                    clean = times[np.isfinite(times)]
                    found = (float(np.median(clean)) if clean.size else None, False)
            self._medians[key] = found
        median, all_finite = found
        if finite or all_finite:
            return median
        times = self.times(name, steps)
        return float(np.median(times)) if times.size else None

    def times(self, name: str, steps: Counted) -> Any:
        """The times of `name` (columns.TIMED) of the steps `steps` selects,
        as the table of those steps would give them; after a digesting pass
        their Digest (or, for a selection of at most ARRAY_STEPS steps,
        their times), of a selection named before it."""
        if self.steps_read is not None:
            gathered = self._gathered.get(steps)
            if gathered is None:
                raise KeyError(f"steps {steps} were not named before the pass over rank "
                               f"{self.rank}'s {self.steps_read} steps")
            return gathered.times(name)
        if name == "step":
            values = self.step
        elif name == "others":
            values = self.others
        else:
            values = self.phases[name]
        return steps.take(values)


def read_pass(rank: RankResult, counted: Optional[Mapping[str, Counted]] = None,
              sinks: Sequence[Sink] = (), align: int = 1,
              selections: Sequence[Counted] = ()) -> RankPass:
    """Read `rank`'s steps once. `counted`: selections (by name) whose
    Quantities are wanted whole, tallies and GPU times included (the
    summaries'); `sinks`: given each block in order; `align`: blocks hold a
    multiple of this many steps (the page's buckets), so that what a sink
    computes per block is what it would compute over all the steps;
    `selections`: the other steps whose times (`times`, `median`) are
    asked afterwards, which a rank of more than ARRAY_STEPS steps must
    know before its pass. Raises ResultsError (a step file found damaged
    on the way)."""
    if digested(rank):
        return _digest_pass(rank, dict(counted or {}), sinks, align, selections)
    n = rank.n_steps
    step = np.empty(n)
    phases = {p: np.empty(n) for p in PHASES}
    others = np.empty(n)
    asked = dict(counted or {})
    tallies: dict[str, list[columns.Tallies]] = {name: [] for name in asked}
    gpus: dict[str, list[Optional[columns.Gpu]]] = {name: [] for name in asked}
    rows = max(1, align) * max(1, READ_ROWS // max(1, align))
    for lo, table in rank.blocks(rows):
        hi = lo + int(table.shape[0])
        b_step = columns.step_times(table)
        b_phases = {p: columns.phase_times(table, p) for p in PHASES}
        b_others = columns.others_times(table, b_step)
        step[lo:hi] = b_step
        for p in PHASES:
            phases[p][lo:hi] = b_phases[p]
        others[lo:hi] = b_others
        for name, steps in asked.items():
            keep = steps.block_mask(lo, hi)
            if not keep.any():
                continue
            part, part_step = (table, b_step) if keep.all() else (table[keep], b_step[keep])
            tallies[name].append(columns.Tallies.of(part, part_step))
            gpus[name].append(columns.Gpu.of(part))
        block = Block(lo, table, b_step, b_phases, b_others)
        for sink in sinks:
            sink(block)
    out = RankPass(rank.rank, step, phases, others)
    for name, steps in asked.items():
        out.counted[name] = out._asked[steps] = columns.Quantities(
            out.times("step", steps), {p: out.times(p, steps) for p in PHASES},
            out.times("others", steps), columns.Tallies.join(tallies[name]),
            columns.Gpu.join(gpus[name]))
    return out


class _Gather:
    """What a digesting pass keeps of one selection: a Digest of each
    quantity (columns.TIMED), or for a selection of at most ARRAY_STEPS
    steps their times; with `whole`, the tallies and GPU times of its
    Quantities too."""

    def __init__(self, steps: Counted, whole: bool) -> None:
        self.steps = steps
        self.whole = whole
        self.exact = steps.count <= ARRAY_STEPS
        self.parts: dict[str, list[Any]] = {q: [] for q in columns.TIMED}
        self.digests = {q: Digest() for q in columns.TIMED} if not self.exact else {}
        self.tallies: list[columns.Tallies] = []
        self.gpus: list[Optional[columns.Gpu]] = []
        self.gpu: Optional[columns.Gpu] = None

    def add(self, block: Block) -> None:
        hi = block.lo + int(block.table.shape[0])
        keep = self.steps.block_mask(block.lo, hi)
        if not keep.any():
            return
        every = bool(keep.all())
        values = {"step": block.step, "others": block.others, **block.phases}
        for q in columns.TIMED:
            part = values[q] if every else values[q][keep]
            if self.exact:
                self.parts[q].append(part)
            else:
                self.digests[q].add(part)
        if not self.whole:
            return
        table, step = (block.table, block.step) if every else (block.table[keep],
                                                                block.step[keep])
        tallies = columns.Tallies.of(table, step)
        if self.exact:
            self.tallies.append(tallies)
            self.gpus.append(columns.Gpu.of(table))
            return
        # Each block's tallies reduced as they come: a block's sample rates
        # are an array of its steps, of which only the extremes are asked.
        self.tallies = [columns.Tallies.join(self.tallies + [tallies])]
        gpu = columns.Gpu.of(table)
        if gpu is not None:
            if self.gpu is None:
                self.gpu = columns.Gpu(Digest(), {p: Digest() for p in PHASES}, Digest())
            self.gpu.step.add(gpu.step)
            for p in PHASES:
                self.gpu.phases[p].add(gpu.phases[p])
            self.gpu.others.add(gpu.others)

    def times(self, name: str) -> Any:
        if not self.exact:
            return self.digests[name]
        parts = self.parts[name]
        if len(parts) != 1:
            self.parts[name] = [np.concatenate(parts) if parts else np.empty(0)]
        return self.parts[name][0]

    def quantities(self) -> columns.Quantities:
        gpu = columns.Gpu.join(self.gpus) if self.exact else self.gpu
        return columns.Quantities(self.times("step"), {p: self.times(p) for p in PHASES},
                                  self.times("others"), columns.Tallies.join(self.tallies), gpu)


def _digest_pass(rank: RankResult, asked: dict[str, Counted], sinks: Sequence[Sink],
                 align: int, selections: Sequence[Counted]) -> RankPass:
    """read_pass of a rank of more than ARRAY_STEPS steps: each selection
    asked or named gathered block by block (_Gather), no step's times
    kept beyond its block."""
    wanted = set(asked.values())
    gathered: dict[Counted, _Gather] = {}
    for steps in [*asked.values(), *selections]:
        if steps not in gathered:
            gathered[steps] = _Gather(steps, steps in wanted)
    rows = max(1, align) * max(1, DIGEST_ROWS // max(1, align))
    for lo, table in rank.blocks(rows):
        b_step = columns.step_times(table)
        block = Block(lo, table, b_step, {p: columns.phase_times(table, p) for p in PHASES},
                      columns.others_times(table, b_step))
        for gather in gathered.values():
            gather.add(block)
        for sink in sinks:
            sink(block)
    out = RankPass(rank.rank, None, {}, None, steps_read=rank.n_steps, _gathered=gathered)
    for name, steps in asked.items():
        out.counted[name] = out._asked[steps] = gathered[steps].quantities()
    return out


class Sampled:
    """A sink that keeps the step times of `size` of the steps `steps`
    selects, in step order: all of them when there are no more, else one
    drawn uniformly (seeded: the same steps on every read) from each of
    `size` equal stretches of them. What the gate's bootstrap takes from a
    rank too long to hold (digested): its statistics over a sample of
    ARRAY_STEPS steps, as over a rank of that length, spread over the
    whole run."""

    def __init__(self, steps: Counted, size: Optional[int] = None,
                 seed: int = 20240601) -> None:
        self.steps = steps
        count = steps.count
        size = ARRAY_STEPS if size is None else size
        self.positions: Optional[Any] = None
        if count > size:
            rng = np.random.default_rng(seed)
            edges = (np.arange(size + 1) * (count / size)).astype(np.int64)
            edges[-1] = count
            widths = np.diff(edges)
            self.positions = edges[:-1] + (rng.random(size) * widths).astype(np.int64)
        self.seen = 0
        self.parts: list[Any] = []

    def __call__(self, block: Block) -> None:
        hi = block.lo + int(block.table.shape[0])
        times = block.step[self.steps.block_mask(block.lo, hi)]
        m = int(times.size)
        if self.positions is None:
            self.parts.append(times.copy())
        else:
            a, b = np.searchsorted(self.positions, [self.seen, self.seen + m])
            self.parts.append(times[self.positions[a:b] - self.seen])
        self.seen += m

    @property
    def times(self) -> Any:
        return np.concatenate(self.parts) if self.parts else np.empty(0)


class Picked:
    """A sink that keeps the rows at `index` (sorted step indices): the
    straggler check's sample of steps, gathered on the pass rather than
    read again."""

    def __init__(self, index: Any) -> None:
        self.index = np.asarray(index, dtype=np.int64)
        self.parts: list[Any] = []

    def __call__(self, block: Block) -> None:
        hi = block.lo + int(block.table.shape[0])
        a, b = np.searchsorted(self.index, [block.lo, hi])
        if b > a:
            self.parts.append(block.table[self.index[a:b] - block.lo])

    @property
    def rows(self) -> Any:
        if not self.parts:
            return np.empty((0, len(COL)))
        return np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0]


class SampleTally:
    """A sink that counts the steps of each samples-per-step value: what
    the batch size (store/baseline.py batch_size) is taken from, without
    holding the column."""

    def __init__(self) -> None:
        self.counts: dict[float, int] = {}

    def __call__(self, block: Block) -> None:
        column = block.table[:, COL["samples"]]
        known = column[np.isfinite(column)]
        if not known.size:
            return
        if known.min() == known.max():  # one batch size throughout: no sort
            values, counts = known[:1], [known.size]
        else:
            values, counts = np.unique(known, return_counts=True)
        for v, c in zip(np.asarray(values).tolist(), list(counts)):
            self.counts[v] = self.counts.get(v, 0) + int(c)

    def tally(self) -> tuple[Any, Any]:
        """(values, counts), as baseline.batch_size takes them."""
        return (np.array(list(self.counts), dtype=np.float64),
                np.array(list(self.counts.values()), dtype=np.int64))
