"""Keep the log folder from growing without bound: `--keep N` runs.

Every run leaves a folder, and a detailed window's traces can be tens of
megabytes a rank, so a log folder that is never pruned fills the disk a
nightly job writes to. Once a run has started, the oldest runs beyond the
newest N are removed, with one line saying which.

What is counted is runs that recorded steps: a run that recorded none (a
syntax error, `--help`, a script that never imported torch or failed before
its loop) is no measurement, and twenty such mistakes must not push out
every real run. So the newest N runs with steps are kept, besides the run
starting (whose steps are not known yet); runs without steps are removed
first, and kept only in the room the runs with steps leave.

Only what perfrun named itself is ever a candidate (`YYYYMMDD-HHMMSS-PID`
and `job-...` folders holding run.json or rank files): a folder a user put
there, or made with `perfrun combine`, is neither counted nor removed. The
current run is never removed, and neither is a run that may still be in
progress: one whose launcher has not recorded its end, unless every process
it had is known to be dead (on this host) or it has written nothing for
STALE_AFTER seconds (on another host, where no process can be asked; a live
rank rewrites its file every few seconds).

A folder is first renamed out of the way, then deleted: a reader never sees
half a run, and of two launchers pruning one shared folder only one wins
each folder.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..store.files import ResultsError
from ..store.layout import MANAGED, NODES_DIR, REMOVING, RUN_META
from ..store.rankfile import hostname, peek_rank_file, read_rank_file
from ..store.results import pid_alive, rank_alive
from ..store.runmeta import peek_run_meta

#: The default of --keep: a few weeks of nightly runs, a day of busy work.
DEFAULT_KEEP = 20
#: A run that has not ended and whose processes cannot be asked counts as
#: in progress until it has written nothing for this long. A rendezvous
#: waits up to 15 minutes by default; a live rank writes every 2 seconds.
STALE_AFTER = 3600.0


@dataclass(frozen=True)
class RunState:
    """What retention needs to know of one run folder."""

    name: str
    #: When it began (run.json's `started`, else the folder's mtime).
    started: float
    #: Its launcher(s) recorded an end.
    ended: bool
    #: True: a process of the run is alive; False: every process of it was
    #: on this host and is dead; None: cannot be told.
    alive: Optional[bool]
    #: The newest modification time of its files.
    last_write: float
    #: Steps its ranks recorded, as far as its rank files say (the first
    #: rank file that has any); 0 for a run that recorded none.
    steps: int = 0


def in_progress(run: RunState, now: float, stale_after: float = STALE_AFTER) -> bool:
    """Whether a run may still be running, so must not be removed."""
    if run.ended:
        return False
    if run.alive is not None:
        return run.alive
    return now - run.last_write < stale_after


def runs_to_remove(
    runs: Sequence[RunState], keep: int, current: str, now: float,
    stale_after: float = STALE_AFTER,
) -> list[str]:
    """The names of the runs to remove: besides the current run (never
    removed, whatever its start time), the newest `keep` runs with steps
    stay, and runs without steps only fill the room those leave. The runs
    without steps go first, then the runs with steps, each oldest first;
    none still in progress. `keep` 0 keeps everything."""
    if keep <= 0:
        return []
    newest_first = sorted((r for r in runs if r.name != current),
                          key=lambda r: (r.started, r.name), reverse=True)
    measured = [r for r in newest_first if r.steps > 0]
    empty = [r for r in newest_first if r.steps <= 0]
    room = keep - min(keep, len(measured))
    doomed = [*reversed(empty[room:]), *reversed(measured[keep:])]
    return [r.name for r in doomed if not in_progress(r, now, stale_after)]


# -- reading the log folder -------------------------------------------------------


def scan(log_dir: str, skip: Iterable[str] = (), ask: bool = False) -> list[RunState]:
    """The run folders perfrun made in `log_dir`. `skip`: names not to
    look into (the current run); they are still listed. `ask`: find out
    whether the processes of runs not ended are alive (see read_state)."""
    skipped = set(skip)
    try:
        names = os.listdir(log_dir)
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(log_dir, name)
        if not MANAGED.match(name) or os.path.islink(path) or not os.path.isdir(path):
            continue
        if name in skipped:
            out.append(RunState(name, float("inf"), False, True, time.time()))
            continue
        state = read_state(path, ask)
        if state is not None:
            out.append(state)
    return out


def read_state(path: str, ask: bool = True) -> Optional[RunState]:
    """A run folder's RunState, or None when it is no run folder (no
    run.json and no rank file). `ask` False leaves `alive` unknown: asking
    may read rank files, which only the runs about to be removed need."""
    files = _files(path)
    meta_path = os.path.join(path, RUN_META)
    rank_files = [p for p in files if os.path.basename(p).startswith("rank")
                  and p.endswith(".json")]
    if meta_path not in files and not rank_files:
        return None
    meta = peek_run_meta(path) if meta_path in files else {}
    mtimes = [_mtime(p) for p in files] or [_mtime(path)]
    started = meta.get("started")
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        started = _mtime(path)
    ended = isinstance(meta.get("returncode"), int)
    alive: Optional[bool] = None
    if not ended and ask:
        alive = _alive(meta, rank_files)
    return RunState(os.path.basename(path), float(started), ended, alive, max(mtimes),
                    _steps(sorted(rank_files)))


def _steps(rank_files: list[str]) -> int:
    """The steps of the first rank file that recorded any (one is enough
    to tell a run with steps; a file that cannot be read counts none)."""
    for path in rank_files:
        doc = peek_rank_file(path)
        steps = doc.get("steps") if doc is not None else None
        if not isinstance(steps, dict):
            continue
        count = steps.get("count")
        if not isinstance(count, int) or isinstance(count, bool):
            rows = steps.get("rows")  # format 1: the rows inline
            count = len(rows) if isinstance(rows, list) else 0
        if count > 0:
            return count
    return 0


def _alive(meta: dict[str, Any], rank_files: list[str]) -> Optional[bool]:
    """Ask the run's processes on this host: its launcher(s) (run.json's
    host and pid, or each node's in a job folder), else its ranks. True if
    any is alive, False if all were here and are dead, else None."""
    here = hostname()
    launchers = list((meta.get("nodes") or {}).values()) if isinstance(
        meta.get("nodes"), dict) else []
    if not launchers and meta:
        launchers = [meta]
    answers: list[Optional[bool]] = []
    for node in launchers:
        if not isinstance(node, dict):
            answers.append(None)
        elif isinstance(node.get("returncode"), int):
            answers.append(False)
        elif node.get("host") == here and isinstance(node.get("pid"), int):
            answers.append(pid_alive(node["pid"]))
        else:
            answers.append(None)
    if True in answers:
        return True
    for path in rank_files:
        try:
            answers.append(rank_alive(read_rank_file(path)))
        except ResultsError:
            answers.append(None)
        if answers[-1]:
            return True
    if answers and all(a is False for a in answers):
        return False
    return None


def _files(path: str) -> list[str]:
    out = []
    for sub in (path, os.path.join(path, NODES_DIR)):
        try:
            with os.scandir(sub) as entries:
                out += [e.path for e in entries if e.is_file(follow_symlinks=False)]
        except OSError:
            pass
    return out


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def prune(log_dir: str, keep: int, current: str) -> list[str]:
    """Remove the runs `runs_to_remove` picks; return the names this
    process removed (another launcher pruning the same folder may take
    some first)."""
    if keep <= 0:
        return []
    _clear_leftovers(log_dir)
    runs = scan(log_dir, skip=[current])
    if sum(r.name != current for r in runs) <= keep:
        return []
    # Ask about processes only for the runs that would go.
    going = set(runs_to_remove(runs, keep, current, time.time(), stale_after=float("-inf")))
    runs = [
        (read_state(os.path.join(log_dir, r.name)) or r) if r.name in going and not r.ended else r
        for r in runs
    ]
    removed = []
    for name in runs_to_remove(runs, keep, current, time.time()):
        src = os.path.join(log_dir, name)
        doomed = os.path.join(log_dir, f"{REMOVING}{name}-{os.getpid()}")
        try:
            os.rename(src, doomed)
        except OSError:
            continue  # gone already, or not ours to move
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(name)
    return removed


def _clear_leftovers(log_dir: str) -> None:
    """Folders a pruning launcher renamed and did not finish deleting (it
    was killed): nobody reads them."""
    try:
        names = os.listdir(log_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(REMOVING):
            shutil.rmtree(os.path.join(log_dir, name), ignore_errors=True)


def removal_note(removed: Sequence[str], log_dir: str, keep: int) -> str:
    """The line that says what was removed, and how to keep more."""
    n = len(removed)
    shown = ", ".join(removed[:5]) + (f" and {n - 5} more" if n > 5 else "")
    return (
        f"removed {n} old run{'' if n == 1 else 's'} from {log_dir} ({shown}): keeping the "
        f"newest {keep} with steps, runs without steps first to go (--keep N to change, "
        "--keep 0 keeps all)"
    )
