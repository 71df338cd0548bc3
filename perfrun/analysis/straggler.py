"""Culprit and victims: which rank makes the others wait, and where.

In data-parallel training every rank waits in the phase that holds the
collective (Backward under DDP, Optimization under ZeRO/FSDP) for the last
rank to arrive. The victims therefore show the culprit's lost time as *their*
longest phase, and "the slowest rank per phase" names a victim as often as
the culprit. What tells them apart is time order on a common clock: the
culprit enters the waiting phase late, and everyone leaves it together.

So, per steady step on a common clock:

* the waiting phase is the phase whose entry times spread across ranks while
  its exit times do not (its score is the median, over steps, of the entry
  spread minus the exit spread; positive only for a phase that absorbs
  lateness), provided the ranks take the same time a step (their mean
  steps within `SYNC_STEP_SPREAD`) and leave that phase together (within
  `SYNC_LEAVE_SPREAD` of the step): ranks that never wait for each other
  have no waiting phase, and keep the slowest-rank-per-phase advice.
  Where the rank files say which collective paces the ranks (DDP: its
  gradients' all-reduce in Backward, every step; ranks.py reads it), that
  phase is the waiting phase, and the times are not asked whether the
  ranks wait;
* the culprit is the rank that enters the waiting phase latest; its lateness
  (entry time minus the median of the other ranks' entries), bounded by its
  own extra work (below), is what each step loses to it: a rank can be late
  by a constant offset that its work does not explain (a collective
  releases ranks a fraction of a millisecond apart), and that is no
  straggler;
* the culprit's phase is the one, outside the waiting phase, where its own
  time exceeds the other ranks' median the most (Others counts too: work
  after the optimizer step delays the next step's start);
* the victims are the other ranks that spend at least half that loss
  longer than the culprit in the waiting phase.

A culprit is named only when that loss is at least
`CULPRIT_MIN_SHARE` of the median step and `CULPRIT_MIN_SECONDS`, and it is
the last to arrive in at least `CULPRIT_MIN_CONSISTENCY` of the steps: noise
moves the latest arrival from rank to rank, a straggler does not.
`scripts/straggler_false_alarm.py` measures how often a healthy run trips it.

The common clock: each rank's times are seconds since its own start
(`started_unix`, read together with its monotonic clock at boot). Ranks on
one host share the system clock, so `started_unix + t` agrees across them to
the microseconds between the two reads at boot. Across hosts the system
clocks differ by whatever NTP leaves (often milliseconds), so each other
host's offset is estimated from the step ends, which the collective aligns,
and its uncertainty (the median absolute deviation of those differences) is
reported with the verdict.

Pure: plain arrays in, a frozen result out; tests build the ranks by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from perfrun.store.stepfile import COL, PHASES

#: A straggler costs at least this share of the median step ...
CULPRIT_MIN_SHARE = 0.05
#: ... and at least this many seconds a step (timer noise on short steps).
CULPRIT_MIN_SECONDS = 0.001
#: ... and is the last to reach the waiting phase in this share of the steps.
CULPRIT_MIN_CONSISTENCY = 0.6
#: Ranks are taken to wait for each other when their median steps differ
#: by at most this share and they leave the waiting phase within this share
#: of the median step of each other.
SYNC_STEP_SPREAD = 0.10
SYNC_LEAVE_SPREAD = 0.25
#: Fewer common steady steps than this: no verdict.
MIN_COMMON_STEPS = 3

#: The phases in step order, then the time after them ("others").
_ORDER = PHASES
_PHASE_COLS = [COL[p] for p in PHASES]


@dataclass(frozen=True)
class RankSteps:
    """What the decision needs of one rank: its steady steps by index, with
    times in seconds since its own start, and its clock origin."""

    rank: int
    host: Optional[str]
    origin: float
    index: Any  # int array: step indices of the rows
    table: Any  # float array, STEP_COLUMNS


@dataclass(frozen=True)
class Skew:
    """One quantity's spread across ranks: the worst rank's per-step median
    against the median rank's."""

    quantity: str
    worst_rank: int
    worst: float
    median: float

    @property
    def excess(self) -> float:
        return self.worst - self.median


@dataclass(frozen=True)
class Straggler:
    """The verdict. `culprit` is None when no rank stands out (`reason`
    says why); `skew` is filled whenever ranks could be compared."""

    steps: int
    step_median: float
    clock: str
    clock_error: float
    wait_phase: Optional[str] = None
    culprit: Optional[int] = None
    culprit_phase: Optional[str] = None
    phase_loss: float = 0.0
    lateness: float = 0.0
    # min(lateness, the culprit's extra work): what it costs each step.
    loss: float = 0.0
    consistency: float = 0.0
    victims: tuple[int, ...] = ()
    contributions: dict[str, float] = field(default_factory=dict)
    skew: tuple[Skew, ...] = ()
    reason: str = ""

    @property
    def share(self) -> float:
        """The share of the job's step time the culprit costs."""
        return self.loss / self.step_median if self.step_median > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "step_median": self.step_median,
            "clock": self.clock,
            "clock_error": self.clock_error,
            "wait_phase": self.wait_phase,
            "culprit": self.culprit,
            "culprit_phase": self.culprit_phase,
            "phase_loss": self.phase_loss,
            "lateness": self.lateness,
            "loss": self.loss,
            "share": self.share,
            "consistency": self.consistency,
            "victims": list(self.victims),
            "contributions": dict(self.contributions),
            "skew": [
                {"quantity": s.quantity, "worst_rank": s.worst_rank, "worst": s.worst,
                 "median": s.median}
                for s in self.skew
            ],
            "reason": self.reason,
            "thresholds": {
                "min_share": CULPRIT_MIN_SHARE,
                "min_seconds": CULPRIT_MIN_SECONDS,
                "min_consistency": CULPRIT_MIN_CONSISTENCY,
            },
        }


def _durations(table: Any) -> Any:
    """(steps, phases + others): NaN phases count as zero (a phase the
    script does not have)."""
    phases = np.nan_to_num(table[:, _PHASE_COLS], nan=0.0)
    step = table[:, COL["end"]] - table[:, COL["start"]]
    excluded = np.nan_to_num(table[:, COL["excluded"]], nan=0.0)
    others = step - excluded - phases.sum(axis=1)
    return np.column_stack([phases, others])


def _host_offsets(
    ranks: Sequence[RankSteps], ends: Any
) -> tuple[dict[Optional[str], float], float]:
    """Each host's clock offset from the first rank's host, from the step
    ends (aligned by the collective), and the largest uncertainty."""
    hosts: dict[Optional[str], int] = {}
    for i, r in enumerate(ranks):
        hosts.setdefault(r.host, i)
    ref = hosts[ranks[0].host]
    offsets: dict[Optional[str], float] = {}
    error = 0.0
    for host, i in hosts.items():
        if i == ref:
            offsets[host] = 0.0
            continue
        d = ends[i] - ends[ref]
        off = float(np.median(d))
        offsets[host] = off
        error = max(error, float(np.median(np.abs(d - off))))
    return offsets, error


#: The phase each torch data-parallel wrapper (rank file `distributed`)
#: makes every rank wait in, every step: DDP all-reduces the gradients in
#: Backward (tests/test_stragglers.py: a slow rank's victims wait there).
PACED_IN = {"DistributedDataParallel": "backward"}


def decide(ranks: Sequence[RankSteps], paced: Optional[str] = None) -> Optional[Straggler]:
    """The straggler verdict over the ranks' common steady steps, or None
    when fewer than two ranks share `MIN_COMMON_STEPS` steps.

    `paced`: the phase where a collective is known to make the ranks wait
    for each other every step (PACED_IN: Backward under DDP, from the rank
    files), or None when only their times can tell. Known, it is the
    waiting phase, and the times are never read as ranks that do not wait:
    how they spread says how late a rank is, not whether the others wait."""
    ranks = [r for r in ranks if len(r.index)]
    if len(ranks) < 2:
        return None
    common = ranks[0].index
    for r in ranks[1:]:
        common = np.intersect1d(common, r.index)
    if len(common) < MIN_COMMON_STEPS:
        return None
    starts, durs = [], []
    for r in ranks:
        rows = r.table[np.searchsorted(r.index, common)]
        starts.append(r.origin + rows[:, COL["start"]])
        durs.append(_durations(rows))
    start = np.array(starts)  # (ranks, steps)
    dur = np.array(durs)  # (ranks, steps, phases + others)
    ends = start + np.nan_to_num(dur, nan=0.0).sum(axis=2)
    n_ranks, n_steps = start.shape
    names = list(_ORDER) + ["others"]
    rank_ids = [r.rank for r in ranks]

    offsets, error = _host_offsets(ranks, ends)
    if len(offsets) > 1:
        shift = np.array([offsets[r.host] for r in ranks])[:, None]
        start = start - shift
        clock = f"estimated across {len(offsets)} hosts from the step ends"
    else:
        clock = "shared (one host)"

    step_med = float(np.median(np.median(dur.sum(axis=2), axis=1)))
    per_rank = np.median(dur, axis=1)  # (ranks, phases + others)
    skew = []
    for j, name in enumerate(names):
        col = per_rank[:, j]
        w = int(np.argmax(col))
        skew.append(Skew(name, rank_ids[w], float(col[w]), float(np.median(col))))
    step_col = np.median(dur.sum(axis=2), axis=1)
    w = int(np.argmax(step_col))
    skew.append(Skew("step", rank_ids[w], float(step_col[w]), float(np.median(step_col))))
    base = Straggler(steps=n_steps, step_median=step_med, clock=clock, clock_error=error,
                     skew=tuple(skew))

    # Phase entries and exits, in step order, on the common clock.
    phase_dur = dur[:, :, : len(_ORDER)]
    enter = start[:, :, None] + np.cumsum(phase_dur, axis=2) - phase_dur
    leave = enter + phase_dur
    scores = np.median(np.ptp(enter, axis=0) - np.ptp(leave, axis=0), axis=0)
    if paced is not None:
        wp = _ORDER.index(paced)
        if not scores[wp] > 0.0:
            return _replace(base, wait_phase=paced, reason=(
                f"a collective makes the ranks wait for each other in {paced} every step "
                "(DDP's all-reduce of the gradients), and none arrives there late enough "
                "for the others to wait on it"))
    else:
        wp = int(np.argmax(scores))
        # Ranks that wait for each other take the same time a step (the
        # collective paces them all) and leave the waiting phase together;
        # independent ranks (no collective) do neither, and keep the
        # slowest-rank-per-phase reading. The same time a step is their
        # mean step, the whole time of the common steps over their number:
        # paced ranks cross the collective together every step, so their
        # whole times differ by one step's jitter at most, whereas their
        # medians need not agree (on a loaded machine each rank is held up
        # in other steps: a 2-rank DDP job measured medians of 4.7 and 5.6
        # ms a step on means of 5.70 and 5.70).
        step_mean = dur.sum(axis=2).mean(axis=1)
        fast, slow = float(np.min(step_mean)), float(np.max(step_mean))
        leave_spread = float(np.median(np.ptp(leave[:, :, wp], axis=0)))
        # Which test failed says what was seen: ranks that pace each other
        # (DDP's all-reduce every step) but none late enough to be waited on
        # are not ranks that never wait.
        if fast < (1.0 - SYNC_STEP_SPREAD) * slow:
            return _replace(base, reason=(
                f"the ranks' steps differ by more than {SYNC_STEP_SPREAD * 100:.0f}% (mean "
                f"{fast * 1e3:.3f} to {slow * 1e3:.3f} ms): no collective paces them, so no "
                "rank waits for another"))
        if leave_spread > SYNC_LEAVE_SPREAD * step_med:
            return _replace(base, reason=(
                "the ranks leave no phase together (by "
                f"{leave_spread / step_med * 100:.0f}% of the step at best): no collective "
                "paces them, so no rank waits for another"))
        if not scores[wp] > 0.0:
            return _replace(base, reason="the ranks keep pace with each other, and none "
                            "arrives late enough at a phase for the others to wait on it")
    wait = _ORDER[wp]
    arrive = enter[:, :, wp]  # (ranks, steps)
    late = np.empty((n_ranks, n_steps))
    for i in range(n_ranks):
        others = np.delete(arrive, i, axis=0)
        late[i] = arrive[i] - np.median(others, axis=0)
    med_late = np.median(late, axis=1)
    c = int(np.argmax(med_late))
    lateness = float(med_late[c])
    consistency = float(np.mean(np.argmax(arrive, axis=0) == c))
    others_dur = np.delete(dur, c, axis=0)
    excess = np.median(dur[c] - np.median(others_dur, axis=0), axis=0)
    contributions = {names[j]: float(excess[j]) for j in range(len(names)) if j != wp}
    # What the rank's own work explains of its lateness: a rank that is
    # late by a constant offset with no more work than the others (gloo
    # releases ranks from a collective a fraction of a millisecond apart) is
    # not a straggler.
    work = sum(max(0.0, x) for x in contributions.values())
    loss = min(lateness, work)
    verdict = _replace(base, wait_phase=wait, lateness=lateness, consistency=consistency,
                       contributions=contributions, loss=loss)
    floor = max(CULPRIT_MIN_SHARE * step_med, CULPRIT_MIN_SECONDS)
    if loss < floor:
        return _replace(verdict, reason=(
            f"the latest rank reaches {wait} {lateness * 1e3:.2f} ms after the others' "
            f"median, {work * 1e3:.2f} ms of it its own extra work, under the "
            f"{floor * 1e3:.2f} ms threshold"))
    if consistency < CULPRIT_MIN_CONSISTENCY:
        return _replace(verdict, reason=(
            f"rank {rank_ids[c]} is last to reach {wait} in only {consistency:.0%} of the "
            f"steps (threshold {CULPRIT_MIN_CONSISTENCY:.0%})"))
    phase = max(contributions, key=lambda k: contributions[k])
    wait_time = np.median(dur[:, :, wp], axis=1)
    victims = tuple(
        rank_ids[i] for i in range(n_ranks)
        if i != c and wait_time[i] - wait_time[c] >= 0.5 * loss
    )
    return _replace(verdict, culprit=rank_ids[c], culprit_phase=phase,
                    phase_loss=contributions[phase], victims=victims)


def _replace(s: Straggler, **changes: Any) -> Straggler:
    return replace(s, **changes)


def ranks_phrase(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ",".join(str(r) for r in ranks)
