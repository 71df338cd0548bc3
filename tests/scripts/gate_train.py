"""A small DataLoader training loop for the gate tests.

`--steps N` optimizer steps of about 2 ms each on one CPU thread (one batch
each); `--slow-ms MS` adds a busy-wait of MS milliseconds inside the model's
forward every step, a known slowdown of one phase; `--crash-at N` raises at
step N. `--ready FILE` creates FILE once everything is imported and built;
`--wait-for FILE` then holds the loop back until FILE exists. A test can so
start two runs together (torch takes seconds to import) and let them train
one right after the other.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(nn.Module):
    def __init__(self, slow_ms: float) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(32, 384), nn.ReLU(), nn.Linear(384, 384), nn.ReLU(), nn.Linear(384, 1)
        )
        self.slow_s = slow_ms / 1000.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow_s:
            # Busy-wait, not sleep: the slowdown is CPU work, as a slower
            # kernel would be, and cannot be shortened by the scheduler.
            end = time.perf_counter() + self.slow_s
            while time.perf_counter() < end:
                pass
        return self.body(x)


def wait_for(path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {path}")
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--ready", default=None)
    parser.add_argument("--wait-for", default=None)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.steps * args.batch, 32)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch)
    model = Model(args.slow_ms)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.ready:
        open(args.ready, "w").close()
    if args.wait_for:
        wait_for(args.wait_for)
    for i, (xb, yb) in enumerate(loader):
        if i == args.crash_at:
            raise RuntimeError(f"crashed at step {i}")
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print("done")


if __name__ == "__main__":
    main()
