"""What does logging perfrun's figures into the script's tracker cost the
training step?

    python scripts/bench_trackers.py [--pairs N] [--steps N] [--tracker tensorboard|mlflow]

A small classifier trains for --steps steps and logs its loss at every
step to its tracker (a TensorBoard SummaryWriter, or an MLflow run in a
local file store), as tutorials do; it times its own steps and prints the
median of its steady steps on a `BENCH {...}` line. It runs under perfrun
(the default mode) with the tracker figures on and with --no-tracker, in
adjacent pairs whose order alternates, so a slow drift of the machine
favours neither side. Per configuration: the median over pairs of the
difference in the script's median step (microseconds) and of the ratio,
with their range over pairs.

Configurations: `default` (N chosen by perfrun, a save every 2 s) and
`every-10` (a point every 10 steps and a save every 0.2 s: thousands of
points a second into the tracker, far more than perfrun ever chooses), the
flush thread's work pushed up so its cost, if any, shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKLOAD = r'''
import json, os, statistics, sys, time
import torch
import torch.nn.functional as F
from torch import nn
steps, tracker, where = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if tracker == "tensorboard":
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(where)
    log = lambda name, value, step: writer.add_scalar(name, value, step)
else:
    import mlflow
    mlflow.set_tracking_uri("file://" + where)
    mlflow.start_run()
    log = lambda name, value, step: mlflow.log_metric(name, value, step=step)
torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(4096, 64)
y = (x[:, :32].sum(dim=1) > 0).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32,
                                     shuffle=True)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
times, step = [], 0
while step < steps:
    for xb, yb in loader:
        t = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        log("loss", loss.item(), step)
        times.append(time.perf_counter() - t)
        step += 1
        if step == steps:
            break
if tracker == "tensorboard":
    writer.close()
else:
    mlflow.end_run()
print("BENCH " + json.dumps({"median_us": statistics.median(times[len(times) // 10:]) * 1e6}))
'''

CONFIGS = {
    "default": [],
    "every-10": ["--tracker-every", "10", "--flush-interval", "0.2"],
}


def run(options: list[str], script: str, steps: int, tracker: str, work: str) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_ALLOW_FILE_STORE="true")
    out = subprocess.run(
        [sys.executable, "-m", "perfrun", "-q", "--log-dir", os.path.join(work, "log"),
         "--keep", "2", *options, script, str(steps), tracker,
         # A folder of its own, not made yet: MLflow makes its file store.
         os.path.join(tempfile.mkdtemp(dir=work), "store")],
        env=env, capture_output=True, text=True, check=True, timeout=600)
    line = next(x for x in out.stdout.splitlines() if x.startswith("BENCH "))
    return float(json.loads(line[6:])["median_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--tracker", choices=("tensorboard", "mlflow"), default="tensorboard")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "workload.py")
        with open(script, "w") as f:
            f.write(WORKLOAD)
        for name, options in CONFIGS.items():
            diffs, ratios = [], []
            for i in range(args.pairs):
                sides = [options, ["--no-tracker", *options]]
                if i % 2:
                    sides.reverse()
                got = [run(side, script, args.steps, args.tracker, work) for side in sides]
                on, off = (got if i % 2 == 0 else got[::-1])
                diffs.append(on - off)
                ratios.append(on / off)
                print(f"  {name} pair {i + 1}: on {on:.1f} us, off {off:.1f} us", flush=True)
            print(f"{args.tracker} {name}: median step {statistics.median(diffs):+.1f} us "
                  f"(range {min(diffs):+.1f} .. {max(diffs):+.1f}), ratio "
                  f"{statistics.median(ratios):.4f} ({min(ratios):.4f} .. {max(ratios):.4f})",
                  flush=True)


if __name__ == "__main__":
    main()
