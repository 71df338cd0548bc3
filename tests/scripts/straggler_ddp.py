"""A small DistributedDataParallel loop on gloo (CPU) with one rank made slow
or stuck, for the straggler and hang tests.

`--slow-rank R --slow-phase dataloader|forward --delay S` makes rank R's
batches (or its forward) S seconds slower; `--hang-rank R --hang-at N` makes
rank R sleep for ever inside its forward at step N; `--busy-rank R
--busy-steps A B` makes rank R run 3000 small tensor ops more in each of
steps [A, B) (under a detailed window there, its trace is the larger and
takes the longer to export).
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        return torch.randn(16), torch.randn(1)


class Net(nn.Module):
    def __init__(self, delay: float, hang_at: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.delay, self.hang_at, self.calls = delay, hang_at, 0

    def forward(self, x):
        if self.calls == self.hang_at:
            while True:
                time.sleep(3600)
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return self.body(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--slow-phase", default="dataloader")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--hang-rank", type=int, default=None)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--busy-rank", type=int, default=None)
    parser.add_argument("--busy-steps", type=int, nargs=2, default=(0, 0))
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    slow = args.delay if rank == args.slow_rank else 0.0
    # One sample a batch: the dataset's delay is the batch's delay.
    data = Batches(args.steps, slow if args.slow_phase == "dataloader" else 0.0)
    loader = DataLoader(data, batch_size=1)
    net = Net(slow if args.slow_phase == "forward" else 0.0,
              args.hang_at if rank == args.hang_rank else -1)
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    busy = torch.zeros(4)
    for step, (x, y) in enumerate(loader):
        if rank == args.busy_rank and args.busy_steps[0] <= step < args.busy_steps[1]:
            for _ in range(3000):
                busy.add_(1.0)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
