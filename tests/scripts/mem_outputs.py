"""An image classifier trained the way many tutorials write the epoch
loop: every step's logits and targets are appended to lists for the
epoch's metrics, computed at the end. Appending `logits` (not
`logits.detach().cpu()` or a number) keeps each step's output alive, so
the process's memory grows by a batch of logits a step until the epoch
ends. `--count` counts the correct predictions as it goes, a number a
step, and keeps no tensor: the flat run.

Prints `LOGITS_BYTES <n>`: what one step's kept logits hold.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--classes", type=int, default=2000)
    parser.add_argument("--count", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)

    images = torch.randn(args.steps * args.batch_size, 3, 8, 8)
    labels = torch.randint(0, args.classes, (images.shape[0],))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 256), nn.ReLU(),
                          nn.Linear(256, args.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    model.train()
    all_outputs, all_targets = [], []
    correct = seen = 0
    for inputs, targets in loader:
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
        if args.count:
            correct += (outputs.argmax(dim=1) == targets).sum().item()
            seen += len(targets)
        else:
            all_outputs.append(outputs)
            all_targets.append(targets)
    if not args.count:
        predictions = torch.cat(all_outputs).argmax(dim=1)
        correct, seen = (predictions == torch.cat(all_targets)).sum().item(), len(predictions)
    print(f"accuracy {correct / seen:.4f}")
    print(f"LOGITS_BYTES {args.batch_size * args.classes * 4}")


if __name__ == "__main__":
    main()
