"""Is the DataLoader advice right when followed? Predicted against measured.

    python scripts/bench_pipeline.py [--pairs N] [--steps N] [--json OUT]

For each loop of scripts/workloads/decode_loader.py (a dataset that decodes
and augments each sample, at two costs; a small one beside a larger model;
an in-memory TensorDataset, without workers and with two), it runs the loop
under perfrun and reads the I/O-bound advice from the JSON report: which
change it recommends (num_workers=N, num_workers=0, indexing a whole batch
at once, or none) and the step it predicts. It then runs the loop as plain
`python` with and without that change, in adjacent pairs (the order
alternating, so a drift of the machine favours neither), and reports per
loop: the step without the change, the step the advice predicted, the step
measured with the change, and the predicted and measured gains. Where the
advice recommends no workers, the change measured is num_workers=2
anyway: what the advice says would not pay, measured.

Each step is the loop's own stopwatch (its median steady step, on its
BENCH line), never perfrun's figure. Public tools only: python, perfrun,
torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "decode_loader.py")

#: (name, the loop's arguments): loops whose making a batch and computing a
#: step differ.
CASES = (
    ("decode, 20 flips", ["--flips", "20"]),
    ("decode, 60 flips", ["--flips", "60"]),
    ("decode, 5 flips, larger model", ["--flips", "5", "--hidden", "1024"]),
    ("in-memory TensorDataset", ["--in-memory", "--batch", "64"]),
    ("in-memory, 2 workers", ["--in-memory", "--batch", "64", "--workers", "2"]),
)


def bench_line(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[len("BENCH "):])  # type: ignore[no-any-return]
    raise RuntimeError(f"no BENCH line in:\n{output[-2000:]}")


def plain(args: list[str], steps: int) -> float:
    """The loop's median step, as plain python."""
    proc = subprocess.run([sys.executable, WORKLOAD, str(steps), "10", *args],
                          capture_output=True, text=True, timeout=600, check=True)
    return float(bench_line(proc.stdout)["median_step_s"])


def advice(args: list[str], steps: int, work: str) -> dict[str, Any]:
    """The I/O-bound advice perfrun gives the loop with num_workers=0."""
    out = os.path.join(work, f"report-{len(os.listdir(work))}.json")
    subprocess.run([sys.executable, "-m", "perfrun", "-q", "--log-dir", os.path.join(work, "log"),
                    "--format", "json", "--output", out, WORKLOAD, str(steps), "10", *args],
                   capture_output=True, text=True, timeout=600, check=True)
    with open(out, encoding="utf-8") as f:
        report = json.load(f)
    found = [a for a in report["advice"] if a["kind"] == "io-bound"]
    return found[0] if found else {}


def change_of(found: dict[str, Any]) -> tuple[list[str], Optional[float], str]:
    """The change the advice recommends (as the loop's arguments), the step
    it predicts, and how it reads."""
    pipeline = (found.get("evidence") or {}).get("pipeline") or {}
    actions = found.get("actions") or []
    prediction = pipeline.get("workers_prediction") or {}
    if any(a.startswith("num_workers=") for a in actions) and prediction:
        workers = int(prediction["num_workers"])
        return ["--workers", str(workers)], float(prediction["step"]), f"num_workers={workers}"
    if any(a.startswith("num_workers=0:") for a in actions):
        step = (pipeline.get("no_workers_prediction") or {}).get("step")
        return ["--workers", "0"], step, "num_workers=0"
    if any(a.startswith("index a whole batch") for a in actions):
        estimate = pipeline.get("batched_fetch_estimate")
        step = None
        if estimate is not None:
            fetch, compute = pipeline.get("fetch"), pipeline.get("compute")
            stages = pipeline.get("stages") or {}
            made = (stages.get("dataset") or 0.0) + (stages.get("collate") or 0.0)
            step = compute + estimate + fetch - made
        return ["--batched"], step, "a whole batch indexed at once"
    return ["--workers", "2"], None, "num_workers=2 (not recommended)"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--json", metavar="OUT", default=None)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="perfrun-pipeline-") as work:
        for name, case in CASES:
            found = advice(case, args.steps, work)
            change, predicted, what = change_of(found)
            before, after = [], []
            for i in range(args.pairs):
                order = [(before, case), (after, case + change)]
                for into, argv_ in (order if i % 2 == 0 else order[::-1]):
                    into.append(plain(argv_, args.steps))
            base, changed = statistics.median(before), statistics.median(after)
            row = {"loop": name, "change": what, "step": base, "predicted": predicted,
                   "measured": changed, "predicted_gain": (base - predicted)
                   if predicted is not None else None, "measured_gain": base - changed,
                   "actions": found.get("actions") or []}
            results.append(row)
            print(f"{name}: {what}: step {base * 1e3:.2f} ms -> measured {changed * 1e3:.2f} ms"
                  + (f", predicted {predicted * 1e3:.2f} ms" if predicted is not None else ""),
                  flush=True)
    print()
    print(f"{'loop':32} {'change':34} {'step':>8} {'predicted':>10} {'measured':>9} "
          f"{'gain pred.':>10} {'gain meas.':>10}")
    for r in results:
        pred = f"{r['predicted'] * 1e3:.2f}" if r["predicted"] is not None else "-"
        gain = f"{r['predicted_gain'] * 1e3:+.2f}" if r["predicted_gain"] is not None else "-"
        print(f"{r['loop']:32} {r['change']:34} {r['step'] * 1e3:8.2f} {pred:>10} "
              f"{r['measured'] * 1e3:9.2f} {gain:>10} {r['measured_gain'] * 1e3:+10.2f}")
    print("(ms per step, the loop's own median; gain: step without the change less with it)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
