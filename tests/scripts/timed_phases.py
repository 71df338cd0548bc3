"""Phases of known length: the Dataset sleeps `--sleep-ms` per batch and the
model's forward busy-waits `--busy-ms`, so a test can check that each lands
in the right column."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowBatches(Dataset):
    """Each item is a whole batch (the DataLoader runs with batch_size=None),
    so the sleep is paid exactly once per batch."""

    def __init__(self, batches: int, batch: int, sleep: float) -> None:
        self.batches = batches
        self.batch = batch
        self.sleep = sleep

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sleep)
        x = torch.full((self.batch, 4), float(index))
        return x, x.sum(dim=1, keepdim=True)


class BusyModel(nn.Module):
    def __init__(self, busy: float) -> None:
        super().__init__()
        self.busy = busy
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deadline = time.perf_counter() + self.busy
        while time.perf_counter() < deadline:
            pass
        return self.linear(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=6)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--busy-ms", type=float, default=0.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = DataLoader(
        SlowBatches(args.steps, args.batch, args.sleep_ms / 1000.0), batch_size=None
    )
    model = BusyModel(args.busy_ms / 1000.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    for xb, yb in loader:
        optimizer.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        optimizer.step()


if __name__ == "__main__":
    main()
