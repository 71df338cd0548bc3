"""How often does the gate cry wolf on this machine?

    python scripts/gate_false_alarm.py [--runs N] [--steps N] [--max-regression PCT]
                                       [--script FILE [ARGS...]] [--json OUT] [--keep DIR]

Runs one workload N times under `perfrun --timer-only` (default: a small CPU
training loop fed by a DataLoader, 150 steps, one thread), then gates every
ordered pair of runs (i, j), i != j, with run i as the baseline and run j as
the current run, through the same API `perfrun compare` uses
(perfrun.store.baseline.load and perfrun.analysis.compare.compare_runs). Every run is the
same workload, so every FAIL is a false alarm. It prints the number of pairs,
the FAIL, INCONCLUSIVE and PASS counts and the false-alarm rate; --json
writes the same figures with each run's median step time and each pair's
verdict and interval.

Runs follow one another, so a machine whose speed drifts over minutes
(thermal state, a neighbour's load) shows up here as it would between a CI
job's baseline and its current run. Close other work first if the figure is
meant to describe the machine rather than its load at the moment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from perfrun.analysis.build import build_report
from perfrun.analysis.compare import compare_runs
from perfrun.analysis.gate import Verdict
from perfrun.settings import parse_threshold
from perfrun.store.baseline import load
from perfrun.store.results import RunResults

#: The default workload, written to a temporary file: a small MLP trained on
#: CPU from a DataLoader, one optimizer step per batch.
WORKLOAD = """\
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 150
torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(steps * 64, 32)
y = x.sum(dim=1, keepdim=True)
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for xb, yb in loader:
    loss = F.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"loss {loss.item():.4f}")
"""


def run_once(target: list[str], log_dir: str, timeout: float) -> RunResults:
    """One `perfrun --timer-only` run of the workload, read back."""
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "perfrun", "--timer-only", "--log-dir", log_dir, *target]
    proc = subprocess.run(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-5:]
        raise SystemExit(
            f"gate_false_alarm: {' '.join(cmd)} exited {proc.returncode}:\n" + "\n".join(tail)
        )
    return load(log_dir)


def median_step(run: RunResults) -> Optional[float]:
    """The run's median steady-state step time, as its Perf Summary gives it."""
    perf = build_report(run).perf
    return perf.batch_cost.median if perf is not None else None


def measure(args: argparse.Namespace, work: str) -> dict[str, Any]:
    threshold = parse_threshold(args.max_regression)
    if args.script:
        target = list(args.script)
    else:
        path = os.path.join(work, "gate_workload.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(WORKLOAD)
        target = [path, str(args.steps)]

    runs: list[RunResults] = []
    for i in range(args.runs):
        started = time.monotonic()
        runs.append(run_once(target, os.path.join(work, f"run{i}"), args.timeout))
        median = median_step(runs[-1])
        shown = f"{median * 1e3:.3f} ms" if median is not None else "no measurement"
        print(
            f"run {i + 1}/{args.runs}: median step {shown} ({time.monotonic() - started:.1f} s)",
            flush=True,
        )

    counts = {v.value: 0 for v in Verdict}
    problems = 0
    pairs: list[dict[str, Any]] = []
    for i, base in enumerate(runs):
        for j, current in enumerate(runs):
            if i == j:
                continue
            comparison = compare_runs(base, current, threshold)
            gate = comparison.gate
            if gate is None:
                problems += 1
                pairs.append({"baseline": i, "current": j, "problem": comparison.problem})
                continue
            counts[gate.verdict.value] += 1
            pairs.append({"baseline": i, "current": j, **gate.to_dict()})

    # The same, with baselines of several runs (what repeated --save-baseline
    # builds): each run against the K runs that follow it, cyclically.
    k = min(args.baseline_runs, len(runs) - 1)
    pooled = {v.value: 0 for v in Verdict}
    pooled_pairs: list[dict[str, Any]] = []
    if k >= 2:
        for j, current in enumerate(runs):
            members = [(j + 1 + m) % len(runs) for m in range(k)]
            comparison = compare_runs(
                runs[members[0]],
                current,
                threshold,
                base_history=[runs[m] for m in members[1:]],
            )
            if comparison.gate is not None:
                pooled[comparison.gate.verdict.value] += 1
                pooled_pairs.append(
                    {"baseline": members, "current": j, **comparison.gate.to_dict()}
                )

    decided = len(pairs) - problems
    fails = counts[Verdict.FAIL.value]
    return {
        "format": "perfrun-gate-false-alarm",
        "version": 1,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "workload": target if args.script else ["(built-in)", str(args.steps)],
        "runs": args.runs,
        "threshold": threshold,
        "median_step_s": [median_step(r) for r in runs],
        "pairs": len(pairs),
        "fail": fails,
        "inconclusive": counts[Verdict.INCONCLUSIVE.value],
        "pass": counts[Verdict.PASS.value],
        "no_measurement": problems,
        "false_alarm_rate": fails / decided if decided else None,
        "pair_results": pairs,
        "baseline_runs": k if k >= 2 else None,
        "pooled": {
            "comparisons": len(pooled_pairs),
            "fail": pooled[Verdict.FAIL.value],
            "inconclusive": pooled[Verdict.INCONCLUSIVE.value],
            "pass": pooled[Verdict.PASS.value],
            "false_alarm_rate": (
                pooled[Verdict.FAIL.value] / len(pooled_pairs) if pooled_pairs else None
            ),
            "results": pooled_pairs,
        },
    }


def print_summary(result: dict[str, Any]) -> None:
    medians = [m for m in result["median_step_s"] if m is not None]
    print()
    print(f"threshold:          {result['threshold'] * 100:g}%")
    if medians:
        spread = (max(medians) / min(medians) - 1.0) * 100 if min(medians) > 0 else float("nan")
        print(
            f"median step:        {statistics.median(medians) * 1e3:.3f} ms over the runs "
            f"(slowest run {spread:+.1f}% over the fastest)"
        )
    print(f"pairs:              {result['pairs']}")
    print(f"FAIL (false alarm): {result['fail']}")
    print(f"INCONCLUSIVE:       {result['inconclusive']}")
    print(f"PASS:               {result['pass']}")
    if result["no_measurement"]:
        print(f"no measurement:     {result['no_measurement']}")
    rate = result["false_alarm_rate"]
    print(
        "false-alarm rate:   "
        + (f"{rate * 100:.1f}% ({result['fail']}/{result['pairs']})" if rate is not None else "-")
    )
    pooled = result.get("pooled") or {}
    if pooled.get("comparisons"):
        rate = pooled["false_alarm_rate"]
        print(
            f"\nwith baselines of {result['baseline_runs']} runs (repeated --save-baseline): "
            f"{pooled['comparisons']} comparisons, FAIL {pooled['fail']}, INCONCLUSIVE "
            f"{pooled['inconclusive']}, PASS {pooled['pass']}, false-alarm rate "
            f"{rate * 100:.1f}%"
        )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [options] [--script FILE [ARGS...]]",
    )
    parser.add_argument("--runs", type=int, default=10, help="runs of the workload (default 10)")
    parser.add_argument(
        "--steps", type=int, default=150, help="steps of the built-in workload (default 150)"
    )
    parser.add_argument(
        "--max-regression", default="5%", metavar="PCT", help="gate threshold (default 5%%)"
    )
    parser.add_argument(
        "--script",
        nargs=argparse.REMAINDER,
        metavar="FILE [ARGS...]",
        help="profile this script instead of the built-in workload (must come last)",
    )
    parser.add_argument(
        "--baseline-runs",
        type=int,
        default=3,
        metavar="K",
        help="also gate each run against baselines of K other runs (default 3)",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' results in DIR")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one run may take (default 600)"
    )
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be at least 2 (pairs of runs are gated)")
    try:
        parse_threshold(args.max_regression)
    except ValueError as exc:
        parser.error(str(exc))
    if args.script is not None and not args.script:
        parser.error("--script needs a file")

    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        result = measure(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="perfrun-false-alarm-") as work:
            result = measure(args, work)
    print_summary(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
