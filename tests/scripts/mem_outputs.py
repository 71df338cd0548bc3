"""An image classifier trained the way many tutorials write the epoch
loop: every step's logits and targets are appended to lists for the
epoch's metrics, computed at the end. Appending `logits` (not
`logits.detach().cpu()` or a number) keeps each step's output alive, so
the process's memory grows by a batch of logits a step until the epoch
ends. `--count` counts the correct predictions as it goes, a number a
step, and keeps no tensor: the flat run.

Prints `LOGITS_BYTES <n>`: what one step's kept logits hold, and
`RSS_SLOPE <n>`: the growth of the process's resident memory a step, read
by the script itself from /proc/self/statm after each step and fitted by
least squares over the steps past the first tenth.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slope(points: list[tuple[int, int]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


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
    memory = []
    for step, (inputs, targets) in enumerate(loader):
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
        memory.append((step, rss()))
    if not args.count:
        predictions = torch.cat(all_outputs).argmax(dim=1)
        correct, seen = (predictions == torch.cat(all_targets)).sum().item(), len(predictions)
    print(f"accuracy {correct / seen:.4f}")
    print(f"LOGITS_BYTES {args.batch_size * args.classes * 4}")
    print(f"RSS_SLOPE {slope(memory[len(memory) // 10:]):.0f}")


if __name__ == "__main__":
    main()
