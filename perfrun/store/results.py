"""A run folder read back: every rank's document merged into one run.

The live path (the launcher, after the script ended) and `perfrun report`
both come through `read_run`, so what is printed after a run can be
reproduced from its folder. A rank restarted by torchrun elastic leaves one
file per restart; the last one stands for the rank. A rank the launcher
expected but that wrote nothing is `missing`.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from . import layout
from .files import DAMAGED, MISSING, ResultsError
from .rankfile import RankResult, hostname, read_rank_file
from .runmeta import read_exit_codes, read_run_meta, run_started, task_exit_codes

#: What a run in which no rank imported torch reports (the full report, and
#: the command line's short one for such runs: never_imported_torch).
NO_TORCH = "no PyTorch training loop was seen: the script never imported torch"

#: Said when perfrun saw no torch at all: the likeliest reason in a script
#: that does train is that it trains in a process perfrun never entered.
BOOTSTRAP_HINT = (
    "the process perfrun started never imported torch. If the script trains in a process "
    "it starts itself (subprocess, python -E, -I or -S) or after it re-executes itself "
    "(os.exec*), perfrun does not measure that process; a script that does not use "
    "PyTorch has no training loop for perfrun to see"
)


def find_rank_files(run_dir: str) -> list[str]:
    """The rank files of a run folder, ordered by rank then restart."""
    found = []
    for path in glob.glob(os.path.join(run_dir, "rank*.json")):
        m = layout.RANK_FILE.match(os.path.basename(path))
        if m:
            found.append((int(m.group(1)), int(m.group(2) or 0), path))
    return [p for _, _, p in sorted(found)]


@dataclass
class RunResults:
    """All ranks of one run, merged: for each rank its last restart's file."""

    run_dir: str
    ranks: list[RankResult]
    meta: dict[str, Any] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    #: torchrun's record of its failed workers (runmeta.read_exit_codes):
    #: each failed rank's exit status (negative: the signal that ended it),
    #: and the rank torchrun saw fail first.
    exit_codes: dict[int, int] = field(default_factory=dict)
    first_failed: Optional[int] = None

    @property
    def world_size(self) -> int:
        sizes = [int(r.data.get("world_size", 1)) for r in self.ranks]
        return max(sizes + [int(self.meta.get("expected_ranks", 0) or 0), 1])


def never_imported_torch(run: RunResults) -> bool:
    """A run whose every rank finished without importing torch: there is
    nothing to analyse, so its report needs none of the analysis or table
    machinery (and a script that never imports torch is not slowed by it)."""
    return bool(run.ranks) and not run.missing and all(
        not r.n_steps and not r.data.get("torch_imported") and r.status == "finished"
        and not (r.data.get("exit") or {}).get("exception")
        for r in run.ranks
    )


def read_run(run_dir: str, check_steps: bool = True) -> RunResults:
    """Read and merge a run folder (the live path and `perfrun report` both
    come through here, so what is printed after a run can be reproduced).
    `check_steps=False`: each step file's rows are checked on the first pass
    over them (rankfile.validate), for a report, which reads each once."""
    if not os.path.isdir(run_dir):
        raise ResultsError(not_a_run_folder(run_dir), MISSING if not os.path.exists(run_dir)
                           else DAMAGED)
    paths = find_rank_files(run_dir)
    meta = read_run_meta(run_dir)
    if not paths and not meta:
        raise ResultsError(f"{run_dir} holds no perfrun results (no rank*.json)")
    by_rank: dict[int, RankResult] = {}
    for path in paths:
        result = read_rank_file(path, check_steps)
        current = by_rank.get(result.rank)
        if current is None or result.restart >= current.restart:
            by_rank[result.rank] = result
    ranks = [by_rank[r] for r in sorted(by_rank)]
    expected = int(meta.get("expected_ranks") or 0)
    world = max([int(r.data.get("world_size", 1)) for r in ranks] + [expected, 0])
    missing = [r for r in range(world) if r not in by_rank]
    job: dict[str, Any] = meta["job"] if isinstance(meta.get("job"), dict) else {}
    if str(meta.get("nnodes") or "1") != "1" and not isinstance(job.get("world_size"), int):
        # Several nodes with no job-wide record (a folder from before job
        # folders, or an elastic MIN:MAX job): this folder may hold one
        # node's ranks only, and the others' are not missing, they are in
        # the other nodes' folders. A job folder's run.json counts the
        # job's ranks (expected_ranks), so its missing ranks are the job's.
        missing = []
    first, codes = read_exit_codes(run_dir)
    codes = {**task_exit_codes(meta), **codes}
    return RunResults(run_dir=run_dir, ranks=ranks, meta=meta, missing=missing,
                      exit_codes=codes, first_failed=first)


def not_a_run_folder(path: str) -> str:
    """What to tell a user who named `path` as a run folder and it is
    none: that nothing is there, or what the file is and what reads it
    (a file of a run folder, a baseline, anything else)."""
    if not os.path.lexists(path):
        return f"no such results folder: {path}"
    if not os.path.isfile(path):
        return f"{path} is not a folder: give a run folder or a log folder"
    folder = os.path.dirname(os.path.abspath(path))
    if is_run_dir(folder):
        return (f"{path} is a file of the run folder {folder}: give the folder "
                f"(perfrun report {folder})")
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        head = b""
    if b'"perfrun-baseline"' in head:
        return (f"{path} is a baseline file, not a results folder: compare a run with it "
                f"(perfrun compare {path} RUN)")
    return (f"{path} is a file, not a results folder: give a run folder or a log folder "
            "(a torch.profiler trace is read by perfrun analyze)")


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path) and (
        bool(find_rank_files(path)) or os.path.exists(os.path.join(path, layout.RUN_META))
    )


def resolve_run_dir(path: str, note: Optional[Callable[[str], None]] = None) -> str:
    """Accept a run folder, a log folder (its newest run), or a `latest` link.

    `latest` is where the launcher points each new run, but a link can go
    stale: its run deleted, or the folder copied without it, or a run
    started by a perfrun that could not make links. In a log folder the
    newest existing run wins, and `note` (given one line) is told when
    that is not what `latest` points to, so the caller can say so and
    earlier runs are never hidden behind it."""
    if not os.path.isdir(path) or is_run_dir(path):
        return path
    latest = os.path.join(path, layout.LATEST)
    target = os.path.realpath(latest) if os.path.lexists(latest) else None
    try:
        names = os.listdir(path)
    except OSError:
        names = []
    # A name starting with "." is a folder being removed (--keep) or
    # assembled (combine): never the newest run.
    runs = [
        os.path.join(path, name) for name in names
        if name != layout.LATEST and not name.startswith(layout.HIDDEN)
        and is_run_dir(os.path.join(path, name))
    ]
    if not runs:
        return target if target is not None and os.path.isdir(target) else path
    newest = max(runs, key=lambda d: (run_started(d), os.path.basename(d)))
    if target is not None and is_run_dir(target):
        if run_started(target) >= run_started(newest):
            return target
        why = f"{latest} points to an older run ({os.path.basename(target)})"
    elif target is not None:
        why = f"{latest} points to a missing run ({os.path.basename(target)})"
    else:
        why = f"{path} has no latest link"
    if note is not None:
        note(f"{why}; reporting the newest run, {newest}")
    return newest


def rank_alive(rank: RankResult) -> Optional[bool]:
    """Whether the process that wrote `rank` is still running: True or False
    when it ran on this host, None when that cannot be told (another host,
    no pid recorded). A file whose status is "running" was written by a
    live rank's periodic flush; only a dead process makes it a rank that
    died. A pid can be reused after its process ends, so True is a strong
    hint rather than proof: pair it with the file's age when it matters."""
    env = rank.data.get("env")
    if not isinstance(env, dict):
        return None
    pid, host = env.get("pid"), env.get("hostname")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not host:
        return None
    if host != hostname():
        return None
    return pid_alive(pid)


def pid_alive(pid: int) -> Optional[bool]:
    """Whether a process of this host is running: None where it cannot be
    told. One that exists under another user is alive (the signal is
    refused, not the process missing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def live_ranks(run: RunResults, now: Optional[float] = None) -> set[int]:
    """Ranks of a run still in progress: a `running` rank whose process is
    alive on this machine (a report taken during the run). A rank on
    another host cannot be asked: in a multi-node job folder it counts as
    running while its node's launcher has recorded no end and its file was
    written in the last RANK_FRESH seconds (a live rank rewrites it every
    few). A run whose launchers all recorded their end has none."""
    if run.meta.get("returncode") is not None:
        return set()
    nodes = run.meta.get("nodes") if isinstance(run.meta.get("nodes"), dict) else {}
    now = time.time() if now is None else now
    live = set()
    for rank in run.ranks:
        if rank.status != "running" or (rank.data.get("env") or {}).get("pid") == os.getpid():
            continue
        alive = rank_alive(rank)
        if alive is None and nodes:
            alive = _node_running(rank, nodes) and _written_since(rank.path, now - RANK_FRESH)
        if alive:
            live.add(rank.rank)
    return live


#: How recently a rank on another host must have written its file to count
#: as running (it flushes every 2 seconds).
RANK_FRESH = 60.0


def _node_running(rank: RankResult, nodes: dict[str, Any]) -> bool:
    """Whether the launcher of the node `rank` ran on has recorded no end:
    the node found by the --node-rank in the rank's settings, else by host;
    a task of a job srun or mpirun started (launcher/external.py), a node
    of one rank, by that rank."""
    node_rank = (rank.data.get("settings") or {}).get("node_rank")
    host = (rank.data.get("env") or {}).get("hostname")
    for key, node in nodes.items():
        if not isinstance(node, dict):
            continue
        task = node.get("task")
        if isinstance(task, dict):
            mine = task.get("rank") == rank.rank
        else:
            mine = str(node_rank) == key if node_rank is not None else node.get("host") == host
        if mine:
            return not isinstance(node.get("returncode"), int)
    return False


def _written_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except OSError:
        return False
