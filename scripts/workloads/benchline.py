"""What the benchmark workloads share: their argument line and the one
line of JSON each ends with. Imported by the workloads (run as scripts, so
this folder is first on sys.path)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Optional

#: The process's CPU time (all its threads: a profiler's own threads too) at
#: each mark(), beside the wall-clock marks the workload keeps.
CPU: list[float] = []


def mark() -> float:
    """A step's end: the wall clock (returned, for the workload's marks) and
    the process's CPU time (kept here). CPU time per step is what the
    process itself spent, whoever else runs on the machine: steadier than
    wall time on a shared machine, and it counts a profiler's background
    threads, which wall time in the script's own thread may not."""
    CPU.append(time.process_time())
    return time.perf_counter()


def parse(argv: list[str], doc: str, steps: int, warmup: int) -> tuple[int, int]:
    """`STEPS WARMUP` (positional, optional): the timed steps and those before."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("steps", type=int, nargs="?", default=steps)
    parser.add_argument("warmup", type=int, nargs="?", default=warmup)
    args = parser.parse_args(argv)
    return args.steps, max(1, args.warmup)


def report(name: str, marks: list[float], warmup: int, torch_version: str,
           extra: Optional[dict[str, Any]] = None) -> None:
    """A step lasts from the end of the previous step to the end of its own,
    so anything between steps (the loop itself, a fetch) is counted.
    `extra`: a workload's own figures, added to the line."""
    durations = [b - a for a, b in zip(marks[warmup - 1 : -1], marks[warmup:])]
    cpu = {}
    if len(CPU) == len(marks) and durations:
        cpu = {"cpu_per_step_s": (CPU[-1] - CPU[warmup - 1]) / len(durations)}
    result = {
        "workload": name,
        "median_step_s": statistics.median(durations),
        "mean_step_s": statistics.fmean(durations),
        "steps": len(durations),
        "warmup": warmup,
        "torch": torch_version,
        # Every timed step, so a reader can leave some out (a profiler window).
        "step_s": [round(d, 9) for d in durations],
        **cpu,
        **(extra or {}),
    }
    print("BENCH " + json.dumps(result), flush=True)
