"""The polynomial regression of PyTorch's "Learning PyTorch with Examples":
a Linear(3, 1) fit to sin(x) on 2,000 points, its parameters updated by
hand under `torch.no_grad()` (no torch.optim optimizer: making one imports
torch._dynamo, and this script never does).

Prints `DYNAMO <True|False>`: whether torch._dynamo was imported by the end.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--points", type=int, default=2000)
    args = parser.parse_args()
    x = torch.linspace(-math.pi, math.pi, args.points)
    y = torch.sin(x)
    xx = x.unsqueeze(-1).pow(torch.tensor([1, 2, 3]))
    model = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0, 1))
    loss_fn = torch.nn.MSELoss(reduction="sum")
    for _ in range(args.steps):
        loss = loss_fn(model(xx), y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 1e-6 * param.grad
    print(f"loss {loss.item():.2f}")
    print(f"DYNAMO {'torch._dynamo' in sys.modules}")


if __name__ == "__main__":
    main()
