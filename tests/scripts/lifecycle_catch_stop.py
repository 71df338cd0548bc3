"""A loop that catches BaseException around each step and carries on, as
scripts do to survive a bad batch: it catches SystemExit too, --stop-after's
among them.

    lifecycle_catch_stop.py --steps N
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = [torch.randn(8, 8) for _ in range(args.steps)]
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trained = 0
    for step, xb in enumerate(batches):
        try:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(xb), xb.sum(dim=1, keepdim=True)).backward()
            optimizer.step()
            trained += 1
        except BaseException as exc:  # noqa: BLE001 - the loop under test
            print(f"step {step}: {type(exc).__name__} caught, carrying on", flush=True)
    print(f"trained {trained} steps", flush=True)


if __name__ == "__main__":
    main()
