"""Where every rank is: for `perfrun status`, and the launcher's hang detector.

A multi-rank job that hangs is nearly always every rank waiting in a
collective for one rank that is somewhere else. Each rank already writes its
live position (step, phase, since when: runtime/position.py) with every
flush, so the launcher can tell, from the files alone and without touching
the training processes, when no rank has finished a step for
`--hang-timeout` seconds, and then say where each rank is and which one is
the odd one out. For the Python stacks it sends each rank on this host
`STACK_SIGNAL`, on which the agent registered `faulthandler` (all threads,
chaining a handler the script had set) to write `stack.rank<R>.txt` in the
run folder.

What decides (positions, the odd one out, the report's text) is pure and
tested on hand-built rank data; `HangWatch` only polls and signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Optional

from ..prose import wrap
from ..runtime.lifeline import STACK_SIGNAL
from ..store.layout import HANG_FILE, stack_path
from ..store.rankfile import hostname, peek_rank_file
from ..store.results import find_rank_files

#: Seconds the launcher waits for the ranks' stack dumps.
STACK_WAIT = 1.5
#: Seconds between two looks at the rank files (they are flushed every 2 s).
POLL = 1.0
#: After a hang with --hang-action terminate: seconds given to the Ctrl-C
#: shutdown, then to SIGTERM, before SIGKILL.
SHUTDOWN_GRACE = (20.0, 10.0)
#: A collective's phase in the report's words.
WAITING = {"backward": "waiting in the gradient all_reduce, if DDP",
           "optimization": "waiting in the optimizer's collective, if sharded",
           "forward": "waiting in a collective, if FSDP"}
_ORDER = {"dataloader": 0, "forward": 1, "backward": 2, "optimization": 3, "others": 4}


@dataclass(frozen=True)
class Position:
    """One rank's position as its last flush saw it."""

    rank: int
    status: str
    step: Optional[int]
    phase: Optional[str]
    since_unix: Optional[float]
    written_unix: Optional[float]
    steps_done: int
    buffered: bool
    pid: Optional[int]
    host: Optional[str]
    #: The run was started with --timer-only (else the default mode, which
    #: buffers edges the same way on a CPU run).
    timer_only: bool = False
    #: Steps a second and the median step (seconds) over the rank's last
    #: saved steps (`pace_of`), where they were read.
    rate: Optional[float] = None
    step_time: Optional[float] = None

    def for_seconds(self, now: float) -> Optional[float]:
        return None if self.since_unix is None else max(0.0, now - self.since_unix)

    def moving(self) -> bool:
        """Whether the rank was passing through its phase when it saved,
        steps of under MOVING each and its phase entered under MOVING
        before: its phase then is one instant among thousands, and the time
        since it says how old the save is, not that the rank is held there.
        A rank whose pace is unknown, or held in a phase, is never moving."""
        return (self.status == "running" and self.step_time is not None
                and self.step_time < MOVING and self.since_unix is not None
                and self.written_unix is not None
                and self.written_unix - self.since_unix < MOVING)

    def place(self, now: float) -> str:
        """Where the rank is, in words: a moving rank's step and pace
        (`at step 60953, 3,012 steps/s`), else its phase and how long it
        has been in it (`Backward at step 3 for 2.1 s`)."""
        if self.moving() and self.step is not None and self.rate is not None:
            return f"at step {self.step}, {_pace(self.rate)} steps/s"
        where = _where(self.phase, self.step) if self.phase is not None else "position unknown"
        took = self.for_seconds(now)
        if took is not None and self.status == "running":
            where += f" for {took:.1f} s"
        return where


#: Seconds: a rank with steps shorter than this, in its phase for less than
#: this when it saved, is moving (Position.moving); the ranks save every 2 s.
MOVING = 1.0
#: Steps the pace of a rank is taken over, as `perfrun watch` takes it.
PACE_STEPS = 50


def _pace(rate: float) -> str:
    """Steps a second: `3,012`, `41.7`, `0.82`."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 1 else f"{rate:.2f}"


def position_of(data: dict[str, Any]) -> Position:
    """A rank file's position (older files, or a rank before torch was
    imported, have none: step and phase unknown)."""
    pos = data.get("position") if isinstance(data.get("position"), dict) else {}
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    steps = data.get("steps") if isinstance(data.get("steps"), dict) else {}
    pid = env.get("pid")
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    return Position(
        rank=int(data.get("rank", -1)),
        status=str(data.get("status", "?")),
        step=pos.get("step") if isinstance(pos.get("step"), int) else None,
        phase=pos.get("phase") if isinstance(pos.get("phase"), str) else None,
        since_unix=_num(pos.get("since_unix")),
        written_unix=_num(pos.get("written_unix")),
        steps_done=int(steps.get("count") or 0) if isinstance(steps.get("count"), int) else 0,
        buffered=bool(pos.get("buffered")),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        host=env.get("hostname") if isinstance(env.get("hostname"), str) else None,
        timer_only=settings.get("timer_only") is True,
    )


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_positions(run_dir: str, pace: bool = False) -> list[Position]:
    """The positions of a run folder's ranks, each rank's latest restart;
    a file caught between writes or unreadable is skipped (the next look
    sees it). `pace`: with each rank's pace from its step file (`pace_of`),
    for `perfrun status`; the hang watch needs none."""
    latest: dict[int, Position] = {}
    for path in find_rank_files(run_dir):
        data = peek_rank_file(path)
        if data is not None:
            p = position_of(data)
            if pace:
                rate, step_time = pace_of(os.path.dirname(path), data)
                p = replace(p, rate=rate, step_time=step_time)
            latest[p.rank] = p
    return [latest[r] for r in sorted(latest)]


def pace_of(folder: str, data: dict[str, Any]) -> tuple[Optional[float], Optional[float]]:
    """(steps a second, median step in seconds) over a rank's last
    PACE_STEPS saved steps: the tail of its step file, mapped, so a rank of
    10^7 steps costs what 50 steps cost. (None, None) where it has fewer
    than two steps or its file cannot be read."""
    import numpy as np

    from ..store.stepfile import COL, read_table

    steps = data.get("steps") if isinstance(data.get("steps"), dict) else {}
    name = steps.get("file")
    if not isinstance(name, str) or not name:
        return None, None
    try:
        table = read_table(os.path.join(folder, os.path.basename(name)), mapped=True)
        tail = np.array(table[max(0, int(table.shape[0]) - PACE_STEPS):], dtype=float)
    except Exception:  # noqa: BLE001 - a file being replaced: no pace this look
        return None, None
    if tail.shape[0] < 2:
        return None, None
    start, end = tail[:, COL["start"]], tail[:, COL["end"]]
    span = float(end[-1] - start[0])
    times = (end - start)[np.isfinite(end - start)]
    if not span > 0 or not times.size:
        return None, None
    return tail.shape[0] / span, float(np.median(times))


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _where(phase: Optional[str], step: Optional[int]) -> str:
    name = (phase or "an unknown phase").capitalize() if phase else "an unknown phase"
    return f"{name} at step {step}" if step is not None else name


def odd_one_out(positions: list[Position], now: float) -> Optional[str]:
    """The line that names the rank(s) elsewhere: the largest group of ranks
    in the same phase of the same step is taken to be waiting, the others
    are named with how long they have been where they are. None when all
    ranks are in one place (or fewer than two are known)."""
    known = [p for p in positions if p.phase is not None]
    if len(known) < 2:
        return None
    groups = Counter((p.phase, p.step) for p in known)
    if len(groups) < 2:
        return None
    # Ties (two ranks, one in each place) go to the place further on in
    # the step: the ranks that wait have got further than the one they
    # wait for.
    (phase, step), _ = max(
        groups.items(), key=lambda kv: (kv[1], kv[0][1] or 0, _ORDER.get(kv[0][0] or "", -1))
    )
    crowd = [p.rank for p in known if (p.phase, p.step) == (phase, step)]
    line = f"{_ranks(crowd)} {'is' if len(crowd) == 1 else 'are'} in {_where(phase, step)}"
    if phase in WAITING:
        line += f" ({WAITING[phase]})"
    odd = []
    for p in known:
        if (p.phase, p.step) == (phase, step):
            continue
        took = p.for_seconds(now)
        odd.append(f"rank {p.rank} is in {_where(p.phase, p.step)}"
                   + (f" for {took:.0f} s" if took is not None else ""))
    return line + "; " + "; ".join(odd)


def lag_note(positions: list[Position], status: bool = False) -> Optional[str]:
    """Why a rank's position may lag it, in the mode the run used, or None
    when every rank's edges reach its position as they happen. Both
    --timer-only and the default mode on a CPU run hand phase edges over
    in batches (runtime/clock.py); `status` adds the time between saves,
    which `perfrun status` sees and the hang watch does not care about."""
    buffered = [p for p in positions if p.buffered]
    if not buffered:
        return None
    if all(p.timer_only for p in buffered):
        mode = "timer-only mode"
    elif not any(p.timer_only for p in buffered):
        mode = "default mode on CPU"
    else:
        mode = "timer-only and default modes"
    lag = ("positions may lag the ranks by up to 0.5 s, plus the 2 s between saves" if status
           else "a rank's phase may lag it by up to 0.5 s")
    return f"({mode}: phase edges are handed over in batches, so {lag})"


def status_lines(positions: list[Position], now: float) -> list[str]:
    """One line per rank: where it is and for how long (or, moving, its
    step and pace: Position.place), for `perfrun status` and the hang
    report."""
    out = []
    for p in positions:
        line = f"rank {p.rank:<3} {p.status:<9} {p.place(now)}"
        if p.written_unix is not None:
            line += f"  (saved {max(0.0, now - p.written_unix):.0f} s ago)"
        out.append(line)
    return out


#: The hang report's width (on stderr and in hang.txt): its sentences wrap
#: there; the Python stacks keep their own lines.
REPORT_WIDTH = 80


def hang_report(positions: list[Position], stacks: dict[int, str], now: float,
                quiet_for: float, width: Optional[int] = None) -> str:
    """The hang report: every rank's position and stack, then the odd one
    out. `width`: where its sentences wrap (None: one line each)."""
    lines = wrap(f"perfrun: hang: no rank has finished a step for {quiet_for:.0f} s", width,
                 rest="  ")
    for s in status_lines(positions, now):
        lines += wrap(s, width, "  ", "      ")
    lag = lag_note(positions)
    if lag is not None:
        lines += wrap(lag, width, "  ", "   ")
    for p in positions:
        text = stacks.get(p.rank)
        lines.append(f"--- rank {p.rank} Python stack"
                     + (":" if text else ": not available (not on this host, or no dump)"))
        if text:
            lines += ["  " + s for s in text.rstrip().splitlines()]
    odd = odd_one_out(positions, now)
    lines += wrap("perfrun: hang: " + (odd or "every rank is in the same place"), width,
                  rest="  ")
    return "\n".join(lines) + "\n"


class HangWatch:
    """Polled by the launcher while the child runs: watches the rank files
    for progress and, past the timeout, reports once (and, with
    `terminate`, ends the run)."""

    def __init__(self, run_dir: str, timeout: float, action: str,
                 clock: Any = time.monotonic) -> None:
        self.run_dir = run_dir
        self.timeout = timeout
        self.action = action
        self.clock = clock
        self.last_progress = clock()
        self.key: Any = None
        self.hung = False

    def progress_key(self, positions: list[Position]) -> Any:
        return tuple((p.rank, p.steps_done, p.step, p.status) for p in positions)

    def poll(self, proc: Optional[subprocess.Popen[bytes]] = None) -> bool:
        """One look; True once the hang was reported."""
        if self.hung:
            return True
        positions = read_positions(self.run_dir)
        key = self.progress_key(positions)
        now = self.clock()
        if key != self.key:
            self.key, self.last_progress = key, now
            return False
        if now - self.last_progress < self.timeout:
            return False
        if positions and all(p.status != "running" for p in positions):
            return False  # the ranks are done: the child is ending
        self.hung = True
        self.report(now - self.last_progress)
        if self.action == "terminate" and proc is not None:
            shutdown(proc)
        return True

    def report(self, quiet_for: float) -> None:
        host = hostname()
        positions = read_positions(self.run_dir)
        for p in positions:
            if p.pid and p.host == host and p.status == "running":
                path = stack_path(self.run_dir, p.rank)
                try:
                    if os.path.exists(path):
                        os.truncate(path, 0)
                    os.kill(p.pid, STACK_SIGNAL)
                except OSError:
                    pass
        time.sleep(STACK_WAIT)
        stacks = {}
        for p in positions:
            try:
                with open(stack_path(self.run_dir, p.rank), encoding="utf-8",
                          errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            if text.strip():
                stacks[p.rank] = text
        text = hang_report(read_positions(self.run_dir) or positions, stacks, time.time(),
                           quiet_for, REPORT_WIDTH)
        sys.stderr.write(text)
        sys.stderr.flush()
        try:
            with open(os.path.join(self.run_dir, HANG_FILE), "w", encoding="utf-8") as f:
                f.write(text)
        except OSError:
            pass


def shutdown(proc: subprocess.Popen[bytes]) -> None:
    """End the run as Ctrl-C would (SIGINT to the child: python or
    torchrun, which passes it on), then SIGTERM, then SIGKILL: a rank
    blocked in a collective may not see the first."""
    for sig, grace in ((signal.SIGINT, SHUTDOWN_GRACE[0]), (signal.SIGTERM, SHUTDOWN_GRACE[1])):
        try:
            proc.send_signal(sig)
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
        except OSError:
            return
    try:
        proc.kill()
    except OSError:
        pass
