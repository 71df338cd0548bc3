"""The script's own failure, raised from inside a call perfrun wraps.

    fault_user_error.py --where dataloader|collate|forward|backward|optimizer
                        [--exit STATUS] [--at K] [--workers N]

At step K (default 2) the Dataset's `__getitem__`, the DataLoader's
collate_fn, the model's forward, a custom autograd Function's backward or
the optimizer's `step` raises ValueError (or, with --exit, calls
`sys.exit(STATUS)`). Everything before prints one line per step. With
--workers the Dataset and the collate_fn run in worker processes, and
torch re-raises their exception in the loop with the worker's traceback.
"""

import argparse
import sys
from typing import Callable, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_convert

ARGS = argparse.Namespace()
STEP = [0]


def fail(where: str) -> None:
    step = STEP[0]
    if ARGS.where != where or step != ARGS.at:
        return
    if ARGS.exit is not None:
        sys.exit(ARGS.exit)
    raise ValueError(f"user failure in {where} at step {step}")


class Batches(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        STEP[0] = index  # the batch about to be step `index`
        fail("dataloader")
        x = torch.full((4, 8), float(index))
        return x, x.sum(dim=1, keepdim=True)


def collate(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    fail("collate")
    return default_convert(batch)


class FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        fail("backward")
        return grad


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fail("forward")
        return FailingBackward.apply(self.linear(x))


class FailingSGD(torch.optim.SGD):
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        fail("optimizer")
        return super().step(closure)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--where", required=True)
    parser.add_argument("--exit", type=int, default=None)
    parser.add_argument("--at", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.parse_args(namespace=ARGS)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model()
    optimizer = FailingSGD(model.parameters(), lr=0.001)
    loader = DataLoader(Batches(), batch_size=None, collate_fn=collate,
                        num_workers=ARGS.workers)
    for step, (xb, yb) in enumerate(loader):
        STEP[0] = step
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        print(f"step {step} done", flush=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
