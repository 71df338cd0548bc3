"""A rank's input pipeline, fetch by fetch and batch by batch: the tables
behind the Data Pipeline table (analysis/pipeline.py), written beside the
rank file in `pipeline/`.

A DataLoader's fetch is one block to the step clock. Split into its
stages, it says what would make it cheaper: the sampler, the dataset's
`__getitem__`, the collate function, pinning, and, with workers, the main
process's wait on the queue against what each worker spent on the batch.
Two kinds of table, in the step file's layout (stepfile.py: a JSON header
naming the columns, then float64 rows, appended, so a killed process keeps
every whole row):

* `rank<R>.loader<L>.fetches`: one row per fetch of DataLoader L in the
  rank's main process, appended by the rank's flush thread every few
  seconds (FETCH_COLUMNS);
* `rank<R>.loader<L>.pid<P>.batches`: one row per batch a worker process
  produced, appended by the worker itself as it puts the batch on the
  queue, and a first row (`task` -1) when its loop starts
  (BATCH_COLUMNS).

Times are `time.perf_counter()` readings, the one clock every process of a
host shares (CLOCK_MONOTONIC), so a worker's batch and the main process's
wait for it can be laid side by side. A value not measured is NaN.

Version history: 1, the only one (the step file's layout, version 1).

The writers are imported in the rank and in its workers: standard library
only; the reader uses numpy, imported where it reads.
"""

from __future__ import annotations

import os
from typing import Any

from . import layout
from .stepfile import StepFileError, StepWriter, read

#: One row per fetch in the main process. `start`, `end`: the fetch as
#: the step clock read it (the iterator's `__next__`, its hook's readings);
#: `next_data`: the iterator's `_next_data` within it, the fetch proper
#: (what is left, torch's `__next__` and the other threads that held the
#: GIL meanwhile, the index queue's among them, is the fetch too, as the
#: step waits for it); `sampler`: the time in the sampler; `dataset` and
#: `collate`: the dataset's `__getitem__` (or `__getitems__`, or the
#: iterable's `next`) and the collate function, when the main process made
#: the batch (num_workers=0); `pin`: pinning in the main process; `wait`:
#: the time on the workers' queue (num_workers > 0); `task`: the batch's
#: index in its epoch and `worker_pid` the worker that made it; `first`: 1
#: for an iterator's first fetch (which pays for its start); `tensors`,
#: `bytes`: the batch's tensors and their bytes, measured on an iterator's
#: first fetch; `cpu`: the CPU time the main process's thread spent in the
#: dataset and the collate (num_workers=0: how much of the fetch would run
#: in parallel on other cores, and how much is waiting on I/O; read on
#: a timed fetch every 0.2 s at most, NaN on the others); `weight`:
#: how many fetches the row stands for (a cheap fetch is timed stage by
#: stage once in so many, runtime/pipeline.py); `send`: with workers, the
#: time sending the next indices to a worker's queue; `runq`: with `cpu`,
#: the time the thread waited for a CPU (the scheduler's run queue: a
#: loaded machine, not the dataset's own waiting).
FETCH_COLUMNS = ("start", "end", "sampler", "dataset", "collate", "pin", "wait", "task",
                 "worker_pid", "first", "tensors", "bytes", "cpu", "weight", "send",
                 "next_data", "runq")
#: One row per batch a worker made: the `task` it got and when (`got`),
#: when the batch was made (`fetched`: the dataset and the collate done)
#: and handed to the queue (`sent`), the collate's share (`collate`), the
#: worker's resident memory then (`rss`, bytes), the CPU time it spent on
#: the batch (`cpu`) and its time waiting for a CPU (`runq`). The first
#: row, task -1, has `got` the moment the worker's loop started and
#: `fetched` the moment the main process began making the iterator that
#: started the worker (its start-up is the difference: the process made,
#: the dataset sent, torch imported when spawned).
BATCH_COLUMNS = ("task", "got", "fetched", "sent", "collate", "rss", "cpu", "runq")
#: The task of a worker's first row: when its loop started.
STARTED = -1.0


def fetch_writer(run_dir: str, stem: str, loader: int) -> StepWriter:
    """The writer of a DataLoader's fetch table (made when the loader is
    first iterated; rows appended by the rank's flush)."""
    path = layout.fetches_path(run_dir, stem, loader)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return StepWriter(path, FETCH_COLUMNS)


def batch_writer(run_dir: str, stem: str, loader: int, pid: int) -> StepWriter:
    """The writer of one worker process's batch table."""
    path = layout.batches_path(run_dir, stem, loader, pid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return StepWriter(path, BATCH_COLUMNS)


def read_columns(path: str, columns: tuple[str, ...]) -> Any:
    """A pipeline table as a (rows, len(columns)) float64 array in `columns`
    order: columns the file lacks are NaN, rows a kill cut short left out.
    Raises StepFileError."""
    import numpy as np

    names, table = read(path)
    out = np.full((table.shape[0], len(columns)), np.nan)
    index = {c: i for i, c in enumerate(names)}
    for j, c in enumerate(columns):
        if c in index:
            out[:, j] = table[:, index[c]]
    return out


def read_fetches(path: str) -> Any:
    return read_columns(path, FETCH_COLUMNS)


def read_batches(path: str) -> Any:
    return read_columns(path, BATCH_COLUMNS)


def loader_files(run_dir: str, stem: str, loader: int) -> tuple[str, list[tuple[int, str]]]:
    """A DataLoader's fetch table and its workers' batch tables (pid, path),
    as the rank's pipeline folder holds them."""
    fetches = layout.fetches_path(run_dir, stem, loader)
    folder = os.path.dirname(fetches)
    workers = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    for name in names:
        pid = layout.batches_pid(name, stem, loader)
        if pid is not None:
            workers.append((pid, os.path.join(folder, name)))
    return fetches, workers


__all__ = [
    "BATCH_COLUMNS", "FETCH_COLUMNS", "STARTED", "StepFileError", "batch_writer",
    "fetch_writer", "loader_files", "read_batches", "read_columns", "read_fetches",
]
