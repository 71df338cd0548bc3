"""Trains where perfrun's bootstrap cannot run: the script starts Python
again with -I (isolated mode: PYTHONPATH is ignored, so no injected
sitecustomize) and trains there.

    fault_reexec.py --how exec|spawn [--steps N]

`exec` replaces the process (os.execv, same pid); `spawn` runs the child
with subprocess and exits with its status. Either way the parent never
imports torch.
"""

import argparse
import os
import subprocess
import sys


def train(steps: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
        optimizer.step()
        print(f"step {step} done", flush=True)
    print("training finished", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--how", choices=("exec", "spawn"), default="exec")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        train(args.steps)
        return
    argv = [sys.executable, "-I", os.path.abspath(__file__), "--child", "--steps", str(args.steps)]
    sys.stdout.flush()
    if args.how == "exec":
        os.execv(sys.executable, argv)
    sys.exit(subprocess.call(argv))


if __name__ == "__main__":
    main()
