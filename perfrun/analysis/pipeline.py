"""The Data Pipeline table: what a DataLoader's fetch is made of, and what
held the steps up.

From a rank's fetch table and its workers' batch tables
(store/pipelinefile.py, written by runtime/pipeline.py), per DataLoader:

* each stage of the fetch per batch and its share of the fetch. Without
  workers the main process makes every batch: the sampler, the dataset's
  `__getitem__`, the collate function, pinning, and what is left. With
  workers it samples, waits on the queue and does the rest; either way,
  torch's `__next__` wraps the fetch, and other threads may hold the GIL
  meanwhile ("around it"); its wait is
  split by what it waited for, batch by batch: a worker still making the
  batch (its dataset or its collate, whichever took longer for that batch)
  or the batch's transfer (made already, and still being received);
* how many fetches held their step up, and by which stage (MindInsight's
  "steps held up"): without workers every fetch is the step's wait, put on
  its largest stage; with workers, a fetch whose wait passed HELD_WAIT;
* each worker: its batches, its time per batch, split into dataset and
  collate, how much of its life it was idle, its start-up (from the
  iterator's making to the worker's loop running), its peak memory, and
  whether it is slower than the others.

An iterator's first fetch pays for its start (worker processes, the first
file opened) and is left out of the per-batch figures; the first fetches
are reported apart. A cheap fetch is timed stage by stage once in so many
(runtime/pipeline.py): each row weighs as many fetches as it stands for.
Pure functions over arrays; the reading is in `loader_pipeline`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from perfrun.store import pipelinefile
from perfrun.store.layout import rank_stem
from perfrun.store.rankfile import RankResult
from perfrun.store.stepfile import StepFileError

F = {name: i for i, name in enumerate(pipelinefile.FETCH_COLUMNS)}
B = {name: i for i, name in enumerate(pipelinefile.BATCH_COLUMNS)}

#: A wait on the workers' queue longer than this (seconds) held its step up.
HELD_WAIT = 50e-6
#: A worker whose median batch takes this many times the workers' median is slow...
SLOW_WORKER = 1.5
#: ... and by at least this much per batch (seconds): a 50% difference in a
#: batch of 0.1 ms is noise, not a slow worker.
SLOW_WORKER_MIN = 200e-6

#: The stages as the table names them, in its order.
STAGE_TITLES = {
    "sampler": "sampler",
    "send": "send the indices to a worker",
    "dataset": "dataset (__getitem__)",
    "collate": "collate",
    "pin": "pin_memory",
    "worker dataset": "wait: a worker's dataset",
    "worker collate": "wait: a worker's collate",
    "transfer": "wait: transfer from a worker",
    "wait": "wait: worker unknown",
    "around": "around it: __next__, other threads",
    "other": "other",
}


@dataclass(frozen=True)
class Stage:
    """One stage of the fetch: seconds per batch (over the fetches counted),
    its share of the fetch, and the fetches it held up."""

    name: str
    per_batch: float
    share: float
    held: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "per_batch": self.per_batch, "share": self.share,
                "held": self.held}


@dataclass(frozen=True)
class Worker:
    """One worker process of a DataLoader (seconds per batch)."""

    pid: int
    batches: int
    busy: Optional[float]
    dataset: Optional[float]
    collate: Optional[float]
    idle_share: Optional[float]
    startup: Optional[float]
    rss_max: Optional[float]
    #: CPU time per batch: below `busy`, the worker waited (on I/O, a lock,
    #: or for a CPU: `runq`, the part of `busy` spent in the run queue).
    cpu: Optional[float] = None
    slow: bool = False
    runq: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "batches": self.batches, "busy": self.busy,
                "dataset": self.dataset, "collate": self.collate,
                "idle_share": self.idle_share, "startup": self.startup,
                "rss_max": self.rss_max, "cpu": self.cpu, "slow": self.slow,
                "runq": self.runq}


@dataclass(frozen=True)
class LoaderPipeline:
    """One DataLoader's fetches, stage by stage."""

    loader: int
    settings: Mapping[str, Any]
    fetches: int
    fetch: Optional[float]
    stages: list[Stage]
    held: int
    first_fetches: int = 0
    first_fetch: Optional[float] = None
    workers: list[Worker] = field(default_factory=list)
    tensors: Optional[int] = None
    bytes: Optional[int] = None
    #: CPU time per batch of the main process's dataset and collate
    #: (num_workers=0): the work workers would share out; the rest of those
    #: stages' time is spent waiting: for a CPU (`runq`, a loaded machine),
    #: or on a file, the network, a sleep.
    cpu: Optional[float] = None
    runq: Optional[float] = None

    @property
    def num_workers(self) -> int:
        value = self.settings.get("num_workers")
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    @property
    def samples(self) -> Optional[int]:
        """Samples a batch: the loader's batch_size, or its batch sampler's."""
        for key in ("batch_size", "batch_sampler_size"):
            value = self.settings.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    def stage(self, name: str) -> Optional[Stage]:
        return next((s for s in self.stages if s.name == name), None)

    def per_batch(self, name: str) -> float:
        found = self.stage(name)
        return found.per_batch if found is not None else 0.0

    @property
    def slow_worker(self) -> Optional[Worker]:
        return next((w for w in self.workers if w.slow), None)

    @property
    def usual_workers(self) -> list[Worker]:
        """The workers that made batches, less the slow ones (all of them
        when every one is slow, which cannot be said of all)."""
        timed = [w for w in self.workers if w.busy is not None and w.batches]
        usual = [w for w in timed if not w.slow]
        return usual or timed

    @property
    def usual_busy(self) -> Optional[float]:
        """The median time a batch of the workers that are not slow."""
        busy = [w.busy for w in self.usual_workers if w.busy is not None]
        return float(np.median(busy)) if busy else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "loader": self.loader,
            "settings": dict(self.settings),
            "fetches": self.fetches,
            "fetch": self.fetch,
            "stages": [s.to_dict() for s in self.stages],
            "held": self.held,
            "first_fetches": self.first_fetches,
            "first_fetch": self.first_fetch,
            "workers": [w.to_dict() for w in self.workers],
            "tensors": self.tensors,
            "bytes": self.bytes,
            "cpu": self.cpu,
            "runq": self.runq,
        }


@dataclass(frozen=True)
class PipelineSummary:
    """Every DataLoader of the reference rank, the most time first."""

    loaders: list[LoaderPipeline]

    @property
    def main(self) -> Optional[LoaderPipeline]:
        """The loader the training steps wait on most: of those iterated with
        gradients on, the one that spent the most time fetching."""
        training = [lp for lp in self.loaders if lp.settings.get("training", True)]
        return training[0] if training else None

    def to_dict(self) -> dict[str, Any]:
        return {"loaders": [lp.to_dict() for lp in self.loaders]}


def _mean(values: Any, weights: Any = None) -> Optional[float]:
    arr = np.asarray(values, dtype=np.float64)
    w = np.ones_like(arr) if weights is None else np.asarray(weights, dtype=np.float64)
    known = np.isfinite(arr)
    if not known.any() or not w[known].sum() > 0:
        return None
    return float(np.average(arr[known], weights=w[known]))


def _zero(values: Any) -> Any:
    values = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(values), values, 0.0)


def workers_of(batches: Sequence[tuple[int, Any]],
               waits: Optional[Mapping[int, float]] = None) -> list[Worker]:
    """Each worker's figures from its batch table (pid, rows). `waits`: the
    main process's wait on each worker's batches (seconds in all), where
    the fetch rows say: a worker is slow only if the loop waited on it
    more than on the others (see `_slow`)."""
    out = []
    medians: dict[int, float] = {}
    for pid, t in batches:
        started = t[t[:, B["task"]] == pipelinefile.STARTED]
        rows = t[t[:, B["task"]] >= 0]
        got, fetched, sent = rows[:, B["got"]], rows[:, B["fetched"]], rows[:, B["sent"]]
        busy = fetched - got
        collate = _zero(rows[:, B["collate"]])
        idle = None
        if rows.shape[0] > 1:
            span = float(sent[-1] - got[0])
            gaps = _zero(got[1:] - sent[:-1])
            idle = float(np.maximum(gaps, 0.0).sum()) / span if span > 0 else None
        startup = None
        if started.shape[0] and math.isfinite(started[0, B["fetched"]]):
            startup = float(started[0, B["got"]] - started[0, B["fetched"]])
        rss = t[:, B["rss"]]
        rss = rss[np.isfinite(rss)]
        known = busy[np.isfinite(busy)]
        if known.size:
            medians[int(pid)] = float(np.median(known))
        out.append(Worker(
            pid=int(pid), batches=int(rows.shape[0]), busy=_mean(busy),
            dataset=_mean(busy - collate), collate=_mean(collate), idle_share=idle,
            startup=startup, rss_max=float(rss.max()) if rss.size else None,
            cpu=_mean(rows[:, B["cpu"]]), runq=_mean(rows[:, B["runq"]]),
        ))
    slow = _slow(medians, waits)
    return [replace(w, slow=w.pid in slow) for w in out]


def _slow(medians: Mapping[int, float], waits: Optional[Mapping[int, float]]) -> set[int]:
    """The slow workers: a median batch SLOW_WORKER times the workers'
    median and SLOW_WORKER_MIN longer at least, and, where the waits are
    known, twice its share of them (1/W each, were the workers equal). The
    median, not the mean: on a loaded machine a worker loses a few batches
    to the scheduler now and then, which a mean counts and a median does
    not; and a worker the loop never waited on holds nothing up."""
    if len(medians) < 2:
        return set()
    middle = float(np.median(list(medians.values())))
    found = {pid for pid, m in medians.items()
             if m > SLOW_WORKER * middle and m - middle > SLOW_WORKER_MIN}
    if waits is not None:
        total = sum(waits.values())
        fair = 1.0 / len(medians)
        found = {pid for pid in found
                 if total > 0 and waits.get(pid, 0.0) / total >= 2 * fair}
    return found


def _batch_for(batches: Mapping[int, Any], pid: float, task: float, end: float
               ) -> Optional[Any]:
    """The row of the batch a fetch received: its worker's row for the task,
    the latest one got before the fetch ended (a task number comes back
    each epoch)."""
    if not (math.isfinite(pid) and math.isfinite(task)):
        return None
    t = batches.get(int(pid))
    if t is None:
        return None
    rows = t[(t[:, B["task"]] == task) & (t[:, B["got"]] <= end)]
    if not rows.shape[0]:
        return None
    return rows[int(np.argmax(rows[:, B["got"]]))]


def summarize(settings: Mapping[str, Any], loader: int, fetches: Any,
              batches: Sequence[tuple[int, Any]] = ()) -> LoaderPipeline:
    """One loader's LoaderPipeline from its fetch rows (FETCH_COLUMNS) and its
    workers' batch rows (pid, BATCH_COLUMNS)."""
    first = fetches[:, F["first"]] == 1.0
    rest = fetches[~first]
    first_times = fetches[first, F["end"]] - fetches[first, F["start"]]
    sized = fetches[np.isfinite(fetches[:, F["bytes"]])]
    tensors = int(sized[0, F["tensors"]]) if sized.shape[0] else None
    size = int(sized[0, F["bytes"]]) if sized.shape[0] else None
    weight = rest[:, F["weight"]]
    weight = np.where(np.isfinite(weight) & (weight > 0), weight, 1.0)
    waits = None
    if batches and np.isfinite(rest[:, F["wait"]]).any():
        waits = {}
        for pid, wait, w in zip(rest[:, F["worker_pid"]], _zero(rest[:, F["wait"]]), weight):
            if math.isfinite(pid):
                waits[int(pid)] = waits.get(int(pid), 0.0) + float(wait * w)
    workers = workers_of(batches, waits)
    n = int(round(float(weight.sum())))
    common = dict(loader=loader, settings=dict(settings), fetches=n,
                  first_fetches=int(first.sum()), first_fetch=_mean(first_times),
                  workers=workers, tensors=tensors, bytes=size,
                  cpu=_cpu(rest, weight, "cpu"), runq=_cpu(rest, weight, "runq"))
    if not rest.shape[0]:
        return LoaderPipeline(fetch=None, stages=[], held=0, **common)
    total = rest[:, F["end"]] - rest[:, F["start"]]
    fetch = float(np.average(total, weights=weight))
    parts: dict[str, Any] = {"sampler": _zero(rest[:, F["sampler"]])}
    if np.isfinite(rest[:, F["wait"]]).any():
        parts["send"] = _zero(rest[:, F["send"]])
        parts.update(_waits(rest, {pid: t for pid, t in batches}))
        causes = ("worker dataset", "worker collate", "transfer", "wait")
        held_mask = _zero(rest[:, F["wait"]]) > HELD_WAIT
    else:
        parts["dataset"] = _zero(rest[:, F["dataset"]])
        parts["collate"] = _zero(rest[:, F["collate"]])
        parts["pin"] = _zero(rest[:, F["pin"]])
        causes = ("sampler", "dataset", "collate", "pin")
        held_mask = np.ones(rest.shape[0], dtype=bool)
    # The fetch as the step waited for it, less `_next_data`: torch's
    # __next__ around it, and other threads holding the GIL meanwhile (the
    # index queue's thread pickling the indices just sent to a worker).
    inner = rest[:, F["next_data"]]
    parts["around"] = np.where(np.isfinite(inner), np.maximum(total - inner, 0.0), 0.0)
    parts["other"] = np.maximum(total - sum(parts.values()), 0.0)
    names = [c for c in causes if c in parts]
    stacked = np.vstack([parts[c] for c in names])
    cause = np.argmax(stacked, axis=0)
    held = {c: int(round(float(weight[(cause == i) & held_mask].sum())))
            for i, c in enumerate(names)}
    stages = []
    for name in STAGE_TITLES:
        if name not in parts:
            continue
        values = parts[name]
        if (name in ("pin", "wait", "worker dataset", "worker collate", "around")
                and not values.any()):
            continue
        per = float(np.average(values, weights=weight))
        stages.append(Stage(name, per, per / fetch if fetch > 0 else 0.0, held.get(name, 0)))
    return LoaderPipeline(fetch=fetch, stages=stages,
                          held=int(round(float(weight[held_mask].sum()))), **common)


def _cpu(rows: Any, weight: Any, column: str) -> Optional[float]:
    """The CPU time (or the wait for a CPU: `column` runq) a batch of the
    dataset and the collate: its share of their time on the fetches whose
    CPU time was read (a timed fetch every so often, runtime/pipeline.py),
    times their mean over all."""
    cpu = rows[:, F[column]]
    read = np.isfinite(cpu)
    if not read.any():
        return None
    made = _zero(rows[:, F["dataset"]]) + _zero(rows[:, F["collate"]])
    spent = float(np.sum(made[read] * weight[read]))
    if not spent > 0:
        return None
    share = float(np.sum(cpu[read] * weight[read])) / spent
    return share * float(np.average(made, weights=weight))


def _waits(rows: Any, batches: Mapping[int, Any]) -> dict[str, Any]:
    """The main process's waits on the queue, each put on what it waited
    for: the batch's worker still making it (its dataset or collate), or the
    batch's transfer; "wait" where no worker's record says."""
    n = rows.shape[0]
    out = {name: np.zeros(n) for name in ("worker dataset", "worker collate", "transfer",
                                           "wait")}
    waits = _zero(rows[:, F["wait"]])
    for i in range(n):
        wait = waits[i]
        if not wait:
            continue
        start, end = rows[i, F["start"]], rows[i, F["end"]]
        batch = _batch_for(batches, rows[i, F["worker_pid"]], rows[i, F["task"]], end)
        if batch is None:
            out["wait"][i] = wait
            continue
        made = batch[B["fetched"]]
        if made <= start:  # ready before the fetch began: only its transfer
            out["transfer"][i] = wait
            continue
        # Made while the main process waited: the wait until it was made is
        # the worker's, the rest the transfer.
        making = min(wait, made - start)
        collate = batch[B["collate"]] if math.isfinite(batch[B["collate"]]) else 0.0
        dataset = made - batch[B["got"]] - collate
        out["worker collate" if collate > dataset else "worker dataset"][i] = making
        out["transfer"][i] = wait - making
    return out


def loader_pipeline(rank: RankResult) -> Optional[PipelineSummary]:
    """The reference rank's DataLoaders, stage by stage, from the tables its
    document names (None when it has none: timer-only, or an older
    perfrun). A table that cannot be read costs its loader, not the report."""
    run_dir = os.path.dirname(os.path.abspath(rank.path))
    stem = rank_stem(rank.rank, rank.restart)
    out = []
    for entry in rank.data.get("dataloaders") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("loader"), int):
            continue
        if not entry.get("fetches"):
            continue
        number = int(entry["loader"])
        fetch_path, worker_paths = pipelinefile.loader_files(run_dir, stem, number)
        try:
            fetches = pipelinefile.read_fetches(fetch_path)
            batches = [(pid, pipelinefile.read_batches(p)) for pid, p in worker_paths]
        except StepFileError:
            continue
        out.append(summarize(entry, number, fetches, batches))
    if not out:
        return None
    out.sort(key=lambda lp: -((lp.fetch or 0.0) * lp.fetches))
    return PipelineSummary(out)
