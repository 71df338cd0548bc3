"""Benchmark workload (g): an MNIST-sized MLP (784-512-512-10, batch 32,
Adam) whose training step takes one to two milliseconds on one CPU thread:
the short end of the steps the default mode is held to 1% on.

    python mlp.py [STEPS] [WARMUP]

Batches come from a plain list (no DataLoader). The script times its own
steady-state steps and ends with one line:
    BENCH {"median_step_s": ..., "steps": N, ..., "step_s": [each timed step]}
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
from benchline import mark, parse, report
from torch import nn


def make_step() -> tuple[Callable[[int], None], torch.optim.Optimizer]:
    """One training step on batch `i`, and its optimizer: the loop main()
    times, and scripts/bench_inprocess.py runs in blocks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                          nn.ReLU(), nn.Linear(512, 10))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = [(torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))) for _ in range(32)]
    model.train()

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    return step, optimizer


def main(argv: list[str]) -> None:
    steps, warmup = parse(argv, __doc__, 2000, 100)

    torch.set_num_threads(1)
    step, _ = make_step()

    marks: list[float] = []
    for i in range(warmup + steps):
        step(i)
        marks.append(mark())
    report("mlp", marks, warmup, torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1:])
