"""Does perfrun stay flat over a long run, and report it fast?

    python scripts/bench_scale.py [--steps N] [--ranks R] [--json OUT]

Runs scripts/workloads/long_run.py (a tiny model, a step well under a
millisecond, timed by its own stopwatch) for N steps (default 1,000,000) as
`python`, under `perfrun --timer-only` and under perfrun's default mode, one
after the other, and reports for each:

* the script's memory (RSS) over the run, sampled every second, and its peak
  (VmHWM), against plain python's;
* the size of the rank's files at the end (rank0.json, rank0.steps);
* perfrun's saves over time, from the rank file's own counters (extra.flush)
  read every second: their number, mean and longest cost in each tenth of
  the run;
* the script's own step times per tenth of the run (mean) and its slowest
  step in each tenth, against plain python's (a save that stalled the
  script shows here, in the script's stopwatch, not in perfrun's figures);
* the time from the script's last step to perfrun's exit (the report), and
  `perfrun report` of the run folder on its own.

Then, with --ranks R (default 64; 0 skips it), it copies the default mode's
rank into a folder of R ranks (R x N steps) and times `perfrun report` over
it, with its peak memory.

Needs perfrun installed in this interpreter, torch and psutil. One run per
mode, in sequence: these are figures of growth over a run (memory, file
size, cost early against late), each read within one run, so a machine that
is busy now and then blurs them less than it would a comparison of runs;
still, run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "long_run.py")
MIB = 1024 * 1024
MODES = {
    "python": [],
    "timer-only": ["--timer-only"],
    "default": [],
}


def perfrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "perfrun", *args]


def workload_process(root: psutil.Process) -> Optional[psutil.Process]:
    """The process running the workload: the root itself (python) or the
    python below perfrun's launcher."""
    for proc in [root, *root.children(recursive=True)]:
        try:
            if any(a.endswith("long_run.py") for a in proc.cmdline()) and proc.pid != root.pid:
                return proc
        except psutil.Error:
            continue
    return None


def vm_hwm(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def read_flush(run_dir: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(run_dir, "rank0.json"), encoding="utf-8") as f:
            return json.load(f).get("extra", {}).get("flush")
    except (OSError, ValueError):
        return None


def run_mode(mode: str, steps: int, work: str) -> dict[str, Any]:
    stats = os.path.join(work, f"{mode}.stats.json")
    log = os.path.join(work, f"log-{mode}")
    if mode == "python":
        cmd = [sys.executable, WORKLOAD, str(steps), stats]
    else:
        cmd = perfrun_cmd("--log-dir", log, "-q", *MODES[mode], WORKLOAD, str(steps), stats)
    began = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(proc.pid)
    samples: list[tuple[float, int]] = []  # (seconds, rss)
    flushes: list[tuple[float, dict[str, Any]]] = []
    peak = 0
    target: Optional[psutil.Process] = root if mode == "python" else None
    run_dir: Optional[str] = None
    while proc.poll() is None:
        time.sleep(1.0)
        now = time.time() - began
        if target is None:
            target = workload_process(root)
        if target is not None:
            try:
                samples.append((now, target.memory_info().rss))
                peak = max(peak, vm_hwm(target.pid) or 0)
            except psutil.Error:
                pass
        if mode != "python":
            if run_dir is None and os.path.isdir(log):
                runs = [d for d in os.listdir(log) if d != "latest"]
                run_dir = os.path.join(log, runs[0]) if runs else None
            flush = read_flush(run_dir) if run_dir else None
            if flush:
                flushes.append((now, flush))
    ended = time.time()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: exit {proc.returncode}\n{err[-2000:]}")
    with open(stats, encoding="utf-8") as f:
        own = json.load(f)
    result: dict[str, Any] = {
        "mode": mode,
        "wall_s": round(ended - began, 1),
        "script_s": round(own["seconds"], 1),
        "rss_mib": [(round(t), round(r / MIB, 1)) for t, r in samples],
        "rss_peak_mib": round(peak / MIB, 1),
        "tenths": tenths(own["buckets"]),
    }
    if mode != "python":
        assert run_dir is not None
        result["after_script_s"] = round(ended - own["end_unix"], 2)
        result["files"] = {
            name: os.path.getsize(os.path.join(run_dir, name))
            for name in sorted(os.listdir(run_dir)) if name.startswith("rank0")
        }
        result["flush"] = flush_tenths(flushes)
        t = time.perf_counter()
        subprocess.run(perfrun_cmd("report", run_dir), stdout=subprocess.DEVNULL, check=True)
        result["report_s"] = round(time.perf_counter() - t, 2)
        result["run_dir"] = run_dir
    return result


def tenths(buckets: list[list[float]]) -> list[dict[str, float]]:
    """The script's own step times in each tenth of its seconds."""
    buckets = [b for b in buckets if b[1]]
    out = []
    n = len(buckets)
    for k in range(10):
        part = buckets[k * n // 10:(k + 1) * n // 10]
        if not part:
            continue
        count = sum(b[1] for b in part)
        out.append({
            "mean_us": round(sum(b[2] for b in part) / count * 1e6, 1),
            "slowest_ms": round(max(b[3] for b in part) * 1e3, 2),
        })
    return out


def flush_tenths(flushes: list[tuple[float, dict[str, Any]]]) -> list[dict[str, float]]:
    """perfrun's saves in each tenth of the run, from the counters it
    writes: how many, their mean cost, and the longest save so far."""
    if len(flushes) < 2:
        return []
    out = []
    n = len(flushes)
    for k in range(10):
        lo, hi = flushes[k * (n - 1) // 10][1], flushes[(k + 1) * (n - 1) // 10][1]
        calls = hi["calls"] - lo["calls"]
        out.append({
            "saves": calls,
            "mean_ms": round((hi["time"] - lo["time"]) / calls * 1e3, 2) if calls else None,
            "longest_so_far_ms": round(hi["max"] * 1e3, 2),
            "step_file_mb": round(hi["bytes"] / 1e6, 1),
        })
    return out


def many_ranks(run_dir: str, ranks: int, work: str) -> dict[str, Any]:
    """A run folder of `ranks` copies of one rank; `perfrun report` over it."""
    folder = os.path.join(work, f"ranks{ranks}")
    os.makedirs(folder)
    with open(os.path.join(run_dir, "rank0.json"), encoding="utf-8") as f:
        doc = json.load(f)
    for r in range(ranks):
        one = dict(doc, rank=r, local_rank=r % 8, world_size=ranks)
        one["steps"] = dict(doc["steps"], file=f"rank{r}.steps")
        with open(os.path.join(folder, f"rank{r}.json"), "w", encoding="utf-8") as f:
            json.dump(one, f)
        shutil.copyfile(os.path.join(run_dir, "rank0.steps"),
                        os.path.join(folder, f"rank{r}.steps"))
    t = time.perf_counter()
    proc = subprocess.Popen(perfrun_cmd("report", folder), stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"perfrun report over {ranks} ranks failed: status {status}")
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    shutil.rmtree(folder)
    return {"ranks": ranks, "data_gb": round(size / 1e9, 2), "report_s": round(took, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--modes", default="python,timer-only,default")
    parser.add_argument("--json", help="write the figures here as JSON")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="perfrun-scale-")
    figures: dict[str, Any] = {
        "steps": args.steps, "python": platform.python_version(),
        "cpus": os.cpu_count(), "runs": {},
    }
    try:
        for mode in args.modes.split(","):
            print(f"== {mode}: {args.steps} steps", flush=True)
            result = run_mode(mode, args.steps, work)
            figures["runs"][mode] = result
            print(json.dumps({k: v for k, v in result.items() if k != "rss_mib"}, indent=1))
            rss = [r for _, r in result["rss_mib"]]
            if rss:
                print(f"   RSS MiB: first {rss[0]}, median {statistics.median(rss)}, "
                      f"last {rss[-1]}, peak (VmHWM) {result['rss_peak_mib']}", flush=True)
        ranked = next((figures["runs"][m] for m in ("default", "timer-only")
                       if m in figures["runs"]), None)
        if args.ranks and ranked is not None:
            print(f"== perfrun report over {args.ranks} ranks", flush=True)
            figures["many_ranks"] = many_ranks(ranked["run_dir"], args.ranks, work)
            print(json.dumps(figures["many_ranks"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
