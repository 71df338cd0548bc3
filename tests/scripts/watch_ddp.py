"""A two-rank DistributedDataParallel loop on gloo (CPU) that trains until
the test says stop, for `perfrun watch` in a real terminal
(tests/test_watch.py): it runs until the file given by `--stop-file` exists
(or `--max-seconds` pass), so the test can look at the live view for as long
as it needs and then end the run. `--slow-rank R` makes rank R's forward
take `--slow-ms` longer, so the view has a slowest rank to name."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--slow-ms", type=float, default=3.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + args.max_seconds
    stop = torch.zeros(1)
    step = 0
    while True:
        if step % 20 == 0:
            # Every rank stops at the same step: rank 0 decides, all follow.
            stop[0] = float(rank == 0 and (os.path.exists(args.stop_file)
                                           or time.monotonic() > deadline))
            dist.broadcast(stop, 0)
            if stop[0]:
                break
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        optimizer.zero_grad()
        out = model(x)
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000.0)
        nn.functional.mse_loss(out, y).backward()
        optimizer.step()
        time.sleep(0.002)  # a gentle loop: the machine is shared with the test
        step += 1
    print(f"rank {rank} stopped after {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
