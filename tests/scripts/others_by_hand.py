"""Training written from scratch, as tutorials teach it before torch.optim
and DataLoader ("neural networks from scratch"): the batch sliced out of
tensors held in memory, the loss computed outside the model, and plain SGD
written by hand over the parameters. All three run between the calls
perfrun times, so they are the step's Others; the script times each with
its own stopwatch.

    python others_by_hand.py [--steps N] [--width W]

Prints, per step, `STEP <i> BATCH <ms> LOSS <ms> UPDATE <ms>`: the
three parts of the step that are neither Forward (the model's call) nor
Backward nor Optimization (`model.zero_grad()`).
"""

from __future__ import annotations

import argparse
from time import perf_counter

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n, batch = 8192, 64
    X = torch.randn(n, 784)
    Y = torch.randint(0, 10, (n,))
    model = nn.Sequential(nn.Linear(784, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    lr = 0.05
    perm = torch.randperm(n)
    for step in range(args.steps):
        t0 = perf_counter()
        i = (step * batch) % n
        idx = perm[i:i + batch]
        xb, yb = X[idx], Y[idx]
        t1 = perf_counter()
        logits = model(xb)
        t2 = perf_counter()
        loss = F.cross_entropy(logits, yb)
        t3 = perf_counter()
        model.zero_grad()
        loss.backward()
        t4 = perf_counter()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        t5 = perf_counter()
        ms = 1e3
        print(f"STEP {step} BATCH {(t1 - t0) * ms:.4f} LOSS {(t3 - t2) * ms:.4f} "
              f"UPDATE {(t5 - t4) * ms:.4f}", flush=True)


if __name__ == "__main__":
    main()
