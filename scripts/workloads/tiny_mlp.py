"""Benchmark workload (a): a tiny MLP whose training step takes well under a
millisecond on CPU, so any fixed per-step cost of a profiler dominates.

    python tiny_mlp.py [STEPS] [WARMUP]

Batches come from a plain list (no DataLoader). The script times its own
steady-state steps with time.perf_counter and ends with one line:
    BENCH {"median_step_s": ..., "steps": N, ..., "step_s": [each timed step]}
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from time import perf_counter

import torch
from torch import nn


def report(name: str, marks: list[float], warmup: int) -> None:
    """A step lasts from the end of the previous step to the end of its own,
    so anything between steps (the loop itself) is counted."""
    durations = [b - a for a, b in zip(marks[warmup - 1 : -1], marks[warmup:])]
    result = {
        "workload": name,
        "median_step_s": statistics.median(durations),
        "mean_step_s": statistics.fmean(durations),
        "steps": len(durations),
        "warmup": warmup,
        "torch": torch.__version__,
        # Every timed step, so a reader can leave some out (a profiler window).
        "step_s": [round(d, 9) for d in durations],
    }
    print("BENCH " + json.dumps(result), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", type=int, nargs="?", default=4000)
    parser.add_argument("warmup", type=int, nargs="?", default=200)
    args = parser.parse_args(argv)
    warmup = max(1, args.warmup)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch, n_in, hidden, n_out = 16, 32, 64, 10
    data = [(torch.randn(batch, n_in), torch.randint(0, n_out, (batch,))) for _ in range(64)]
    model = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    marks: list[float] = []
    for i in range(warmup + args.steps):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        marks.append(perf_counter())
    report("tiny_mlp", marks, warmup)


if __name__ == "__main__":
    main(sys.argv[1:])
