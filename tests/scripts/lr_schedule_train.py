"""A regression model trained with a learning-rate schedule chosen on the
command line, the way many training scripts choose theirs: `--scheduler
cosine|step|constant` picks torch's LR scheduler, stepped every batch,
after an optional linear warm-up (`--warmup-epochs`).

Its `--scheduler` is not perfrun's detailed window: written after the
script, it is the script's, because the script defines it.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import lr_scheduler
from torch.utils.data import DataLoader, TensorDataset


def make_scheduler(
    name: str, optimizer: torch.optim.Optimizer, steps: int, warmup: int
) -> lr_scheduler.LRScheduler:
    if name == "cosine":
        main = lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, steps - warmup))
    elif name == "step":
        main = lr_scheduler.StepLR(optimizer, step_size=max(1, (steps - warmup) // 3), gamma=0.5)
    else:
        main = lr_scheduler.ConstantLR(optimizer, factor=1.0)
    if not warmup:
        return main
    ramp = lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup)
    return lr_scheduler.SequentialLR(optimizer, [ramp, main], milestones=[warmup])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheduler", choices=("cosine", "step", "constant"), default="constant",
                        help="learning-rate schedule")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--warmup-epochs", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(256, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    schedule = make_scheduler(args.scheduler, optimizer, args.epochs * len(loader),
                              args.warmup_epochs * len(loader))
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            schedule.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}  lr {schedule.get_last_lr()[0]:.5f} "
              f"({args.scheduler})")


if __name__ == "__main__":
    main()
