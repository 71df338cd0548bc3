"""How often is a quiet run flagged as disturbed, and is a busy one caught?

    python scripts/host_load_false_alarm.py [--quiet N] [--busy N] [--steps N]
                                            [--spinners K] [--wait-quiet S] [--json OUT]

Runs tests/scripts/gate_train.py (a small CPU training loop) under
`perfrun --timer-only`: N quiet runs, where any host flag is a false alarm,
then N runs with K busy processes (a Python spin loop each; default one per
core) started beside, where the `host_cpu_others` flag must be raised.
Prints the false-alarm rate, the detection rate, the "other processes"
figure of every run, and the sampler's own cost per sample; --json writes
each run's evidence.

A quiet run is one nothing else was started beside. On a machine shared
with other work, that work is a real disturbance and the flag rightly sees
it, so this script measures the background itself, independently of
perfrun (psutil, every half second during the run: the machine's busy CPU
less this script's whole process tree), and counts a flag as a false alarm
only on a run whose background was truly quiet (under `--quiet-below`
cores, default 0.25, half the flag's threshold). Runs with background
between that and the threshold, or above it, are reported apart.
`--wait-quiet S` waits up to S seconds before each quiet run for the
machine to pause (under a quarter of its CPU busy over a second). The
thresholds are those of perfrun/analysis/disturbed.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

from perfrun.analysis.disturbed import flags_of
from perfrun.store.results import read_run, resolve_run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "gate_train.py")
SPIN = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"


def background(seconds: float = 1.0) -> float:
    """The machine's busy CPU, in cores, over `seconds` before a run."""
    return psutil.cpu_percent(interval=seconds) / 100.0 * (os.cpu_count() or 1)


def wait_quiet(limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and psutil.cpu_percent(interval=1.0) > 25:
        pass


class Background:
    """The machine's CPU used by processes outside this script's tree, in
    cores on average, measured with psutil alone (not perfrun's code)."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _tree_cpu() -> float:
        me = psutil.Process()
        total = 0.0
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue
        return total

    def _point(self) -> None:
        t = psutil.cpu_times()
        self.points.append((time.monotonic(), t.user + t.nice + t.system, self._tree_cpu()))

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._point()

    def __enter__(self) -> Background:
        self._point()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._point()

    def cores(self) -> float:
        (t0, b0, j0), (t1, b1, j1) = self.points[0], self.points[-1]
        return max(0.0, ((b1 - b0) - (j1 - j0)) / (t1 - t0)) if t1 > t0 else 0.0


def one_run(steps: int, spinners: int) -> dict[str, Any]:
    """One run under perfrun, with `spinners` busy processes beside it."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(spinners)]
    background = Background()
    try:
        with tempfile.TemporaryDirectory() as log:
            args = [sys.executable, "-m", "perfrun", "--log-dir", log, "--timer-only", "-q",
                    "--format", "json", "--output", os.devnull, SCRIPT, "--steps", str(steps)]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            with background:
                done = subprocess.run(args, capture_output=True, text=True, env=env,
                                      timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-2000:]}")
            run = read_run(resolve_run_dir(log))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    ev = run.meta.get("host_load") or {}
    # The spinners are this script's children: outside the job, but inside
    # this script's tree, so they are added back.
    measured = background.cores()
    return {"evidence": ev, "flags": [f.to_dict() for f in flags_of(run)],
            "independent_other_cores": measured if not spinners else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quiet", type=int, default=10, help="quiet runs")
    parser.add_argument("--busy", type=int, default=3, help="runs with busy processes beside")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--spinners", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="S")
    parser.add_argument("--quiet-below", type=float, default=0.25, metavar="CORES")
    parser.add_argument("--json", default=None, metavar="OUT")
    args = parser.parse_args()

    results: dict[str, list[dict[str, Any]]] = {"quiet": [], "busy": []}
    for kind, count, spinners in (("quiet", args.quiet, 0), ("busy", args.busy, args.spinners)):
        for i in range(count):
            if kind == "quiet" and args.wait_quiet:
                wait_quiet(args.wait_quiet)
            before = background()
            out = one_run(args.steps, spinners)
            out["background_before_cores"] = before
            results[kind].append(out)
            ev = out["evidence"]
            kinds = [f["kind"] for f in out["flags"]]
            measured = out["independent_other_cores"]
            also = f", measured apart {measured:.2f}" if measured is not None else ""
            print(f"{kind} {i + 1}/{count}: other processes {ev.get('other_cores', 0):.2f} "
                  f"cores{also} (peak {ev.get('other_cores_max') or 0:.2f}), job "
                  f"{ev.get('job_cores') or 0:.2f}, steal "
                  f"{100 * (ev.get('steal_fraction') or 0):.1f}%,"
                  f" background before {before:.2f} cores; flags: {kinds or 'none'}", flush=True)

    def host_flagged(r: dict[str, Any]) -> bool:
        return any(f["kind"].startswith("host_") for f in r["flags"])

    quiet, busy = results["quiet"], results["busy"]
    if quiet:
        calm = [r for r in quiet if r["independent_other_cores"] < args.quiet_below]
        alarms = sum(host_flagged(r) for r in calm)
        rate = f"{100 * alarms / len(calm):.0f}%" if calm else "n/a"
        print(f"false alarms: {alarms} of {len(calm)} quiet runs whose background, measured "
              f"apart, was under {args.quiet_below} cores ({rate})")
        loaded = [r for r in quiet if r not in calm]
        if loaded:
            seen = sum(host_flagged(r) for r in loaded)
            print(f"runs with no spinner but other work on the machine (background "
                  f"{min(r['independent_other_cores'] for r in loaded):.2f}-"
                  f"{max(r['independent_other_cores'] for r in loaded):.2f} cores): "
                  f"{seen} of {len(loaded)} flagged")
        others = [r["evidence"].get("other_cores") or 0.0 for r in quiet]
        print(f"quiet runs' other processes: median {statistics.median(others):.3f} cores, "
              f"max {max(others):.3f}")
    if busy:
        caught = sum(any(f["kind"] == "host_cpu_others" for f in r["flags"]) for r in busy)
        print(f"detected: {caught} of {len(busy)} busy runs ({100 * caught / len(busy):.0f}%)")
    costs = [r["evidence"].get("sample_cost") or {} for r in quiet + busy]
    cpu = [c["cpu_seconds_avg"] for c in costs if c.get("cpu_seconds_avg") is not None]
    wall = [c["wall_seconds_avg"] for c in costs if c.get("wall_seconds_avg") is not None]
    if cpu:
        print(f"sampler cost per sample (one a second): CPU {statistics.median(cpu) * 1e3:.2f} ms, "
              f"wall {statistics.median(wall) * 1e3:.2f} ms (medians over runs; "
              f"{psutil.cpu_count()} cores, {len(psutil.pids())} processes)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
