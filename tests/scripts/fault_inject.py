"""Breaks perfrun from inside: a small DataLoader training loop that, under
perfrun, replaces one of perfrun's own internals with a function raising
RuntimeError("injected") for a few steps, then puts it back.

    fault_inject.py --target tracker.begin|tracker.end|clock.now
                    --steps N --inject-at K --inject-steps M --count-file PATH

`tracker.begin` fails as each phase starts, `tracker.end` as it ends (after
the script's own call returned), `clock.now` on every clock read of the
phase clock. The number of times the injected function raised is written to
PATH. Without perfrun nothing is injected and PATH gets 0; the script prints
the same lines either way.
"""

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Injector:
    def __init__(self, target: str) -> None:
        self.raised = 0
        self.owner: Any = None
        self.name = ""
        try:
            from perfrun.runtime import agent
        except ImportError:
            return
        current = agent.current()
        if current is None:
            return
        holder, self.name = target.split(".")
        self.owner = current.tracker if holder == "tracker" else current.clock
        self.original = getattr(self.owner, self.name)

    def failing(self, *args: Any, **kwargs: Any) -> Any:
        self.raised += 1
        raise RuntimeError("injected")

    def start(self) -> None:
        if self.owner is not None:
            setattr(self.owner, self.name, self.failing)

    def stop(self) -> None:
        if self.owner is not None:
            setattr(self.owner, self.name, self.original)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--inject-at", type=int, default=3)
    parser.add_argument("--inject-steps", type=int, default=3)
    parser.add_argument("--count-file", required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.steps * 4, 8)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    injector = Injector(args.target)
    for step, (xb, yb) in enumerate(loader):
        if step == args.inject_at:
            injector.start()
        if step == args.inject_at + args.inject_steps:
            injector.stop()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    injector.stop()
    with open(args.count_file, "w") as f:
        f.write(str(injector.raised))
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
