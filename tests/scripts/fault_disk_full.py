"""The disk fills up mid-run: at step `--full-at` the script lets perfrun's
periodic flush run, then limits the size of any file it writes to 0 bytes
(RLIMIT_FSIZE; Python ignores SIGXFSZ, so writes fail with EFBIG as on a
full disk) and trains on.

    fault_disk_full.py --steps N --full-at K

The script itself writes no file and must not notice.
"""

import argparse
import resource
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--full-at", type=int, default=4)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.steps * 4, 8)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (xb, yb) in enumerate(loader):
        if step == args.full_at:
            time.sleep(0.6)  # several --flush-interval 0.2 flushes
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
