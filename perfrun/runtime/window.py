"""The detailed window: torch.profiler over steps [START, END), driven by
perfrun's own step counter (no `prof.step()` in the script).

The profiler starts one step before START where there is room (a warm-up
step whose events are discarded, as Paddle's READY state does) and records
END - START steps. During the window perfrun's steps and phases are also
recorded as `record_function` ranges, so they show in the trace, and get a
track of their own there. When the window closes the trace is exported into
the run folder and summarised (analysis/trace.py) into the rank's results,
so `perfrun report` prints the window tables without re-reading the trace.

The profiler's start, its per-step bookkeeping, its stop, the trace export
and the tables all run inside a step-begin callback, that is inside the
phase edge that begins a step: each is reported to the step tracker as
perfrun's own work (StepTracker.own_work), so no step and no phase is
charged with it, and the report gives its total on a line of its own.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from ..analysis.modules import summarize_modules
from ..analysis.trace import PHASE_PREFIX, STEP_PREFIX, evaluation_ranges, summarize
from ..analysis.tracefile import compact
from ..store import layout
from ..store.files import atomic_write_text
from .annotations import as_annotations, range_api
from .gpu import PHASE_NAMES

# A trace larger than this is written gzipped (Perfetto and TensorBoard read both).
GZIP_ABOVE = 8 << 20
MIB = 1 << 20
PERFRUN_TRACK_TID = "perfrun steps and phases"


class ProfilerWindow:
    def __init__(self, agent: Any, torch: Any) -> None:
        settings = agent.settings
        assert settings.scheduler is not None
        self.agent = agent
        self.torch = torch
        self.start, self.end = settings.scheduler
        self.warm = 1 if self.start > 0 else 0
        self.state = "waiting"  # waiting -> running -> done
        self.prof: Any = None
        self.recorded_from: Optional[int] = None
        self.last_index = -1
        self.last_committed = -1
        # A step cancelled by its own StopIteration is begun again under the
        # same index: that second begin must not advance the profiler's
        # schedule, or the window loses its last step.
        self._reopen: Optional[int] = None
        self.cancelled: dict[int, int] = {}
        self._handles: list[Any] = []
        self._step_handle: Any = None
        self._enter, self._exit = range_api(torch)
        self.result: Optional[dict[str, Any]] = None
        self._cuda_capture = False
        self._capture_device: Optional[int] = None
        self._roots_known = 0
        self._now = time.perf_counter
        # Names of the top-level phase ranges of each recorded step, in
        # order, as the step tracker finally decided them (see relabel).
        self.names: dict[int, list[str]] = {}
        self._step_names: Optional[list[str]] = None
        # cudaProfilerStart/Stop calls (and where they would be, on CPU).
        self.capture: list[dict[str, Any]] = []

    # -- step callbacks ----------------------------------------------------------

    def step_begin(self, index: int, t: float) -> None:
        self.last_index = index
        if self.state == "done":
            return
        t0 = self._now()
        reopened, self._reopen = index == self._reopen, None
        if self.state == "waiting":
            if index == self.start - self.warm or (
                index > self.start - self.warm and index < self.end
            ):
                self._start(index)
            else:
                return
        elif self.state == "running" and not reopened:
            self.prof.step()
            if index >= self.end:
                self._stop(index - 1)
                self.agent.tracker.own_work(t0, self._now())
                return
            if len(self.agent.roots.ids) != self._roots_known:
                # A model first called after the window opened (every model,
                # where step 0 starts with a DataLoader fetch): hook it too.
                self._attach_modules()
        if self.state == "running" and index >= self.start:
            self._step_handle = self._enter(f"{STEP_PREFIX}{index}")
            self._step_names = self.names[index] = []
        self.agent.tracker.own_work(t0, self._now())

    def step_end(self, index: int, t: float, committed: bool) -> None:
        if committed:
            self.last_committed = index
        else:
            self._reopen = index
        self._step_names = None
        if self._step_handle is not None:
            handle, self._step_handle = self._step_handle, None
            self._exit(handle)
            if not committed:
                self.cancelled[index] = self.cancelled.get(index, 0) + 1
                self.names.pop(index, None)

    def edge(self, kind: int, enter: bool, is_eval: bool) -> None:
        if self.state != "running":
            return
        if enter:
            name = "Eval" if is_eval else PHASE_NAMES[kind]
            if not self._handles and self._step_names is not None:
                self._step_names.append(name)
            self._handles.append(self._enter(PHASE_PREFIX + name))
        elif self._handles:
            self._exit(self._handles.pop())

    def relabel(self, names: list[str]) -> None:
        """The step tracker renamed the last top-level phases of the open
        step (an evaluation batch fetched with gradients on, a no-grad
        forward that was training): their trace ranges are renamed at
        export."""
        current = self._step_names
        if current and names:
            k = min(len(current), len(names))
            current[len(current) - k:] = names[len(names) - k:]

    # -- the profiler ------------------------------------------------------------

    def under_nsys(self) -> bool:
        """Is this rank run inside nsys (--nsys, and one of --nsys-ranks)?"""
        here = getattr(self.agent, "_nsys_here", None)
        return bool(here()) if here is not None else bool(self.agent.settings.nsys)

    def activities(self) -> list[Any]:
        """What torch.profiler records. CUDA activity only once the script
        has initialised CUDA (`is_initialized` makes no driver call;
        `is_available` would initialise the driver itself), and never under
        nsys: nsys already holds the process's CUPTI subscription, and a
        second subscriber (Kineto's) fails. There the GPU tables are nsys's
        (see nsys_tables), and the window is nsys's capture range."""
        torch = self.torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_initialized() and not self.under_nsys():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return activities

    def _start(self, index: int) -> None:
        torch = self.torch
        settings = self.agent.settings
        activities = self.activities()
        warm = 1 if index < self.start else 0
        active = self.end - max(index + warm, self.start)
        self.recorded_from = max(index + warm, self.start)
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=torch_schedule(torch, warm, active),
            on_trace_ready=self._ready,
            record_shapes=settings.record_shapes or settings.detailed,
            profile_memory=settings.profile_memory or settings.detailed,
            with_stack=settings.with_stack,
            with_flops=settings.with_flops or settings.detailed,
        )
        self.prof.start()
        self.state = "running"
        self._attach_modules()
        if settings.nsys:
            # For `nsys --capture-range=cudaProfilerApi`: capture the window
            # only. cudaProfilerStart acts on the current context, so it is
            # called on the script's own device (agent.cuda_device), never
            # on device 0 by default, where it would create a context on
            # every rank of a script that does not call set_device.
            cuda = torch.cuda.is_initialized()
            edge: dict[str, Any] = {"edge": "start", "step": index, "cuda": cuda}
            if cuda:
                try:
                    device = self.agent.cuda_device()
                    with torch.cuda.device(device):
                        torch.cuda.profiler.start()
                    self._cuda_capture = True
                    self._capture_device = edge["device"] = device
                except Exception as exc:
                    self.agent.record_fault("window.nsys", exc)
            self.capture.append(edge)

    def _attach_modules(self) -> None:
        ranges = self.agent.module_ranges
        if ranges is None:
            return
        self._roots_known = len(self.agent.roots.ids)
        try:
            ranges.detach()
            ranges.attach(self.agent.roots.alive())
        except Exception as exc:
            self.agent.record_fault("modules", exc)

    def _stop(self, last_step: Optional[int] = None) -> None:
        """`last_step`: the last step captured (default: the last begun)."""
        prof, self.prof = self.prof, None
        ranges = self.agent.module_ranges
        if ranges is not None:
            ranges.detach()
        if self.agent.settings.nsys:
            if self._cuda_capture:
                try:
                    with self.torch.cuda.device(self._capture_device):
                        self.torch.cuda.profiler.stop()
                except Exception as exc:
                    self.agent.record_fault("window.nsys", exc)
            last = self.last_index if last_step is None else last_step
            self.capture.append({"edge": "stop", "step": last,
                                 "cuda": self._cuda_capture})
            self._cuda_capture = False
        while self._handles:
            self._exit(self._handles.pop())
        if self._step_handle is not None:
            self._exit(self._step_handle)
            self._step_handle = None
        if prof is not None:
            prof.stop()
        self.state = "done"

    def finish(self) -> None:
        """The run ended: close a window that is still open (the script ran
        out of steps inside it) and export what it recorded."""
        if self.state == "running" and self.last_committed >= self.end - 1:
            self._stop()  # --stop-after-window: every step was recorded
        elif self.state == "running":
            self.agent.notes.append(
                f"detailed window [{self.start}, {self.end}) ended early: the script's last "
                f"step was {self.last_committed}"
            )
            self._stop()
        elif self.state == "waiting":
            self.agent.notes.append(
                f"detailed window [{self.start}, {self.end}) never opened: the script ran "
                f"{self.last_committed + 1} steps"
            )

    def _ready(self, prof: Any) -> None:
        try:
            self._export(prof)
        except Exception as exc:
            self.agent.record_fault("window.export", exc)
        finally:
            self.state = "done"

    def _export(self, prof: Any) -> None:
        t0 = time.perf_counter()
        check = os.environ.get("PERFRUN_KEY_AVERAGES_OUT")
        if check:
            # For the test that holds the Operator table against torch's own
            # aggregation of the very same window.
            table = {e.key: {"count": e.count, "cpu_time_total_us": e.cpu_time_total}
                     for e in prof.key_averages()}
            atomic_write_text(check, json.dumps(table))
        agent = self.agent
        stem = layout.rank_stem(agent.rank, agent.restart)
        raw = layout.raw_trace_path(agent.run_dir, stem)
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        prof.export_chrome_trace(raw)
        with open(raw, encoding="utf-8") as f:
            trace = json.load(f)
        os.unlink(raw)
        events = trace.get("traceEvents", [])
        as_annotations(events)
        _drop_cancelled(events, self.cancelled)
        rename_phases(events, self.names)
        steps = self.end - (self.recorded_from or self.start)
        if self.last_committed < self.end - 1:
            steps = max(0, self.last_committed + 1 - (self.recorded_from or self.start))
        # The trace's events made compact once, for the passes and the tables.
        compact_events = compact(events)
        evaluation = evaluation_ranges(compact_events)
        summary = summarize(compact_events, steps, evaluation)
        ranges = agent.module_ranges
        summary["modules"] = summarize_modules(
            events, summary["window_time"], ranges.tree if ranges is not None else None,
            evaluation,
        )
        events.extend(_perfrun_track(events))
        path = layout.trace_path(agent.run_dir, stem)
        limit = trace_limit(getattr(agent.settings, "max_trace_mb", 0.0))
        data, gz, cut = fit_trace(trace, limit)
        if gz:
            path += ".gz"
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            atomic_write_text(path, data.decode("utf-8"))
        summary["trace_bytes"] = len(data)
        if cut is not None:
            summary["trace_steps"] = cut.steps
            summary["trace_full_bytes"] = cut.full_bytes
            agent.notes.append(trace_cut_note(cut, self.recorded_from or self.start, self.end,
                                              getattr(agent.settings, "max_trace_mb", 0.0)))
        summary["trace"] = os.path.relpath(path, agent.run_dir)
        summary["range"] = [self.recorded_from, self.end]
        summary["export_seconds"] = time.perf_counter() - t0
        if self.under_nsys():
            summary.update(nsys_tables(agent.rank))
        self.result = summary


# -- the trace file's size -----------------------------------------------------------
#
# A long window on a large model makes a trace of gigabytes: more than a
# browser opens, and, kept run after run, more than a disk holds. The file is
# bounded (--max-trace-mb); the tables are computed from every event before
# the file is cut, so only the file loses steps, never the report.


def schedule_action(step: int, warm: int, active: int) -> str:
    """The profiler's action at `step` (counted from its start), by name:
    what `torch.profiler.schedule(wait=0, warmup=warm, active=active,
    repeat=1)` returns. perfrun's own, because torch's warns when `warm` is
    0 (a window that starts at step 0 has no step before it to warm up on),
    and that warning would be printed in the script's output as if from
    the script."""
    if step < warm:
        return "WARMUP"
    if step < warm + active - 1:
        return "RECORD"
    if step == warm + active - 1:
        return "RECORD_AND_SAVE"
    return "NONE"


def torch_schedule(torch: Any, warm: int, active: int) -> Any:
    """`schedule_action` as the schedule torch.profiler.profile calls."""
    actions = torch.profiler.ProfilerAction
    return lambda step: actions[schedule_action(step, warm, active)]


def trace_limit(max_trace_mb: Any) -> int:
    """--max-trace-mb in bytes; 0 for no bound."""
    try:
        mb = float(max_trace_mb or 0.0)
    except (TypeError, ValueError):
        return 0
    return int(mb * MIB) if 0 < mb < float("inf") else 0


@dataclass(frozen=True)
class TraceCut:
    """How a trace was cut to its bound."""

    #: [first, end) of the window's steps the file holds whole; None when
    #: even the first step did not fit and the file holds part of it.
    steps: Optional[list[int]]
    #: The size the whole trace would have taken, as it would be written.
    full_bytes: int


def encode_trace(trace: dict[str, Any], gzip_it: Optional[bool] = None) -> tuple[bytes, bool]:
    """The trace as it is written: JSON, gzipped above GZIP_ABOVE (or as
    `gzip_it` says)."""
    text = json.dumps(trace).encode("utf-8")
    gz = len(text) > GZIP_ABOVE if gzip_it is None else gzip_it
    return (gzip.compress(text, compresslevel=3) if gz else text), gz


def fit_trace(trace: dict[str, Any], limit: int) -> tuple[bytes, bool, Optional[TraceCut]]:
    """The trace's bytes, gzipped or not, within `limit` bytes (0: no
    limit). A trace over it keeps the window's first steps whole, as many
    as fit: a prefix of whole steps reads in Perfetto as the window did,
    where events thinned at random would show steps with holes."""
    data, gz = encode_trace(trace)
    if not limit or len(data) <= limit:
        return data, gz, None
    full = len(data)
    events = trace.get("traceEvents") or []
    times = sorted(e["ts"] for e in events if _timed(e))
    spans = _step_spans(events)
    fraction = limit / full
    for _ in range(12):
        fraction *= 0.9
        k = int(len(times) * fraction)
        at = times[k] if k < len(times) else float("inf")
        whole = [(i, end) for i, _ts, end in spans if end <= at]
        cut = max(end for _i, end in whole) if whole else at
        kept = events_before(events, cut)
        data, _ = encode_trace({**trace, "traceEvents": kept}, gz)
        if len(data) <= limit:
            steps = [min(i for i, _ in whole), max(i for i, _ in whole) + 1] if whole else None
            return data, gz, TraceCut(steps, full)
        fraction = min(fraction, fraction * limit / len(data))
    data, _ = encode_trace({**trace, "traceEvents": events_before(events, float("-inf"))}, gz)
    return data, gz, TraceCut(None, full)


#: Events that run on a device, placed by the CPU call that launched them.
_DEVICE_CATS = frozenset(("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"))
_LAUNCH_CATS = frozenset(("cuda_runtime", "cuda_driver"))


def events_before(events: list[dict[str, Any]], cut: float) -> list[dict[str, Any]]:
    """The events of the trace up to `cut` (microseconds): metadata always;
    CPU events that begin before it; device work (kernels, copies) and flow
    arrows launched by a kept CPU call, even where the device ran it after
    `cut`."""
    launched = {
        (e.get("args") or {}).get("correlation")
        for e in events
        if e.get("cat") in _LAUNCH_CATS and _timed(e) and e["ts"] < cut
    }
    launched.discard(None)
    out = []
    for e in events:
        if not _timed(e):
            out.append(e)
        elif e.get("cat") in _DEVICE_CATS:
            if (e.get("args") or {}).get("correlation") in launched:
                out.append(e)
        elif e.get("ph") in ("s", "f", "t"):
            if e.get("id") in launched or e["ts"] < cut:
                out.append(e)
        elif e["ts"] < cut:
            out.append(e)
    return out


def _timed(e: Any) -> bool:
    """An event placed in time (not metadata, not damaged)."""
    if not isinstance(e, dict) or e.get("ph") == "M":
        return False
    ts = e.get("ts")
    return isinstance(ts, (int, float)) and not isinstance(ts, bool)


def _step_spans(events: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(step index, start, end) of perfrun's step ranges in the trace."""
    out = []
    for e in events:
        name = e.get("name")
        if (
            e.get("cat") == "user_annotation" and isinstance(name, str)
            and name.startswith(STEP_PREFIX) and _timed(e)
            and isinstance(e.get("dur"), (int, float))
        ):
            try:
                out.append((int(name[len(STEP_PREFIX):]), e["ts"], e["ts"] + e["dur"]))
            except ValueError:
                pass
    return out


def size_text(n: float) -> str:
    """Bytes for a line of text: `812 KiB`, `12.3 MiB`."""
    if n < MIB:
        return f"{n / 1024:.0f} KiB"
    if n < 1024 * MIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / (1024 * MIB):.2f} GiB"


def trace_cut_note(cut: TraceCut, start: int, end: int, max_trace_mb: float) -> str:
    held = (f"steps [{cut.steps[0]}, {cut.steps[1]})" if cut.steps
            else "part of its first step")
    return (
        f"the window's trace file holds {held} of [{start}, {end}): the whole trace would take "
        f"{size_text(cut.full_bytes)}, over --max-trace-mb {max_trace_mb:g} (raise it to keep "
        "every step; 0: no bound). The window's tables cover every step"
    )


def nsys_tables(rank: int) -> dict[str, Any]:
    """Where this rank's GPU tables are when it ran inside nsys: the window
    recorded CPU activity only (see ProfilerWindow.activities), and the
    kernels, memory copies and CUDA graph nodes of the same window are in
    nsys's report, written where launch.build_command told nsys to
    (run folder/nsys/rank<R>, relative to the run folder here)."""
    return {"gpu_tables": "nsys", "nsys_report": layout.nsys_report(rank)}


def _drop_cancelled(events: list[dict[str, Any]], cancelled: dict[int, int]) -> None:
    """A step whose leading fetch raised StopIteration was no step (the
    report counts that fetch as "DataLoader end of data"): its range is
    renamed so, and the phase ranges inside it are removed, so that the
    window's steps and phases are only the real ones."""
    spans: list[tuple[float, float]] = []
    for index, count in cancelled.items():
        name = f"{STEP_PREFIX}{index}"
        ranges = sorted(
            (e for e in events if e.get("cat") == "user_annotation" and e.get("name") == name),
            key=lambda e: e.get("ts", 0.0),
        )
        for e in ranges[:count]:
            e["name"] = PHASE_PREFIX + "DataLoader end of data"
            spans.append((e["ts"], e["ts"] + e.get("dur", 0.0)))
    if not spans:
        return
    events[:] = [
        e
        for e in events
        if not (
            e.get("cat") == "user_annotation"
            and str(e.get("name", "")).startswith(PHASE_PREFIX)
            and not str(e.get("name", "")).endswith("DataLoader end of data")
            and any(_within(e, a, b) for a, b in spans)
        )
    ]


def rename_phases(events: list[dict[str, Any]], names: dict[int, list[str]]) -> int:
    """Give the top-level phase ranges of each recorded step the names the
    step tracker settled on (`names[step]`, in order), where the tracker
    renamed a phase after its range had begun. A step whose ranges do not
    match its list one for one is left as it is. Returns the ranges renamed."""
    if not names:
        return 0
    steps: dict[int, tuple[float, float]] = {}
    phases: list[dict[str, Any]] = []
    for e in events:
        if e.get("cat") != "user_annotation" or "dur" not in e:
            continue
        name = str(e.get("name", ""))
        if name.startswith(STEP_PREFIX):
            try:
                steps[int(name[len(STEP_PREFIX):])] = (e["ts"], e["ts"] + e["dur"])
            except ValueError:
                pass
        elif name.startswith(PHASE_PREFIX):
            phases.append(e)
    phases.sort(key=lambda e: (e["ts"], -e["dur"]))
    top: list[dict[str, Any]] = []
    end = float("-inf")
    for e in phases:
        if e["ts"] >= end - 1e-3:  # not inside the previous top-level range
            top.append(e)
            end = e["ts"] + e["dur"]
    renamed = 0
    for index, wanted in names.items():
        span = steps.get(index)
        if span is None:
            continue
        inside = [e for e in top if span[0] - 1e-3 <= e["ts"] and e["ts"] <= span[1] + 1e-3]
        if len(inside) != len(wanted):
            continue
        for e, name in zip(inside, wanted):
            if e["name"] != PHASE_PREFIX + name:
                e["name"] = PHASE_PREFIX + name
                renamed += 1
    return renamed


def _within(e: dict[str, Any], a: float, b: float) -> bool:
    # A nanosecond of slack: trace times are microsecond floats.
    ts = e.get("ts")
    return ts is not None and a - 1e-3 <= ts and ts + e.get("dur", 0.0) <= b + 1e-3


def _perfrun_track(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of perfrun's step and phase ranges on a track of their own, so
    the step structure is visible even where no torch event is."""
    out: list[dict[str, Any]] = []
    pid = None
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "user_annotation" and name.startswith(PHASE_PREFIX) and "dur" in e:
            pid = e.get("pid") if pid is None else pid
            out.append(
                {
                    "ph": "X",
                    "cat": "perfrun",
                    "name": name[len(PHASE_PREFIX) :],
                    "pid": e.get("pid"),
                    "tid": PERFRUN_TRACK_TID,
                    "ts": e["ts"],
                    "dur": e["dur"],
                }
            )
    if pid is not None:
        out.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": PERFRUN_TRACK_TID,
                "args": {"name": PERFRUN_TRACK_TID},
            }
        )
    return out
