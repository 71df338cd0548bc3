"""Two ranks under torchrun train on their own (no collectives, so neither
waits on the other); rank 1 SIGKILLs itself in step `--kill-at`, once rank 0
has exited.

    fault_rank_kill.py --steps N --kill-at K --done-file PATH

Rank 0 trains N steps, writes its pid to PATH and exits 0. Rank 1 trains
until step K, waits for rank 0's process to be gone (so torchrun never has
to stop rank 0 on its account), lets perfrun's periodic flush run, and kills
itself right after step K's `zero_grad` (which ends step K - 1: K steps are
complete).
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
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        optimizer.zero_grad()
        if rank == 1 and step == args.kill_at:
            wait_for_exit(args.done_file)
            time.sleep(0.6)  # several --flush-interval 0.2 flushes
            os.kill(os.getpid(), signal.SIGKILL)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        print(f"rank {rank} step {step} done", flush=True)
    print(f"rank {rank} finished", flush=True)
    if rank == 0:
        with open(args.done_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(args.done_file + ".tmp", args.done_file)


def wait_for_exit(pid_file: str, timeout: float = 60.0) -> None:
    """Until the process named in `pid_file` has exited (gone, or a zombie
    its parent has not reaped yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(pid_file) as f:
                pid = int(f.read())
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                return
        except FileNotFoundError:
            if os.path.exists(pid_file):
                return  # the process is gone
        time.sleep(0.05)


if __name__ == "__main__":
    main()
