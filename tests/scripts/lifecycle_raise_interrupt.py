"""Trains, then raises KeyboardInterrupt itself (no signal), as a script
does to stop on a condition of its own:

    lifecycle_raise_interrupt.py --steps N --raise-at K

Python ends such a script by SIGINT, as after Ctrl-C; nothing killed it.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--raise-at", type=int, default=20)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step == args.raise_at:
            raise KeyboardInterrupt


if __name__ == "__main__":
    main()
