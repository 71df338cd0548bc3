"""How much does perfrun cost the script it profiles?

    python scripts/bench_overhead.py [--quick] [--pairs N] [--json OUT]

Each workload in scripts/workloads/ is run as `python WORKLOAD` and under
perfrun (`--timer-only`, the default mode, and `--scheduler START END`), in
pairs of adjacent runs: plain then perfrun, the next pair perfrun then plain,
and so on, so that a slow drift of the machine favours neither side. The step
time is the one each workload measures itself (the median of its steady-state
steps, printed on its `BENCH {...}` line), never perfrun's own figure, so a
perfrun that mis-timed a step could not hide its own cost.

Per configuration it reports the median over pairs of perfrun step / plain
step, the range of that ratio over pairs, and the median over pairs of the
difference per step (what perfrun adds to a step, in microseconds where the
targets are set that way: (a) and (d), whose steps are well under a
millisecond). What perfrun adds to module calls below the model is (e), a
forward of 1,000 submodule calls, less (f), the same loop with none. With
--scheduler the steps inside the detailed window and the steps away from it
are reported apart. It also times the launcher: the
wall time of `perfrun --timer-only noop.py` against `python noop.py` (a
script that imports nothing), and of a script that only imports torch.

Needs perfrun installed in this interpreter, and torch. The figures are only
as quiet as the machine: stop other work first, and on a busy machine read
the ranges before the verdicts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional, TextIO

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD_DIR = os.path.join(HERE, "workloads")


@dataclass(frozen=True)
class Workload:
    key: str  # (a), (b), ...
    name: str
    steps: int
    quick_steps: int
    warmup: int
    # The script, when it is not NAME.py, and its arguments after STEPS WARMUP.
    script_name: str = ""
    extra: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("timer-only", "default", "scheduler")

    @property
    def script(self) -> str:
        return os.path.join(WORKLOAD_DIR, f"{self.script_name or self.name}.py")

    @property
    def label(self) -> str:
        return f"{self.key} {self.name}"


FAST = ("timer-only", "default")
WORKLOADS = (
    Workload("(a)", "tiny_mlp", steps=3000, quick_steps=1000, warmup=200),
    Workload("(b)", "small_transformer", steps=300, quick_steps=60, warmup=5),
    Workload("(c)", "dataloader_bound", steps=300, quick_steps=100, warmup=20),
    # A sub-millisecond step that fetches from a DataLoader: every hooked
    # call of a training loop, and nothing to hide their cost.
    Workload("(d)", "loader_mlp", steps=3000, quick_steps=1000, warmup=200, modes=FAST),
    # 1,000 submodule calls a forward, and the same loop without them: the
    # difference between the two is what perfrun adds to those calls.
    Workload("(e)", "many_modules", steps=1000, quick_steps=300, warmup=100, modes=FAST),
    Workload("(f)", "no_submodules", steps=1000, quick_steps=300, warmup=100,
             script_name="many_modules", extra=("0",), modes=FAST),
    # An MNIST-sized MLP: a step of 1-2 ms, the short end of the 1% target.
    Workload("(g)", "mlp", steps=2000, quick_steps=600, warmup=100, modes=FAST),
)
MODES = ("timer-only", "default", "scheduler")
OUTSIDE, INSIDE = "scheduler, outside window", "scheduler, in window"
# The targets: (workload, mode, "us" per step or "pct" of step time, limit).
# Steps of 1-50 ms (the MLP, the transformer): the default mode within 1%,
# --timer-only within 0.5%; sub-millisecond steps in microseconds.
TARGETS = (
    ("tiny_mlp", "timer-only", "us", 15.0),
    ("mlp", "timer-only", "pct", 0.5),
    ("mlp", "default", "pct", 1.0),
    ("small_transformer", "timer-only", "pct", 0.5),
    ("small_transformer", "default", "pct", 1.0),
    ("dataloader_bound", "timer-only", "pct", 1.0),
    ("loader_mlp", "timer-only", "us", 15.0),
    ("loader_mlp", "default", "us", 20.0),
)
# What perfrun adds to 1,000 submodule calls: (e) less (f), per step.
SUBMODULES = ("many_modules", "no_submodules", 10.0)
STARTUP_LIMIT_MS = 150.0
#: ... and for a script that imports torch (the default mode).
TORCH_STARTUP_LIMIT_MS = 200.0


class BenchError(Exception):
    """A run failed or printed no BENCH line; the message says which."""


# -- what is run -----------------------------------------------------------------


def window_for(wl: Workload, steps: int) -> tuple[int, int]:
    """A detailed window in the middle of the timed steps, in perfrun's step
    numbers (which count the workload's warm-up steps too)."""
    length = min(10, max(3, steps // 5))
    start = wl.warmup + (steps - length) // 2
    return start, start + length


def mode_options(mode: str, window: Optional[tuple[int, int]] = None) -> list[str]:
    if mode == "timer-only":
        return ["--timer-only"]
    if mode == "default":
        return []
    if mode == "scheduler" and window is not None:
        return ["--scheduler", str(window[0]), str(window[1])]
    raise ValueError(mode)


@dataclass
class RunResult:
    wall_s: float
    bench: Optional[dict[str, Any]]
    options: Optional[list[str]]  # perfrun's options; None for a plain run
    perfrun: Optional[dict[str, Any]]  # what perfrun's own results say, for sanity
    load: Optional[float] = None  # the machine's 1-minute load as the run ended


class Runner:
    def __init__(self, workdir: str, verbose: bool, pin: Optional[int] = None) -> None:
        self.workdir = workdir
        self.verbose = verbose
        # Both sides of every pair on one CPU (--pin): the same caches, and
        # no migration between cores in the middle of a step.
        self.pin = pin
        self.env = dict(os.environ)
        self.env.pop("PERFRUN_SETTINGS", None)  # never profile a plain run by accident
        self.count = 0

    def run(self, script: str, args: list[str], perfrun: Optional[list[str]]) -> RunResult:
        """Run `python SCRIPT ARGS`, or the same under `perfrun OPTIONS`."""
        self.count += 1
        log_dir = os.path.join(self.workdir, f"log{self.count}")
        if perfrun is None:
            cmd = [sys.executable, script, *args]
        else:
            cmd = [sys.executable, "-m", "perfrun", *perfrun, "--log-dir", log_dir, script, *args]
        if self.verbose:
            print("  $ " + " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        pin = self.pin
        proc = subprocess.run(
            cmd,
            cwd=self.workdir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, {pin})) if pin is not None else None,
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise BenchError(f"exit status {proc.returncode}: {' '.join(cmd)}\n{tail}")
        bench = None
        for line in proc.stdout.splitlines():
            if line.startswith("BENCH "):
                bench = json.loads(line[len("BENCH ") :])
        info = None
        if perfrun is not None:
            info = read_perfrun_results(log_dir)
            shutil.rmtree(log_dir, ignore_errors=True)
        load = _loadavg()
        return RunResult(wall, bench, perfrun, info, load[0] if load else None)


def read_perfrun_results(log_dir: str) -> Optional[dict[str, Any]]:
    """The steps perfrun recorded, its faults and notes, and whether the
    window was recorded: evidence that perfrun really was at work in the run
    being timed. None when the results cannot be read."""
    try:
        run_dirs = [
            os.path.join(log_dir, d)
            for d in os.listdir(log_dir)
            if d != "latest" and os.path.isdir(os.path.join(log_dir, d))
        ]
        with open(os.path.join(sorted(run_dirs)[-1], "rank0.json")) as f:
            doc = json.load(f)
        window = doc.get("window_summary") or None
        steps = doc.get("steps", {})
        flush = (doc.get("extra") or {}).get("flush") or {}
        elapsed = doc.get("elapsed") or 0.0
        return {
            # perfrun's flush thread's CPU time as a share of the rank's
            # time: the most its saves and samplers can have taken from
            # the script's thread (through the GIL).
            "flush_cpu_share": (flush["thread_cpu"] / elapsed
                                if "thread_cpu" in flush and elapsed > 0 else None),
            # The rows themselves, or (results format 2) their count.
            "steps": int(steps["count"]) if "count" in steps else len(steps.get("rows", [])),
            "faults": doc.get("faults", []),
            "notes": doc.get("notes", []),
            "window_recorded": window is not None,
            "window_export_s": window.get("export_seconds") if window else None,
        }
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def run_pair(
    runner: Runner, script: str, args: list[str], options: list[str], perfrun_first: bool
) -> tuple[RunResult, RunResult]:
    """Two adjacent runs of the same script: (plain, under perfrun)."""
    if perfrun_first:
        profiled = runner.run(script, args, options)
        return runner.run(script, args, None), profiled
    plain = runner.run(script, args, None)
    return plain, runner.run(script, args, options)


# -- statistics -------------------------------------------------------------------


#: The confidence of the interval given for each median over pairs.
CONFIDENCE = 0.95


def median_interval(values: list[float], confidence: float = CONFIDENCE
                    ) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median of what
    `values` sample: the order statistics x(j) and x(n-j+1) with the
    largest j whose coverage, 1 - 2 P(Binomial(n, 1/2) <= j - 1), is still
    at least `confidence`. Returns (low, high, coverage). No assumption on
    the shape of the pairs' spread (a busy machine makes it lopsided); with
    7 pairs it is the range (98.4%), with 15 the 4th and 12th (96.5%), with
    31 the 10th and 22nd (97.1%), so it narrows as pairs are added where
    the range only widens. Fewer than 6 pairs give the range, at the lower
    coverage returned."""
    xs = sorted(values)
    n = len(xs)
    total = 2 ** n
    j = 1
    below = 1  # 2^n P(B <= j - 1)
    while j < (n + 1) // 2:
        wider = below + math.comb(n, j)
        if 1 - 2 * wider / total < confidence:
            break
        below, j = wider, j + 1
    return xs[j - 1], xs[n - j], 1 - 2 * below / total


def pair_stats(plain: list[float], profiled: list[float]) -> dict[str, float]:
    """Ratio and difference within each pair of adjacent runs, then their
    median over pairs, its confidence interval and the range."""
    ratios = [b / a for a, b in zip(plain, profiled)]
    diffs = [b - a for a, b in zip(plain, profiled)]
    r_lo, r_hi, coverage = median_interval(ratios)
    d_lo, d_hi, _ = median_interval(diffs)
    return {
        "plain_median": statistics.median(plain),
        "perfrun_median": statistics.median(profiled),
        "ratio_median": statistics.median(ratios),
        "ratio_ci_lo": r_lo,
        "ratio_ci_hi": r_hi,
        "ci_coverage": coverage,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "diff_median": statistics.median(diffs),
        "diff_ci_lo": d_lo,
        "diff_ci_hi": d_hi,
        "diff_min": min(diffs),
        "diff_max": max(diffs),
    }


def _bench(run: RunResult, wl: Workload) -> dict[str, Any]:
    if run.bench is None:
        raise BenchError(f"{wl.name}.py printed no BENCH line")
    return run.bench


def _median_of(run: RunResult, wl: Workload, keep: Optional[range], drop: range) -> float:
    """Median of the run's timed steps in `keep` (all when None) and not in
    `drop`; indices are perfrun step numbers."""
    bench = _bench(run, wl)
    warmup = int(bench["warmup"])
    picked = [
        d
        for j, d in enumerate(bench["step_s"])
        if (keep is None or warmup + j in keep) and warmup + j not in drop
    ]
    if not picked:
        raise BenchError(f"{wl.name}.py: no timed step left around the window")
    return statistics.median(picked)


def config_rows(
    wl: Workload,
    mode: str,
    steps: int,
    window: Optional[tuple[int, int]],
    plain: list[RunResult],
    prof: list[RunResult],
) -> list[dict[str, Any]]:
    """The table rows for one workload and mode: one, or two for a window
    (the steps it records, and the steps well away from it)."""
    if window is None:
        parts = [
            (
                mode,
                [float(_bench(r, wl)["median_step_s"]) for r in plain],
                [float(_bench(r, wl)["median_step_s"]) for r in prof],
            )
        ]
    else:
        start, end = window
        # The profiler starts one step early (its warm-up) and exports the
        # trace at the start of step END; one more step of margin each side.
        near = range(start - 2, end + 2)
        inside = range(start, end)
        parts = [
            (
                OUTSIDE,
                [_median_of(r, wl, None, near) for r in plain],
                [_median_of(r, wl, None, near) for r in prof],
            ),
            (
                INSIDE,
                [_median_of(r, wl, inside, range(0)) for r in plain],
                [_median_of(r, wl, inside, range(0)) for r in prof],
            ),
        ]
    walls = pair_stats([r.wall_s for r in plain], [r.wall_s for r in prof])
    # The process's CPU time per timed step (benchline.mark), where the
    # workload gives it: what each side spent, whoever else ran.
    cpu_a = [_bench(r, wl).get("cpu_per_step_s") for r in plain]
    cpu_b = [_bench(r, wl).get("cpu_per_step_s") for r in prof]
    cpu = (pair_stats(cpu_a, cpu_b)  # type: ignore[arg-type]
           if window is None and None not in cpu_a + cpu_b and all(cpu_a) else None)
    seen = [r.perfrun["steps"] for r in prof if r.perfrun] or None
    shares = [r.perfrun.get("flush_cpu_share") for r in prof if r.perfrun]
    flush_share = (statistics.median(shares) if shares and None not in shares else None)
    rows = []
    for shown, a, b in parts:
        rows.append(
            {
                "workload": wl.name,
                "label": wl.label,
                "mode": mode,
                "shown_as": shown,
                "options": mode_options(mode, window),
                "steps": steps,
                "warmup": wl.warmup,
                "window": list(window) if window else None,
                "plain_step_s": a,
                "perfrun_step_s": b,
                "plain_mean_step_s": [_bench(r, wl)["mean_step_s"] for r in plain],
                "perfrun_mean_step_s": [_bench(r, wl)["mean_step_s"] for r in prof],
                "plain_wall_s": [r.wall_s for r in plain],
                "perfrun_wall_s": [r.wall_s for r in prof],
                "perfrun_steps": seen,
                "flush_cpu_share": flush_share,
                "stats": pair_stats(a, b),
                "cpu_stats": cpu,
                "wall_stats": walls,
                "load": [r.load for pair in zip(plain, prof) for r in pair],
            }
        )
    return rows


def verdicts(steps: list[dict[str, Any]], startup: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target: the measured median, the limit, pass or fail, and whether
    the median's confidence interval (median_interval) holds the limit: too
    noisy to tell, more pairs or a quieter machine needed."""
    out = []
    by_key = {(r["workload"], r["shown_as"]): r for r in steps}
    for name, mode, unit, limit in TARGETS:
        r = by_key.get((name, mode))
        if r is None:
            continue
        s = r["stats"]
        if unit == "us":
            value, lo, hi = (s[k] * 1e6 for k in ("diff_median", "diff_ci_lo", "diff_ci_hi"))
            text = f"{value:+.1f} us a step ({lo:+.1f} to {hi:+.1f}; limit {limit:g} us)"
        else:
            value, lo, hi = ((s[k] - 1) * 100
                             for k in ("ratio_median", "ratio_ci_lo", "ratio_ci_hi"))
            text = f"{value:+.2f}% step time ({lo:+.2f} to {hi:+.2f}%; limit {limit:g}%)"
            c = r.get("cpu_stats")
            if c:
                text += f"; CPU a step {(c['ratio_median'] - 1) * 100:+.2f}%"
        out.append(_verdict(f"{mode} on {r['label']}", text, value, lo, hi, limit))
    with_calls, without, limit = SUBMODULES
    for mode in FAST:
        a, b = by_key.get((with_calls, mode)), by_key.get((without, mode))
        if a is None or b is None:
            continue
        # Two sets of pairs: the difference of their medians, and the widest
        # difference their ranges allow.
        sa, sb = a["stats"], b["stats"]
        value = (sa["diff_median"] - sb["diff_median"]) * 1e6
        lo = (sa["diff_min"] - sb["diff_max"]) * 1e6
        hi = (sa["diff_max"] - sb["diff_min"]) * 1e6
        text = (f"{value:+.1f} us a step for 1,000 submodule calls ({a['label']} less "
                f"{b['label']}; limit {limit:g} us)")
        out.append(_verdict(f"{mode}, 1,000 submodule calls", text, value, lo, hi, limit))
    for r in startup:
        if r["script"] == "noop.py" and r["mode"] == "timer-only":
            s = r["stats"]
            value, lo, hi = (s[k] * 1e3 for k in ("diff_median", "diff_ci_lo", "diff_ci_hi"))
            text = f"{value:+.0f} ms a run ({lo:+.0f} to {hi:+.0f}; limit {STARTUP_LIMIT_MS:g} ms)"
            out.append(
                _verdict("launcher start-up (noop.py)", text, value, lo, hi, STARTUP_LIMIT_MS)
            )
        if r["script"] == "torch_import.py" and r["mode"] == "default":
            s = r["stats"]
            value, lo, hi = (s[k] * 1e3 for k in ("diff_median", "diff_ci_lo", "diff_ci_hi"))
            text = (f"{value:+.0f} ms a run ({lo:+.0f} to {hi:+.0f}; "
                    f"limit {TORCH_STARTUP_LIMIT_MS:g} ms)")
            out.append(_verdict("start-up of a script that imports torch", text, value, lo, hi,
                                TORCH_STARTUP_LIMIT_MS))
    return out


def _verdict(what: str, text: str, value: float, lo: float, hi: float, limit: float) -> dict:
    return {
        "target": what,
        "measured": round(value, 3),
        "limit": limit,
        "pass": value <= limit,
        "noisy": lo <= limit < hi,
        "text": text,
    }


# -- measuring ---------------------------------------------------------------------------


def measure_workload(
    runner: Runner, wl: Workload, quick: bool, pairs: int
) -> tuple[list[dict[str, Any]], list[RunResult]]:
    steps = wl.quick_steps if quick else wl.steps
    wl_args = [str(steps), str(wl.warmup), *wl.extra]
    window = window_for(wl, steps)
    # --quick keeps the (costly, not gated) window to (b).
    modes = [m for m in wl.modes if not (quick and m == "scheduler" and wl.key != "(b)")]
    runs: dict[str, tuple[list[RunResult], list[RunResult]]] = {m: ([], []) for m in modes}
    # Rounds over the modes, so each mode's pairs spread over the same period;
    # odd rounds run perfrun first.
    for i in range(pairs):
        for mode in modes:
            options = mode_options(mode, window if mode == "scheduler" else None)
            a, b = run_pair(runner, wl.script, wl_args, options, perfrun_first=i % 2 == 1)
            runs[mode][0].append(a)
            runs[mode][1].append(b)
            _progress(f"{wl.label} {mode}: pair {i + 1}/{pairs}")
    rows = []
    for mode in modes:
        plain, prof = runs[mode]
        rows += config_rows(wl, mode, steps, window if mode == "scheduler" else None, plain, prof)
    return rows, [r for plain, prof in runs.values() for r in plain + prof]


def measure_startup(runner: Runner, pairs: int) -> list[dict[str, Any]]:
    cases = (
        ("noop.py", "timer-only", max(5, 3 * pairs)),
        ("torch_import.py", "timer-only", pairs),
        ("torch_import.py", "default", pairs),
    )
    out = []
    for name, mode, n in cases:
        script = os.path.join(WORKLOAD_DIR, name)
        plain, prof = [], []
        for i in range(n):
            a, b = run_pair(runner, script, [], mode_options(mode), perfrun_first=i % 2 == 1)
            plain.append(a.wall_s)
            prof.append(b.wall_s)
        _progress(f"start-up {name} {mode}: {n} pairs")
        out.append(
            {
                "script": name,
                "mode": mode,
                "plain_wall_s": plain,
                "perfrun_wall_s": prof,
                "stats": pair_stats(plain, prof),
            }
        )
    return out


def perfrun_notes(runs: list[RunResult]) -> list[str]:
    notes: set[str] = set()
    for r in runs:
        if r.perfrun is None:
            continue
        notes.update(r.perfrun["notes"])
        for f in r.perfrun["faults"]:
            notes.add(f"fault in {f.get('where')}: {f.get('error')}")
    return sorted(notes)


# -- printing ---------------------------------------------------------------------------------


def fmt_time(seconds: float) -> str:
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if abs(seconds) < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_time(abs(seconds))


def table(headers: list[str], rows: list[list[str]], left: int = 2) -> str:
    """Plain text columns; the first `left` columns are left-aligned."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def step_table(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        s, seen = r["stats"], r["perfrun_steps"]
        out.append(
            [
                r["label"],
                r["shown_as"],
                fmt_time(s["plain_median"]),
                fmt_time(s["perfrun_median"]),
                f"{s['ratio_median']:.3f}",
                f"{s['ratio_ci_lo']:.3f}-{s['ratio_ci_hi']:.3f}",
                f"{s['ratio_min']:.3f}-{s['ratio_max']:.3f}",
                f"{(s['ratio_median'] - 1) * 100:+.2f}%",
                f"{(r['cpu_stats']['ratio_median'] - 1) * 100:+.2f}%" if r.get("cpu_stats")
                else "-",
                fmt_signed(s["diff_median"]),
                fmt_signed(r["wall_stats"]["diff_median"]),
                f"{r['flush_cpu_share'] * 100:.2f}%" if r.get("flush_cpu_share") is not None
                else "-",
                "?"
                if not seen
                else str(min(seen))
                if min(seen) == max(seen)
                else f"{min(seen)}-{max(seen)}",
            ]
        )
    headers = [
        "workload",
        "mode",
        "python",
        "perfrun",
        "ratio",
        f"{CONFIDENCE:.0%} CI",
        "ratio range",
        "overhead",
        "CPU",
        "per step",
        "whole run",
        "flush thread",
        "perfrun steps",
    ]
    return table(headers, out)


def startup_table(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        s = r["stats"]
        out.append(
            [
                r["script"],
                r["mode"],
                f"{s['plain_median'] * 1e3:.0f} ms",
                f"{s['perfrun_median'] * 1e3:.0f} ms",
                f"{s['diff_median'] * 1e3:+.0f} ms",
                f"{s['diff_min'] * 1e3:+.0f} to {s['diff_max'] * 1e3:+.0f} ms",
            ]
        )
    return table(["script", "mode", "python", "perfrun", "added", "added range"], out)


def print_report(doc: dict[str, Any], out: TextIO) -> None:
    m = doc["machine"]
    load = m["loadavg_start"], m["loadavg_end"]
    print(
        f"perfrun overhead ({'quick, ' if doc['quick'] else ''}{doc['pairs']} pairs per "
        f"configuration; python {m['python']}, torch {m['torch'] or '?'}, {m['cpus']} CPUs; "
        f"load average {_fmt_load(load[0])} at start, {_fmt_load(load[1])} at end; "
        f"{doc['elapsed_s'] / 60:.1f} min)",
        file=out,
    )
    if doc["steps"]:
        print(
            "\nStep time as each workload measures it (its median step; python and perfrun "
            "columns are medians over runs, the rest over pairs)",
            file=out,
        )
        print(step_table(doc["steps"]), file=out)
    if doc["startup"]:
        print("\nLauncher start-up: wall time of a whole run (medians over pairs)", file=out)
        print(startup_table(doc["startup"]), file=out)
    if doc["targets"]:
        print("\nTargets", file=out)
        for c in doc["targets"]:
            noisy = "  (the interval holds the limit: not resolved)" if c["noisy"] else ""
            print(
                f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['target']}: {c['text']}{noisy}", file=out
            )
    print("\nNotes", file=out)
    for note in doc["notes"]:
        print(f"  - {note}", file=out)


def explanation(rows: list[dict[str, Any]], runs: list[RunResult]) -> list[str]:
    notes = [
        "ratio: perfrun step / python step of two adjacent runs; per step: their difference; "
        "whole run: the difference in wall time of the whole process (start-up, torch "
        "import, exit, report); flush thread: the CPU time of perfrun's flush thread "
        "(saves, samplers) as a share of the rank's time, median over runs (the most it "
        "can have taken from the script's thread)."
    ]
    windows = {r["label"]: r["window"] for r in rows if r["window"]}
    if windows:
        windowed = [r.perfrun for r in runs if r.perfrun and "--scheduler" in (r.options or [])]
        exports = [p["window_export_s"] for p in windowed if p["window_export_s"] is not None]
        missing = sum(1 for p in windowed if not p["window_recorded"])
        where = ", ".join(f"{k} [{a}, {b})" for k, (a, b) in windows.items())
        note = (
            f"scheduler: torch.profiler records perfrun steps {where}. 'in window' is those "
            "steps; 'outside window' leaves out the window and two steps each side (the "
            "profiler's warm-up step, the step that exports the trace)."
        )
        if exports:
            note += f" Trace export and summary: {statistics.median(exports):.2f} s (median)."
        if missing:
            note += f" WARNING: {missing} run(s) recorded no window."
        notes.append(note)
    # perfrun must have seen every step the workload ran, or its hooks were
    # not (all) at work and the figures understate its cost.
    short = [
        r
        for r in runs
        if r.options is not None
        and r.bench is not None
        and (r.perfrun is None or r.perfrun["steps"] < r.bench["warmup"] + r.bench["steps"])
    ]
    if short:
        notes.append(
            f"WARNING: in {len(short)} run(s) perfrun recorded fewer steps than the workload "
            "ran (or no results): its hooks were not all at work there."
        )
    notes += [f"perfrun: {n}" for n in perfrun_notes(runs)]
    return notes


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure what perfrun adds to a training step and to start-up.",
        epilog="Exit status: 0 when every run completed (whatever the verdicts), 1 when a "
        "run failed.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Fewer steps, 3 pairs, the --scheduler window on (b) only: a few minutes.",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="Pairs per configuration (default 7; 3 with --quick).",
    )
    parser.add_argument(
        "--json",
        metavar="OUT",
        default="bench_overhead.json",
        help="Where the JSON results go (default %(default)s; - for standard output).",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(w.name for w in WORKLOADS),
        help="Comma-separated subset of %(default)s.",
    )
    parser.add_argument(
        "--no-startup", action="store_true", help="Skip the launcher start-up measurements."
    )
    parser.add_argument(
        "--pin", type=int, metavar="CPU", default=None,
        help="Run every workload on this one CPU (both sides of each pair; the start-up "
        "runs are not pinned).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Print each command run.")
    args = parser.parse_args(argv)
    if args.pairs is None:
        args.pairs = 3 if args.quick else 7
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    known = [w.name for w in WORKLOADS]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in args.workloads if w not in known]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)} (known: {', '.join(known)})")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    started = time.time()
    load_start = _loadavg()
    workdir = tempfile.mkdtemp(prefix="perfrun-bench-")
    runner = Runner(workdir, args.verbose, args.pin)
    rows: list[dict[str, Any]] = []
    runs: list[RunResult] = []
    startup: list[dict[str, Any]] = []
    try:
        for wl in WORKLOADS:
            if wl.name in args.workloads:
                wl_rows, wl_runs = measure_workload(runner, wl, args.quick, args.pairs)
                rows += wl_rows
                runs += wl_runs
        if not args.no_startup:
            # Never pinned: the launcher's own threads (the host-load
            # sampler, the report's imports) run beside the script on
            # another core, as they do on any machine with more than one.
            startup = measure_startup(Runner(workdir, args.verbose), args.pairs)
    except BenchError as exc:
        print(f"bench_overhead: a run failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    torch_version = next((r.bench.get("torch") for r in runs if r.bench), None)
    doc = {
        "benchmark": "perfrun-overhead",
        "version": 1,
        "quick": args.quick,
        "pairs": args.pairs,
        "started_unix": started,
        "elapsed_s": round(time.time() - started, 1),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch_version,
            "loadavg_start": load_start,
            "loadavg_end": _loadavg(),
            "pinned_cpu": args.pin,
        },
        "steps": rows,
        "startup": startup,
        "targets": verdicts(rows, startup),
        "notes": explanation(rows, runs),
    }
    # With --json - the JSON owns standard output and the table goes to stderr.
    print_report(doc, sys.stderr if args.json == "-" else sys.stdout)
    text = json.dumps(doc, indent=1)
    if args.json == "-":
        print(text)
    else:
        with open(args.json, "w") as f:
            f.write(text + "\n")
        print(f"\nJSON: {args.json}")
    return 0


def _progress(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


def _loadavg() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _fmt_load(load: Optional[list[float]]) -> str:
    return "?" if load is None else f"{load[0]:.2f}"


if __name__ == "__main__":
    sys.exit(main())
