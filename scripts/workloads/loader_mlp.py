"""Benchmark workload (d): a tiny MLP fed by a DataLoader (in the main
process, no workers) whose whole step, fetch included, takes about half a
millisecond on CPU: the loop of the issue on perfrun's per-step cost, where
every hooked call (the fetch, zero_grad, the model, the loss module,
backward, the optimizer step) shows.

    python loader_mlp.py [STEPS] [WARMUP]

The script times its own steady-state steps with time.perf_counter and ends
with one line:
    BENCH {"median_step_s": ..., "steps": N, ..., "step_s": [each timed step]}
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from benchline import mark, parse, report
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build(total: int, shuffle: bool = True) -> tuple[DataLoader, nn.Module, nn.Module, Any]:
    """The loader of `total` batches, the model, the loss and the optimizer
    (scripts/bench_hotpath.py builds the same loop)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch, n_in, hidden, n_out = 32, 32, 64, 10
    x = torch.randn(total * batch, n_in)
    y = torch.randint(0, n_out, (total * batch,))
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=shuffle)
    model = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    return loader, model, loss_fn, optimizer


def main(argv: list[str]) -> None:
    steps, warmup = parse(argv, __doc__, 3000, 200)

    loader, model, loss_fn, optimizer = build(warmup + steps)

    marks: list[float] = []
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        marks.append(mark())
    report("loader_mlp", marks, warmup, torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1:])
