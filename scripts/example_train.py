"""A small real training script for trying perfrun: an MLP classifier on
synthetic data, with a DataLoader, an optimizer and a validation pass.
Runs on CPU in a few seconds.

    perfrun scripts/example_train.py
    perfrun --timer-only scripts/example_train.py --epochs 2
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.samples, 64)
    y = (x[:, :8].sum(dim=1) > 0).long()
    train = DataLoader(
        TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    val = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=256)

    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    )
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        model.train()
        for xb, yb in train:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in val:
                correct += (model(xb).argmax(dim=1) == yb).sum().item()
        print(f"epoch {epoch}: loss {loss.item():.4f}  val accuracy {correct / 512:.3f}")


if __name__ == "__main__":
    main()
