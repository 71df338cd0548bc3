"""Train a small classifier and log to Weights & Biases as its quickstart
does: `wandb.init` with a config, `wandb.log` of the loss each step, and
`wandb.finish()` at the end.

Run it offline (WANDB_MODE=offline) to keep everything on this machine.
`--no-finish` leaves the run for W&B's own exit handler to close.
"""

import argparse

import torch
import torch.nn.functional as F
import wandb
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--no-finish", action="store_true")
    args = parser.parse_args()

    run = wandb.init(project="perfrun-demo", dir=args.dir,
                     config={"lr": 1e-3, "batch_size": 16, "epochs": args.epochs})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(640, 20)
    y = (x[:, :10].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=run.config.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=run.config.lr)

    for epoch in range(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            wandb.log({"loss": loss.item(), "epoch": epoch})
        print(f"epoch {epoch}: loss {loss.item():.4f}")
    print(f"run {run.id}")
    if not args.no_finish:
        wandb.finish()


if __name__ == "__main__":
    main()
