"""How much does perfrun cost the script it profiles?

    python scripts/bench_overhead.py [--quick] [--pairs N] [--json OUT]

Each workload in scripts/workloads/ is run as `python WORKLOAD` and under
perfrun (`--timer-only`, the default mode, and `--scheduler START END`), in
pairs of adjacent runs: plain then perfrun, the next pair perfrun then plain,
and so on, so that a slow drift of the machine does not favour either side.
The step time is the one each workload measures itself (the median of its
steady-state steps, printed on its `BENCH {...}` line), never perfrun's own
figure, so a perfrun that mis-times a step cannot hide its own cost.

Per configuration it reports the median over pairs of perfrun step / plain
step, the range over pairs, and the median over pairs of the absolute
difference per step. It also times the launcher itself: the wall time of
`perfrun --timer-only noop.py` against `python noop.py` (a script that never
imports torch), and of a script that only imports torch.

Needs only perfrun installed in this interpreter, and torch. Timings are only
as quiet as the machine: close other work first; on a busy machine read the
min-max ranges before the verdicts.
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
from dataclasses import dataclass
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD_DIR = os.path.join(HERE, "workloads")


@dataclass(frozen=True)
class Workload:
    key: str  # (a), (b), (c)
    name: str
    steps: int
    quick_steps: int
    warmup: int

    @property
    def script(self) -> str:
        return os.path.join(WORKLOAD_DIR, f"{self.name}.py")

    @property
    def label(self) -> str:
        return f"{self.key} {self.name}"


WORKLOADS = (
    Workload("(a)", "tiny_mlp", steps=3000, quick_steps=1000, warmup=200),
    Workload("(b)", "small_transformer", steps=60, quick_steps=20, warmup=5),
    Workload("(c)", "dataloader_bound", steps=300, quick_steps=100, warmup=20),
)
MODES = ("timer-only", "default", "scheduler")
# The targets of the issue. (workload name, mode, what is compared, limit).
TARGETS = (
    ("tiny_mlp", "timer-only", "us", 10.0),
    ("small_transformer", "timer-only", "pct", 1.0),
    ("dataloader_bound", "timer-only", "pct", 1.0),
    ("small_transformer", "default", "pct", 2.0),
)
STARTUP_LIMIT_MS = 150.0
SCHEDULER_NOTE = (
    "--scheduler only marks the detailed window in the results for now (the detailed "
    "profiler is not implemented yet), so its row measures the default hooks plus that "
    "bookkeeping, not the cost of a detailed window."
)


class BenchError(Exception):
    """A run failed or printed no BENCH line; the message says which."""


# -- running -------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)  # never profile the plain runs by accident
    return env


def mode_options(mode: str, workload: Optional[Workload], steps: int) -> list[str]:
    if mode == "timer-only":
        return ["--timer-only"]
    if mode == "default":
        return []
    if mode == "scheduler":
        # A window inside the timed steps: perfrun counts the warm-up steps too.
        warmup = workload.warmup if workload else 0
        start = warmup + min(2, steps // 4)
        return ["--scheduler", str(start), str(start + max(1, min(10, steps // 2)))]
    raise ValueError(mode)


@dataclass
class RunResult:
    wall_s: float
    bench: Optional[dict[str, Any]]
    perfrun: Optional[dict[str, Any]]  # what perfrun's own results say, for sanity


class Runner:
    def __init__(self, workdir: str, verbose: bool) -> None:
        self.workdir = workdir
        self.verbose = verbose
        self.env = _child_env()
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
        proc = subprocess.run(
            cmd,
            cwd=self.workdir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
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
        return RunResult(wall, bench, info)


def read_perfrun_results(log_dir: str) -> Optional[dict[str, Any]]:
    """Steps perfrun recorded, and its faults and notes: proof that the hooks
    were really on during the run being timed. None when unreadable."""
    try:
        run_dirs = [
            os.path.join(log_dir, d)
            for d in os.listdir(log_dir)
            if d != "latest" and os.path.isdir(os.path.join(log_dir, d))
        ]
        with open(os.path.join(sorted(run_dirs)[-1], "rank0.json")) as f:
            doc = json.load(f)
        return {
            "steps": len(doc.get("steps", {}).get("rows", [])),
            "torch_imported": doc.get("torch_imported"),
            "faults": doc.get("faults", []),
            "notes": doc.get("notes", []),
        }
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# -- statistics -----------------------------------------------------------------


def pair_stats(plain: list[float], profiled: list[float]) -> dict[str, float]:
    """Ratio and difference of each pair of adjacent runs, then their median
    and range over pairs."""
    ratios = [b / a for a, b in zip(plain, profiled)]
    diffs = [b - a for a, b in zip(plain, profiled)]
    return {
        "plain_median": statistics.median(plain),
        "perfrun_median": statistics.median(profiled),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "diff_median": statistics.median(diffs),
        "diff_min": min(diffs),
        "diff_max": max(diffs),
    }


def run_pair(
    runner: Runner, script: str, args: list[str], options: list[str], perfrun_first: bool
) -> tuple[RunResult, RunResult]:
    """Two adjacent runs of the same script: (plain, under perfrun)."""
    if perfrun_first:
        profiled = runner.run(script, args, options)
        return runner.run(script, args, None), profiled
    plain = runner.run(script, args, None)
    return plain, runner.run(script, args, options)


def bench_step_times(results: list[RunResult], script: str) -> list[float]:
    out = []
    for r in results:
        if r.bench is None:
            raise BenchError(f"{os.path.basename(script)} printed no BENCH line")
        out.append(float(r.bench["median_step_s"]))
    return out


# -- formatting ---------------------------------------------------------------------


def fmt_time(seconds: float) -> str:
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if abs(seconds) < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_signed_us(seconds: float) -> str:
    return f"{seconds * 1e6:+.1f} us"


def table(headers: list[str], rows: list[list[str]], right: set[int]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def step_rows(step_results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in step_results:
        s = r["stats"]
        seen = r["perfrun_steps"]
        rows.append(
            [
                r["label"],
                r["mode"],
                fmt_time(s["plain_median"]),
                fmt_time(s["perfrun_median"]),
                f"{s['ratio_median']:.3f}",
                f"{s['ratio_min']:.3f}-{s['ratio_max']:.3f}",
                f"{(s['ratio_median'] - 1) * 100:+.2f}%",
                fmt_signed_us(s["diff_median"]),
                "?"
                if seen is None
                else f"{min(seen)}-{max(seen)}"
                if min(seen) != max(seen)
                else str(seen[0]),
            ]
        )
    return rows


def startup_rows(startup: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in startup:
        s = r["stats"]
        rows.append(
            [
                r["script"],
                r["mode"],
                f"{s['plain_median'] * 1e3:.0f} ms",
                f"{s['perfrun_median'] * 1e3:.0f} ms",
                f"{s['diff_median'] * 1e3:+.0f} ms",
                f"{s['diff_min'] * 1e3:+.0f} to {s['diff_max'] * 1e3:+.0f} ms",
            ]
        )
    return rows


def verdicts(step_results: list[dict[str, Any]], startup: list[dict[str, Any]]) -> list[dict]:
    """Each target: the measured median, the limit, pass or fail, and whether
    the pairs themselves fall on both sides of the limit (too noisy to tell)."""
    out = []
    by_key = {(r["workload"], r["mode"]): r for r in step_results}
    for name, mode, unit, limit in TARGETS:
        r = by_key.get((name, mode))
        if r is None:
            continue
        s = r["stats"]
        if unit == "us":
            value, lo, hi = (s[k] * 1e6 for k in ("diff_median", "diff_min", "diff_max"))
            text = f"{value:+.1f} us/step (limit {limit:g} us)"
        else:
            value, lo, hi = ((s[k] - 1) * 100 for k in ("ratio_median", "ratio_min", "ratio_max"))
            text = f"{value:+.2f}% step time (limit {limit:g}%)"
        out.append(_verdict(f"{mode} on {r['label']}", text, value, lo, hi, limit))
    for r in startup:
        if r["script"] == "noop.py" and r["mode"] == "timer-only":
            s = r["stats"]
            value, lo, hi = (s[k] * 1e3 for k in ("diff_median", "diff_min", "diff_max"))
            text = f"{value:+.0f} ms per run (limit {STARTUP_LIMIT_MS:g} ms)"
            out.append(
                _verdict("launcher start-up (noop.py)", text, value, lo, hi, STARTUP_LIMIT_MS)
            )
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


# -- main ------------------------------------------------------------------------------


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure what perfrun adds to a training step and to start-up.",
        epilog="Exit status: 0 when every run completed (whatever the verdicts), 1 when a "
        "run failed.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Fewer steps and 3 pairs; --scheduler only on (b). About 3 minutes on 2 cores.",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="Pairs per configuration (default 7, or 3 with --quick).",
    )
    parser.add_argument(
        "--json",
        metavar="OUT",
        default="bench_overhead.json",
        help="Where the JSON results go (default %(default)s; - for stdout).",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(w.name for w in WORKLOADS),
        help="Comma-separated subset of: %(default)s.",
    )
    parser.add_argument(
        "--no-startup", action="store_true", help="Skip the launcher start-up measurements."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="Print each command.")
    args = parser.parse_args(argv)
    if args.pairs is None:
        args.pairs = 3 if args.quick else 7
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    known = {w.name for w in WORKLOADS}
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)} (known: {', '.join(known)})")
    args.workloads = wanted
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    started = time.time()
    load_start = _loadavg()
    workdir = tempfile.mkdtemp(prefix="perfrun-bench-")
    runner = Runner(workdir, args.verbose)
    step_results: list[dict[str, Any]] = []
    startup: list[dict[str, Any]] = []
    notes: set[str] = set()
    torch_version = None
    try:
        for wl in (w for w in WORKLOADS if w.name in args.workloads):
            steps = wl.quick_steps if args.quick else wl.steps
            wl_args = [str(steps), str(wl.warmup)]
            modes = [
                m
                for m in MODES
                if not (args.quick and m == "scheduler" and wl.name != "small_transformer")
            ]
            collected: dict[str, tuple[list[RunResult], list[RunResult]]] = {
                m: ([], []) for m in modes
            }
            # Rounds over the modes, so each mode's pairs spread over the same
            # period; odd rounds run perfrun first, so drift favours neither side.
            for i in range(args.pairs):
                for mode in modes:
                    a, b = run_pair(
                        runner,
                        wl.script,
                        wl_args,
                        mode_options(mode, wl, steps),
                        perfrun_first=i % 2 == 1,
                    )
                    collected[mode][0].append(a)
                    collected[mode][1].append(b)
                    _progress(f"{wl.label} {mode}: pair {i + 1}/{args.pairs}")
            for mode in modes:
                plain, prof = collected[mode]
                a = bench_step_times(plain, wl.script)
                b = bench_step_times(prof, wl.script)
                torch_version = torch_version or plain[0].bench.get("torch")  # type: ignore[union-attr]
                seen = [r.perfrun["steps"] for r in prof if r.perfrun]
                for r in prof:
                    if r.perfrun:
                        notes.update(r.perfrun["notes"])
                        for f in r.perfrun["faults"]:
                            notes.add(f"perfrun fault in {f.get('where')}: {f.get('error')}")
                step_results.append(
                    {
                        "workload": wl.name,
                        "label": wl.label,
                        "mode": mode,
                        "options": mode_options(mode, wl, steps),
                        "steps": steps,
                        "warmup": wl.warmup,
                        "plain_step_s": a,
                        "perfrun_step_s": b,
                        "plain_mean_step_s": [r.bench["mean_step_s"] for r in plain],  # type: ignore[index]
                        "perfrun_mean_step_s": [r.bench["mean_step_s"] for r in prof],  # type: ignore[index]
                        "perfrun_steps": seen or None,
                        "stats": pair_stats(a, b),
                    }
                )
        if not args.no_startup:
            startup_cases = [
                ("noop.py", "timer-only", max(5, 3 * args.pairs)),
                ("torch_import.py", "timer-only", args.pairs),
                ("torch_import.py", "default", args.pairs),
            ]
            for script_name, mode, pairs in startup_cases:
                script = os.path.join(WORKLOAD_DIR, script_name)
                plain, prof = [], []
                for i in range(pairs):
                    a1, b1 = run_pair(
                        runner, script, [], mode_options(mode, None, 0), perfrun_first=i % 2 == 1
                    )
                    plain.append(a1)
                    prof.append(b1)
                _progress(f"start-up {script_name} {mode}: {pairs} pairs")
                a = [r.wall_s for r in plain]
                b = [r.wall_s for r in prof]
                startup.append(
                    {
                        "script": script_name,
                        "mode": mode,
                        "plain_wall_s": a,
                        "perfrun_wall_s": b,
                        "stats": pair_stats(a, b),
                    }
                )
    except BenchError as exc:
        print(f"bench_overhead: a run failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    checks = verdicts(step_results, startup)
    elapsed = time.time() - started
    header = (
        f"perfrun overhead ({'quick, ' if args.quick else ''}{args.pairs} pairs per "
        f"configuration; python {platform.python_version()}, torch {torch_version or '?'}, "
        f"{os.cpu_count()} CPUs; load average {_fmt_load(load_start)} at start, "
        f"{_fmt_load(_loadavg())} at end; {elapsed / 60:.1f} min)"
    )
    print(header)
    if step_results:
        print(
            "\nStep time as each workload measures it (median of its steady-state steps; "
            "medians over pairs)"
        )
        print(
            table(
                [
                    "workload",
                    "mode",
                    "python",
                    "perfrun",
                    "ratio",
                    "ratio range",
                    "overhead",
                    "per step",
                    "perfrun steps",
                ],
                step_rows(step_results),
                right={2, 3, 4, 5, 6, 7, 8},
            )
        )
    if startup:
        print("\nLauncher start-up: wall time of a whole run (medians over pairs)")
        print(
            table(
                ["script", "mode", "python", "perfrun", "added", "added range"],
                startup_rows(startup),
                right={2, 3, 4, 5},
            )
        )
    if checks:
        print("\nTargets")
        for c in checks:
            mark = "PASS" if c["pass"] else "FAIL"
            extra = "  (pairs on both sides of the limit: noisy)" if c["noisy"] else ""
            print(f"  [{mark}] {c['target']}: {c['text']}{extra}")
    print("\nNotes")
    print("  - ratio = perfrun step / python step of adjacent runs; per step = the difference.")
    if any(r["mode"] == "scheduler" for r in step_results):
        print(f"  - {SCHEDULER_NOTE}")
    for note in sorted(notes):
        print(f"  - perfrun: {note}")

    doc = {
        "benchmark": "perfrun-overhead",
        "version": 1,
        "quick": args.quick,
        "pairs": args.pairs,
        "started_unix": started,
        "elapsed_s": round(elapsed, 1),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch_version,
            "loadavg_start": load_start,
            "loadavg_end": _loadavg(),
        },
        "steps": step_results,
        "startup": startup,
        "targets": checks,
        "notes": [SCHEDULER_NOTE, *sorted(notes)],
    }
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
