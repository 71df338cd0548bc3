"""How often does the culprit decision name a straggler in a healthy run, and
how close is the time it gives a real one?

    python scripts/straggler_false_alarm.py [--healthy N] [--faulty N] [--steps N]
                                            [--delay S] [--nproc N] [--json OUT]

Runs tests/scripts/straggler_ddp.py (a small DDP loop on gloo, CPU) under
`perfrun --timer-only --nproc-per-node NPROC`: N healthy runs, where every
named culprit is a false alarm, then N runs with the last rank's DataLoader
and N with its forward made slower by --delay seconds a step, where the
culprit must be that rank and phase and its loss per step is compared with
the delay. Prints the false-alarm rate, the misses and the loss's error
(median and worst, in percent of the delay); --json writes each run's verdict.

The thresholds are those of perfrun/analysis/straggler.py (a culprit is late
by at least 5% of the median step and 1 ms, in at least 60% of the steps).
The machine's own load shows up here: run it on a quiet machine for a figure
that describes perfrun rather than the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Optional

from perfrun.analysis.build import build_report
from perfrun.store.results import read_run, resolve_run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "straggler_ddp.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(nproc: int, steps: int, fault: Optional[str], delay: float) -> dict[str, Any]:
    """One run under perfrun; its straggler verdict as a dict."""
    with tempfile.TemporaryDirectory() as log:
        args = [sys.executable, "-m", "perfrun", "--log-dir", log, "--nproc-per-node",
                str(nproc), "--master-port", str(_port()), "--timer-only", "-q",
                "--format", "json", "--output", os.devnull, SCRIPT, "--steps", str(steps)]
        if fault:
            args += ["--slow-rank", str(nproc - 1), "--slow-phase", fault, "--delay", str(delay)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        report = build_report(read_run(resolve_run_dir(log, note=None)))
        verdict = report.ranks.straggler if report.ranks is not None else None
        return verdict.to_dict() if verdict is not None else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--healthy", type=int, default=20)
    parser.add_argument("--faulty", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--delay", type=float, default=0.04)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--json", default=None)
    a = parser.parse_args()

    healthy = [one_run(a.nproc, a.steps, None, a.delay) for _ in range(a.healthy)]
    alarms = sum(1 for v in healthy if v.get("culprit") is not None)
    print(f"healthy runs: {len(healthy)}, culprit named in {alarms} "
          f"(false-alarm rate {alarms / max(1, len(healthy)):.1%})")
    # The margin: the largest loss a healthy run showed against its threshold.
    margins = [(v.get("loss", 0.0), max(v["thresholds"]["min_share"] * v["step_median"],
                                         v["thresholds"]["min_seconds"]))
               for v in healthy if v]
    if margins:
        loss, floor = max(margins)
        print(f"largest healthy loss {loss * 1e3:.3f} ms a step (threshold {floor * 1e3:.3f} ms)")
    out: dict[str, Any] = {"healthy": healthy, "faulty": {}}
    for phase in ("dataloader", "forward"):
        runs = [one_run(a.nproc, a.steps, phase, a.delay) for _ in range(a.faulty)]
        out["faulty"][phase] = runs
        hits = [v for v in runs
                if v.get("culprit") == a.nproc - 1 and v.get("culprit_phase") == phase]
        errors = [abs(v["phase_loss"] - a.delay) / a.delay * 100.0 for v in hits]
        line = f"{phase} slower by {a.delay * 1e3:.0f} ms: found {len(hits)} of {len(runs)}"
        if errors:
            line += (f"; loss per step error median {statistics.median(errors):.1f}%, "
                     f"worst {max(errors):.1f}%")
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
