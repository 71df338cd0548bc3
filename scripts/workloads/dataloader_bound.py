"""Benchmark workload (c): a loop that waits on its DataLoader. Two worker
processes build each item with some CPU work; the model step in the main
process is small, so step time is set by the data pipeline.

    python dataloader_bound.py [STEPS] [WARMUP]

The script times its own steady-state steps (fetch included) with
time.perf_counter and ends with one line:
    BENCH {"median_step_s": ..., "steps": N, ..., "step_s": [each timed step]}
"""

from __future__ import annotations

import sys

import torch
from benchline import mark, parse, report
from torch import nn
from torch.utils.data import DataLoader, Dataset

BATCH, FEATURES, CLASSES = 16, 64, 10


class SyntheticImages(Dataset):
    """Each item is "decoded and augmented" on the CPU: a few small matrix
    products and non-linearities on a per-item random tensor."""

    def __init__(self, length: int, work: int = 6) -> None:
        self.length = length
        self.work = work
        g = torch.Generator().manual_seed(1)
        self.kernel = torch.randn(FEATURES, FEATURES, generator=g) / FEATURES**0.5

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(index)
        x = torch.randn(FEATURES, FEATURES, generator=g)
        for _ in range(self.work):
            x = torch.tanh(x @ self.kernel)
        return x.mean(dim=0), index % CLASSES


def main(argv: list[str]) -> None:
    steps, warmup = parse(argv, __doc__, 300, 20)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    total = warmup + steps
    loader = DataLoader(SyntheticImages(total * BATCH), batch_size=BATCH, num_workers=2)
    model = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    marks: list[float] = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        marks.append(mark())
    report("dataloader_bound", marks, warmup, torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1:])
