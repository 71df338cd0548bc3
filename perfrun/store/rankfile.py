"""A rank's document, `rank<R>.json`: its spec, its one writer, its reader.

Each rank writes one JSON document about itself (who it is, how it ended,
its environment and settings, its DataLoaders, device samples, window
tables, faults, notes, live position) and rewrites it whole at every flush,
so it stays a few kilobytes however long the run: the steps themselves go
to the step file beside it (stepfile.py). A rank writes it from two places,
before the script imports torch (runtime/lite.py) and after
(runtime/saving.py); both build it with `rank_document`, so the two can
never disagree on its shape.

Version history:

* 2: the steps in an append-only step file beside the rank file, named by
  `steps.file`, with `steps.count` the rows written by this save (a reader
  takes every whole row the file holds, which is never fewer; see
  `_step_file` for a file that holds fewer, or more after a final save);
* 1: the steps inline, as rows under `steps.columns`: still read, still
  written inside baselines (a baseline is one file that stands alone) and
  by a rank that never imported torch (it has no steps).

Readers refuse versions they do not know: a newer file read by an older
perfrun must fail loudly, never be half-understood. Times in the steps are
seconds on the rank's monotonic clock, relative to the moment perfrun
started inside that rank; `started_unix` puts that moment on the wall clock.

The writer's side is standard library only (the rank imports it at start);
the reader uses numpy, imported inside the reading functions.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from itertools import chain
from operator import itemgetter
from typing import Any, NamedTuple, Optional

from .. import __version__
from .files import ResultsError, atomic_write_text, load_json
from .schema import (
    BOOL,
    INT,
    LIST,
    NUMBER,
    OBJ,
    STR,
    Kind,
    ListOf,
    Obj,
    Opt,
    SchemaError,
    check,
    shown,
    type_name,
)
from .stepfile import (
    COL,
    READ_ROWS,
    REQUIRED_COLUMNS,
    STEP_COLUMNS,
    StepFileError,
    blocks,
    damage,
    read_header,
    read_table,
)

FORMAT = "perfrun-results"
VERSION = 2
#: The fault (`faults[].where`) of a rank whose profiling could not start
#: when the script imported torch (runtime/lite.py): the script trained on
#: unseen, which the report says rather than "no training loop".
PROFILING_DISABLED = "profiling"


# -- spec ------------------------------------------------------------------------------

#: Timing statistics of a named thing (an operator, a kernel, a copy).
_STATS = Obj({
    "name": STR,
    "calls": INT,
    "total": NUMBER,
    "avg": Opt(NUMBER),
    "max": Opt(NUMBER),
    "min": Opt(NUMBER),
    "ratio": Opt(NUMBER),
})
_DIST_SIDE = Obj({
    name: Opt(NUMBER)
    for name in ("communication", "computation", "overlap", "communication_ratio",
                 "computation_ratio", "overlap_ratio")
})
_WINDOW_SUMMARY = Obj({
    "steps": INT,
    # The window's training time: its evaluation passes (below) are out of
    # every table, as they are out of the step rows.
    "window_time": NUMBER,
    # The steps' time outside every phase (Others), what operators took of
    # it (the rest: the loop's own Python) and the longest of them
    # (outermost calls); absent from files written before it was recorded.
    "others": Opt(Obj({"time": NUMBER, "operators": NUMBER,
                       "top": ListOf(Obj({"name": STR, "calls": INT, "total": NUMBER}))})),
    "evaluation": Obj({"passes": INT, "time": NUMBER, "operator_calls": INT,
                       "operator_time": NUMBER}),
    # The trace file's size, its size before --max-trace-mb cut it, and
    # the steps it kept then.
    "trace_bytes": Opt(INT),
    "trace_full_bytes": Opt(INT),
    "trace_steps": Opt(ListOf(INT, 2)),
    "overview": ListOf(Obj({
        "type": STR, "side": STR, "calls": INT, "time": NUMBER, "ratio": Opt(NUMBER),
    })),
    "operators": ListOf(Obj({
        **_STATS.fields,
        "gpu_total": Opt(NUMBER),
        "gpu_avg": Opt(NUMBER),
        "gpu_max": Opt(NUMBER),
        "gpu_min": Opt(NUMBER),
        "flops": Opt(NUMBER),
        "kernels": ListOf(_STATS),
    })),
    "kernels": ListOf(_STATS),
    "kernel_total": Obj({"calls": INT, "total": NUMBER, "ratio": Opt(NUMBER)}),
    "user_defined": ListOf(_STATS),
    "memory_manipulation": Obj({
        "copies": ListOf(_STATS),
        "sync_calls": INT,
        "sync_per_step": Opt(NUMBER),
        "sync_by_op": Obj(values=NUMBER),
    }),
    "distributed": Obj({"basis": STR, "cpu": _DIST_SIDE, "gpu": _DIST_SIDE}),
    "memory": OBJ,
    "modules": Obj({
        "recorded": BOOL,
        "eval_calls": INT,
        "modules": ListOf(Obj({
            "name": STR,
            "depth": INT,
            "parent": Opt(STR),
            "type": STR,
            "shapes": Opt(STR),
            "calls": INT,
            "eval_calls": INT,
            "forward": Opt(NUMBER),
            "backward": Opt(NUMBER),
            "recompute": Opt(NUMBER),
            "gpu_forward": Opt(NUMBER),
            "gpu_backward": Opt(NUMBER),
            "total": NUMBER,
            "share": Opt(NUMBER),
        })),
        "groups": ListOf(Obj({
            "pattern": STR,
            "type": STR,
            "members": INT,
            "total": NUMBER,
            "median": Opt(NUMBER),
            "slowest": Opt(STR),
            "slowest_total": Opt(NUMBER),
            "slowest_vs_median": Opt(NUMBER),
        })),
    }),
    "trace": Opt(STR),
    "range": Opt(ListOf(INT, 2)),
    "export_seconds": NUMBER,
})
_PERCENT = Obj({"avg": Opt(NUMBER), "max": Opt(NUMBER)})
# `measure`: "rss" (resident set) or "uss" (private memory).
_MEMORY_SERIES = Obj({"name": STR, "measure": STR, "peak": INT,
                      "points": ListOf(ListOf(INT, 2))})
_COUNTED = Obj({"calls": INT, "time": NUMBER})
#: One out-of-memory error (runtime/allocator.py): where the rank was, what
#: was asked and what the allocator held, bytes.
_OOM = Obj({"step": Opt(INT), "phase": Opt(STR), "module": Opt(STR), "main_thread": BOOL,
            "device": INT, "requested": INT, "device_total": INT, "device_free": INT,
            "allocated": INT, "reserved": INT, "largest_free_block": Opt(INT),
            "unix": NUMBER})
#: The CUDA allocator over the run (runtime/allocator.py): sampled steps'
#: rows [step, allocated and reserved at its end, peak allocated per
#: bucket, peak reserved per bucket (-1: not entered)], bytes;
#: out-of-memory errors; the snapshot written.
_CUDA_MEMORY = Obj({
    "device": Opt(INT),
    "total": Opt(INT),
    "every": NUMBER,
    "sampled": INT,
    "events_per_step": INT,
    "buckets": ListOf(STR),
    "rows": ListOf(ListOf(INT, 15)),
    "oom": Opt(Obj({"count": INT, "first": Opt(_OOM), "last": Opt(_OOM)})),
    "snapshot": Opt(Obj({"file": STR, "reason": STR, "bytes": INT, "entries": INT,
                         "seconds": NUMBER})),
})

#: The FLOPs of the one step the rank counted (runtime/flops.py): per phase,
#: the step (left out of the statistics), what it ran in, and why not when
#: it was not counted.
_FLOPS = Obj({
    "counted": BOOL,
    "step": Opt(INT),
    "reason": Opt(STR),
    "forward": INT,
    "backward": INT,
    "optimizer": INT,
    "calls": Obj(values=INT),
    "ops": Obj(values=INT),
    "dtype": Opt(STR),
    "autocast": BOOL,
    "tf32": Opt(BOOL),
    "device": Opt(STR),
    "device_name": Opt(STR),
    "seconds": NUMBER,
    "notes": ListOf(STR),
})

#: What a rank's NVML samples say about disturbance (runtime/device.py;
#: decided on in analysis/disturbed.py). Optional: older files have none.
GPU_EVIDENCE = Obj({
    "samples": INT,
    "busy_samples": INT,
    "reasons_samples": Opt(INT),
    "reasons": Obj(values=NUMBER),
    "sm_clock_min": Opt(INT),
    "sm_clock_median": Opt(INT),
    "sm_clock_max": Opt(INT),
    "process_reads": Opt(INT),
    "own_pid_seen": Opt(BOOL),
    "other_processes": ListOf(Obj({"pid": INT, "name": Opt(STR), "kind": Opt(STR),
                                   "used_memory_max": Opt(INT), "samples": INT})),
    "unresolved_processes": Opt(LIST),
    "ecc_uncorrected_new": Opt(INT),
    "xid_available": Opt(BOOL),
    "xid_errors": ListOf(INT),
    "unavailable": Obj(values=STR),
})
#: The top-level keys of a rank file. Only the rows' container is declared
#: here: they are the one part that grows with the run's length, and
#: `validate` checks them with bulk operations rather than per value.
RANK_FILE = Obj({
    "format": STR,
    "version": INT,
    "perfrun": STR,
    "rank": INT,
    "local_rank": INT,
    "world_size": INT,
    "restart": INT,
    "status": STR,
    # How the rank ended: the uncaught exception's type name, the signal,
    # the status the script gave os._exit, and what kept the script from
    # starting (a SyntaxError in its own file: the error's words).
    "exit": Obj({"exception": Opt(STR), "signal": Opt(INT), "os_exit": Opt(INT),
                 "start_error": Opt(STR)}),
    "started_unix": NUMBER,
    "elapsed": NUMBER,
    "env": Obj({
        "hostname": Opt(STR),
        "pid": Opt(INT),
        "python": Opt(STR),
        "platform": Opt(STR),
        "torch": Opt(STR),
        "argv": Opt(ListOf(STR)),
        "command": Opt(Kind("a string or a list", str, list)),
        "cwd": Opt(STR),
    }),
    # The run's Settings as the rank saw them; only what readers use is
    # declared (a reader of an older file sees fewer fields).
    "settings": Obj({
        "script": Opt(STR),
        "module": Opt(STR),
        "script_args": Opt(ListOf(STR)),
        "scheduler": Opt(ListOf(INT, 2)),
        "timer_only": Opt(BOOL),
        "warmup": Opt(INT),
        "summary": Opt(OBJ),
    }),
    "window": Opt(ListOf(INT, 2)),
    "profiled": Opt(ListOf(INT, 2)),
    "window_summary": Opt(_WINDOW_SUMMARY),
    "nsys_capture": Opt(ListOf(OBJ)),
    "module_hook_calls": Opt(INT),
    # What the rank saw of torch.distributed when it first called each root
    # module (runtime/modules.py, RootTracker): the default process group's
    # size and backend (null: none was initialised then), and the torch
    # data-parallel wrappers among the roots, by class name
    # (`DistributedDataParallel`: the gradients' all-reduce runs inside
    # Backward, every step). The analysis reads from it whether Backward
    # holds collectives. Absent in older files; null when no root was called.
    "distributed": Opt(Obj({"world_size": Opt(INT), "backend": Opt(STR),
                            "wrappers": ListOf(STR)})),
    "torch_imported": BOOL,
    "gpu": BOOL,
    "cuda": Opt(OBJ),
    "extra": Obj({
        "dataloader_init": _COUNTED,
        "stop_iteration": _COUNTED,
        "eval": _COUNTED,
        "profiler": _COUNTED,
        # perfrun's own saves before this one (format 2): count, seconds in
        # all, the longest one, and the bytes of the step file; the longest
        # time from one save's start to the next's (absent in older files).
        "flush": Obj({"calls": INT, "time": NUMBER, "max": NUMBER, "bytes": INT,
                      "gap": NUMBER}),
    }),
    "dataloaders": ListOf(OBJ),
    # FLOPs of one step (runtime/flops.py); absent in older files, null
    # when not asked for.
    "flops": Opt(_FLOPS),
    "device": Opt(Obj({
        "samples": INT,
        "cpu_process_percent": _PERCENT,
        "cpu_system_percent": _PERCENT,
        "cpu_count": Opt(INT),
        "rss_peak_bytes": Opt(INT),
        "gpus": ListOf(Obj({"index": Opt(INT), "name": Opt(STR), "evidence": Opt(GPU_EVIDENCE)})),
        "driver": Opt(STR),
    })),
    # Host memory over the run (runtime/memory.py): the rank's resident set
    # and each child process's, as (milliseconds since the rank started, on
    # its step rows' clock; bytes) points, thinned evenly to a bounded
    # count; the memory the rank may use at most.
    "memory": Opt(Obj({
        "limit": Opt(INT),
        "process": Opt(_MEMORY_SERIES),
        "children": Obj(values=_MEMORY_SERIES),
        "unavailable": Opt(STR),
        "cuda": Opt(_CUDA_MEMORY),
    })),
    "faults": ListOf(Obj({"where": STR, "count": INT, "error": Opt(STR)})),
    "notes": ListOf(STR),
    # Where the rank was at this save (runtime/position.py): step index,
    # phase, since when (seconds since the epoch, the rank's clock), and
    # whether edges reach the state machine in batches (timer-only mode).
    "position": Opt(Obj({
        "step": INT,
        "phase": STR,
        "since_unix": Opt(NUMBER),
        "step_since_unix": Opt(NUMBER),
        "written_unix": NUMBER,
        "buffered": BOOL,
    })),
    # Format 1: the rows inline. Format 2: `file` names the step file
    # beside the rank file (stepfile.py) and `count` the rows written to it
    # by this save (a reader takes every whole row the file holds; see
    # _step_file).
    "steps": Obj({"columns": ListOf(STR), "rows": LIST, "file": STR, "count": INT}),
    # The steps the rank held that this save could not write (a full disk:
    # `errno` ENOSPC), and the system's words; absent or null when every
    # step it had was written.
    "unsaved": Opt(Obj({"steps": INT, "errno": Opt(INT), "error": STR})),
})

#: run.json, written by the launcher beside the rank files.


# -- the writer ----------------------------------------------------------------------------


def hostname() -> str:
    """This machine's name, as every rank file records it and every reader
    compares it (is a rank's process on this host, to be asked if alive?)."""
    try:
        return os.uname().nodename
    except AttributeError:  # not POSIX; socket costs a rank 3 ms to import
        import socket

        return socket.gethostname()


def env_int(value: Optional[str], default: int) -> int:
    """An integer from an environment variable, `default` when unset or not
    an integer (a launcher's variables are not perfrun's to refuse)."""
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


#: Where a rank's place in its job is read, first found first: (whose
#: variables, rank, local rank (alternatives), world size). torchrun's own
#: first: a torchrun worker inside a Slurm task has both, and RANK is its
#: own. The MPI launchers' before Slurm's: mpirun or mpiexec inside a
#: Slurm allocation starts its daemons with srun, one task a node, so each
#: rank inherits the SLURM_PROCID of its node's daemon. Slurm's only for a
#: task of a job step (SLURM_STEP_NUM_TASKS): a batch script, one process,
#: has SLURM_PROCID=0 and SLURM_NTASKS of the whole allocation, and no step.
IDENTITY_VARIABLES: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("torchrun", "RANK", ("LOCAL_RANK",), "WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_LOCAL_RANK",), "OMPI_COMM_WORLD_SIZE"),
    ("pmi", "PMI_RANK", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"), "PMI_SIZE"),
    ("slurm", "SLURM_PROCID", ("SLURM_LOCALID",), "SLURM_STEP_NUM_TASKS"),
)


class LaunchIdentity(NamedTuple):
    """A process's place in its job as the job's launcher told it."""

    rank: int
    local_rank: int
    world_size: int
    #: Whose variables said so (IDENTITY_VARIABLES), or None: no launcher
    #: did, a process of its own (rank 0 of 1).
    source: Optional[str]


def launch_identity(environ: Mapping[str, str]) -> LaunchIdentity:
    """This process's rank, local rank and world size, from the first
    launcher whose variables it has (IDENTITY_VARIABLES). torchrun's are
    taken as they always were (RANK present; a missing or odd one is
    0 or 1); another launcher's only where its rank and size are both
    integers and the rank is within the size: a stray variable must not
    make a process a rank of a job it is not in."""
    for source, rank_var, local_vars, size_var in IDENTITY_VARIABLES:
        if rank_var not in environ:
            continue
        local = next((environ[v] for v in local_vars if v in environ), None)
        if source == "torchrun":
            return LaunchIdentity(env_int(environ.get(rank_var), 0), env_int(local, 0),
                                  env_int(environ.get(size_var), 1), source)
        rank, size = env_int(environ.get(rank_var), -1), env_int(environ.get(size_var), 0)
        if 0 <= rank < size:
            local_rank = env_int(local, 0)
            return LaunchIdentity(rank, local_rank if local_rank >= 0 else 0, size, source)
    return LaunchIdentity(0, env_int(environ.get("LOCAL_RANK"), 0),
                          env_int(environ.get("WORLD_SIZE"), 1), None)


def rank_identity(environ: Mapping[str, str]) -> dict[str, int]:
    """Which rank of which job this process is, from the variables of the
    launcher that started it (launch_identity: torchrun's, else Open MPI's,
    PMI's or a Slurm step's; a plain `python` run is rank 0 of 1). Read,
    never set: the script sees the environment it was given."""
    ident = launch_identity(environ)
    return {
        "rank": ident.rank,
        "local_rank": ident.local_rank,
        "world_size": ident.world_size,
        "restart": env_int(environ.get("TORCHELASTIC_RESTART_COUNT"), 0),
    }


def environment(pid: int, command: Any, *, torch: Optional[str] = None,
                platform: Optional[str] = None) -> dict[str, Any]:
    """The `env` section: where and how the rank ran. `torch` and
    `platform` are known once the agent runs (platform's module is not
    worth importing before torch)."""
    env: dict[str, Any] = {
        "hostname": hostname(),
        "pid": pid,
        "python": sys.version.split()[0],
        "argv": list(getattr(sys, "argv", [])),
        "command": command,
        "cwd": os.getcwd(),
    }
    if platform is not None:
        env["platform"] = platform
    if torch is not None or platform is not None:
        env["torch"] = torch
    return env


def _inline_steps() -> dict[str, Any]:
    return {"columns": list(STEP_COLUMNS), "rows": []}


#: The sections after the rank's identity and how it ended, each with its
#: value in a rank that has not imported torch (yet). A writer gives the
#: ones it knows; a name not listed here is refused, so a new section is
#: declared here (and in RANK_FILE) before any writer can write it.
SECTIONS: dict[str, Any] = {
    "window": lambda: None,
    "profiled": lambda: None,
    "window_summary": lambda: None,
    "nsys_capture": lambda: None,
    "module_hook_calls": lambda: None,
    "distributed": lambda: None,
    "torch_imported": lambda: False,
    "gpu": lambda: False,
    "cuda": dict,
    "extra": dict,
    "dataloaders": list,
    "flops": lambda: None,
    "device": lambda: None,
    "memory": lambda: None,
    "faults": list,
    "notes": list,
    "position": lambda: None,
    "steps": _inline_steps,
    "unsaved": lambda: None,
}


def rank_document(
    identity: Mapping[str, int],
    status: str,
    exit: Mapping[str, Any],
    started_unix: float,
    elapsed: float,
    env: Mapping[str, Any],
    settings: Mapping[str, Any],
    **sections: Any,
) -> dict[str, Any]:
    """A rank document (format VERSION), the one shape both writers write.
    `identity`: rank_identity(); `status`: running, finished, stopped or
    signalled; `exit`: the exception's type name and the signal, if any."""
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown rank document section(s): {', '.join(sorted(unknown))}")
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "perfrun": __version__,
        "rank": identity["rank"],
        "local_rank": identity["local_rank"],
        "world_size": identity["world_size"],
        "restart": identity["restart"],
        "status": status,
        "exit": exit,
        "started_unix": started_unix,
        "elapsed": elapsed,
        "env": env,
        "settings": settings,
    }
    for name, default in SECTIONS.items():
        doc[name] = sections[name] if name in sections else default()
    return doc


def write_rank_file(path: str, document: Mapping[str, Any], *, durable: bool = False) -> None:
    """Save a rank document whole (a reader never sees half of it);
    `durable` for the final save, which must survive the machine."""
    atomic_write_text(path, json.dumps(document, default=str), durable=durable)


# -- the reader ----------------------------------------------------------------------------


def peek_rank_file(path: str) -> Optional[dict[str, Any]]:
    """A rank document as it stands, unchecked, or None when it cannot be
    read now: for the live views that look every second (`perfrun status`,
    the hang watch), which skip such a file and see it at the next look."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


class RankResult:
    """One rank's results as read back from disk.

    The steps are held as a (steps, STEP_COLUMNS) float64 array, `table`,
    with NaN for a value not recorded: for a rank in format 2 it is mapped
    from its step file, so reading a rank costs no memory until its steps
    are used. `rows` gives the same steps as lists (None for missing), made
    when first asked for: the analysis works on `table`, or on `blocks`
    (the steps a block at a time, for a pass that reads a long rank once
    and holds one block); `rows` is for callers that want a few steps in
    hand, or hand-built results.

    A step file's rows are checked (stepfile.damage) before any of them is
    used: when the rank is read (`validate`), or, for a reader that passes
    over every step anyway (`check_steps=False`: a report), during its
    first pass over `blocks`, so that the file is read once. Until then
    every other way to the steps checks them first.
    """

    __slots__ = ("path", "data", "steps_file", "steps_note", "_rows", "_table", "_n",
                 "_unchecked", "_limit")

    def __init__(
        self,
        path: str,
        data: dict[str, Any],
        rows: Optional[list[list[Any]]] = None,
        table: Any = None,
        steps_file: Optional[str] = None,
        n_steps: Optional[int] = None,
        steps_note: Optional[str] = None,
        unchecked: bool = False,
        limit: Optional[float] = None,
    ) -> None:
        self.path = path
        self.data = data
        #: The step file the steps are read from, when they are not held.
        self.steps_file = steps_file
        #: When the steps are not all those the rank file counts (its step
        #: file cut short, or longer than its final save): which are used.
        self.steps_note = steps_note
        held = table is not None or steps_file is not None
        self._rows = None if rows is None and held else list(rows or [])
        self._table = table
        self._n = n_steps
        #: The step file's rows are still to be checked, and the time no
        #: step may end after (the rank's final save), for that check.
        self._unchecked = unchecked and steps_file is not None
        self._limit = limit

    def _from_file(self) -> bool:
        return self._table is None and self.steps_file is not None and self._rows is None

    @property
    def table(self) -> Any:
        """The steps as an array. From a step file it is mapped again at
        each use and never kept: a report over many long ranks then holds
        only the rank it is working on."""
        if self._table is not None:
            return self._table
        if self.steps_file is not None and self._rows is None:
            self.check()
            table = read_table(self.steps_file)
            return table[: self._n] if self._n is not None else table
        self._table = rows_table(self._rows or [])
        return self._table

    def blocks(self, rows: int = READ_ROWS) -> Any:
        """The steps `rows` at a time: (index of the block's first step,
        array of (rows, STEP_COLUMNS)), in order. From a step file, the file
        is read once into one buffer (an array given is valid until the next
        is asked for; copy what is kept), and its rows are checked on the
        way when they were not on reading. Raises ResultsError."""
        path = self.steps_file
        if not self._from_file() or path is None:
            table = self.table
            for lo in range(0, int(table.shape[0]), rows):
                yield lo, table[lo:lo + rows]
            return
        check = self._unchecked
        previous: Optional[float] = None
        try:
            for lo, block in blocks(path, self.n_steps, rows):
                if check:
                    why = damage(block, lo, previous, self._limit)
                    if why is not None:
                        raise ResultsError(f"cannot read {path}: {why}: the file is damaged")
                    previous = float(block[-1, COL["end"]])
                yield lo, block
        except StepFileError as exc:
            raise ResultsError(str(exc), exc.kind) from None
        self._unchecked = False

    def check(self) -> None:
        """Check the step file's rows now, if they are still to be checked
        (a pass over the file, one block held at a time). Raises
        ResultsError."""
        if self._unchecked:
            for _ in self.blocks():
                pass

    def mapped(self) -> Any:
        """The steps as an array that reads from the step file only the rows
        looked at (memory-mapped; a bisection over a million steps reads a
        few pages), or the table held."""
        path = self.steps_file
        if self._from_file() and path is not None:
            self.check()
            return read_table(path, mapped=True)[: self.n_steps]
        return self.table

    def take(self, index: Any) -> Any:
        """The steps at `index` (step indices below n_steps) as an array of
        their own; from a step file, mapped, so only those steps are read."""
        import numpy as np

        path = self.steps_file
        if self._from_file() and path is not None:
            self.check()
            return np.array(read_table(path, mapped=True)[index])
        return np.asarray(self.table)[index]

    @property
    def rows(self) -> list[list[Any]]:
        if self._rows is None:
            self._rows = table_rows(self.table)
        return self._rows

    @property
    def n_steps(self) -> int:
        if self._rows is not None:
            return len(self._rows)
        if self._n is not None:
            return self._n
        return int(self.table.shape[0])

    @property
    def rank(self) -> int:
        return int(self.data.get("rank", 0))

    @property
    def restart(self) -> int:
        return int(self.data.get("restart", 0))

    @property
    def status(self) -> str:
        return str(self.data.get("status", "unknown"))

    def column(self, name: str) -> list[Any]:
        i = COL[name]
        return [row[i] for row in self.rows]

    def inline(self) -> dict[str, Any]:
        """The rank document with its steps inside it (format 1's layout,
        which every reader takes): for a file that must stand alone, such
        as a baseline."""
        doc = dict(self.data)
        doc["steps"] = {"columns": list(STEP_COLUMNS), "rows": self.rows}
        return doc


def table_rows(table: Any) -> list[list[Any]]:
    import numpy as np

    values: list[list[Any]] = table.tolist()
    missing = np.isnan(table)
    if missing.any():
        for i, j in zip(*np.nonzero(missing)):
            values[i][j] = None
    # Counts were written as floats: give them back as the integers they are.
    for j in _INT_COLUMNS:
        for row in values:
            v = row[j]
            if v is not None and v == v and float(v).is_integer():
                row[j] = int(v)
    return values


_INT_COLUMNS = tuple(COL[c] for c in STEP_COLUMNS if c.endswith("_calls") or c == "samples")


def rows_table(rows: Any) -> Any:
    """Rows as lists (None for a value not recorded) as a (steps,
    STEP_COLUMNS) float64 array with NaN for None."""
    import numpy as np

    rows = list(rows)
    if not rows:
        return np.empty((0, len(STEP_COLUMNS)), dtype=np.float64)
    return np.array(rows, dtype=np.float64)


def read_rank_file(path: str, check_steps: bool = True) -> RankResult:
    """A rank file read and checked (`validate`); `check_steps=False` leaves
    its step file's rows to be checked on the first pass over them."""
    return validate(load_json(path), path, check_steps=check_steps)


def _step_file(data: dict[str, Any], path: str, where: str, check: bool = True
               ) -> tuple[str, int, Optional[str], Optional[float]]:
    """The step file a format-2 rank names (beside the rank file), checked
    against the rank file and, unless `check` is false, row by row
    (stepfile.damage), a block of steps at a time so that checking a long
    rank holds no more than a block: its path, how many of its steps the
    rank stands for, when that is not every step the rank file counts a
    line saying which, and the time no step may end after (for the check
    of the rows, when it is left to the first pass over them).

    The rank file is rewritten after each append to the step file, so the
    step file holds at least the steps the rank file counts (`steps.count`):
    more when the rank was killed between the two (those steps are whole,
    and kept), never fewer. One that holds fewer was cut short after the
    rank wrote it (a copy, a crash of the machine): the steps left are
    whole, so they are used, and the report says which. A rank's final save
    comes after its last step, so a step file longer than a final rank file
    counts has had rows added since: those are left out, and said. A row
    that no rank could have written refuses the file."""
    name = data["steps"]["file"]
    if not isinstance(name, str) or not name or os.path.basename(name) != name:
        raise SchemaError(f"{where}steps.file", "a file name beside the rank file", shown(name))
    step_path = os.path.join(os.path.dirname(os.path.abspath(path)), name)
    try:
        meta, offset = read_header(step_path)
        width = len(meta["columns"])
        missing = [c for c in REQUIRED_COLUMNS if c not in meta["columns"]]
        if missing:
            raise StepFileError(f"{step_path} has no {missing[0]!r} column")
        size = os.path.getsize(step_path)
    except StepFileError as exc:
        raise ResultsError(str(exc), exc.kind) from None
    except OSError as exc:
        raise ResultsError(f"cannot read {step_path}: {exc.strerror or exc}") from None
    held = max(0, size - offset) // (8 * width)
    count = data["steps"].get("count")
    final = data.get("status") != "running"
    n, note = held, None
    if isinstance(count, int) and count >= 0:
        rank_name = os.path.basename(path)
        if held < count:
            note = (f"its step file {name} is cut short: it holds {_steps(held)} of the "
                    f"{count} {rank_name} counts, so "
                    + (f"this report uses {_range(0, held)} and "
                       if held else "this report has none of them, and ")
                    + f"{_range(held, count)} are lost")
        elif final and held > count:
            n = count
            note = (f"its step file {name} holds {_steps(held - count)} after the {count} "
                    f"{rank_name} counts at its final save: {_range(count, held)} are left "
                    "out of this report")
    elapsed = data.get("elapsed")
    limit = float(elapsed) if final and isinstance(elapsed, (int, float)) else None
    if check:  # as a pass over the steps left to check would check them
        RankResult(path, data, steps_file=step_path, n_steps=n, unchecked=True,
                   limit=limit).check()
    return step_path, n, note, limit


def _steps(n: int) -> str:
    return "1 step" if n == 1 else f"{n} steps"


def _range(lo: int, hi: int) -> str:
    """Steps lo to hi - 1, in words."""
    return f"step {lo}" if hi - lo == 1 else f"steps {lo} to {hi - 1}"


#: Step values are numbers or null (a phase not measured, no GPU timing).
_ROW_VALUE_TYPES = frozenset((int, float, type(None)))


def validate(data: Any, path: str, where: str = "", check_steps: bool = True) -> RankResult:
    """Check a rank document by type (schema.RANK_FILE) before anything reads
    it, so a damaged file is one line naming the file and the field, never a
    traceback from deep inside a report. `where` prefixes field paths of a
    document held inside another file (`ranks[0]` of a baseline).
    `check_steps=False`: the rows of its step file are checked on the first
    pass over them (RankResult.blocks), for a reader that makes one anyway
    and so reads the file once, not twice."""
    label = f"{path} ({where})" if where else path
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultsError(f"{label} is not a perfrun results file")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ResultsError(f"{label} has no format version")
    if version > VERSION:
        raise ResultsError(
            f"{label} has results format version {version}; this perfrun reads up to "
            f"version {VERSION}: upgrade perfrun"
        )
    if version < 1:
        raise ResultsError(f"{label} has unknown results format version {version}")
    try:
        check(data, RANK_FILE, where)
        steps = data.get("steps") or {}
        if isinstance(steps, dict) and "file" in steps:
            step_path, n, note, limit = _step_file(data, path, f"{where}." if where else "",
                                                   check_steps)
            return RankResult(path=path, data=data, steps_file=step_path, n_steps=n,
                              steps_note=note, unchecked=not check_steps, limit=limit)
        rows = _checked_rows(steps, f"{where}.steps" if where else "steps")
    except SchemaError as exc:
        raise ResultsError(f"cannot read {path}: {exc}") from None
    return RankResult(path=path, data=data, rows=rows)


def _checked_rows(steps: dict[str, Any], where: str) -> list[list[Any]]:
    """The step rows in STEP_COLUMNS order, checked in bulk: a long run has
    100,000s of rows, so the common case costs a few passes at C speed and
    only a damaged file pays for finding the exact field."""
    columns = steps.get("columns", list(STEP_COLUMNS))
    rows: list[list[Any]] = steps.get("rows", [])
    width = len(columns)
    if not all(type(row) is list and len(row) == width for row in rows):
        i, row = next(
            (i, r) for i, r in enumerate(rows) if type(r) is not list or len(r) != width
        )
        got = f"{len(row)} values" if type(row) is list else type_name(row)
        raise SchemaError(f"{where}.rows[{i}]", f"a list of {width} values", got)
    if not _ROW_VALUE_TYPES.issuperset(map(type, chain.from_iterable(rows))):
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                if type(value) not in _ROW_VALUE_TYPES:
                    raise SchemaError(
                        f"{where}.rows[{i}][{j}] ({columns[j]})", "a number or null",
                        type_name(value),
                    )
    if columns != list(STEP_COLUMNS):
        # Re-map by name, so a file with reordered or extra columns still reads.
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise SchemaError(f"{where}.columns", f"a list naming {missing[0]!r}", "none")
        index = {name: i for i, name in enumerate(columns)}
        rows = [[row[index[c]] if c in index else None for c in STEP_COLUMNS] for row in rows]
    for name in REQUIRED_COLUMNS:
        j = COL[name]
        if None in map(itemgetter(j), rows):
            i = next(i for i, row in enumerate(rows) if row[j] is None)
            raise SchemaError(f"{where}.rows[{i}] ({name})", "a number", "null")
    return rows
