"""Several ranks side by side: each rank's averages, min / median / max
across ranks, the slowest rank, the straggler verdict, what went wrong
with a rank (died, killed, raised, wrote nothing), and, when ranks failed
one after another, which failed first.

In data-parallel training every step waits for the slowest rank, so one
slow rank (a throttled GPU, a busy host, a skewed shard) sets the pace of
all of them; and a rank that died explains the others' numbers. Pure
functions over the ranks' documents and counted steps (selection.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from perfrun.analysis import digest
from perfrun.analysis.rankpass import RankPass, read_pass
from perfrun.analysis.selection import Counted, rank_counted
from perfrun.analysis.stats import Stats, size
from perfrun.analysis.straggler import PACED_IN, RankSteps, Straggler
from perfrun.analysis.straggler import decide as decide_straggler
from perfrun.store.files import full_reason
from perfrun.store.rankfile import RankResult
from perfrun.store.results import RunResults
from perfrun.store.stepfile import PHASES


def _signal_name(number: Any) -> str:
    try:
        return signal.Signals(int(number)).name
    except (TypeError, ValueError):
        return f"signal {number}"


def steps_phrase(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


@dataclass(frozen=True)
class Ending:
    """How a rank's process ended, as seen from outside it: what its own
    file cannot say when it never wrote its final save (killed outright),
    or what came after that save (torchrun's clean-up)."""

    #: The process's exit status (negative: the signal that ended it): the
    #: launcher's for a run of one process, torchrun's record of its failed
    #: workers under torchrun; None when not known.
    status: Optional[int] = None
    #: When the process had ended by, at the latest (seconds since the
    #: epoch): the launcher's own end.
    by: Optional[float] = None
    #: What started it: "python" (perfrun itself) or "torchrun".
    launcher: Optional[str] = None
    #: Processes the out-of-memory killer ended in the run's memory cgroup
    #: while it ran (the launcher's count before and after); None when the
    #: kernel does not say.
    oom_kills: Optional[int] = None


def run_endings(run: RunResults) -> dict[int, Ending]:
    """How each rank's process ended, from the run's records outside the
    ranks: run.json (the launcher's exit status and end; the status is the
    rank's own only for a run of one process that perfrun started itself)
    and torchrun's record of its failed workers."""
    meta = run.meta
    launcher = meta.get("launcher") if isinstance(meta.get("launcher"), str) else None
    started, elapsed = meta.get("started"), meta.get("elapsed")
    by = (float(started) + float(elapsed)
          if _number(started) and _number(elapsed) else None)
    ooms = meta.get("oom_kills")
    oom_kills = ooms if isinstance(ooms, int) and not isinstance(ooms, bool) else None
    out = {}
    for rank in run.ranks:
        if launcher == "python":
            code = meta.get("returncode")
            status = code if isinstance(code, int) and not isinstance(code, bool) else None
        else:
            status = run.exit_codes.get(rank.rank)
            if (status is None and launcher == "torchrun" and meta.get("returncode") == 0
                    and str(meta.get("nnodes") or 1) == "1"):
                # One node's torchrun exits 0 only when every worker did.
                status = 0
        out[rank.rank] = Ending(status=status, by=by, launcher=launcher, oom_kills=oom_kills)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def saved_at(rank: RankResult) -> Optional[float]:
    """When the rank last saved (seconds since the epoch): its end, for a
    rank that wrote its final save."""
    started, elapsed = rank.data.get("started_unix"), rank.data.get("elapsed")
    if _number(started) and _number(elapsed):
        return float(started) + float(elapsed)
    return None


def steps_saved_to(rank: RankResult) -> Optional[float]:
    """How far in time (seconds since the epoch) the steps of the rank's
    last save reach: the buffered clock's last replay before it
    (`extra.flush.replayed`, up to a second before the save), or the save
    itself for a file without it."""
    last = saved_at(rank)
    flush = (rank.data.get("extra") or {}).get("flush")
    replayed = flush.get("replayed") if isinstance(flush, Mapping) else None
    started = rank.data.get("started_unix")
    if last is not None and _number(replayed) and _number(started):
        return min(last, float(started) + float(replayed))
    return last


def failed(rank: RankResult, ending: Optional[Ending] = None, alive: bool = False) -> bool:
    """Whether the rank ended other than by finishing its script (or a
    clean --stop-after): died, killed, raised, or left with a status."""
    if alive:
        return False
    exit_info = rank.data.get("exit") or {}
    os_exit = exit_info.get("os_exit")
    return (rank.status not in ("finished", "stopped") or bool(exit_info.get("exception"))
            or (isinstance(os_exit, int) and os_exit != 0)
            or bool(ending is not None and ending.status))


def first_failure(
    ranks: Sequence[RankResult],
    endings: Mapping[int, Ending],
    alive: Iterable[int] = (),
    recorded: Optional[int] = None,
    stopped: bool = False,
) -> Optional[int]:
    """The rank that failed first, when several did: in a job, one rank's
    failure fails the others (a collective loses its peer, the launcher
    stops the rest), so the first is the root cause and the others' errors
    are its consequences. None when fewer than two ranks failed.

    Each failed rank's last save (`saved_at`) orders them: a rank that
    raised or was stopped saves as it ends; one killed outright saved last
    before it died, so it orders no later than it ended, and a rank that
    failed because it died ends after it. `recorded`, torchrun's own pick
    (to the second, and ties go to the lowest local rank), stands in when a
    failed rank has no time.

    A job stopped from outside failed in no rank first: `stopped` (the
    launcher passed on a signal: run.json's `signals`), or every rank that
    failed was sent a signal it handled (Ctrl-C, a scheduler's SIGTERM)."""
    live = set(alive)
    hit = [rank for rank in ranks if failed(rank, endings.get(rank.rank), rank.rank in live)]
    if stopped or len(hit) < 2 or all(rank.status == "signalled" for rank in hit):
        return None
    # A rank whose own file says it ended well, and that only the launcher
    # ended after (torchrun's clean-up during its teardown), failed after
    # its last save, not at it: it is a candidate only if no other is.
    own = [rank for rank in hit if failed(rank)]
    times = [(saved_at(rank), rank.rank) for rank in own or hit]
    if any(t is None for t, _ in times):
        return recorded if recorded in {rank.rank for rank in hit} else None
    return min(times)[1]  # type: ignore[type-var]


def lost_span(saved: float, reach: float, interval: float, longest_save: float,
              longest_gap: float, ended_by: Optional[float]) -> float:
    """The most seconds of steps a rank killed outright can have lost: those
    after `reach`, how far in time the steps of its last save (made at
    `saved`) go. The rank saves every `interval` seconds once a save has
    ended (`longest_save`: its longest so far), and the longest it was
    seen to go from one save to the next is `longest_gap` (a flush thread
    kept waiting by a busy machine): it died before its next save was
    due, or that save would be its last. It also died before the launcher
    ended (`ended_by`, when known), which may be long after the kill
    (torchrun's teardown, the other ranks training on): the sooner of the
    two bounds the loss."""
    bound = max(0.0, saved - reach) + max(interval + max(0.0, longest_save), longest_gap)
    if ended_by is not None:
        bound = min(bound, ended_by - reach)
    return max(0.0, bound)


def _unsaved(rank: RankResult, ending: Ending, what: str,
             step_time: Optional[float]) -> str:
    """What a rank killed outright lost: the steps after its last save."""
    settings = rank.data.get("settings") or {}
    interval = settings.get("flush_interval") if isinstance(settings, Mapping) else None
    if not isinstance(interval, (int, float)) or isinstance(interval, bool):
        return ""
    why = (f"a rank saves every {interval:g} s, and {what} leaves it no time to save "
           "the rest")
    last = steps_saved_to(rank)
    saved = saved_at(rank)
    if last is None or saved is None:
        return f"; the steps after its last save are not in its results: {why}"
    flush = (rank.data.get("extra") or {}).get("flush")
    flush = flush if isinstance(flush, Mapping) else {}
    longest, apart = (flush.get(key) for key in ("max", "gap"))
    gap = lost_span(saved, last, float(interval),
                    float(longest) if isinstance(longest, (int, float)) else 0.0,
                    float(apart) if isinstance(apart, (int, float)) else 0.0, ending.by)
    steps = ""
    if step_time and step_time > 0:
        # Two figures: the gap is a bound, and the pace a median.
        k = int(round(gap / step_time))
        k = int(round(k, 2 - len(str(k)))) if k >= 100 else k
        steps = f" (about {k:,} steps at its median step)"
    return (f"; at most its last {gap:.1f} s of steps{steps} are not in its results: "
            f"{why}")


def _memory_then(rank: RankResult) -> str:
    """The rank's memory at its last sample, against what it may use."""
    memory = rank.data.get("memory")
    process = memory.get("process") if isinstance(memory, Mapping) else None
    points = process.get("points") if isinstance(process, Mapping) else None
    if not points or not isinstance(points[-1], list) or len(points[-1]) != 2:
        return ""
    value = points[-1][1]
    limit = memory.get("limit")
    of = (f"; it may use {size(limit)}" if isinstance(limit, int) and limit > 0
          and not isinstance(limit, bool) else "")
    return f" (its resident memory was {size(value)} at its last sample{of})"


def _oom_where(rank: RankResult) -> str:
    """Where the rank's first CUDA out-of-memory error happened (its step,
    phase and module, runtime/allocator.py), for the exception it raised."""
    memory = rank.data.get("memory")
    cuda = memory.get("cuda") if isinstance(memory, Mapping) else None
    oom = cuda.get("oom") if isinstance(cuda, Mapping) else None
    first = oom.get("first") if isinstance(oom, Mapping) else None
    if not isinstance(first, Mapping):
        return ""
    parts = [str(first[k]) for k in ("phase", "module") if first.get(k)]
    step = first.get("step")
    where = f" in step {step}" if isinstance(step, int) else ""
    return where + (f" ({', '.join(parts)})" if parts else "")


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


@dataclass(frozen=True)
class Unsaved:
    """Steps that ran and are not in the results because a save failed (a
    full disk): the run's results are incomplete, whatever the script's own
    status. The launcher's closing line and exit status say so (README,
    Exit codes: 74 when the script itself succeeded)."""

    #: Steps the ranks' final saves counted as not saved.
    steps: int
    #: Steps those ranks ran in all (saved and not), when every one of them
    #: said; None when a rank never saved its final results.
    ran: Optional[int]
    #: The ranks whose results were cut short, and of those the ranks that
    #: exited by themselves without their final save (their count of the
    #: steps after their last save is not known).
    ranks: tuple[int, ...]
    unknown: tuple[int, ...]
    #: Why, in a few words ("disk full"), when a rank said.
    reason: Optional[str]

    def sentence(self) -> str:
        """What was not saved, in a few words: "9,807 of the 10,831 steps
        that ran were not saved (disk full)"; where a rank ended without
        its final save, the steps its last save counted are the least."""
        why = f" ({self.reason})" if self.reason else ""
        were = "was" if self.steps == 1 else "were"
        if self.steps and self.ran is not None:
            return f"{self.steps:,} of the {self.ran:,} steps that ran {were} not saved{why}"
        one = len(self.unknown) == 1
        who = ("rank " if one else "ranks ") + ",".join(str(r) for r in self.unknown)
        its = "its" if one else "their"
        ended = f"{who} ended without saving {its} final results"
        if self.steps:
            return (f"at least {self.steps:,} step{'' if self.steps == 1 else 's'} {were} not "
                    f"saved{why}, and {ended}")
        return f"{ended}: the steps after {its} last save are not in them"

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "ran": self.ran, "ranks": list(self.ranks),
                "unknown": list(self.unknown), "reason": self.reason}


def unsaved_steps(
    ranks: Sequence[RankResult],
    endings: Mapping[int, Ending],
    alive: Iterable[int] = (),
) -> Optional[Unsaved]:
    """The steps that ran and were not saved, or None when every rank saved
    all it ran (as far as its files and the launcher say). A rank counts
    when its final save said steps were not written (`unsaved`), or when
    its process exited by itself (a status of 0 or more: no signal) yet its
    file is still a periodic save made after the script imported torch:
    its final save failed. A rank killed outright is not counted here: its
    kill is the problem the report names (with what it may have lost), and
    its status the run's."""
    live = set(alive)
    steps = ran = 0
    cut: list[int] = []
    unknown: list[int] = []
    reason: Optional[str] = None
    for rank in ranks:
        if rank.rank in live:
            continue
        status = endings.get(rank.rank, Ending()).status
        # Exited by itself, its file still a periodic save of a rank that
        # had imported torch (whose agent saves before os._exit and
        # os.exec*): the final save failed, and the steps after that save
        # are not counted. (Before torch, an os.exec* leaves the same file:
        # the script went on in another program, which is no lost step.)
        ended_unsaved = (rank.status == "running" and status is not None and status >= 0
                         and bool(rank.data.get("torch_imported")))
        record = rank.data.get("unsaved")
        lost = record.get("steps") if isinstance(record, Mapping) else None
        if isinstance(lost, int) and not isinstance(lost, bool) and lost > 0:
            steps += lost
            ran += lost + rank.n_steps
            if reason is None:
                code = record.get("errno")  # type: ignore[union-attr]
                reason = full_reason(code if isinstance(code, int) else None,
                                     record.get("error"))  # type: ignore[union-attr]
        elif not ended_unsaved:
            continue
        cut.append(rank.rank)
        if ended_unsaved:
            unknown.append(rank.rank)
    if not cut:
        return None
    return Unsaved(steps=steps, ran=ran if steps and not unknown else None, ranks=tuple(cut),
                   unknown=tuple(unknown), reason=reason)


def rank_problem(
    rank: RankResult,
    ending: Optional[Ending] = None,
    alive: Optional[bool] = None,
    first: Optional[int] = None,
    step_time: Optional[float] = None,
) -> Optional[str]:
    """What went wrong with this rank, in a few words, or None: how it
    ended (`ended_problem`, which says what the arguments are), after where
    its results stop if a full disk cut them short (`unsaved_problem`)."""
    ended = ended_problem(rank, ending, alive, first, step_time)
    lost = unsaved_problem(rank)
    if lost is None:
        return ended
    if ended is None or ended == "recorded no steps":
        return lost
    return f"{lost}; {ended}"


def ended_problem(
    rank: RankResult,
    ending: Optional[Ending] = None,
    alive: Optional[bool] = None,
    first: Optional[int] = None,
    step_time: Optional[float] = None,
) -> Optional[str]:
    """How this rank ended, when that was a problem, in a few words, or None.

    `alive`: whether the rank's process is still running (known where it
    runs on this machine; None where it cannot be known). A `running` file
    of a live process is a run in progress: no problem at all (the report
    says it is running, `running_sentence`).

    `running` in a file read after the run means the rank never wrote its
    final record: it died (SIGKILL, OOM killer, a hard crash) and what is left
    is its last periodic flush, so the signal that killed it (`ending`) and
    how much it may have lost are said. A clean `--stop-after` stop is not a
    problem.

    `ending.status` is the process's own exit status when the launcher saw
    it. A process that exited normally yet never wrote its final record did
    not die: it replaced itself (`os.exec*`, so the new program runs without
    perfrun), or could not write (perfrun then said so on its stderr).

    `first`: the rank that failed first in a job whose ranks failed one
    after another (`first_failure`): it is named as the root cause, and the
    others as failing after it. `step_time`: the rank's median step, to
    count the steps a rank killed outright lost.
    """
    ending = ending or Ending()
    n = rank.n_steps
    status = rank.status
    exit_info = rank.data.get("exit") or {}
    root = "the first rank to fail: " if first is not None and first == rank.rank else ""
    later = (f", once rank {first} had failed"
             if first is not None and first != rank.rank else "")
    code = ending.status
    if status == "running":
        if alive:
            return None
        when = f"after {steps_phrase(n)}" if n else "before its first step"
        if code is not None and code >= 0:
            return (
                f"{root}exited with status {code} {when} but never saved its final "
                "results: it re-executed itself (os.exec*) or called os._exit, or "
                "writing them failed (a full disk?)"
            )
        if code is not None:
            sig = _signal_name(-code)
            if -code == signal.SIGKILL and ending.oom_kills:
                return (f"{root}killed by the out-of-memory killer (SIGKILL) {when}{later}"
                        + _memory_then(rank) + _unsaved(rank, ending, sig, step_time))
            return f"{root}killed by {sig} {when}{later}" + _unsaved(rank, ending, sig, step_time)
        return (f"{root}died {when}{later}"
                + _unsaved(rank, ending, "a process killed outright", step_time))
    if status == "signalled":
        sig = exit_info.get("signal")
        if later and ending.launcher == "torchrun" and sig == signal.SIGTERM:
            return f"terminated by torchrun (SIGTERM) after {steps_phrase(n)}{later}"
        what = f"killed by {_signal_name(sig)}" if sig is not None else "killed by a signal"
        return f"{root}{what} after {steps_phrase(n)}{later}"
    if status in ("finished", "stopped"):
        exception = exit_info.get("exception")
        start_error = exit_info.get("start_error")
        if exception and start_error:
            return f"did not start: {exception}: {start_error}"
        then = ""
        if exception == "KeyboardInterrupt" and code == -signal.SIGINT:
            # Python ends by SIGINT after an uncaught KeyboardInterrupt, one
            # the script raised itself included: its own end, no signal's.
            pass
        elif code is not None and code < 0:
            who = "torchrun" if ending.launcher == "torchrun" else "a signal"
            then = f"; {who} then ended it ({_signal_name(-code)})"
        if exception:
            text = " ".join(str(exception).split())
            if len(text) > 80:
                text = text[:77] + "..."
            return f"{root}raised {text}{_oom_where(rank)} after {steps_phrase(n)}{later}{then}"
        os_exit = exit_info.get("os_exit")
        if isinstance(os_exit, int) and os_exit != 0:
            when = f"after {steps_phrase(n)}" if n else "before its first step"
            return f"{root}left by os._exit({os_exit}) {when}{later}"
        if n == 0:
            return "recorded no steps"
        if then and later:
            return f"finished its script after {steps_phrase(n)}{later}{then}"
        return None
    return f"ended with unknown status {status!r} after {steps_phrase(n)}"


def rank_outcome(
    rank: RankResult,
    ending: Optional[Ending] = None,
    alive: Optional[bool] = None,
    first: Optional[int] = None,
) -> str:
    """How the rank ended, in a word or two, for the Ranks table: the same
    reading as `rank_problem`, so the table and the list never disagree."""
    ending = ending or Ending()
    exit_info = rank.data.get("exit") or {}
    status = rank.status
    if status == "running":
        word = ("running" if alive else "killed" if ending.status is not None
                and ending.status < 0 else "died")
    elif status == "signalled":
        word = ("terminated" if first is not None and first != rank.rank
                and ending.launcher == "torchrun"
                and exit_info.get("signal") == signal.SIGTERM else "killed")
    elif status in ("finished", "stopped"):
        os_exit = exit_info.get("os_exit")
        if exit_info.get("start_error"):
            word = "not started"
        elif exit_info.get("exception"):
            word = "raised"
        elif isinstance(os_exit, int) and os_exit != 0:
            word = f"os._exit({os_exit})"
        else:
            word = status
    else:
        word = status
    return f"{word}, first" if first is not None and first == rank.rank else word


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
    #: How it ended, in a word or two (rank_outcome): the table's Status.
    #: `status` is its rank file's own (running, finished, stopped,
    #: signalled), kept for readers of the JSON.
    outcome: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "hostname": self.hostname,
            "status": self.status,
            "outcome": self.outcome or self.status,
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
    #: The rank that failed first when several failed (first_failure).
    first_failed: Optional[int] = None

    @property
    def problems(self) -> list[str]:
        """Each rank's problem, the root cause first."""
        rows = sorted(self.rows, key=lambda r: r.rank != self.first_failed)
        return [f"rank {r.rank}: {r.problem}" for r in rows if r.problem]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows": [r.to_dict() for r in self.rows],
            "across": {k: v.to_dict() for k, v in self.across.items()},
            "slowest": self.slowest.to_dict() if self.slowest else None,
            "first_failed": self.first_failed,
        }
        if self.straggler is not None:
            out["straggler"] = self.straggler.to_dict()
        return out


@dataclass(frozen=True)
class Steady:
    """What the Ranks table takes from one rank's counted steps: how many,
    the step's, each phase's and Others' averages, and the median step
    (for the FLOP rates and the steps a rank killed outright lost)."""

    counted: int
    step_avg: Optional[float]
    phase_avg: dict[str, Optional[float]]
    others_avg: Optional[float]
    step_median: Optional[float]


def steady_of(steps: RankPass, counted: Counted) -> Steady:
    """A rank's Steady figures from the pass over its steps (rankpass.py),
    over its `counted` steps."""
    times = steps.times("step", counted)
    median = steps.median("step", counted, finite=True)
    return Steady(
        counted=digest.size(times),
        step_avg=digest.avg_of(times),
        phase_avg={p: digest.avg_of(steps.times(p, counted)) for p in PHASES},
        others_avg=digest.avg_of(steps.times("others", counted)),
        # flops.median_time's: none that is not positive.
        step_median=median if median is not None and median > 0.0 else None,
    )


#: multi_rank_summary's `straggler`: not given, so decided there.
READ = object()


def multi_rank_summary(
    ranks: Sequence[RankResult],
    warmup: int,
    missing: Iterable[int] = (),
    exclude_window: bool = True,
    alive: Iterable[int] = (),
    endings: Optional[Mapping[int, Ending]] = None,
    recorded_first: Optional[int] = None,
    stopped: bool = False,
    steady: Optional[Mapping[int, Steady]] = None,
    straggler: Any = READ,
) -> MultiRankSummary:
    """Compare ranks: in data-parallel training every step waits for the
    slowest rank, so one slow rank (a throttled GPU, a busy host, a skewed
    shard) sets the pace of all of them. `endings`: how each rank's process
    ended, seen from outside (torchrun's record); `recorded_first`: the rank
    torchrun saw fail first; `stopped`: the launcher passed on a signal
    (see first_failure). `steady` (by rank) and `straggler`: what the
    caller's passes over the ranks' steps found already (build_report reads
    each rank once for every figure); else each rank is read here."""
    live = set(alive)
    endings = endings or {}
    first = first_failure(ranks, endings, live, recorded_first, stopped)
    if steady is None:
        steady = {}
        for rank in ranks:
            counted = rank_counted(rank, warmup, exclude_window=exclude_window)
            steady[rank.rank] = steady_of(read_pass(rank, selections=[counted]), counted)
    rows: list[RankRow] = []
    for rank in ranks:
        found = steady[rank.rank]
        env = rank.data.get("env") or {}
        median = found.step_median
        ending, on = endings.get(rank.rank), rank.rank in live
        rows.append(
            RankRow(
                rank=rank.rank,
                hostname=env.get("hostname"),
                status=rank.status,
                steps=rank.n_steps,
                counted=found.counted,
                step_avg=found.step_avg,
                phase_avg=dict(found.phase_avg),
                others_avg=found.others_avg,
                problem=rank_problem(rank, ending, alive=on, first=first, step_time=median),
                step_median=median,
                outcome=rank_outcome(rank, ending, alive=on, first=first),
            )
        )
    for r in missing:
        rows.append(
            RankRow(
                rank=int(r), hostname=None, status="missing", steps=0, counted=0,
                step_avg=None, phase_avg=dict.fromkeys(PHASES), others_avg=None,
                problem="wrote nothing", outcome="no results",
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
    if straggler is READ:
        straggler = _straggler(ranks, warmup, exclude_window)
    return MultiRankSummary(rows=rows, across=across, slowest=slowest, straggler=straggler,
                            first_failed=first)

#: The most steps the straggler check compares, evenly spaced over the steady
#: steps all ranks share: its verdict rests on medians per rank and per
#: phase, which a sample of this size gives to well within the noise of a
#: step, and it holds this many steps of every rank at once (a job of 64
#: ranks x 1,000,000 steps would otherwise hold all 8.7 GB of its steps).
STRAGGLER_STEPS = 20_000


def straggler_steps(ranks: Sequence[RankResult], warmup: int,
                    exclude_window: bool) -> Optional[Any]:
    """The steps the straggler check compares (step indices): the steady
    steps every rank that has any recorded, at most STRAGGLER_STEPS of
    them, chosen from the ranks' step counts alone, so that a pass over
    each rank can gather them (rankpass.Picked); None when fewer than two
    ranks have steady steps."""
    kept = [counted for counted in (rank_counted(rank, warmup, exclude_window=exclude_window)
                                    for rank in ranks) if counted.count]
    if len(kept) < 2:
        return None
    # The steps counted on every rank: the counted masks anded (a million
    # steps of 64 ranks in milliseconds, where intersecting their indices
    # sorted them all).
    shared = min(counted.n for counted in kept)
    keep = np.ones(shared, dtype=bool)
    for counted in kept:
        keep &= counted.mask()[:shared]
    common = np.flatnonzero(keep)
    if len(common) > STRAGGLER_STEPS:
        common = common[np.linspace(0, len(common) - 1, STRAGGLER_STEPS).astype(np.int64)]
    return common


def straggler_of(ranks: Sequence[RankResult], index: Any,
                 rows: Mapping[int, Any]) -> Optional[Straggler]:
    """The straggler verdict (straggler.py) over the steps `index`
    (straggler_steps) of every rank that has steady steps, each rank's rows
    at `index` in `rows` (by rank)."""
    compared = [rank for rank in ranks if rank.rank in rows]
    return decide_straggler([_rank_steps(rank, index, rows[rank.rank]) for rank in compared],
                            paced=paced_phase(compared))


def paced_phase(ranks: Sequence[RankResult]) -> Optional[str]:
    """The phase a collective makes the ranks wait in every step, where
    their files say (straggler.PACED_IN: Backward for a model the ranks
    call through DistributedDataParallel), or None. Their times alone do
    not always tell: on a loaded machine the all-reduce hands its result to
    each rank a little late in turn, and their steps then read as those of
    ranks that no collective paces. One rank's word is enough: DDP runs
    only when every rank takes part in its all-reduce."""
    for rank in ranks:
        record = rank.data.get("distributed")
        wrappers = record.get("wrappers") if isinstance(record, Mapping) else None
        for name in wrappers if isinstance(wrappers, list) else ():
            if name in PACED_IN:
                return PACED_IN[name]
    return None


def _straggler(ranks: Sequence[RankResult], warmup: int,
               exclude_window: bool) -> Optional[Straggler]:
    """The straggler verdict over the steady steps every rank recorded, at
    most STRAGGLER_STEPS of them, read rank by rank."""
    index = straggler_steps(ranks, warmup, exclude_window)
    if index is None:
        return None
    with_steps = [rank for rank in ranks
                  if rank_counted(rank, warmup, exclude_window=exclude_window).count]
    return straggler_of(with_steps, index, {rank.rank: rank.take(index)
                                            for rank in with_steps})


def _rank_steps(rank: RankResult, index: Any, table: Any) -> RankSteps:
    """The rank's steps at `index` (`table`), with their indices and clock
    origin."""
    env = rank.data.get("env") or {}
    origin = rank.data.get("started_unix")
    return RankSteps(
        rank=rank.rank,
        host=env.get("hostname"),
        origin=float(origin) if isinstance(origin, (int, float)) else 0.0,
        index=index,
        table=table,
    )
