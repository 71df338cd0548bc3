"""A tiny real training loop for the process tests: a linear model, SGD, a
TensorDataset DataLoader. Options make it fail, exit, kill itself or wait
for a signal at a given step, so each test runs the same loop."""

import argparse
import os
import signal
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    parser.add_argument("--raise-at", type=int, default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--ready-at", type=int, default=None)
    parser.add_argument("--ready-file", default=None)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--context", default=None)
    parser.add_argument("--marker", default=None)
    args = parser.parse_args()

    if args.marker:
        with open(args.marker, "w") as f:
            f.write("ran\n")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.steps * 4, 8)
    y = torch.randn(args.steps * 4, 1)
    extra = {"multiprocessing_context": args.context} if args.context else {}
    loader = DataLoader(TensorDataset(x, y), batch_size=4, num_workers=args.workers, **extra)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (xb, yb) in enumerate(loader):
        if step == args.raise_at:
            raise ValueError(f"bad batch at step {step}")
        if step == args.kill_at:
            time.sleep(0.6)  # let at least one periodic flush happen
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.ready_at and args.ready_file:
            with open(args.ready_file, "w") as f:
                f.write(str(step))
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        print(f"step {step} done", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    print("training finished", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
