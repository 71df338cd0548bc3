"""What else the host was doing while the job ran, sampled by the launcher.

A step time measured while another process took half the CPUs, while the
hypervisor stole cycles, or while every core ran at a fraction of its
clock, says more about the machine than about the script. The launcher is
the one process that lives as long as the job and knows the job's process
tree (every process it started: the script, torchrun, the ranks, their
DataLoader workers), so it samples, about once a second from a thread of
its own:

* the machine's busy CPU time (user + nice + system from /proc/stat, all
  CPUs) and its steal time;
* the CPU time of the job's process tree, and of the launcher itself;
* the current frequency of each core against its maximum.

"CPU taken by other processes" is then machine busy − job − launcher, as
cores on average over the run. Interrupt time is left out of "busy": a
job's own network or disk traffic lands there, and it belongs to nobody.

A job that srun or mpirun started, each task with its own perfrun
(external.py), has its other ranks on this host outside this launcher's
tree: they are the job, not load from outside. They are the tree of the
process that started the tasks here (slurmstepd, mpirun or orted, MPICH's
hydra proxy: `TASK_STARTERS`), found by walking up from the launcher, a
wrapper script on the way included; only the first task on a host samples
it, so the host has one record.

A dead process's CPU time is not lost: a process's own children, once
reaped, are in its cutime/cstime, which the job's figure includes; the
launcher's, likewise (the script, after the launcher waited for it).

On Linux one pass over /proc/<pid>/stat gives every process's parent and
CPU time at once, so the job's tree and the heaviest other processes (for
the report's evidence) come from the same read. Elsewhere psutil gives the
job's tree, and the other processes go unnamed. Any reading that cannot be
had is recorded as unavailable, never an error: the run must not suffer
from its observer.

Everything that decides (the tree, the averages, the frequency ratio) is a
pure function of readings; `HostLoadSampler` only reads and stores them.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

#: The evidence's own format version (it lives in run.json under
#: `host_load`, and in each node's record of a multi-node job).
VERSION = 1
#: Seconds between samples.
INTERVAL = 1.0
#: Other processes named in the evidence: the heaviest few.
TOP_OTHERS = 5
#: Per-process CPU totals kept between samples at most; beyond it the
#: lightest are dropped (a host that starts processes by the thousand).
MAX_TRACKED = 2000
#: Readings kept at most (a day at one a second is 86,400): beyond it every
#: other one is dropped, the first and the last kept, so the averages are
#: unchanged and only the peak is taken over longer intervals.
MAX_READINGS = 20000
#: Names (/proc's, at most 15 characters) of the processes that start a
#: job's tasks on a host: Slurm's step daemon, Open MPI's mpirun and its
#: daemons (4: orterun/orted, 5: prterun/prted), MPICH's and Intel MPI's
#: hydra.
TASK_STARTERS = frozenset({
    "slurmstepd", "mpirun", "mpiexec", "orterun", "orted", "prterun", "prted",
    "mpirun.openmpi", "mpiexec.openmpi", "mpiexec.hydra", "hydra_pmi_proxy", "pmi_proxy",
})
#: Ancestors looked at, at most, for the task starter.
MAX_DEPTH = 32


@dataclass
class Reading:
    """One sample. Times are CPU seconds since boot (or since the process
    started), `t` a monotonic clock; None where the reading failed."""

    t: float
    busy: Optional[float] = None
    total: Optional[float] = None
    steal: Optional[float] = None
    job: Optional[float] = None
    launcher: Optional[float] = None
    #: Other processes: pid -> (name, CPU seconds so far). Folded into
    #: the sampler's running totals (`accumulate_others`), then dropped.
    others: dict[int, tuple[str, float]] = field(default_factory=dict)
    #: The fastest core's current frequency and the highest maximum, MHz.
    freq_top: Optional[float] = None
    freq_max: Optional[float] = None


# -- pure ------------------------------------------------------------------------


def parse_proc_stat(text: str) -> Optional[tuple[str, int, int, int]]:
    """/proc/<pid>/stat as (name, ppid, own ticks, reaped children's ticks).
    The name is in parentheses and may itself hold spaces and parentheses:
    the fields start after the last `)`."""
    close = text.rfind(")")
    if close < 0:
        return None
    name = text[text.find("(") + 1 : close]
    rest = text[close + 2 :].split()
    try:
        ppid = int(rest[1])
        own = int(rest[11]) + int(rest[12])
        children = int(rest[13]) + int(rest[14])
    except (IndexError, ValueError):
        return None
    return name, ppid, own, children


def descendants(parents: Mapping[int, int], root: int) -> set[int]:
    """Every process below `root` in the tree that `parents` (pid -> ppid)
    describes: the job, when `root` is the launcher."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in out or pid == root:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def task_starter(parents: Mapping[int, int], names: Mapping[int, str], launcher: int,
                 starters: frozenset[str] = TASK_STARTERS) -> Optional[int]:
    """The nearest ancestor of `launcher` that started a job's tasks on this
    host (by its name), or None: the tree below it is every task of the job
    here. Nearest, so that mpirun's daemons started by srun under Slurm
    count their own ranks, not the step's other daemons."""
    pid = parents.get(launcher)
    for _ in range(MAX_DEPTH):
        if pid is None or pid <= 1:
            return None
        if names.get(pid) in starters:
            return pid
        pid = parents.get(pid)
    return None


def job_processes(parents: Mapping[int, int], launcher: int,
                  starter: Optional[int] = None) -> set[int]:
    """The job's processes on this host, the launcher itself left out (its
    own CPU time is counted apart): everything below the launcher, or, for
    a task of a job srun or mpirun started, everything below the process
    that started the tasks, that process included."""
    if starter is None:
        return descendants(parents, launcher)
    return (descendants(parents, starter) | {starter}) - {launcher}


def machine_times(fields: Mapping[str, float]) -> tuple[float, float, float]:
    """(busy, total, steal) CPU seconds from the aggregate /proc/stat line
    (psutil.cpu_times()'s fields). Guest time is already inside user time
    on Linux, so it is not added again."""
    busy = sum(float(fields.get(k) or 0.0) for k in ("user", "nice", "system"))
    total = sum(
        float(fields.get(k) or 0.0)
        for k in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    )
    return busy, total, float(fields.get("steal") or 0.0)


def fastest_core(freqs: Iterable[tuple[float, float]]) -> tuple[Optional[float], Optional[float]]:
    """(current MHz of the fastest core, highest maximum MHz) from per-core
    (current, max). Idle cores clock down, so only the fastest one says
    whether the machine could run at full speed. A maximum of 0 (a virtual
    machine's cpuinfo: no cpufreq driver) is unknown."""
    pairs = [(float(c), float(m)) for c, m in freqs if c is not None]
    if not pairs:
        return None, None
    top = max(c for c, _ in pairs)
    highest = max((m for _, m in pairs if m and m > 0), default=None)
    return top, highest


def summarise(
    readings: list[Reading],
    cpu_count: Optional[int],
    unavailable: Iterable[str] = (),
    cost: Optional[Mapping[str, float]] = None,
    host: Optional[str] = None,
    others_used: Optional[Mapping[int, tuple[str, float]]] = None,
    top: int = TOP_OTHERS,
) -> dict[str, Any]:
    """The evidence written to run.json: averages over the run (first to
    last sample), in cores (CPU seconds per second), and what could not be
    read. `others_used`: other processes' CPU seconds during the run
    (`accumulate_others`), of which the `top` busiest are listed."""
    missing = list(dict.fromkeys(unavailable))
    out: dict[str, Any] = {
        "version": VERSION,
        "host": host,
        "cpu_count": cpu_count,
        "samples": len(readings),
        "seconds": None,
        "machine_busy_cores": None,
        "job_cores": None,
        "launcher_cores": None,
        "other_cores": None,
        "other_cores_max": None,
        "steal_fraction": None,
        "cpu_freq": None,
        "top_others": [],
        "unavailable": missing,
        "sample_cost": dict(cost or {}),
    }
    if len(readings) < 2:
        missing.append("too few samples: the run was shorter than the sampling interval")
        return out
    first, last = readings[0], readings[-1]
    wall = last.t - first.t
    if wall <= 0:
        return out
    out["seconds"] = wall

    def rate(attr: str) -> Optional[float]:
        a, b = getattr(first, attr), getattr(last, attr)
        return None if a is None or b is None else max(0.0, (b - a) / wall)

    busy, job, launcher = rate("busy"), rate("job"), rate("launcher")
    out["machine_busy_cores"], out["job_cores"], out["launcher_cores"] = busy, job, launcher
    if busy is not None and job is not None:
        out["other_cores"] = max(0.0, busy - job - (launcher or 0.0))
        peaks = []
        for a, b in zip(readings, readings[1:]):
            dt = b.t - a.t
            if dt <= 0 or None in (a.busy, b.busy, a.job, b.job):
                continue
            used = (b.busy - a.busy) - (b.job - a.job)  # type: ignore[operator]
            if a.launcher is not None and b.launcher is not None:
                used -= b.launcher - a.launcher
            peaks.append(used / dt)
        out["other_cores_max"] = max(0.0, max(peaks)) if peaks else None
    if None not in (first.total, last.total, first.steal, last.steal):
        spent = last.total - first.total  # type: ignore[operator]
        if spent > 0:
            out["steal_fraction"] = max(0.0, (last.steal - first.steal) / spent)  # type: ignore[operator]
    ratios = [r.freq_top / r.freq_max for r in readings if r.freq_top and r.freq_max]
    if ratios:
        tops = [r.freq_top for r in readings if r.freq_top and r.freq_max]
        out["cpu_freq"] = {
            "fastest_mhz_median": statistics.median(tops),
            "max_mhz": max(r.freq_max for r in readings if r.freq_max),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
        }
    out["top_others"] = top_others(others_used or {}, wall, top)
    return out


def accumulate_others(
    used: dict[int, tuple[str, float]],
    start: Mapping[int, tuple[str, float]],
    others: Mapping[int, tuple[str, float]],
) -> None:
    """Fold one reading's other processes into `used` (pid -> name, CPU
    seconds since the first reading). A process missing from `start`
    began during the run: all its CPU time counts. A process that ends
    keeps what it had at its last sighting."""
    for pid, (name, seconds) in others.items():
        base = start[pid][1] if pid in start else 0.0
        used[pid] = (name, max(0.0, seconds - base))
    if len(used) > MAX_TRACKED:
        keep = sorted(used.items(), key=lambda kv: -kv[1][1])[: MAX_TRACKED // 2]
        used.clear()
        used.update(keep)


def top_others(
    used: Mapping[int, tuple[str, float]], wall: float, count: int = TOP_OTHERS
) -> list[dict[str, Any]]:
    """The other processes that took the most CPU during the run, in cores."""
    if wall <= 0:
        return []
    ranked = sorted(used.items(), key=lambda kv: -kv[1][1])[:count]
    return [
        {"pid": pid, "name": name, "cores": seconds / wall}
        for pid, (name, seconds) in ranked
        if seconds > 0
    ]


# -- reads -----------------------------------------------------------------------


class HostLoadSampler:
    """Samples the host from a daemon thread of the launcher, `root` being
    the launcher's own pid (its descendants are the job). `task_of_job`:
    the launcher is one task of a job srun or mpirun started, and the
    tree of the process that started the tasks is the job
    (`task_starter`)."""

    def __init__(self, root: Optional[int] = None, interval: float = INTERVAL,
                 top: int = TOP_OTHERS, task_of_job: bool = False) -> None:
        self.root = os.getpid() if root is None else root
        self.task_of_job = task_of_job
        self.interval = interval
        self.top = top  # other processes the evidence lists, busiest first
        self.readings: list[Reading] = []
        self.unavailable: list[str] = []
        self._stop = threading.Event()
        # Set once the thread's first reading is in (stop()).
        self._first = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._cost = [0, 0.0, 0.0, 0.0]  # samples, wall, CPU, max wall
        self._tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self._proc_fs = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
        self._start_others: Optional[dict[int, tuple[str, float]]] = None
        self._used: dict[int, tuple[str, float]] = {}
        self._psutil: Any = None

    def _import(self) -> None:
        try:
            import psutil

            self._psutil = psutil
        except Exception:  # pragma: no cover - psutil is a dependency
            self._psutil = None
            self.unavailable.append("psutil unavailable: no host load")

    def start(self) -> None:
        """The first sample, and psutil's import, in the thread: they cost
        the launcher about 40 ms, which the script's start need not wait for
        (other processes' CPU time is counted from that first sample, a few
        milliseconds into the job)."""
        self._thread = threading.Thread(target=self._loop, name="perfrun-hostload", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            self._import()
            self.sample()
        finally:
            self._first.set()
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> dict[str, Any]:
        """End the thread, take a last sample, and return the evidence. A
        run that ended before the thread's first reading (a script of a few
        tens of milliseconds) has nothing a last reading could be compared
        with: the evidence says too few samples at once, rather than after
        waiting for psutil's import and a reading (20-50 ms of such a run's
        wall time)."""
        self._stop.set()
        if self._thread is not None:
            if not self._first.is_set():
                return self.evidence()
            self._thread.join(timeout=5)
        elif self._psutil is None:
            self._import()
        self.sample()
        return self.evidence()

    def evidence(self) -> dict[str, Any]:
        n, wall, cpu, worst = self._cost
        cost = {"samples": n, "wall_seconds_avg": wall / n if n else None,
                "cpu_seconds_avg": cpu / n if n else None, "wall_seconds_max": worst}
        with self._lock:
            readings = list(self.readings)
            used = dict(self._used)
        return summarise(readings, os.cpu_count(), self.unavailable, cost,
                         socket.gethostname(), used, self.top)

    def _note(self, what: str) -> None:
        if what not in self.unavailable:
            self.unavailable.append(what)

    def sample(self) -> None:
        """One reading; never raises."""
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            reading = self._read()
        except Exception as exc:  # noqa: BLE001 - the observer never ends the run
            self._note(f"sampling failed: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if self._start_others is None:
                self._start_others = reading.others
            else:
                accumulate_others(self._used, self._start_others, reading.others)
            reading.others = {}
            readings = self.readings
            readings.append(reading)
            if len(readings) > MAX_READINGS:
                self.readings = [readings[0], *readings[1:-1][1::2], readings[-1]]
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
        cost = self._cost
        cost[0] += 1
        cost[1] += wall
        cost[2] += cpu
        cost[3] = max(cost[3], wall)

    def _read(self) -> Reading:
        reading = Reading(t=time.monotonic())
        ps = self._psutil
        if ps is None:
            return reading
        try:
            times = ps.cpu_times()._asdict()
            reading.busy, reading.total, reading.steal = machine_times(times)
            if "steal" not in times:
                reading.steal = None
                self._note("steal time: not reported on this system")
        except Exception as exc:  # noqa: BLE001
            self._note(f"machine CPU time: {exc}")
        if self._proc_fs:
            self._read_proc(reading)
        else:
            self._read_psutil(reading)
        try:
            freqs = ps.cpu_freq(percpu=True) or []
            top, highest = fastest_core((f.current, f.max) for f in freqs)
            reading.freq_top, reading.freq_max = top, highest
            if top is None:
                self._note("CPU frequency: not reported")
            elif highest is None:
                self._note("CPU frequency: no maximum reported (no cpufreq driver, e.g. a VM)")
        except Exception as exc:  # noqa: BLE001
            self._note(f"CPU frequency: {exc}")
        return reading

    def _read_proc(self, reading: Reading) -> None:
        """One pass over /proc: parents and CPU times of every process."""
        stats: dict[int, tuple[str, int, int, int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parsed = parse_proc_stat(f.read().decode("utf-8", "replace"))
            except OSError:
                continue  # ended between the listing and the read
            if parsed is not None:
                stats[int(entry)] = parsed
        tick = self._tick
        root = stats.get(self.root)
        if root is None:
            self._note("the launcher's own CPU time could not be read")
            return
        parents = {pid: s[1] for pid, s in stats.items()}
        starter = None
        if self.task_of_job:
            starter = task_starter(parents, {pid: s[0] for pid, s in stats.items()}, self.root)
        job = job_processes(parents, self.root, starter)
        # The launcher's reaped children (the script, after the end) are job.
        reading.launcher = root[2] / tick
        reading.job = (root[3] + sum(stats[p][2] + stats[p][3] for p in job)) / tick
        others = {pid: (s[0], s[2] / tick) for pid, s in stats.items()
                  if pid not in job and pid != self.root}
        if len(others) > MAX_TRACKED:
            others = dict(sorted(others.items(), key=lambda kv: -kv[1][1])[:MAX_TRACKED])
        reading.others = others

    def _read_psutil(self, reading: Reading) -> None:
        ps = self._psutil
        try:
            me = ps.Process(self.root)
            mine = me.cpu_times()
            reading.launcher = mine.user + mine.system
            total = getattr(mine, "children_user", 0.0) + getattr(mine, "children_system", 0.0)
            for child in me.children(recursive=True):
                try:
                    t = child.cpu_times()
                    total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(
                        t, "children_system", 0.0)
                except Exception:  # noqa: BLE001 - ended meanwhile
                    continue
            reading.job = total
        except Exception as exc:  # noqa: BLE001
            self._note(f"the job's CPU time: {exc}")
