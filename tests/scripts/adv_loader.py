"""A training loop fed by a single-process DataLoader (num_workers=0) whose
Dataset can be made slow: `--sleep-ms N` sleeps N ms in every __getitem__.

Each item is a whole pre-built batch (batch_size=None), so with no sleep the
DataLoader costs next to nothing next to the model's step.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __init__(self, steps: int, batch: int, sleep_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(steps, batch, 256, generator=g)
        self.y = torch.randint(0, 10, (steps, batch), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[index], self.y[index]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = Batches(args.steps, 128, args.sleep_ms / 1000.0)
    loader = DataLoader(data, batch_size=None, num_workers=0)
    model = nn.Sequential(
        nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    print("done")


if __name__ == "__main__":
    main()
