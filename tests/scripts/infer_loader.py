"""An inference loop: model.eval(), torch.no_grad(), a DataLoader, no
optimizer and no backward anywhere."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(args.samples, 8)), batch_size=args.batch)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model.eval()
    total = 0
    with torch.no_grad():
        for (xb,) in loader:
            total += int(model(xb).argmax(dim=1).sum())
    print(f"predicted positives: {total}")


if __name__ == "__main__":
    main()
