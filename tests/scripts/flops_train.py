"""A small MLP trained on random tensors for the FLOP counter's end-to-end
check: `--width`, `--batch` and `--steps` fix the matmuls, so the test can
compute the step's FLOPs by hand (2*m*n*k per Linear forward, 4*m*n*k
backward, none for the first layer's input gradient)."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w))
    run = torch.compile(model, backend="eager") if args.compile else model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, w)
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = run(x).square().mean()
        loss.backward()
        optimizer.step()
    print(f"flops_train done: loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
