"""The tutorial loop: an in-memory TensorDataset (MNIST-sized images made
up here), a small MLP, a shuffled DataLoader, Adam, an evaluation pass each
epoch. Its fetch is the per-sample indexing and `default_collate`: workers
would only add to it.

    python data_in_memory.py [--epochs N] [--workers N] [--batched]

--batched indexes a whole batch at once (a BatchSampler, batch_size=None).

Prints `STEP <median ms> FETCH <median ms>` by its own stopwatch.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batched", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    images = torch.rand(6400, 1, 28, 28)
    labels = torch.randint(0, 10, (6400,))
    data = TensorDataset(images[:5760], labels[:5760])
    if args.batched:
        train = DataLoader(data, sampler=BatchSampler(RandomSampler(data), 64, drop_last=False),
                           batch_size=None, num_workers=args.workers)
    else:
        train = DataLoader(data, batch_size=64, shuffle=True, num_workers=args.workers)
    test = DataLoader(TensorDataset(images[5760:], labels[5760:]), batch_size=256)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps: list[float] = []
    fetches: list[float] = []
    for _epoch in range(args.epochs):
        model.train()
        t_end = time.perf_counter()
        for x, y in train:
            t_fetched = time.perf_counter()
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            steps.append(now - t_end)
            fetches.append(t_fetched - t_end)
            t_end = now
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in test:
                correct += int((model(x).argmax(1) == y).sum())
    kept = slice(10, None)
    print(f"STEP {statistics.median(steps[kept]) * 1e3:.4f} "
          f"FETCH {statistics.median(fetches[kept]) * 1e3:.4f}")


if __name__ == "__main__":
    main()
