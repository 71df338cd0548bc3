"""What does the FLOP-counted step cost the first time torch's counter is
used in a process, and what of it does perfrun no longer pay?

    python scripts/bench_flops_firstuse.py [--pairs N] [--workloads reg,mlp,cnn,transformer]

Each workload is a training step as tutorials write it:

* `reg`: the polynomial regression of PyTorch's "Learning PyTorch with
  Examples" (nn.Sequential, MSELoss, parameters updated by hand: no
  torch.optim optimizer);
* `mlp`: an MLP regression on 13 features, Adam;
* `cnn`: the PyTorch MNIST example's network on MNIST-shaped tensors
  (batch 64), Adadelta;
* `transformer`: a 2-layer nn.TransformerEncoder (d_model 64, 4 heads) over
  16 x 32 tokens with an embedding and a head, AdamW.

Each run is a fresh interpreter (the first use is what is measured): it
times 5 plain steps, then the pieces of perfrun's counting (importing
`torch.utils.flop_counter`, perfrun's `custom_mapping`), then one step under
the counter, cold, then one more, warm. Arm `torch` enters FlopCounterMode
as torch ships it; arm `perfrun` enters it through perfrun's
`counting_mode` (runtime/flops.py). The two arms run in adjacent pairs
whose order alternates, so a drift of the machine favours neither.

Per workload and arm, the median over pairs (and the range) of the counted
step's extra cost over the median plain step, in the script thread's CPU
time (what a busy machine stretches least) and in wall time; and whether
Dynamo was imported before the counted step (making a torch.optim optimizer
imports it). Needs perfrun importable and torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

WORKLOAD = r'''
import json, statistics, sys, time
import torch
from torch import nn
import torch.nn.functional as F
which, arm = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(1)
if which == "reg":
    x = torch.linspace(-3.14159, 3.14159, 2000)
    target = torch.sin(x)
    inputs = x.unsqueeze(-1).pow(torch.tensor([1, 2, 3]))
    model = nn.Sequential(nn.Linear(3, 1), nn.Flatten(0, 1))
    loss_fn = nn.MSELoss(reduction="sum")
    optimizer = None
elif which == "mlp":
    inputs, target = torch.randn(64, 13), torch.randn(64, 1)
    model = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
elif which == "cnn":
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
            self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
            self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)
        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
            return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)
    inputs, target = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    model = Net()
    loss_fn = F.nll_loss
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
else:
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1000, 64)
            layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=256, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, num_layers=2)
            self.head = nn.Linear(64, 1000)
        def forward(self, x):
            return self.head(self.enc(self.emb(x))).view(-1, 1000)
    inputs = torch.randint(0, 1000, (16, 32))
    target = inputs.view(-1)
    model = LM()
    loss_fn = F.cross_entropy
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

def step():
    if optimizer is not None:
        optimizer.zero_grad()
    loss = loss_fn(model(inputs), target)
    if optimizer is None:
        model.zero_grad()
    loss.backward()
    if optimizer is None:
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-6 * p.grad
    else:
        optimizer.step()

def timed(fn):
    c, w = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - c, time.perf_counter() - w

plain = [timed(step) for _ in range(6)][1:]
out = {"plain_cpu": statistics.median(p[0] for p in plain),
       "plain_wall": statistics.median(p[1] for p in plain),
       "dynamo_before": "torch._dynamo" in sys.modules}
holder = {}
def imports():
    import torch.utils.flop_counter
    from perfrun.runtime.flops import custom_mapping
    holder["mapping"] = custom_mapping(torch)
out["setup_cpu"], out["setup_wall"] = timed(imports)
from torch.utils.flop_counter import FlopCounterMode
from perfrun.runtime.flops import _Flat, counting_mode

def counted():
    if arm == "torch":
        mode = FlopCounterMode(display=False, custom_mapping=holder["mapping"])
        mode.mod_tracker = _Flat()
        mode.__enter__()
        undo = None
    else:
        mode, undo = counting_mode(holder["mapping"])
    try:
        step()
    finally:
        mode.__exit__(None, None, None)
        if undo is not None:
            undo()
    holder["flops"] = mode.get_total_flops()

out["cold_cpu"], out["cold_wall"] = timed(counted)
out["warm_cpu"], out["warm_wall"] = timed(counted)
out["flops"] = holder["flops"]
out["dynamo_after"] = "torch._dynamo" in sys.modules
print("BENCH " + json.dumps(out), flush=True)
'''

WORKLOADS = ("reg", "mlp", "cnn", "transformer")
ARMS = ("torch", "perfrun")


def run_one(workload: str, arm: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", WORKLOAD, workload, arm],
                          capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    raise RuntimeError(f"{workload}/{arm}: no BENCH line\n{proc.stdout}\n{proc.stderr}")


def ms(values: list[float]) -> str:
    return (f"{statistics.median(values) * 1e3:9.1f} ms "
            f"({min(values) * 1e3:.1f} to {max(values) * 1e3:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    results: dict[tuple[str, str], list[dict]] = {}
    for k in range(args.pairs):
        for w in workloads:
            order = ARMS if k % 2 == 0 else ARMS[::-1]
            for arm in order:
                results.setdefault((w, arm), []).append(run_one(w, arm))
        print(f"pair {k + 1} of {args.pairs} done", file=sys.stderr, flush=True)
    print(f"{args.pairs} pairs; extra cost of the first counted step over the median plain "
          "step, median over runs (range)")
    for w in workloads:
        for arm in ARMS:
            rs = results[(w, arm)]
            flops = {r["flops"] for r in rs}
            print(f"{w:12} {arm:8} plain step {ms([r['plain_cpu'] for r in rs])} CPU; "
                  f"Dynamo imported before: {rs[0]['dynamo_before']}, after: "
                  f"{rs[0]['dynamo_after']}; FLOPs {sorted(flops)}")
            print(f"{'':21} counted step, cold: +{ms([r['cold_cpu'] - r['plain_cpu'] for r in rs])}"
                  f" CPU, +{ms([r['cold_wall'] - r['plain_wall'] for r in rs])} wall")
            print(f"{'':21} counted step, warm: +{ms([r['warm_cpu'] - r['plain_cpu'] for r in rs])}"
                  f" CPU; import and formulas {ms([r['setup_cpu'] for r in rs])} CPU")


if __name__ == "__main__":
    main()
