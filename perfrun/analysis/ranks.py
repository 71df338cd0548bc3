"""Several ranks side by side: each rank's averages, min / median / max
across ranks, the slowest rank, the straggler verdict, and what went wrong
with a rank (died, killed, raised, wrote nothing).

In data-parallel training every step waits for the slowest rank, so one
slow rank (a throttled GPU, a busy host, a skewed shard) sets the pace of
all of them; and a rank that died explains the others' numbers. Pure
functions over the ranks' documents and counted steps (selection.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from perfrun.analysis import columns
from perfrun.analysis.flops import median_step
from perfrun.analysis.selection import rank_counted
from perfrun.analysis.stats import Stats
from perfrun.analysis.straggler import RankSteps, Straggler
from perfrun.analysis.straggler import decide as decide_straggler
from perfrun.store.files import full_reason
from perfrun.store.rankfile import RankResult
from perfrun.store.stepfile import PHASES


def _signal_name(number: Any) -> str:
    try:
        return signal.Signals(int(number)).name
    except (TypeError, ValueError):
        return f"signal {number}"


def steps_phrase(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def unsaved_problem(rank: RankResult) -> Optional[str]:
    """Where the rank's results stop when its last save could not write
    every step it held (a full disk), or None. Its own words: what is
    reported is what was saved, and the steps after it are not."""
    unsaved = rank.data.get("unsaved")
    if not isinstance(unsaved, dict):
        return None
    code = unsaved.get("errno")
    why = full_reason(code if isinstance(code, int) else None, unsaved.get("error"))
    lost = unsaved.get("steps")
    n = rank.n_steps
    where = f"at step {n}" if n else "before the first step"
    text = f"results stopped {where}: {why}"
    if isinstance(lost, int) and lost > 0:
        were = "was" if lost == 1 else "were"
        text += (f"; the {steps_phrase(lost)} after it {were} not saved" if n else
                 f"; {steps_phrase(lost)} {were} not saved")
    return text


def rank_problem(
    rank: RankResult, exit_status: Optional[int] = None, alive: Optional[bool] = None
) -> Optional[str]:
    """What went wrong with this rank, in a few words, or None: how it
    ended (`ended_problem`), after where its results stop if a full disk
    cut them short (`unsaved_problem`)."""
    ended = ended_problem(rank, exit_status, alive)
    lost = unsaved_problem(rank)
    if lost is None:
        return ended
    if ended is None or ended == "recorded no steps":
        return lost
    return f"{lost}; {ended}"


def ended_problem(
    rank: RankResult, exit_status: Optional[int] = None, alive: Optional[bool] = None
) -> Optional[str]:
    """How this rank ended, when that was a problem, in a few words, or None.

    `alive`: whether the rank's process is still running (known where it
    runs on this machine; None where it cannot be known). A `running` file
    of a live process is a run in progress: no problem at all (the report
    says it is running, `running_sentence`).

    `running` in a file read after the run means the rank never wrote its
    final record: it died (SIGKILL, OOM killer, a hard crash) and what is left
    is its last periodic flush. A clean `--stop-after` stop is not a problem.

    `exit_status` is the process's own exit status when the launcher saw it
    (one process, no torchrun). A process that exited normally yet never
    wrote its final record did not die: it replaced itself (`os.exec*`, so
    the new program runs without perfrun), left by `os._exit`, or could not
    write (perfrun then said so on its stderr).
    """
    n = rank.n_steps
    status = rank.status
    exit_info = rank.data.get("exit") or {}
    if status == "running":
        if alive:
            return None
        when = f"after {steps_phrase(n)}" if n else "before its first step"
        if exit_status is not None and exit_status >= 0:
            return (
                f"exited with status {exit_status} {when} but never saved its final "
                "results: it re-executed itself (os.exec*) or called os._exit, or "
                "writing them failed (a full disk?)"
            )
        return f"died {when}"
    if status == "signalled":
        sig = exit_info.get("signal")
        what = f"killed by {_signal_name(sig)}" if sig is not None else "killed by a signal"
        return f"{what} after {steps_phrase(n)}"
    if status in ("finished", "stopped"):
        exception = exit_info.get("exception")
        if exception:
            text = " ".join(str(exception).split())
            if len(text) > 80:
                text = text[:77] + "..."
            return f"raised {text} after {steps_phrase(n)}"
        if n == 0:
            return "recorded no steps"
        return None
    return f"ended with unknown status {status!r} after {steps_phrase(n)}"


def running_sentence(running: Sequence[tuple[int, int]]) -> Optional[str]:
    """What a report of a run in progress says of its live ranks, each a
    (rank, steps so far): that they run, and that the report is of their
    last save. None when no rank is running."""
    if not running:
        return None
    if len(running) == 1:
        rank, n = running[0]
        return (f"rank {rank} is still running ({steps_phrase(n)} so far): this report is of "
                "its last save")
    names = ",".join(str(rank) for rank, _n in running)
    return f"ranks {names} are still running: this report is of their last saves"


@dataclass(frozen=True)
class RankRow:
    """One rank's line in the multi-rank table: averages per counted step."""

    rank: int
    hostname: Optional[str]
    status: str
    steps: int
    counted: int
    step_avg: Optional[float]
    phase_avg: dict[str, Optional[float]]
    others_avg: Optional[float]
    problem: Optional[str]
    #: The median counted step (not in the JSON): what FLOP rates are
    #: taken over, kept so that no rank's steps are read again for them.
    step_median: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "hostname": self.hostname,
            "status": self.status,
            "steps": self.steps,
            "counted": self.counted,
            "step_avg": self.step_avg,
            "phase_avg": dict(self.phase_avg),
            "others_avg": self.others_avg,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class SlowRank:
    rank: int
    step_avg: float
    median: float
    percent_slower: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "step_avg": self.step_avg,
            "median": self.median,
            "percent_slower": self.percent_slower,
        }


#: The quantities compared across ranks, in column order.
RANK_QUANTITIES = ("step",) + PHASES + ("others",)


@dataclass(frozen=True)
class MultiRankSummary:
    """Per-rank rows plus min / median / max across the ranks that counted
    steps (`across[q]` is a `Stats` over the ranks' averages of quantity q,
    one of `RANK_QUANTITIES`)."""

    rows: list[RankRow]
    across: dict[str, Stats]
    slowest: Optional[SlowRank]
    # The culprit/victim verdict (straggler.py); None when fewer than two
    # ranks share enough steady steps to compare on a common clock.
    straggler: Optional[Straggler] = None

    @property
    def problems(self) -> list[str]:
        return [f"rank {r.rank}: {r.problem}" for r in self.rows if r.problem]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows": [r.to_dict() for r in self.rows],
            "across": {k: v.to_dict() for k, v in self.across.items()},
            "slowest": self.slowest.to_dict() if self.slowest else None,
        }
        if self.straggler is not None:
            out["straggler"] = self.straggler.to_dict()
        return out


def multi_rank_summary(
    ranks: Sequence[RankResult],
    warmup: int,
    missing: Iterable[int] = (),
    exclude_window: bool = True,
    alive: Iterable[int] = (),
) -> MultiRankSummary:
    """Compare ranks: in data-parallel training every step waits for the
    slowest rank, so one slow rank (a throttled GPU, a busy host, a skewed
    shard) sets the pace of all of them."""
    live = set(alive)
    rows: list[RankRow] = []
    for rank in ranks:
        steady = rank_counted(rank, warmup, exclude_window=exclude_window).take(rank.table)
        env = rank.data.get("env") or {}
        phase_avg = {p: Stats.avg_of(columns.phase_times(steady, p)) for p in PHASES}
        rows.append(
            RankRow(
                rank=rank.rank,
                hostname=env.get("hostname"),
                status=rank.status,
                steps=rank.n_steps,
                counted=int(steady.shape[0]),
                step_avg=Stats.avg_of(columns.step_times(steady)),
                phase_avg=phase_avg,
                others_avg=Stats.avg_of(columns.others_times(steady)),
                problem=rank_problem(rank, alive=rank.rank in live),
                step_median=median_step(steady),
            )
        )
    for r in missing:
        rows.append(
            RankRow(
                rank=int(r), hostname=None, status="missing", steps=0, counted=0,
                step_avg=None, phase_avg=dict.fromkeys(PHASES), others_avg=None,
                problem="wrote nothing",
            )
        )
    rows.sort(key=lambda r: r.rank)
    across: dict[str, Stats] = {
        "step": Stats.of(r.step_avg for r in rows),
        "others": Stats.of(r.others_avg for r in rows),
    }
    for p in PHASES:
        across[p] = Stats.of(r.phase_avg[p] for r in rows)
    across = {q: across[q] for q in RANK_QUANTITIES}
    slowest: Optional[SlowRank] = None
    timed = [r for r in rows if r.step_avg is not None]
    median = across["step"].median
    if len(timed) > 1 and median:
        worst = max(timed, key=lambda r: (r.step_avg or 0.0, -r.rank))
        assert worst.step_avg is not None
        slowest = SlowRank(
            rank=worst.rank,
            step_avg=worst.step_avg,
            median=median,
            percent_slower=(worst.step_avg / median - 1.0) * 100.0,
        )
    straggler = _straggler(ranks, warmup, exclude_window)
    return MultiRankSummary(rows=rows, across=across, slowest=slowest, straggler=straggler)


#: The most steps the straggler check compares, evenly spaced over the steady
#: steps all ranks share: its verdict rests on medians per rank and per
#: phase, which a sample of this size gives to well within the noise of a
#: step, and it holds this many steps of every rank at once (a job of 64
#: ranks x 1,000,000 steps would otherwise hold all 8.7 GB of its steps).
STRAGGLER_STEPS = 20_000


def _straggler(ranks: Sequence[RankResult], warmup: int,
               exclude_window: bool) -> Optional[Straggler]:
    """The straggler verdict (straggler.py) over the steady steps every rank
    recorded, at most STRAGGLER_STEPS of them: the steps are chosen from the
    ranks' step counts alone, then read rank by rank."""
    kept = [(rank, rank_counted(rank, warmup, exclude_window=exclude_window).index())
            for rank in ranks]
    kept = [(rank, index) for rank, index in kept if len(index)]
    if len(kept) < 2:
        return None
    common = kept[0][1]
    for _, index in kept[1:]:
        common = np.intersect1d(common, index, assume_unique=True)
    if len(common) > STRAGGLER_STEPS:
        common = common[np.linspace(0, len(common) - 1, STRAGGLER_STEPS).astype(np.int64)]
    return decide_straggler([_rank_steps(rank, common) for rank, _ in kept])


def _rank_steps(rank: RankResult, index: Any) -> RankSteps:
    """The rank's steps at `index`, with their indices and clock origin."""
    env = rank.data.get("env") or {}
    origin = rank.data.get("started_unix")
    return RankSteps(
        rank=rank.rank,
        host=env.get("hostname"),
        origin=float(origin) if isinstance(origin, (int, float)) else 0.0,
        index=index,
        table=rank.take(index),
    )
