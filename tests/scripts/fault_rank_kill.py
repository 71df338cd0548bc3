"""Two ranks under torchrun train on their own (no collectives, so neither
waits on the other); rank 1 SIGKILLs itself at the start of step
`--kill-at`, after rank 0 has finished.

    fault_rank_kill.py --steps N --kill-at K --done-file PATH

Rank 0 trains N steps, writes PATH and exits 0. Rank 1 trains until step K,
waits for PATH (so torchrun never has to stop rank 0 on its account), lets
perfrun's periodic flush run, and kills itself.
"""

import argparse
import os
import signal
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill-at", type=int, default=4)
    parser.add_argument("--done-file", required=True)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if rank == 1 and step == args.kill_at:
            deadline = time.monotonic() + 60
            while not os.path.exists(args.done_file) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.6)  # several --flush-interval 0.2 flushes
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        print(f"rank {rank} step {step} done", flush=True)
    if rank == 0:
        with open(args.done_file, "w") as f:
            f.write("done\n")
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    main()
