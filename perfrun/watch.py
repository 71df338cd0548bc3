"""`perfrun watch`: a live view of a run in progress, from a second terminal
(or another node on a shared filesystem).

Why it reads files and nothing else: the ranks already flush their results
every 2 seconds (rank<R>.json and rank<R>.steps), atomically, so a reader
sees whole files and never slows or touches the training processes; the
same read path as `perfrun report` (results.read_run) gives the same
numbers. The view is rich's Live display, kept within 80 columns so it works
over ssh in a default terminal. When the run ends (its launcher records the
exit status in run.json, or every rank's process is gone) the live view is
replaced by the run's final tables, which stay on the screen.

What decides (`snapshot`) is a pure function of the read run, tested
without a terminal; `watch` only loops and draws.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .analysis import columns
from .analysis.build import build_report
from .analysis.pipeline import LoaderPipeline
from .exitcodes import ExitCode
from .launcher.hang import Position, position_of
from .prose import wrap
from .report.table import render_table
from .store.files import ResultsError
from .store.rankfile import RankResult, hostname
from .store.results import (
    RunResults,
    is_run_dir,
    live_ranks,
    not_a_run_folder,
    pid_alive,
    rank_alive,
    read_run,
    resolve_run_dir,
)
from .store.stepfile import COL, PHASES, read_table

#: Steps the rate, the last-step figures and the phase split are taken over:
#: recent enough to show a change, long enough not to jump at every step.
LAST_STEPS = 50
#: Seconds between reads; the ranks flush every 2 s, so faster shows nothing new.
INTERVAL = 1.0
#: Seconds between two computations of the advice: it summarises every step
#: recorded (about a second for 10^6 steps), and changes slowly.
ADVICE_EVERY = 10.0
SHORT = {"dataloader": "Data", "forward": "Fwd", "backward": "Bwd",
         "optimization": "Opt", "others": "Oth"}


@dataclass
class RankView:
    rank: int
    status: str
    steps: int
    rate: Optional[float]  # steps/s over the last steps
    last: Optional[float]  # seconds, the last step
    median: Optional[float]  # seconds, median of the last steps
    split: dict[str, float] = field(default_factory=dict)  # phase -> share of the last steps
    where: str = ""  # its live position (launcher/hang.py), while it runs
    moving: bool = False  # passing through its phases too fast to name one (Position.moving)
    rss: Optional[int] = None  # bytes: its resident memory at its last sample
    gpu: Optional[int] = None  # bytes: GPU memory allocated after its last sampled step


def last_memory(rank: RankResult) -> tuple[Optional[int], Optional[int]]:
    """The rank's resident memory at its last sample and the GPU memory
    allocated at the end of its last sampled step (runtime/memory.py,
    runtime/allocator.py), as its last save recorded them."""
    memory = rank.data.get("memory")
    if not isinstance(memory, dict):
        return None, None
    rss = gpu = None
    points = (memory.get("process") or {}).get("points") if isinstance(
        memory.get("process"), dict) else None
    if isinstance(points, list) and points and isinstance(points[-1], list) \
            and len(points[-1]) == 2:
        rss = int(points[-1][1])
    cuda = memory.get("cuda")
    rows = cuda.get("rows") if isinstance(cuda, dict) else None
    if isinstance(rows, list) and rows and isinstance(rows[-1], list) and len(rows[-1]) > 1:
        gpu = int(rows[-1][1])
    return rss, gpu


def short_bytes(value: Optional[int]) -> str:
    """At most 5 characters: `812M`, `1.2G`, `12G`."""
    if value is None:
        return "-"
    for unit, factor in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= factor:
            v = value / factor
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{value}B"


@dataclass
class Snapshot:
    run_dir: str
    command: Optional[str]
    ranks: list[RankView]
    missing: list[int]
    slowest: Optional[tuple[int, float, float]]  # rank, its median, its excess over the median
    advice: list[str]
    ended: bool
    returncode: Optional[int]
    last: int = LAST_STEPS
    #: The Data Pipeline in a line: the fetch of the loader the steps wait on.
    data: str = ""


def rank_view(rank: RankResult, alive: Optional[bool], last: int = LAST_STEPS) -> RankView:
    """One rank's recent figures from its flushed steps."""
    tail, n = _tail(rank, last)
    status = str(rank.status or "?")
    if status == "running" and alive is False:
        status = "died"
    rss, gpu = last_memory(rank)
    if not n:
        return RankView(rank.rank, status, 0, None, None, None, rss=rss, gpu=gpu)
    times = columns.step_times(tail)
    span = float(columns.num(tail[-1:, COL["end"]])[0] - columns.num(tail[:1, COL["start"]])[0])
    rate = len(tail) / span if span > 0 else None
    total = float(times.sum())
    split = {}
    if total > 0:
        for p in PHASES:
            split[p] = float(columns.phase_times(tail, p).sum()) / total
        split["others"] = float(columns.others_times(tail).sum()) / total
    return RankView(rank.rank, status, n, rate, float(times[-1]), float(np.median(times)), split,
                    rss=rss, gpu=gpu)


def _tail(rank: RankResult, last: int) -> tuple[Any, int]:
    """The rank's last `last` steps and its step count. From a step file
    only the tail is read (the file is mapped): following a run of 10^7
    steps costs what 50 steps cost, every refresh."""
    n = int(rank.n_steps)
    if rank.steps_file is not None:
        try:
            table = read_table(rank.steps_file, mapped=True)
            n = min(n, int(table.shape[0]))
            return np.array(table[max(0, n - last):n]), n
        except Exception:  # noqa: BLE001 - a file being replaced: read it whole
            pass
    table = rank.table
    n = int(table.shape[0])
    return table[max(0, n - last):], n


def run_ended(run: RunResults, live: set[int]) -> bool:
    """The launcher recorded the exit status, or its process is gone from
    this host (killed outright, it records nothing). Where the launcher
    cannot be asked (another host, no run.json), when every rank has
    written its file and each says it stopped."""
    if isinstance(run.meta.get("returncode"), int):
        return True
    launcher = _launcher_alive(run.meta)
    if launcher is not None:
        return not launcher
    return (bool(run.ranks) and not run.missing and not live
            and all(r.status != "running" for r in run.ranks))


def _launcher_alive(meta: dict[str, Any]) -> Optional[bool]:
    pid, host = meta.get("pid"), meta.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool) or host != hostname():
        return None
    return pid_alive(pid)


def snapshot(run: RunResults, last: int = LAST_STEPS, with_advice: bool = True) -> Snapshot:
    """What the live view shows of `run` now."""
    live = live_ranks(run)
    views = [rank_view(r, rank_alive(r), last) for r in run.ranks]
    now = time.time()
    for view, rank in zip(views, run.ranks):
        position = position_now(rank.data, view) if view.status == "running" else None
        if position is not None:
            view.where, view.moving = position.place(now), position.moving()
    slowest = None
    medians = [(v.median, v.rank) for v in views if v.median is not None]
    if len(medians) > 1:
        middle = float(np.median([m for m, _ in medians]))
        worst, who = max(medians)
        slowest = (who, worst, worst / middle - 1.0 if middle > 0 else 0.0)
    advice: list[str] = []
    data = ""
    if with_advice and any(r.n_steps for r in run.ranks):
        try:
            report = build_report(run, alive=live, series=False)
            # The finding, not the list of things to try: the final tables
            # have those, and the live view must fit a terminal.
            advice = [f"{a.title}: {a.message}" for a in report.advice if a.evidence]
            main = report.pipeline.main if report.pipeline is not None else None
            data = pipeline_line(main) if main is not None else ""
        except Exception as exc:  # noqa: BLE001 - a partial file must not end the view
            advice = [f"(advice not available yet: {type(exc).__name__})"]
    command = run.meta.get("command")
    return Snapshot(
        run_dir=run.run_dir,
        command=" ".join(command) if isinstance(command, list) else command,
        ranks=views,
        missing=list(run.missing),
        slowest=slowest,
        advice=advice,
        ended=run_ended(run, live),
        returncode=run.meta.get("returncode") if isinstance(run.meta.get("returncode"), int)
        else None,
        last=last,
        data=data,
    )


def pipeline_line(lp: LoaderPipeline) -> str:
    """`Data: fetch 0.39 ms: dataset 48%, collate 50%; 257 of 257 fetches
    held up`: the loader the steps wait on, stage by stage (its largest
    stages), as the Data Pipeline table has it."""
    if lp.fetch is None:
        return ""
    stages = sorted((s for s in lp.stages if s.share >= 0.05), key=lambda s: -s.share)[:3]
    parts = ", ".join(f"{s.name} {s.share * 100:.0f}%" for s in stages)
    return (f"Data: fetch {lp.fetch * 1e3:.2f} ms ({lp.num_workers} workers): {parts}; "
            f"{lp.held} of {lp.fetches} fetches held up")


def position_now(data: dict[str, Any], view: RankView) -> Optional[Position]:
    """The rank's saved position with its pace from `view`, as `perfrun
    status` reads it (Position.place: `Backward at step 3 for 2.1 s`, or,
    for a rank of thousands of steps a second, `at step 60953, 3,012
    steps/s`: its phase at the save is one instant of thousands, and the
    time since it the save's age); None before the rank has a position."""
    p = position_of(data)
    if p.phase is None:
        return None
    return replace(p, rate=view.rate, step_time=view.median)


#: The live view's width: an 80-column terminal over ssh.
WIDTH = 80


def _fmt(value: Optional[float], scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _prose(text: str, style: str = "", rest: str = "  ") -> Text:
    """A sentence of the view in its 80 columns, each line after the first
    indented under it (prose.py): a path, a number with its unit whole."""
    return Text("\n".join(wrap(text, WIDTH, "", rest)), style=style, overflow="fold")


def render_snapshot(snap: Snapshot, note: str = "") -> Group:
    """The live view: a rich renderable at most 80 columns wide."""

    head = Text(f"perfrun watch  {time.strftime('%H:%M:%S')}", style="bold")
    lines: list[Any] = [head, Text(f"Run: {snap.run_dir}", overflow="fold")]
    if snap.command:
        lines.append(Text(f"Command: {snap.command}", overflow="fold"))
    # One space between columns: 13 of them in 80 columns with 8-digit step
    # counts (tests/test_watch.py).
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))
    for name in ("Rank", "Status", "Steps", "St/s", "Last", "Med"):
        table.add_column(name, justify="left" if name == "Status" else "right", no_wrap=True)
    for q in (*PHASES, "others"):
        table.add_column(SHORT[q], justify="right", no_wrap=True)
    gpu = any(v.gpu is not None for v in snap.ranks)
    table.add_column("RSS", justify="right", no_wrap=True)
    if gpu:
        table.add_column("GPU", justify="right", no_wrap=True)
    for v in snap.ranks:
        table.add_row(
            str(v.rank), v.status, str(v.steps), _fmt(v.rate, 1, 1), _fmt(v.last, 1e3),
            _fmt(v.median, 1e3), *(_fmt(v.split.get(q), 100, 0) for q in (*PHASES, "others")),
            short_bytes(v.rss), *((short_bytes(v.gpu),) if gpu else ()),
        )
    lines.append(_prose(f"Each rank's last {snap.last} steps: St/s steps a second, Last and "
                        "Med (median) step in ms, phases in % of step time; RSS its resident "
                        "memory" + ("; GPU memory allocated after a step" if gpu else ""),
                        style="dim"))
    lines.append(table)
    # A rank of thousands of steps a second is where its Steps and St/s
    # say (Position.moving); the others, held in a phase, are named.
    now = [f"{v.rank}: {v.where}" for v in snap.ranks if v.where and not v.moving]
    if now:
        lines.append(_prose("Now: " + "; ".join(now)))
    if not snap.ranks:
        lines.append(Text("waiting for the ranks' first results...", style="yellow"))
    if snap.missing:
        lines.append(Text(f"no results yet from rank(s) {', '.join(map(str, snap.missing))}",
                          style="yellow"))
    if snap.data:
        lines.append(_prose(snap.data))
    if snap.slowest is not None:
        who, med, excess = snap.slowest
        lines.append(Text(f"Slowest rank: {who} (median {med * 1e3:.2f} ms a step, "
                          f"{excess * 100:+.1f}% vs the ranks' median)"))
    if snap.advice:
        lines.append(Text("Advice so far:", style="bold"))
        for a in snap.advice:  # each item's lines under its bullet (prose.py)
            lines.append(Text("\n".join(wrap(a, WIDTH, "  - ", "    ")), overflow="fold"))
    if note:
        lines.append(Text(note, style="dim"))
    return Group(*lines)


def _resolve(path: str) -> Optional[str]:
    """The run folder to watch: `path` itself, or a log folder's newest run
    (None while it has none)."""
    if is_run_dir(path):
        return path
    found = resolve_run_dir(path, note=None)
    return found if found != path and is_run_dir(found) else None


def watch(path: str, interval: float = INTERVAL, last: int = LAST_STEPS,
          console: Optional[Console] = None) -> int:
    """Follow the run in `path` (a run folder, or a log folder whose newest
    run is followed, waiting for one if it has none) until it ends, then
    print its final report. Exit 66 when `path` does not exist, 130 on
    Ctrl-C, else 0."""

    if not os.path.isdir(path):
        why = not_a_run_folder(path) if os.path.exists(path) else f"no such folder: {path}"
        sys.stderr.write(f"perfrun: error: {why}\n")
        return ExitCode.BAD_RESULTS
    console = console or Console()
    run: Optional[RunResults] = None
    run_dir: Optional[str] = None
    advice: list[str] = []
    advice_at = 0.0
    try:
        with Live(Text(f"waiting for a run in {path}..."), console=console,
                  refresh_per_second=4, transient=True) as live:
            while True:
                run_dir = run_dir or _resolve(path)
                if run_dir is None:
                    live.update(Text(f"waiting for a run in {path}..."))
                    time.sleep(interval)
                    continue
                try:
                    run = read_run(run_dir)
                    due = time.monotonic() >= advice_at
                    snap = snapshot(run, last, with_advice=due)
                    if due:
                        advice, advice_at = snap.advice, time.monotonic() + ADVICE_EVERY
                    snap.advice = advice
                    live.update(render_snapshot(snap))
                except ResultsError as exc:  # a file caught between writes
                    live.update(Text(f"reading {run_dir}: {exc}"))
                    snap = None
                if snap is not None and snap.ended:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        return 130
    assert run_dir is not None
    return _final(run_dir, console)


def _final(run_dir: str, console: Console) -> int:
    """The run's final tables, left on the screen."""
    try:
        run = read_run(run_dir)
    except ResultsError as exc:
        sys.stderr.write(f"perfrun: error: {exc}\n")
        return ExitCode.BAD_RESULTS
    returncode = run.meta.get("returncode")
    console.print("perfrun watch: the run ended"
                  + (f" (exit status {returncode})" if isinstance(returncode, int) else ""))
    render_table(build_report(run, series=False), console)
    return ExitCode.OK
