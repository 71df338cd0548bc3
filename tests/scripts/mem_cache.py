"""An image classifier whose Dataset keeps each decoded sample in a dict on
itself, so the next epoch need not decode it again: a cache filled in
`__getitem__`. Read by two DataLoader workers, each fills its own copy (the
dict is the worker's, not the parent's), and its private memory grows with
every batch it makes, in a run of a few seconds. `--no-cache` decodes every
time; `--load-once` reads its whole table in each worker at its first
sample (a file opened lazily in the worker), then serves from it: memory
that jumps once and stays.

Prints `CACHED_BYTES <n>`: what one worker's cache holds at the end if it
made half the batches (the arrays alone).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SHAPE = (3, 48, 48)


class Decoded(Dataset):
    def __init__(self, n: int, mode: str) -> None:
        self.n = n
        self.mode = mode
        self.cache: dict[int, np.ndarray] = {}
        self.table = None

    def __len__(self) -> int:
        return self.n

    def _decode(self, index: int) -> np.ndarray:
        return np.random.default_rng(index).standard_normal(SHAPE, dtype=np.float32)

    def __getitem__(self, index: int):
        if self.mode == "cache":
            x = self.cache.get(index)
            if x is None:
                x = self.cache[index] = self._decode(index)
        elif self.mode == "load-once":
            if self.table is None:
                self.table = np.ones((self.n // 4, *SHAPE), dtype=np.float32)
            x = self.table[index % len(self.table)] * self._decode(index)
        else:
            x = self._decode(index)
        return torch.from_numpy(x), index % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--load-once", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mode = "load-once" if args.load_once else "decode" if args.no_cache else "cache"
    dataset = Decoded(args.steps * args.batch_size, mode)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=2, shuffle=True)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                          nn.Flatten(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}")
    print(f"CACHED_BYTES {args.steps * args.batch_size // 2 * int(np.prod(SHAPE)) * 4}")


if __name__ == "__main__":
    main()
