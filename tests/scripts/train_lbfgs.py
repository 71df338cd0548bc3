"""Train with torch.optim.LBFGS: forward and backward run inside
optimizer.step(closure), a varying number of times per step. The script
prints how many times, so a test can compare."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(16, 4)
    y = x.sum(dim=1, keepdim=True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)

    for step in range(args.steps):
        calls = 0

        def closure() -> torch.Tensor:
            nonlocal calls
            calls += 1
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        optimizer.step(closure)
        print(f"step {step}: closure calls {calls}")


if __name__ == "__main__":
    main()
