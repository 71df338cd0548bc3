"""Train a small classifier and log to MLflow as its quickstart does: a
run opened with `mlflow.start_run()`, its parameters, and the loss at
each step.

The tracking store is the environment's (MLFLOW_TRACKING_URI).
`--no-end` starts the run without a `with` block and never ends it:
MLflow's own exit handler ends it.
"""

import argparse

import mlflow
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train(epochs: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(640, 20)
    y = (x[:, :10].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    mlflow.log_params({"lr": 1e-3, "batch_size": 16, "epochs": epochs})
    step = 0
    for epoch in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            mlflow.log_metric("loss", loss.item(), step=step)
            step += 1
        print(f"epoch {epoch}: loss {loss.item():.4f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--no-end", action="store_true")
    args = parser.parse_args()
    mlflow.set_experiment("perfrun-demo")
    if args.no_end:
        run = mlflow.start_run()
        train(args.epochs)
    else:
        with mlflow.start_run() as run:
            train(args.epochs)
    print(f"run {run.info.run_id}")


if __name__ == "__main__":
    main()
