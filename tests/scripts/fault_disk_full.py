"""The disk fills up mid-run: at step `--full-at` the script lets perfrun's
periodic flush run, then limits the size of any file it writes to 0 bytes
(RLIMIT_FSIZE; Python ignores SIGXFSZ, so writes fail with EFBIG as on a
full disk) and trains on.

    fault_disk_full.py --steps N --full-at K [--checkpoint PATH --checkpoint-mb M]

The script itself writes no file and must not notice. With `--checkpoint`
the disk fills for real instead: at step K the script saves a checkpoint of
M MiB with torch.save, as training scripts do, to a disk too small for it;
the save fails part-way (the part written stays, filling the disk), the
script says the checkpoint was not saved and trains on.
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
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--checkpoint-mb", type=int, default=16)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.steps * 4, 8)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (xb, yb) in enumerate(loader):
        if step == args.full_at:
            # Time for the steps so far to be saved: the buffered clock
            # replays its edges at most 1 s apart, then a --flush-interval
            # 0.2 flush writes them (0.6 s lost the fourth step in CI, the
            # machine busy with a Ray cluster beside it).
            time.sleep(2.0)
            if args.checkpoint:
                state = {"model": model.state_dict(),
                         "optimizer_state": torch.zeros(args.checkpoint_mb << 18)}
                try:
                    torch.save(state, args.checkpoint)
                except (OSError, RuntimeError) as exc:
                    print(f"step {step}: checkpoint not saved ({type(exc).__name__})",
                          flush=True)
            else:
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
