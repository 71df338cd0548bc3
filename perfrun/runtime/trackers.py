"""perfrun's figures in the script's own experiment tracker run: the W&B
run (`wandb.run`), the MLflow run (`mlflow.start_run`) or the TensorBoard
`SummaryWriter` (torch.utils.tensorboard's or tensorboardX's) the script
opened itself. (Experiment trackers: not the step tracker of steps.py.)

What happens where, and why:

* The flush thread hands each batch of saved steps to `rows`, which sums
  them into blocks (trackerpoints.py) and queues a point a block. Nothing
  runs in the script's thread during training: no wrapper sits on the
  script's own logging calls, and the step rows are the ones saved anyway.
* One daemon thread of perfrun's own (`perfrun-tracker`) takes the points
  off a bounded queue and logs them. A tracker call can block (a W&B or
  MLflow server that does not answer); it then blocks that thread alone:
  the flush and the final save never wait on it, a full queue drops points
  (counted, and said in the report), and a closing run waits for it at
  most `--tracker-timeout` seconds.
* Nothing is opened: perfrun logs only into a run the script opened, while
  it is open, and into nothing when the script opened none. Rank 0 only,
  unless --tracker-all-ranks.
* Each tracker is hooked when its module is imported (or at once, if the
  script imported it before torch): its close (`Run._finish`,
  `mlflow.end_run`, `SummaryWriter.close`) first takes perfrun's steps up
  to that moment, so the last point lands before the run is closed; the
  script calls the same functions with the same arguments and gets the
  same results. Scripts usually close their run (or let the tracker's own
  exit handler close it) before perfrun's final save, so without this the
  end of the run would be missing.

Where points land. W&B: with `commit=False`, into the row the script
commits next, at the script's own step, never advancing its step counter
(the point's own step is logged as `perfrun/step`). MLflow and
TensorBoard keep no step of the script's to join: the points are logged
at perfrun's index of the block's last step, which counts training steps
from 0 as a script's `global_step` does.

At the close of a W&B run the rank also writes its own summary of its
steps into `run.summary` (trackerpoints.run_figures): W&B cannot reopen an
offline run once the process has ended, so the report's figures cannot
reach it later. MLflow runs and TensorBoard folders get the report's
summary and report.html from the launcher after the run (launcher/
trackers.py), from the record this module writes at the final save
(store/trackerfile.py).
"""

from __future__ import annotations

import atexit
import functools
import os
import queue
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional

from ..settings import default_warmup
from ..store import trackerfile
from ..store.layout import rank_stem, steps_path
from ..store.stepfile import StepFileError, read_table
from . import hooks
from .importwatch import ImportWatcher
from .trackerpoints import PREFIX, Blocks, Point, figures, rows_of, run_figures

#: Points waiting for the tracker thread at most: a tracker that has not
#: taken this many points is not keeping up, and newer ones are dropped.
QUEUE_POINTS = 256
#: Errors in a row after which perfrun stops logging to a tracker.
MAX_ERRORS = 3
#: The modules whose import hooks a tracker, and what hooks it.
WANDB = "wandb"
MLFLOW = "mlflow"
TORCH_TB = "torch.utils.tensorboard.writer"
TENSORBOARDX = "tensorboardX.writer"
NAMES = {"wandb": "W&B", "mlflow": "MLflow", "tensorboard": "TensorBoard"}


def wrap(owner: Any, name: str, before: Optional[Callable[..., None]] = None,
         after: Optional[Callable[..., None]] = None) -> Optional[Callable[[], None]]:
    """Replace `owner.name` with a function that calls `before(*args)`,
    the original with the script's arguments, then `after(result, *args)`:
    the script gets the original's result or exception untouched, and
    anything perfrun's parts raise is swallowed. Returns the undo."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "__perfrun__", False):
        return None

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            try:
                before(*args)
            except Exception:
                pass
        result = original(*args, **kwargs)
        if after is not None:
            try:
                after(result, *args)
            except Exception:
                pass
        return result

    wrapper.__perfrun__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


class Target:
    """One run perfrun logs into, and what it took."""

    def __init__(self, kind: str, record: dict[str, Any], handle: Any) -> None:
        self.kind = kind
        self.record = {"kind": kind, **record, "points": 0, "last_step": None}
        self.handle = handle  # the W&B run, the writer (weakly), the MLflow client
        self.closed = False
        self.errors = 0
        self.off = False


class Trackers:
    """The hooks, the blocks and the thread that logs them, for one rank."""

    def __init__(self, agent: Any) -> None:
        settings = agent.settings
        self.agent = agent
        self.blocks = Blocks(settings.tracker_every)
        self.timeout = float(settings.tracker_timeout)
        all_ranks = settings.tracker_all_ranks and agent.world_size > 1
        self.prefix = f"{PREFIX}rank{agent.rank}/" if all_ranks else PREFIX
        self.queue: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=QUEUE_POINTS)
        self.thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()
        self.targets: list[Target] = []
        self.wandb: dict[int, Target] = {}  # by id() of the W&B run
        self.mlflow: list[Target] = []  # the script's started runs, innermost last
        self.writers: list[Target] = []  # SummaryWriters, first opened first
        self.points = 0
        self.dropped = 0
        self.problems: list[str] = []
        # What install() did, for uninstall(): the wrappers and the watchers.
        self._undo: list[Callable[[], None]] = []
        self._watchers: list[ImportWatcher] = []
        self._finished = False

    # -- hooks -----------------------------------------------------------------

    def install(self) -> None:
        """Hook each tracker now if the script imported it already, else as
        its module is imported. An exception of the tracker's own passes
        through a wrapper here: the traceback the script prints leaves its
        frame out, as it does the hooks' (hooks.without_wrapper_frames)."""
        if __file__ not in hooks._OWN_FILES:
            hooks._OWN_FILES = (*hooks._OWN_FILES, __file__)
        for name, hook in ((WANDB, self._hook_wandb), (MLFLOW, self._hook_mlflow),
                           (TORCH_TB, self._hook_writer), (TENSORBOARDX, self._hook_writer)):
            module = sys.modules.get(name)
            if module is not None:
                self._hook(hook, module)
            else:
                watcher = ImportWatcher(functools.partial(self._hook, hook), name)
                self._watchers.append(watcher)
                sys.meta_path.insert(0, watcher)

    def uninstall(self) -> None:
        """Put back what install() changed (a rank never needs to: its hooks
        end with its process; an in-process test does)."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        for watcher in self._watchers:
            if watcher in sys.meta_path:
                sys.meta_path.remove(watcher)
        self._watchers.clear()

    def _wrap(self, owner: Any, name: str, **hooks: Any) -> None:
        undo = wrap(owner, name, **hooks)
        if undo is not None:
            self._undo.append(undo)

    def _hook(self, hook: Callable[[Any], None], module: Any) -> None:
        try:
            hook(module)
        except Exception as exc:
            self.agent.record_fault("tracker.hook", exc)

    def _hook_wandb(self, wandb: Any) -> None:
        from wandb.sdk import wandb_run

        run_class = wandb_run.Run
        # Run.finish, Run.__exit__ and wandb.finish all end in Run._finish.
        self._wrap(run_class, "_finish" if hasattr(run_class, "_finish") else "finish",
                   before=self._wandb_closing)
        self._wrap(wandb, "init", after=lambda run, *a: self._wandb_seen())
        if getattr(wandb, "run", None) is not None:
            self._wandb_seen()

    def _hook_mlflow(self, mlflow: Any) -> None:
        from mlflow.tracking import fluent

        # `with mlflow.start_run()` and MLflow's own exit handler call the
        # fluent module's end_run; the script calls mlflow's.
        for owner in (fluent, mlflow):
            self._wrap(owner, "start_run", after=self._mlflow_started)
            self._wrap(owner, "end_run", before=self._mlflow_ending)

    def _hook_writer(self, module: Any) -> None:
        writer = getattr(module, "SummaryWriter", None)
        if writer is None:
            return
        library = "tensorboardX" if module.__name__.startswith("tensorboardX") else "torch"
        self._wrap(writer, "__init__", after=lambda _, w, *a: self._writer_opened(w, library))
        self._wrap(writer, "close", before=self._writer_closing)

    # -- the script's runs -------------------------------------------------------

    def _wandb_seen(self) -> None:
        """A W&B run is open: perfrun's exit handler goes after W&B's (which
        tears W&B down at exit), so it runs first and the run still takes
        the last figures when the script never calls finish."""
        self._last_at_exit()

    def _last_at_exit(self) -> None:
        """Move perfrun's exit handler after every one registered so far:
        exit handlers run last first, so it runs before the trackers' own
        (W&B's teardown, tensorboardX's closing of its files)."""
        atexit.unregister(self._before_exit)
        atexit.register(self._before_exit)

    def _wandb_target(self, run: Any) -> Optional[Target]:
        target = self.wandb.get(id(run))
        if target is None:
            try:
                settings = run.settings
                record = {"id": str(run.id), "project": str(run.project or ""),
                          "dir": str(run.dir), "offline": bool(getattr(settings, "_offline",
                                                                       False)),
                          "summary": False}
            except Exception:
                return None
            target = self.wandb[id(run)] = Target("wandb", record, run)
            self.targets.append(target)
            self._wandb_seen()
        return target

    def _wandb_closing(self, run: Any, *args: Any) -> None:
        if getattr(run, "_is_finished", False):
            return
        target = self._wandb_target(run)
        if target is None or target.closed:
            return
        self._closing(target)

    def _mlflow_started(self, active: Any, *args: Any) -> None:
        import mlflow

        run_id = str(active.info.run_id)
        if any(t.record["run_id"] == run_id and not t.closed for t in self.mlflow):
            return
        uri = _absolute_uri(str(mlflow.get_tracking_uri()))
        target = Target("mlflow", {"run_id": run_id, "tracking_uri": uri,
                                   "experiment_id": str(active.info.experiment_id)}, None)
        self.mlflow.append(target)
        self.targets.append(target)

    def _mlflow_ending(self, *args: Any) -> None:
        import mlflow

        active = mlflow.active_run()
        if active is None:
            return
        run_id = str(active.info.run_id)
        for target in reversed(self.mlflow):
            if target.record["run_id"] == run_id and not target.closed:
                self._closing(target)
                return

    def _writer_opened(self, writer: Any, library: str) -> None:
        log_dir = writer.get_logdir() if hasattr(writer, "get_logdir") else writer.logdir
        target = Target("tensorboard", {"library": library,
                                        "log_dir": os.path.abspath(str(log_dir))},
                        weakref.ref(writer))
        self.writers.append(target)
        self.targets.append(target)
        # tensorboardX closes the writer's file at exit, in a handler of
        # its own registered just now.
        self._last_at_exit()

    def _writer_closing(self, writer: Any, *args: Any) -> None:
        for target in self.writers:
            if target.handle() is writer and not target.closed:
                self._closing(target)
                return

    def _before_exit(self) -> None:
        """At exit, before the trackers' own exit handlers: an open W&B run
        takes the last figures and the rank's summary, and a writer the
        script left open the last figures, written to its file."""
        try:
            wandb = sys.modules.get(WANDB)
            run = getattr(wandb, "run", None) if wandb is not None else None
            if run is not None:
                self._wandb_closing(run)
            for target in self._open_writers():
                self._closing(target)
        except Exception as exc:
            self.agent.record_fault("tracker.exit", exc)

    def _closing(self, target: Target) -> None:
        """The script closes a run: its steps up to now, the points they
        complete and the open block (and for W&B the rank's summary), then
        wait (at most the timeout) for the tracker to take them before the
        script's close goes on."""
        if os.getpid() != self.agent._pid:
            return  # a forked child (a DataLoader worker) is no rank
        self.agent.flush_for_tracker()
        with self.lock:
            last = self.blocks.close()
        if last is not None:
            self._queue_point(last)
        if target.kind == "wandb":
            summary = self._own_summary()
            if summary:
                self._put(("summary", target, summary))
        elif target.kind == "tensorboard":
            self._put(("flush",))
        if not self._drain():
            self._problem(f"{NAMES[target.kind]} did not take perfrun's last figures within "
                          f"{self.timeout:g} s as the script closed its run: they are not in it")
        target.closed = True

    # -- points --------------------------------------------------------------------

    def rows(self, buf: Any, count: int, first: int) -> None:
        """The flush thread's consumer (Agent.add_row_consumer)."""
        table = rows_of(buf, count)
        with self.lock:
            points = self.blocks.add(table, first)
        for point in points:
            self._queue_point(point)

    def _queue_point(self, point: Point) -> None:
        if not any(not t.closed and not t.off for t in self.targets) and not self._wandb_open():
            return  # no run open to take it: nothing is logged
        figs = figures(point, self._flops_per_step())
        figs.update(self._memory())
        self.points += 1
        self._put(("point", point.step, figs))

    def _put(self, item: tuple[Any, ...]) -> bool:
        self._start()
        try:
            self.queue.put_nowait(item)
            return True
        except queue.Full:
            if item[0] == "point":
                self.dropped += 1
            return False

    def _wandb_open(self) -> bool:
        wandb = sys.modules.get(WANDB)
        run = getattr(wandb, "run", None) if wandb is not None else None
        return run is not None and not getattr(run, "_is_finished", False)

    def _flops_per_step(self) -> Optional[float]:
        flops = self.agent.flops
        if flops is None or not flops.done or flops.step is None or flops.reason is not None:
            return None
        total = sum(flops.counts.values())
        return float(total) if total > 0 else None

    def _memory(self) -> dict[str, float]:
        out: dict[str, float] = {}
        memory = self.agent.host_memory
        process = memory.process if memory is not None else None
        if process is not None and process.last:
            out[PREFIX + "rss_gib"] = process.last / 2**30
        torch = self.agent.torch
        allocator = self.agent.allocator
        latest = allocator.latest() if allocator is not None else None
        if latest is not None:
            # The last sampled step (runtime/allocator.py): what the Memory
            # Summary is made of, read from the allocator at that step's edges.
            for key, value in latest.items():
                out[f"{PREFIX}gpu_{key}_gib"] = value / 2**30
        elif self.agent.gpu_timer is not None and torch is not None:
            try:
                device = self.agent.cuda_device()
                out[PREFIX + "gpu_allocated_gib"] = torch.cuda.memory_allocated(device) / 2**30
                out[PREFIX + "gpu_reserved_gib"] = torch.cuda.memory_reserved(device) / 2**30
            except Exception:
                pass
        return out

    def _own_summary(self) -> Optional[dict[str, float]]:
        """The rank's own summary of its steps so far (run_figures)."""
        try:
            table = read_table(steps_path(self.agent.path))
        except (StepFileError, OSError):
            return None
        warmup = self.agent.settings.warmup
        if warmup is None:
            warmup = default_warmup(table.shape[0])
        out: dict[str, Any] = dict(run_figures(table, warmup, self._flops_per_step()))
        out[PREFIX + "summary/warmup"] = float(warmup)
        out[PREFIX + "results"] = self.agent.run_dir
        return out

    # -- the tracker thread --------------------------------------------------------

    def _start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="perfrun-tracker",
                                           daemon=True)
            self.thread.start()

    def _drain(self) -> bool:
        """Wait, at most the timeout, for the thread to log what is queued."""
        done = threading.Event()
        self._start()
        try:
            self.queue.put(("mark", done), timeout=self.timeout)
        except queue.Full:
            return False
        return done.wait(self.timeout)

    def _loop(self) -> None:
        while True:
            item = self.queue.get()
            try:
                kind = item[0]
                if kind == "mark":
                    item[1].set()
                elif kind == "point":
                    self._log(item[1], item[2])
                elif kind == "summary":
                    summary = {self.prefix + k[len(PREFIX):]: v for k, v in item[2].items()}
                    self._call(item[1], lambda t=item[1], s=summary: _wandb_summary(t, s))
                elif kind == "flush":
                    for target in self._open_writers():
                        self._call(target, lambda t=target: _writer(t).flush())
            except Exception as exc:
                self.agent.record_fault("tracker.thread", exc)

    def _log(self, step: int, figs: dict[str, float]) -> None:
        figs = {self.prefix + k[len(PREFIX):]: v for k, v in figs.items()}
        wandb = sys.modules.get(WANDB)
        run = getattr(wandb, "run", None) if wandb is not None else None
        if run is not None and not getattr(run, "_is_finished", False):
            target = self._wandb_target(run)
            if target is not None and not target.closed and not target.off:
                row = dict(figs)
                row[self.prefix + "step"] = step
                if self._call(target, lambda: run.log(row, commit=False)):
                    self._took(target, step)
        for target in self.mlflow[::-1]:
            if not target.closed and not target.off:
                if self._call(target, lambda t=target: _mlflow_log(t, step, figs)):
                    self._took(target, step)
                break  # the innermost open run
        for target in self._open_writers()[:1]:
            if self._call(target, lambda t=target: _writer_log(t, step, figs)):
                self._took(target, step)

    def _open_writers(self) -> list[Target]:
        out = []
        for target in self.writers:
            writer = target.handle()
            if writer is None or target.closed or target.off or _writer_closed(writer):
                continue
            out.append(target)
        return out

    @staticmethod
    def _took(target: Target, step: int) -> None:
        target.record["points"] += 1
        target.record["last_step"] = step

    def _call(self, target: Target, call: Callable[[], Any]) -> bool:
        try:
            call()
            target.errors = 0
            return True
        except Exception as exc:
            target.errors += 1
            if target.errors >= MAX_ERRORS and not target.off:
                target.off = True
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                self._problem(f"perfrun stopped logging to {NAMES[target.kind]} after "
                              f"{MAX_ERRORS} errors in a row ({reason})")
            return False

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
        self.agent.note_once(text)

    # -- the end of the rank ---------------------------------------------------------

    def finish(self) -> None:
        """After the rank's final save: the last block to the runs still
        open, TensorBoard's writers flushed, and the record written."""
        if self._finished:
            return
        self._finished = True
        with self.lock:
            last = self.blocks.close()
        if last is not None:
            self._queue_point(last)
        if self.thread is not None:
            self._put(("flush",))
            if not self._drain():
                self._problem(f"the tracker did not take perfrun's last figures within "
                              f"{self.timeout:g} s at the end of the run")
        if self.dropped:
            self._problem(f"{self.dropped} of perfrun's {self.points} points for the tracker "
                          "were dropped: it took them slower than the run made them")
        if not self.targets:
            return
        agent = self.agent
        trackerfile.write(agent.run_dir, rank_stem(agent.rank, agent.restart), {
            "rank": agent.rank,
            "every": self.blocks.every,
            "every_auto": self.blocks.auto,
            "points": self.points,
            "dropped": self.dropped,
            "runs": [t.record for t in self.targets],
            "problems": list(self.problems),
        })


def _absolute_uri(uri: str) -> str:
    """MLflow's tracking URI with a local path made absolute, so the
    launcher finds the same store whatever its own working directory."""
    if "://" in uri:
        return uri
    path = uri[len("file:"):] if uri.startswith("file:") else uri
    return "file://" + os.path.abspath(path)


def _wandb_summary(target: Target, summary: dict[str, Any]) -> None:
    target.handle.summary.update(summary)
    target.record["summary"] = True


def _mlflow_log(target: Target, step: int, figs: dict[str, float]) -> None:
    client = target.handle
    if client is None:
        from mlflow.tracking import MlflowClient

        client = target.handle = MlflowClient(target.record["tracking_uri"])
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    client.log_batch(target.record["run_id"],
                     metrics=[Metric(k, v, stamp, step) for k, v in figs.items()])


def _writer(target: Target) -> Any:
    writer = target.handle()
    if writer is None:
        raise RuntimeError("the SummaryWriter is gone")
    return writer


def _writer_closed(writer: Any) -> bool:
    # torch's and tensorboardX's writers drop their file writers on close.
    return getattr(writer, "all_writers", True) is None


def _writer_log(target: Target, step: int, figs: dict[str, float]) -> None:
    writer = _writer(target)
    now = time.time()
    for key, value in figs.items():
        writer.add_scalar(key, value, global_step=step, walltime=now)
