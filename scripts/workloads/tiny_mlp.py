"""Benchmark workload (a): a tiny MLP whose training step takes well under a
millisecond on CPU, so any fixed per-step cost of a profiler dominates.

    python tiny_mlp.py [STEPS] [WARMUP]

Batches come from a plain list (no DataLoader). The script times its own
steady-state steps with time.perf_counter and ends with one line:
    BENCH {"median_step_s": ..., "steps": N, ..., "step_s": [each timed step]}
"""

from __future__ import annotations

import sys

import torch
from benchline import mark, parse, report
from torch import nn


def main(argv: list[str]) -> None:
    steps, warmup = parse(argv, __doc__, 4000, 200)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch, n_in, hidden, n_out = 16, 32, 64, 10
    data = [(torch.randn(batch, n_in), torch.randint(0, n_out, (batch,))) for _ in range(64)]
    model = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    marks: list[float] = []
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        marks.append(mark())
    report("tiny_mlp", marks, warmup, torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1:])
