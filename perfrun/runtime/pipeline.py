"""The input pipeline, stage by stage: what a DataLoader's fetch is made of.

The step clock sees a fetch as one block (hooks.py: the iterator's
`__next__`). Whether more workers would help, or hurt, depends on what is
inside it: the fetch of an in-memory TensorDataset is the per-sample
indexing and `default_collate`, which workers only add pickling and a queue
to; the fetch of a dataset that decodes images is `__getitem__` work that
workers do in parallel. So, in the default mode, every DataLoader iterator
the script makes is timed stage by stage:

* in the main process, on the iterator itself (instance attributes, so no
  other iterator and no class pays): the sampler (`_next_index`), the
  fetcher's `fetch` and its `collate_fn` (the dataset's part is the fetch
  less the collate) and the CPU time of the two, pinning, and with workers
  the wait on the queue (`_get_data`) and which task and worker it waited
  for; one row per timed fetch (store/pipelinefile.py), kept in an array
  and appended to the fetch table by the rank's flush thread;
* in each worker process, forked or spawned: torch's worker loop is called
  through `WorkerLoop`, which notes when the worker got each task, when the
  batch was made and handed to the queue, the collate's share, the CPU
  time and the worker's memory, one row per batch appended by the worker
  itself.

While fetches take longer than SAMPLE_ALL each is timed stage by stage;
cheaper ones once in SAMPLE_EVERY, the others only by how long they took
(the stages' wrappers are put on the iterator for the timed fetch and taken
off after it): an in-memory loop whose fetch takes tens of microseconds
does not pay the few that the stages cost, and a row says how many fetches
it stands for. Timer-only runs none of this: that mode
promises the cheapest run (docs/costs.md).

Never in the script's way: each wrapper calls the original once with its
arguments and returns its result or raises its exception untouched;
perfrun's own bookkeeping is guarded, and a fault is recorded, never raised.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import threading
from array import array
from time import perf_counter as now
from time import thread_time as cpu
from typing import Any, Callable, Optional

from ..store import pipelinefile
from ..store.stepfile import StepWriter
from .hooks import without_wrapper_frames

_NAN = math.nan
_WIDTH = len(pipelinefile.FETCH_COLUMNS)
#: A cheap fetch is timed stage by stage once in so many: a fetch of an
#: in-memory batch takes tens of microseconds, and its stages' wrappers a few.
SAMPLE_EVERY = 16
#: While fetches average longer than this (seconds), each is timed stage by
#: stage.
SAMPLE_ALL = 1e-3
#: The weight of a fetch in that moving average.
AVERAGE = 1 / 8
#: The CPU time of the dataset and collate is read on a timed fetch at most
#: once in so many seconds (it costs system calls, see `_attach_single`).
CPU_EVERY = 0.2
#: A read of the CPU clocks that takes longer than this (seconds) was
#: interrupted: the scheduler ran another process around it, and the run
#: queue's figure would count a wait outside the wall clock's span (or miss
#: one inside it). Such a reading is dropped; a read takes a few
#: microseconds, a switch away hundreds.
READ_SLACK = 100e-6
#: The page size, for a worker's resident memory from /proc/self/statm.
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def batch_bytes(batch: Any) -> tuple[int, int]:
    """The tensors of a batch (a tensor, or tuples, lists and dicts of them)
    and their bytes: what a worker's queue must carry for each batch."""
    count = size = 0
    todo = [batch]
    seen = 0
    while todo and seen < 10_000:
        seen += 1
        item = todo.pop()
        if isinstance(item, (tuple, list)):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.values())
        else:
            nbytes = getattr(item, "nbytes", None)
            if isinstance(nbytes, int) and hasattr(item, "element_size"):
                count += 1
                size += nbytes
    return count, size


def _adding_time(fn: Callable[[], Any], into: list[float], slot: int) -> Callable[[], Any]:
    """`fn` (a bound method of torch's iterator, no arguments), its time
    added to `into[slot]` at each call: a stage of the fetch."""
    def timed() -> Any:
        t = now()
        try:
            return fn()
        finally:
            into[slot] += now() - t

    return timed

class ThreadClock:
    """This thread's CPU time and its time waiting for a CPU, in seconds.
    On a loaded machine a CPU-bound dataset spends much of its time waiting
    for a CPU, and its CPU time alone would read as waiting on I/O. The CPU
    time is `time.thread_time()` (exact to the call); the wait is the run
    queue's from `/proc/thread-self/schedstat` (Linux; its CPU time lags
    while the thread runs, its wait does not), NaN where the file is
    missing. Made in the thread it measures (the file names the thread
    that opened it)."""

    def __init__(self) -> None:
        try:
            self._fd: Optional[int] = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float]:
        if self._fd is not None:
            try:
                return cpu(), int(os.pread(self._fd, 64, 0).split()[1]) * 1e-9
            except (OSError, ValueError, IndexError):
                self._fd = None
        return cpu(), _NAN

    def read_between(self) -> tuple[float, float, float, float]:
        """`read()` and the wall clock just before and just after it: a
        span between two reads is timed from the first one's after to the
        second one's before, and either read taking longer than READ_SLACK
        makes the CPU figures of the span unknown. (The run queue's wait is
        added as the thread gets a CPU back: a switch away just after a
        read counts in the next read's figure and not in the span, one just
        before a read in the read's figure and in the span.)"""
        before = now()
        used, waited = self.read()
        return used, waited, before, now()


class LoaderStages:
    """One DataLoader of the rank: its number, its settings' entry in the
    rank file, and its fetch rows not yet written."""

    def __init__(self, number: int, entry: dict[str, Any]) -> None:
        self.number = number
        self.entry = entry
        self.rows = array("d")
        self.writer: Optional[StepWriter] = None
        #: Each iterator's row awaiting its edges (`_sample`), appended at
        #: the end of the run.
        self.pending: list[list[Any]] = []


class Pipeline:
    """The main process's side: times the iterators of the rank's
    DataLoaders stage by stage (see the module docstring)."""

    def __init__(self, run_dir: str, stem: str, fault: Callable[[str, BaseException], None]
                 ) -> None:
        self.run_dir = run_dir
        self.stem = stem
        self.fault = fault
        self.loaders: dict[int, LoaderStages] = {}
        self._lock = threading.Lock()
        self.worker_loop: Optional[WorkerLoop] = None
        self._clocks: dict[int, ThreadClock] = {}

    def _clock(self) -> ThreadClock:
        """The clock of the thread that iterates (the script's)."""
        ident = threading.get_ident()
        found = self._clocks.get(ident)
        if found is None:
            found = self._clocks[ident] = ThreadClock()
        return found

    # -- torch's worker loop -----------------------------------------------------

    def install(self, torch: Any) -> list[tuple[Any, str, Any]]:
        """Put WorkerLoop in place of torch's worker loop; returns what was
        replaced, as hooks.install does (for hooks.uninstall)."""
        from torch.utils.data._utils import worker

        original = worker._worker_loop
        if isinstance(original, WorkerLoop):
            return []
        self.worker_loop = WorkerLoop(original, self.run_dir, self.stem)
        worker._worker_loop = self.worker_loop
        return [(worker, "_worker_loop", original)]

    # -- iterators ---------------------------------------------------------------------

    def loader(self, loader: Any, entry: dict[str, Any]) -> LoaderStages:
        """The stages of `loader` (`entry`: its settings in the rank file,
        which gets its number and its tables' names)."""
        key = id(loader)
        found = self.loaders.get(key)
        if found is None:
            found = LoaderStages(len(self.loaders), entry)
            entry["loader"] = found.number
            self.loaders[key] = found
        return found

    def before_iter(self, stages: LoaderStages) -> None:
        """Just before the iterator (and its workers) is made: the workers
        it starts are this loader's."""
        if self.worker_loop is not None:
            self.worker_loop.loader = stages.number
            self.worker_loop.created = now()

    def attach(self, stages: LoaderStages, it: Any) -> None:
        """Time `it`, an iterator of the loader, stage by stage. An iterator
        is timed once: with persistent workers the loader hands the same one
        out again each epoch, and its next fetch is its epoch's first."""
        state = it.__dict__.get("_perfrun_first")
        if state is not None:  # see _sample
            state[0], state[1] = 1, 1.0
            return
        if hasattr(it, "_get_data") and hasattr(it, "_task_info"):
            self._attach_workers(stages, it)
        elif hasattr(it, "_dataset_fetcher") and hasattr(it, "_next_index"):
            self._attach_single(stages, it)
        else:
            stages.entry.setdefault("stages_unseen", type(it).__name__)

    def _attach_single(self, stages: LoaderStages, it: Any) -> None:
        """num_workers=0: the main process makes every batch. A sampled
        fetch runs with the stages' wrappers in place on the iterator and
        its fetcher; the others run torch's own methods (`_sample`)."""
        # sampler, fetch, collate, CPU of the fetch, its wait for a CPU
        cur = [0.0, 0.0, 0.0, 0.0, 0.0]
        last_cpu = [-CPU_EVERY]  # when the CPU clock was last read
        clock = self._clock()
        pins = bool(getattr(it, "_pin_memory", False))
        fetcher = it._dataset_fetcher
        orig_fetch = fetcher.fetch
        orig_collate = fetcher.collate_fn
        orig_data = it._next_data
        _next_index = _adding_time(it._next_index, cur, 0)

        def fetch(index: Any) -> Any:
            t = now()
            try:
                return orig_fetch(index)
            finally:
                cur[1] += now() - t

        def fetch_and_cpu(index: Any) -> Any:
            # The CPU clocks are system calls (on a timed fetch once in
            # CPU_EVERY seconds only), where a loaded machine's scheduler
            # is apt to switch to another process: read outside the wall
            # clock's span, and their figures kept only where neither read
            # was interrupted (ThreadClock.read_between). Kept regardless,
            # a 0.7 ms fetch of an in-memory dataset beside three busy
            # processes read as 6 ms waiting for a CPU.
            c, q, before, t = clock.read_between()
            try:
                return orig_fetch(index)
            finally:
                c1, q1, end, after = clock.read_between()
                cur[1] += end - t
                if t - before < READ_SLACK and after - end < READ_SLACK:
                    cur[3], cur[4] = c1 - c, q1 - q

        def collate_fn(batch: Any) -> Any:
            t = now()
            try:
                return orig_collate(batch)
            finally:
                cur[2] += now() - t

        def timed() -> tuple[Any, float, float, tuple[float, ...]]:
            cur[0] = cur[1] = cur[2] = 0.0
            cur[3] = cur[4] = _NAN
            it._next_index = _next_index
            t = now()
            if t - last_cpu[0] >= CPU_EVERY:
                last_cpu[0] = t
                fetcher.fetch = fetch_and_cpu
            else:
                fetcher.fetch = fetch
            fetcher.collate_fn = collate_fn
            try:
                t0 = now()
                data = orig_data()
                t1 = now()
            finally:
                del it._next_index, fetcher.fetch
                fetcher.collate_fn = orig_collate
            # torch pins right after the fetch, and does nothing else
            # there: with pin_memory, what is left of the fetch is that.
            pin = (t1 - t0 - cur[0] - cur[1]) if pins else _NAN
            return data, t0, t1, (cur[0], cur[1] - cur[2], cur[2], pin, _NAN, _NAN, _NAN,
                                  cur[3], _NAN, cur[4])

        self._sample(stages, it, orig_data, timed)

    def _attach_workers(self, stages: LoaderStages, it: Any) -> None:
        """num_workers > 0: the main process samples, sends the indices and
        waits; the workers make the batches (WorkerLoop times them)."""
        cur = [0.0, 0.0, 0.0]  # sampler, wait, sending indices (sampler included)
        orig_data = it._next_data
        _next_index = _adding_time(it._next_index, cur, 0)
        _get_data = _adding_time(it._get_data, cur, 1)
        _try_put_index = _adding_time(it._try_put_index, cur, 2)

        def timed() -> tuple[Any, float, float, tuple[float, ...]]:
            cur[0] = cur[1] = cur[2] = 0.0
            task = pid = _NAN
            try:
                task = it._rcvd_idx
                info = it._task_info.get(task)
                worker = it._workers[info[0]] if info else None
                pid = worker.pid if worker is not None and worker.pid else _NAN
            except Exception as exc:
                self.fault("pipeline", exc)
            it._next_index = _next_index
            it._get_data = _get_data
            it._try_put_index = _try_put_index
            try:
                t0 = now()
                data = orig_data()
                t1 = now()
            finally:
                del it._next_index, it._get_data, it._try_put_index
            # Sending the next indices to a worker: pickled onto its queue.
            send = max(0.0, cur[2] - cur[0])
            return data, t0, t1, (cur[0], _NAN, _NAN, _NAN, cur[1], float(task), float(pid),
                                  _NAN, send, _NAN)

        self._sample(stages, it, orig_data, timed)

    def _sample(self, stages: LoaderStages, it: Any, orig_data: Callable[[], Any],
                timed: Callable[[], tuple[Any, float, float, tuple[float, ...]]]) -> None:
        """Put the iterator's `_next_data` in place: it times a fetch stage by
        stage (`timed`) when the fetch is sampled, and otherwise only how
        long it took. While the iterator's fetches average more than
        SAMPLE_ALL (a moving average: their stages' few microseconds are
        lost in them) every fetch is sampled, otherwise one in SAMPLE_EVERY,
        and an iterator's first fetch always. The choice is made before the
        fetch, from the ones before it, so the rows sampled stand for the
        others (each row carries how many, `weight`); an average rather than
        the last fetch, so fetches that alternate (a slow worker's batch
        every other one) are all sampled, not the fast half."""
        fault = self.fault
        rows = stages.rows
        # period, first, fetches since the last sample, average fetch
        state: list[Any] = [1, 1.0, 0, 0.0]
        # The row of a timed fetch, until the step clock's hook gives it the
        # fetch's edges as the step saw them (`done`); appended then, or by
        # the next fetch where no hook came (an exception in between, a
        # loader iterated outside the hooks).
        pending: list[Any] = [None]

        def _next_data() -> Any:
            if pending[0] is not None:
                rows.extend(pending[0])
                pending[0] = None
            state[2] += 1
            if state[2] < state[0]:
                t0 = now()
                data = orig_data()
                state[3] += (now() - t0 - state[3]) * AVERAGE
                state[0] = 1 if state[3] > SAMPLE_ALL else SAMPLE_EVERY
                return data
            data, t0, t1, parts = timed()
            try:
                first = state[1]
                tensors = size = _NAN
                if first:
                    tensors, size = batch_bytes(data)
                pending[0] = [t0, t1, *parts[:7], first, tensors, size, parts[7],
                              float(state[2]), parts[8], t1 - t0, parts[9]]
                state[1] = 0.0
                state[2] = 0
                state[3] = (t1 - t0) if first else state[3] + (t1 - t0 - state[3]) * AVERAGE
                state[0] = 1 if state[3] > SAMPLE_ALL else SAMPLE_EVERY
            except Exception as exc:
                fault("pipeline", exc)
            return data

        def done(start: float, end: float) -> None:
            row = pending[0]
            if row is not None:
                pending[0] = None
                row[0], row[1] = start, end
                rows.extend(row)

        it._next_data = _next_data
        it._perfrun_first = state
        it._perfrun_done = done
        stages.pending.append(pending)

    # -- saving -----------------------------------------------------------------------

    def flush(self, final: bool = False) -> None:
        """Append the fetch rows gathered since the last flush (the rank's
        flush thread, under its write lock); the last one (`final`, the
        script done) also the rows still awaiting their edges."""
        for stages in list(self.loaders.values()):
            if final:
                for pending in stages.pending:
                    row, pending[0] = pending[0], None
                    if row is not None:
                        stages.rows.extend(row)
            rows = stages.rows
            n = len(rows) // _WIDTH
            if not n:
                continue
            if stages.writer is None:
                stages.writer = pipelinefile.fetch_writer(self.run_dir, self.stem, stages.number)
                stages.entry["fetches"] = os.path.basename(stages.writer.path)
            taken = rows[: n * _WIDTH]
            del rows[: n * _WIDTH]
            stages.writer.append_held(taken, n)

    def close(self) -> None:
        for stages in self.loaders.values():
            if stages.writer is not None:
                stages.writer.close()


# -- in the workers ----------------------------------------------------------------------


def _rss() -> float:
    """This process's resident memory in bytes (Linux), else NaN."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        return _NAN


class _Recorder:
    """One worker's batches, each written as it is handed to the queue."""

    def __init__(self, writer: StepWriter, created: float) -> None:
        self.writer = writer
        self.clock = ThreadClock()
        self.task = _NAN
        self.got = _NAN
        self.cpu = 0.0
        self.runq = 0.0
        #: Whether the CPU clocks' read as the batch's task arrived was
        #: uninterrupted (READ_SLACK).
        self.clean = False
        self.collate = 0.0
        self.writer.append([(pipelinefile.STARTED, now(), created, _NAN, _NAN, _rss(), _NAN,
                             _NAN)])

    def sent(self, fetched: float, used: float, waited: float) -> None:
        try:
            self.writer.append([(self.task, self.got, fetched, now(), self.collate, _rss(),
                                 used - self.cpu, waited - self.runq)])
        except Exception:  # a full disk costs the record, never the batch
            pass
        self.task = _NAN


class _IndexQueue:
    """The worker's index queue: notes when each task arrives."""

    def __init__(self, queue: Any, recorder: _Recorder) -> None:
        self._queue = queue
        self._recorder = recorder

    def get(self, *args: Any, **kwargs: Any) -> Any:
        r = self._queue.get(*args, **kwargs)
        if type(r) is tuple and len(r) == 2:
            recorder = self._recorder
            recorder.task = float(r[0]) if isinstance(r[0], int) else _NAN
            # Outside the wall clock's span: see _attach_single's fetch.
            recorder.cpu, recorder.runq, before, recorder.got = recorder.clock.read_between()
            recorder.clean = recorder.got - before < READ_SLACK
            recorder.collate = 0.0
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


class _DataQueue:
    """The worker's data queue: notes when each batch is handed over."""

    def __init__(self, queue: Any, recorder: _Recorder) -> None:
        self._queue = queue
        self._recorder = recorder

    def put(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = self._recorder
        used, waited, fetched, after = recorder.clock.read_between()
        if not (recorder.clean and after - fetched < READ_SLACK):
            used = waited = _NAN
        try:
            return self._queue.put(obj, *args, **kwargs)
        finally:
            if recorder.task == recorder.task and type(obj) is tuple and len(obj) == 2:
                recorder.sent(fetched, used, waited)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


def _timed_collate(collate: Callable[[Any], Any], recorder: _Recorder) -> Callable[[Any], Any]:
    def collate_fn(batch: Any) -> Any:
        t = now()
        try:
            return collate(batch)
        finally:
            recorder.collate += now() - t

    return collate_fn


def _clean_exception_wrapper(worker: Any) -> None:
    """In this worker process, torch's loop wraps an exception of the
    dataset or the collate as an ExceptionWrapper, the traceback formatted
    there and printed by the main process: the same traceback as without
    perfrun, not the collate's timing wrapper among its frames."""
    wrapper = worker.ExceptionWrapper

    def ExceptionWrapper(exc_info: Any = None, where: str = "in background") -> Any:
        if exc_info is None:
            exc_info = sys.exc_info()
        try:
            exc_info = (exc_info[0], exc_info[1], without_wrapper_frames(exc_info[2]))
        except Exception:
            pass
        return wrapper(exc_info, where)

    worker.ExceptionWrapper = ExceptionWrapper


def _worker_loop_in_child(run_dir: str, stem: str, loader: int, created: float = _NAN
                          ) -> WorkerLoop:
    """A WorkerLoop unpickled in a spawned worker: the loop it runs is
    torch's own, which a fresh interpreter has not replaced."""
    loop = WorkerLoop(None, run_dir, stem, loader)
    loop.created = created
    return loop


class WorkerLoop:
    """Stands in for torch's `_worker_loop`, the function each DataLoader
    worker runs: it records the worker's batches, then runs torch's loop
    with the same arguments (its queues and collate function timed).

    A forked worker inherits it from the rank; a spawned one gets it
    pickled as the process's target (`__reduce__`), and runs torch's own
    loop from its fresh import. Whatever fails here, the worker runs
    torch's loop untimed."""

    def __init__(self, original: Optional[Callable[..., Any]], run_dir: str, stem: str,
                 loader: int = 0) -> None:
        self.original = original
        self.run_dir = run_dir
        self.stem = stem
        #: The loader whose iterator is being made, and when its making
        #: began (Pipeline.before_iter).
        self.loader = loader
        self.created = _NAN

    def __reduce__(self) -> tuple[Any, ...]:
        return (_worker_loop_in_child, (self.run_dir, self.stem, self.loader, self.created))

    def _torch_loop(self) -> Callable[..., Any]:
        if self.original is not None:
            return self.original
        from torch.utils.data._utils import worker

        loop = worker._worker_loop
        return loop.original if isinstance(loop, WorkerLoop) else loop  # type: ignore[return-value]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        loop = self._torch_loop()
        try:
            bound = inspect.signature(loop).bind(*args, **kwargs)
            params = bound.arguments
            if not {"index_queue", "data_queue", "collate_fn"} <= set(params):
                return loop(*args, **kwargs)
            writer = pipelinefile.batch_writer(self.run_dir, self.stem, self.loader, os.getpid())
            recorder = _Recorder(writer, self.created)
            params["index_queue"] = _IndexQueue(params["index_queue"], recorder)
            params["data_queue"] = _DataQueue(params["data_queue"], recorder)
            params["collate_fn"] = _timed_collate(params["collate_fn"], recorder)
            args, kwargs = bound.args, bound.kwargs
            from torch.utils.data._utils import worker

            _clean_exception_wrapper(worker)
        except Exception:  # the worker must run whatever perfrun cannot do
            pass
        return loop(*args, **kwargs)
