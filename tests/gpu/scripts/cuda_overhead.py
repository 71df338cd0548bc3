"""A training step of about 10 ms of GPU work that times itself.

    cuda_overhead.py --steps 200 --skip 20

Two bf16 `Linear(8192, 8192)` layers on an 8192-row batch: five large
matmuls per step, which an H100 runs in roughly 10 ms. The script
synchronises once after step `skip` and once after the last step and prints
the mean step time between them (`STEP_MS`), the figure a user would quote;
steps are not synchronised one by one, so the CPU can run ahead as it does
in real training, and any cost perfrun adds to the CPU side only shows if it
is large enough to starve the GPU.

    cuda_overhead.py --item

reads the loss every step (`loss.item()`, as loops that log or print it
do): the CPU waits for the GPU each step, so whatever perfrun adds on the
CPU between two steps adds to the step.
"""

import argparse
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--skip", type=int, default=20)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--item", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    width = args.width
    model = nn.Sequential(
        *[nn.Linear(width, width, bias=False) for _ in range(args.layers)]
    ).to(device=device, dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(width, width, device=device, dtype=torch.bfloat16)
    start = None
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        if args.item:
            loss.item()
        if step == args.skip - 1:
            torch.cuda.synchronize()
            start = time.perf_counter()
    torch.cuda.synchronize()
    assert start is not None, "--skip must be below --steps"
    step_ms = (time.perf_counter() - start) / (args.steps - args.skip) * 1000.0
    print(f"STEP_MS {step_ms:.4f}", flush=True)


if __name__ == "__main__":
    main()
