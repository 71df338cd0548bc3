"""Host memory over the run: the rank's resident set and each of its child
processes' (DataLoader workers, compile workers), sampled from the flush
thread, each reading with its time: milliseconds since the rank started,
on the clock of its step rows, so that the analysis places each reading in
the step that was running (the step machine's own count can lag the
script, and a reading after the last step is the script's epilogue, not a
step).

Why sampled and not per step: reading a resident set is a /proc read
(about 15 µs for the process; a child's private memory, a page-table walk
in the kernel, with the GIL released: about 2 ms for a 140 MB worker),
which the flush thread can afford every couple of seconds and the training
step cannot.
Memory creep is a slope over hundreds of steps, so a point every flush is
enough to measure it (analysis/memory.py), and the per-step cost stays
nothing.

A child's figure is its private memory (USS: the pages only it holds, from
/proc/PID/smaps_rollup), not its resident set: a forked DataLoader worker's
resident set is the parent's pages from its first moment, and stays flat as
it copies them one by one (copy-on-read of a Dataset's Python objects: each
access writes a reference count), while its private memory grows with each
copy. The kernel walks the page tables for that file in the read, with the
GIL released, so the training thread does not wait on it. Where the file
cannot be read (an older kernel) every child's resident set stands in
(`measure` says which).

A series keeps at most MAX_POINTS points whatever the run's length: when it
is full every other point is dropped and the stride between the samples it
keeps doubles, so a run of a million steps is still covered end to end, as
evenly as a short one, in a rank file of a few kilobytes.
"""

from __future__ import annotations

import os
from typing import Any, Optional

#: Points kept per process.
MAX_POINTS = 256
#: Children followed at most (a script that starts hundreds of processes
#: gets the first ones).
MAX_CHILDREN = 64


class Series:
    """(milliseconds, bytes) points of one process, thinned evenly when
    full."""

    __slots__ = ("points", "stride", "seen", "peak", "last", "name", "measure")

    def __init__(self, name: str, measure: str = "rss") -> None:
        self.name = name
        self.measure = measure
        self.points: list[list[int]] = []
        self.stride = 1
        self.seen = 0
        self.peak = 0
        #: The latest reading, whether or not thinning kept its point (the
        #: metrics endpoint's, runtime/metrics.py).
        self.last: Optional[int] = None

    def add(self, at_ms: int, value: int) -> None:
        self.last = value
        if value > self.peak:
            self.peak = value
        self.last = value
        self.seen += 1
        if (self.seen - 1) % self.stride:
            return
        self.points.append([at_ms, value])
        if len(self.points) >= MAX_POINTS:
            del self.points[1::2]
            self.stride *= 2

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "measure": self.measure, "peak": self.peak,
                "points": [list(p) for p in self.points]}


class HostMemory:
    """The rank's and its children's resident sets, one point per sample."""

    def __init__(self, psutil: Any = None) -> None:
        self.process: Optional[Series] = None
        self.children: dict[int, Series] = {}
        self.limit: Optional[int] = None
        self._proc: Any = None
        self._psutil: Any = None
        self._private = False
        self._known: dict[int, Any] = {}
        self._off: Optional[str] = None
        try:
            if psutil is None:
                import psutil
            self._psutil = psutil
            self._proc = psutil.Process()
            # Whether this kernel gives private memory at all: decided once,
            # so a child caught mid-fork is never measured another way.
            self._private = private_bytes(os.getpid()) is not None
            self.process = Series("main")
            self.limit = memory_limit(psutil)
        except Exception as exc:  # pragma: no cover - psutil is a dependency
            self._off = f"{type(exc).__name__}: {exc}"

    def sample(self, at: float) -> None:
        """One reading of every process, at `at` seconds since the rank
        started (the origin of its step rows)."""
        ms = int(round(at * 1000.0))
        proc = self._proc
        if proc is None or self.process is None:
            return
        try:
            self.process.add(ms, int(proc.memory_info().rss))
        except Exception as exc:
            self._off = f"{type(exc).__name__}: {exc}"
            self._proc = None
            return
        pids = child_pids(proc.pid)
        if pids is None:
            try:
                pids = [c.pid for c in proc.children(recursive=True)]
            except Exception:
                return
        for pid in pids:
            series = self.children.get(pid)
            if series is None:
                if len(self.children) >= MAX_CHILDREN:
                    continue
                try:
                    child = self._psutil.Process(pid)
                except Exception:
                    continue
                series = self.children[pid] = Series(_child_name(child, proc),
                                                     "uss" if self._private else "rss")
                self._known[pid] = child
            try:
                # The Process object first seen: psutil checks it is still
                # that process (a reused pid is another one).
                known = self._known[pid]
                if not known.is_running():
                    continue
                if series.measure == "uss":
                    value = private_bytes(pid)
                    if value is None:
                        continue  # gone, or not readable at this moment
                else:
                    value = int(known.memory_info().rss)
                series.add(ms, value)
            except Exception:
                continue

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "limit": self.limit,
            "process": self.process.to_dict() if self.process is not None else None,
            "children": {str(pid): s.to_dict() for pid, s in self.children.items()
                         if s.points},
        }
        if self._off:
            out["unavailable"] = self._off
        return out


def child_pids(pid: int, depth: int = 2) -> Optional[list[int]]:
    """The process's children, and theirs down to `depth`, from
    /proc/PID/task/*/children: a few small reads, where psutil's
    `children()` reads every process of the machine (milliseconds with the
    GIL held on a busy node). None where the kernel does not list them."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: list[int] = []
    found = False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                text = f.read()
        except OSError:
            continue
        found = True
        out.extend(int(x) for x in text.split())
    if not found:
        return None
    if depth > 1:
        for child in list(out):
            out.extend(child_pids(child, depth - 1) or ())
    return out


def private_bytes(pid: int) -> Optional[int]:
    """A process's private memory (Private_Clean + Private_Dirty of
    /proc/PID/smaps_rollup), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total = 0
    found = False
    for line in text.splitlines():
        if line.startswith(b"Private_"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                total += int(parts[1]) * 1024
                found = True
    return total if found else None


def _child_name(child: Any, parent: Any) -> str:
    """What the child is: a compile worker, a forked copy of the script (a
    DataLoader worker, a multiprocessing child), or its command line."""
    try:
        cmdline = child.cmdline()
    except Exception:
        cmdline = []
    text = " ".join(cmdline)
    if "torch._inductor" in text or "compile_worker" in text:
        return "compile worker"
    try:
        same = cmdline == parent.cmdline()
    except Exception:
        same = False
    if same or "multiprocessing" in text or not text:
        return "child process"
    from .children import process_title

    return process_title(cmdline)


CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_dirs(proc_cgroup: str, root: str = CGROUP_ROOT) -> list[str]:
    """The memory cgroup folders of a process, innermost first (its own,
    then each parent up to the root), from /proc/PID/cgroup's text: the
    v1 memory controller's where one is mounted, else the v2 hierarchy's."""
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1 = os.path.join(root, "memory") + parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = root + parts[2]
    own = v1 or v2
    if own is None:
        return []
    base = os.path.join(root, "memory") if v1 else root
    out = []
    path = os.path.normpath(own)
    while True:
        out.append(path)
        if path == os.path.normpath(base) or len(path) <= len(root):
            break
        path = os.path.dirname(path)
    return out


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def _own_cgroup_dirs() -> list[str]:
    text = _read("/proc/self/cgroup")
    return cgroup_dirs(text) if text else []


def memory_limit(psutil: Any) -> Optional[int]:
    """The memory this rank can use at most: the lowest limit of its memory
    cgroup and their parents (a container, a Slurm job) where that is below
    the machine's memory, else the machine's."""
    total: Optional[int]
    try:
        total = int(psutil.virtual_memory().total)
    except Exception:
        total = None
    limits = []
    for folder in _own_cgroup_dirs():
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = (_read(os.path.join(folder, name)) or "").strip()
            if text.isdigit():
                limits.append(int(text))
    limit = min(limits) if limits else None
    if limit is not None and (total is None or limit < total):
        return limit
    return total


def oom_kills() -> Optional[int]:
    """How many processes the out-of-memory killer has ended in this
    process's memory cgroup so far (v2 `memory.events`, v1
    `memory.oom_control`), or None where the kernel does not say."""
    for folder in _own_cgroup_dirs()[:1]:
        for name in ("memory.events", "memory.oom_control"):
            text = _read(os.path.join(folder, name))
            if not text:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return None
