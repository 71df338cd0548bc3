"""Ground truth: every phase of the loop busy-waits a known time.

    gt_phases.py --steps N --data-ms X --forward-ms Y --backward-ms Z
                 --optimizer-ms W --untimed-ms U

Per batch: the Dataset busy-waits X ms in `__getitem__` (num_workers=0, one
item per batch), the model's forward Y ms, a custom autograd Function's
backward Z ms, the optimizer's `step` W ms, and the loop body U ms after
`optimizer.step()`, outside every phase.

A busy-wait lasts at least its time, and on an idle machine only that; on a
loaded one the process can be descheduled across the deadline and the wait
ends late. So the script measures, on perfrun's clock (`time.perf_counter`),
both what each wait really took (`busy`) and, with its own stopwatch around
each call the loop makes, what each phase took as the script sees it
(`stopwatch`: the DataLoader fetch, `zero_grad` plus `step` for the
optimizer, the rest of the iteration as `others`, the whole iteration as
`step`). It prints them per step as one `GT_PHASES {json}` line at the end.
"""

import argparse
import json
import time
from collections.abc import Iterable
from typing import Callable, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

clock = time.perf_counter

#: What each busy-wait really took, one entry per step, in seconds.
BUSY: dict[str, list[float]] = {
    name: [] for name in ("dataloader", "forward", "backward", "optimization", "untimed")
}


def busy(seconds: float, phase: str) -> None:
    start = clock()
    deadline = start + seconds
    now = start
    while now < deadline:
        now = clock()
    BUSY[phase].append(now - start)


class Batches(Dataset):
    """Each item is a whole batch (batch_size=None): one wait per batch."""

    def __init__(self, n: int, wait: float) -> None:
        self.n = n
        self.wait = wait

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        busy(self.wait, "dataloader")
        x = torch.full((4, 8), float(index) / self.n)
        return x, x.sum(dim=1, keepdim=True)


class SlowBackward(torch.autograd.Function):
    """Identity forward; its backward busy-waits inside autograd."""

    wait = 0.0

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        busy(SlowBackward.wait, "backward")
        return grad


class Model(nn.Module):
    def __init__(self, wait: float) -> None:
        super().__init__()
        self.wait = wait
        self.linear = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        busy(self.wait, "forward")
        return SlowBackward.apply(self.linear(x))


class SlowSGD(torch.optim.SGD):
    def __init__(self, params: Iterable[torch.Tensor], lr: float, wait: float) -> None:
        super().__init__(params, lr=lr)
        self.wait = wait

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        busy(self.wait, "optimization")
        return super().step(closure)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--data-ms", type=float, default=0.0)
    parser.add_argument("--forward-ms", type=float, default=0.0)
    parser.add_argument("--backward-ms", type=float, default=0.0)
    parser.add_argument("--optimizer-ms", type=float, default=0.0)
    parser.add_argument("--untimed-ms", type=float, default=0.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    SlowBackward.wait = args.backward_ms / 1000.0
    loader = DataLoader(Batches(args.steps, args.data_ms / 1000.0), batch_size=None)
    model = Model(args.forward_ms / 1000.0)
    optimizer = SlowSGD(model.parameters(), lr=0.01, wait=args.optimizer_ms / 1000.0)
    untimed = args.untimed_ms / 1000.0

    watch: dict[str, list[float]] = {
        name: []
        for name in ("dataloader", "forward", "backward", "optimization", "others", "step")
    }
    batches = iter(loader)
    step_start = clock()
    while True:
        t0 = clock()
        try:
            x, y = next(batches)
        except StopIteration:
            break
        t1 = clock()
        optimizer.zero_grad()
        t2 = clock()
        out = model(x)
        t3 = clock()
        loss = (out - y).pow(2).mean()
        t4 = clock()
        loss.backward()
        t5 = clock()
        optimizer.step()
        t6 = clock()
        busy(untimed, "untimed")
        t7 = clock()
        phases = {
            "dataloader": t1 - t0,
            "forward": t3 - t2,
            "backward": t5 - t4,
            "optimization": (t2 - t1) + (t6 - t5),
        }
        for name, value in phases.items():
            watch[name].append(value)
        watch["step"].append(t7 - step_start)
        watch["others"].append((t7 - step_start) - sum(phases.values()))
        step_start = t7
    print(f"gt_phases: {args.steps} steps, last loss {loss.item():.6f}")
    print("GT_PHASES " + json.dumps({"busy": BUSY, "stopwatch": watch}), flush=True)


if __name__ == "__main__":
    main()
