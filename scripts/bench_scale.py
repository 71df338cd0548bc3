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
* flat over the run: per tenth of the steps, the median and 99th
  percentile step and the steps over 5 ms, each mode beside python's, with
  perfrun's saves in that tenth, and the first tenth against the last;
* the time from the script's last step to perfrun's exit (the report), and
  `perfrun report` of the run folder on its own.

Then, with --ranks R (default 64; 0 skips it), it copies the default mode's
rank into a folder of R ranks (R x N steps) and times `perfrun report` over
it, with its peak memory.

With --reports, it times perfrun's reading side at scale instead of (or
after) the runs: every report format (`perfrun report --format
table|json|markdown|html`) and `perfrun compare` (its table and its page)
over a run of --report-ranks ranks x --report-steps steps (default 64 x
1,000,000: 8.7 GB of step files) against a second one 3% slower, and over
one rank of --long-steps steps (default 10,000,000; several sizes,
comma-separated, lay each command's peak memory out by size), each as a fresh
process, with its time and peak RSS (ru_maxrss) and the machine's load
average then. Those folders are written directly, in perfrun's own formats
(store/rankfile.py's rank document, store/stepfile.py's StepWriter), from a
short real run of the workload (2,000 steps, for a rank document as a run
writes it) and synthetic steps: a minute or two of writing instead of hours
of running. --work DIR keeps them there and reuses them on the next call
(they take 20 GB: put DIR under /tmp and remove it after); --modes ''
skips the runs:

    python scripts/bench_scale.py --modes '' --reports --work /tmp/scale

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

import numpy as np
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
        "tenths_by_step": own.get("tenths_by_step", []),
        "load": [round(x, 2) for x in os.getloadavg()],
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


def flat_table(runs: dict[str, dict[str, Any]]) -> str:
    """Is each mode flat over its run? Per tenth of the steps, by the
    script's own stopwatch: the median and 99th percentile step, and the
    steps over 5 ms (on a step of a fraction of a millisecond, a stall),
    for every mode; perfrun's saves in the same tenth beside them. The
    first and last tenths side by side answer the question; python's own
    row says what the machine did without perfrun."""
    lines = ["flat over the run (per tenth of the steps: median / p99 us, steps over 5 ms; "
             "saves)"]
    for mode, result in runs.items():
        parts = result.get("tenths_by_step") or []
        saves = [t.get("saves") for t in result.get("flush", [])]
        cells = []
        for k, t in enumerate(parts):
            save = f"; {saves[k]}" if k < len(saves) and saves[k] is not None else ""
            cells.append(f"{t['median_us']:.0f}/{t['p99_us']:.0f} {t['over_5ms']}{save}")
        lines.append(f"  {mode:>10}: " + " | ".join(cells))
        if len(parts) >= 2:
            a, b = parts[0], parts[-1]
            lines.append(f"  {'':>10}  first tenth median {a['median_us']:.1f} us, p99 "
                         f"{a['p99_us']:.1f} us, {a['over_5ms']} over 5 ms; last tenth "
                         f"{b['median_us']:.1f} us, {b['p99_us']:.1f} us, {b['over_5ms']} "
                         f"(load {result.get('load')})")
    return "\n".join(lines)


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


# -- the reading side at scale -----------------------------------------------------------

#: Each step's phases, drawn for the synthetic runs: (median seconds, spread
#: of the log-normal). The shape of the workload's own steps (a forward of
#: some 25 us, a backward of 80, two optimizer calls of 60, 20 us of
#: Others) with a tail, so medians, quartiles and maxima all differ.
SYNTHETIC_PHASES = {"forward": (25e-6, 0.3), "backward": (80e-6, 0.3),
                    "optimization": (60e-6, 0.3), "others": (20e-6, 0.6)}
#: Rows generated and written at a time: a 10^7-step rank is written
#: without ever holding its steps.
CHUNK = 1_000_000


def synthetic_rows(rng: Any, n: int, origin: float, factor: float) -> Any:
    """`n` steps in STEP_COLUMNS order from `origin` (seconds), each phase
    drawn from SYNTHETIC_PHASES and scaled by `factor`; no GPU columns."""
    from perfrun.store.stepfile import COL, STEP_COLUMNS

    rows = np.full((n, len(STEP_COLUMNS)), np.nan)
    total = np.zeros(n)
    for name, (median, sigma) in SYNTHETIC_PHASES.items():
        values = rng.lognormal(np.log(median * factor), sigma, n)
        total += values
        if name != "others":
            rows[:, COL[name]] = values
    rows[:, COL["dataloader"]] = 0.0
    rows[:, COL["excluded"]] = 0.0
    end = origin + np.cumsum(total)
    rows[:, COL["end"]] = end
    rows[:, COL["start"]] = np.concatenate(([origin], end[:-1]))
    for name, calls in (("dataloader", 0), ("forward", 1), ("backward", 1),
                        ("optimization", 2)):
        rows[:, COL[name + "_calls"]] = calls
    rows[:, COL["samples"]] = 0.0
    return rows


def synthetic_run(template: str, folder: str, ranks: int, steps: int, factor: float,
                  seed: int) -> None:
    """A run folder of `ranks` ranks of `steps` synthetic steps each, their
    documents the template run's rank 0 (`template`, a run folder) with its
    identity, steps, times and memory points made to fit."""
    from perfrun.store.rankfile import write_rank_file
    from perfrun.store.stepfile import STEP_COLUMNS, StepWriter

    os.makedirs(folder)
    with open(os.path.join(template, "rank0.json"), encoding="utf-8") as f:
        doc = json.load(f)
    with open(os.path.join(template, "run.json"), encoding="utf-8") as f:
        meta = json.load(f)
    origin = 5.0
    for r in range(ranks):
        rng = np.random.default_rng([seed, r])
        # Ranks differ by up to 0.7%: alike enough for no straggler, apart
        # enough that every rank's figures are its own.
        rank_factor = factor * (1 + 0.001 * (r % 8))
        writer = StepWriter(os.path.join(folder, f"rank{r}.steps"), STEP_COLUMNS)
        at = origin
        for lo in range(0, steps, CHUNK):
            rows = synthetic_rows(rng, min(CHUNK, steps - lo), at, rank_factor)
            at = float(rows[-1, 1])
            writer.append_held(rows.reshape(-1), rows.shape[0])
        writer.close()
        one = json.loads(json.dumps(doc))
        one.update(rank=r, local_rank=r % 8, world_size=ranks, elapsed=round(at + 0.5, 6))
        one["steps"] = dict(doc["steps"], file=f"rank{r}.steps", count=steps)
        one["position"] = dict(doc.get("position") or {}, step=steps)
        process = (one.get("memory") or {}).get("process")
        if process and process.get("points"):
            # The rank's memory samples spread over its steps, as its saves
            # would have taken them.
            points = process["points"]
            k = len(points)
            process["points"] = [[int((origin + (at - origin) * (i + 1) / k) * 1000), v]
                                 for i, (_t, v) in enumerate(points)]
        write_rank_file(os.path.join(folder, f"rank{r}.json"), one)
    meta.update(expected_ranks=ranks, elapsed=at + 1.0)
    if ranks > 1:
        meta.update(launcher="torchrun", returncode=0)
    with open(os.path.join(folder, "run.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    settings = os.path.join(template, "settings.json")
    if os.path.exists(settings):
        shutil.copyfile(settings, os.path.join(folder, "settings.json"))


def template_run(work: str) -> str:
    """A short real run of the workload (2,000 steps, default mode): the
    rank document the synthetic runs are written from."""
    log = os.path.join(work, "template")
    if not os.path.isdir(log):
        stats = os.path.join(work, "template.stats.json")
        subprocess.run(perfrun_cmd("--log-dir", log, "-q", WORKLOAD, "2000", stats),
                       stdout=subprocess.DEVNULL, check=True)
    return os.path.realpath(os.path.join(log, "latest"))


#: Runs the command in argv, its output discarded, and prints its exit
#: status and peak RSS (ru_maxrss, KiB). timed() starts it from this fresh
#: interpreter rather than from the script: on Linux a child's ru_maxrss
#: starts from the memory of the process it was forked from, and the
#: script's own is hundreds of MiB once it has written a folder, which
#: would hide the peak of a report smaller than that.
PEAK = ("import os, subprocess, sys\n"
        "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL)\n"
        "_, status, usage = os.wait4(p.pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")


def timed(args: list[str]) -> dict[str, Any]:
    """`perfrun ARGS` as a fresh process, its output discarded: its time,
    its peak RSS and its exit status, with the load average as it began."""
    load = os.getloadavg()[0]
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK, *perfrun_cmd(*args)],
                          stdout=subprocess.PIPE, text=True, check=True)
    seconds = time.perf_counter() - t
    code, peak_kib = (int(v) for v in done.stdout.split())
    return {"s": round(seconds, 2), "peak_rss_mib": round(peak_kib / 1024, 1),
            "exit": code, "load": round(load, 2)}


#: What is timed over each run folder: every report format, and compare
#: against the second folder as a table and as a page.
REPORT_COMMANDS = (
    ("report table", ["report", "{a}", "--format", "table"]),
    ("report json", ["report", "{a}", "--format", "json"]),
    ("report markdown", ["report", "{a}", "--format", "markdown"]),
    ("report html", ["report", "{a}", "--format", "html", "--output", "{out}"]),
    ("compare table", ["compare", "{a}", "{b}"]),
    ("compare html", ["compare", "{a}", "{b}", "--format", "html", "--output", "{out}"]),
)


def reports_at_scale(work: str, ranks: int, steps: int, long_steps: list[int],
                     only: Optional[list[str]] = None) -> dict[str, Any]:
    """Build (or reuse) the folders under `work` and time each command of
    REPORT_COMMANDS over them: over ranks x steps, and over one rank of each
    of `long_steps` (several sizes show whether a report's memory grows
    with the steps: `flatness` lays each command's peak out by size)."""
    template = template_run(work)
    sets = []
    if ranks and steps:
        sets.append((f"{ranks}x{steps}", ranks, steps))
    for n in long_steps:
        if n:
            sets.append((f"1x{n}", 1, n))
    out: dict[str, Any] = {}
    for name, r, n in sets:
        folders = []
        for which, factor in (("a", 1.0), ("b", 1.03)):
            folder = os.path.join(work, f"{name}-{which}")
            if not os.path.isdir(folder):
                print(f"   writing {folder}", flush=True)
                synthetic_run(template, folder, r, n, factor, seed=1 if which == "a" else 2)
            folders.append(folder)
        size = sum(os.path.getsize(os.path.join(folders[0], f)) for f in os.listdir(folders[0]))
        figures: dict[str, Any] = {"ranks": r, "steps": n, "data_gb": round(size / 1e9, 2)}
        page = os.path.join(work, "page.html")
        for label, args in REPORT_COMMANDS:
            if only and label not in only:
                continue
            figures[label] = timed([a.format(a=folders[0], b=folders[1], out=page)
                                    for a in args])
            print(f"   {name} {label}: {json.dumps(figures[label])}", flush=True)
        out[name] = figures
    longs = [name for name, r, _n in sets if r == 1]
    if len(longs) > 1:
        out["flatness"] = flatness({name: out[name] for name in longs})
        print("   peak RSS (MiB) and time (s) by steps in one rank:", flush=True)
        for label, row in out["flatness"].items():
            print(f"   {label:16} " + "  ".join(f"{k}: {v['peak_rss_mib']} MiB {v['s']} s"
                                                 for k, v in row.items()), flush=True)
    return out


def flatness(sets: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each command's time and peak RSS over each folder of `sets` (by
    name, in order of size), side by side: a report whose memory does not
    grow with the steps shows one figure across."""
    out: dict[str, dict[str, Any]] = {}
    for name, figures in sets.items():
        for label, _args in REPORT_COMMANDS:
            if label in figures:
                out.setdefault(label, {})[name] = {
                    k: figures[label][k] for k in ("s", "peak_rss_mib", "exit")}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--modes", default="python,timer-only,default")
    parser.add_argument("--json", help="write the figures here as JSON")
    parser.add_argument("--reports", action="store_true",
                        help="time every report format and compare at scale")
    parser.add_argument("--report-ranks", type=int, default=64)
    parser.add_argument("--report-steps", type=int, default=1_000_000)
    parser.add_argument("--long-steps", default="10000000",
                        help="steps of the one-rank run, or several sizes comma-separated "
                        "(e.g. 1000000,3000000,10000000: a table of peak memory by size)")
    parser.add_argument("--only", help="the commands to time, comma-separated "
                        "(e.g. 'report html,compare table')")
    parser.add_argument("--work", help="work here and keep what is built (the --reports "
                        "folders are reused from it)")
    args = parser.parse_args()
    if args.work:
        os.makedirs(args.work, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="perfrun-scale-")
    figures: dict[str, Any] = {
        "steps": args.steps, "python": platform.python_version(),
        "cpus": os.cpu_count(), "runs": {},
    }
    try:
        for mode in [m for m in args.modes.split(",") if m]:
            print(f"== {mode}: {args.steps} steps", flush=True)
            result = run_mode(mode, args.steps, work)
            figures["runs"][mode] = result
            print(json.dumps({k: v for k, v in result.items() if k != "rss_mib"}, indent=1))
            rss = [r for _, r in result["rss_mib"]]
            if rss:
                print(f"   RSS MiB: first {rss[0]}, median {statistics.median(rss)}, "
                      f"last {rss[-1]}, peak (VmHWM) {result['rss_peak_mib']}", flush=True)
        if figures["runs"]:
            print(flat_table(figures["runs"]), flush=True)
        ranked = next((figures["runs"][m] for m in ("default", "timer-only")
                       if m in figures["runs"]), None)
        if args.ranks and ranked is not None:
            print(f"== perfrun report over {args.ranks} ranks", flush=True)
            figures["many_ranks"] = many_ranks(ranked["run_dir"], args.ranks, work)
            print(json.dumps(figures["many_ranks"]))
        if args.reports:
            print("== every report format and compare at scale", flush=True)
            figures["reports"] = reports_at_scale(work, args.report_ranks, args.report_steps,
                                                  [int(n) for n in
                                                   args.long_steps.split(",") if n],
                                                  args.only.split(",") if args.only else None)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
