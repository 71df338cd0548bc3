"""Hogwild training, as PyTorch's mnist_hogwild example writes it: the
model in shared memory, N processes started with
`torch.multiprocessing.Process`, each training it with an optimizer of its
own; the parent joins them, then tests the model under `torch.no_grad()`.
Synthetic MNIST-shaped data, nothing downloaded.

Prints `HOGWILD_STEPS <n>`: the optimizer steps the children took, as
they report them on a queue.
"""

from __future__ import annotations

import argparse

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=5)
        self.conv2 = nn.Conv2d(4, 8, kernel_size=5)
        self.fc1 = nn.Linear(128, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = x.view(-1, 128)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset(images, torch.randint(0, 10, (n,), generator=g))


def train(rank: int, args: argparse.Namespace, model: nn.Module, data: TensorDataset,
          steps: mp.Queue[int]) -> None:
    torch.manual_seed(args.seed + rank)
    torch.set_num_threads(1)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    taken = 0
    for _epoch in range(1, args.epochs + 1):
        model.train()
        for data_, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data_), target)
            loss.backward()
            optimizer.step()
            taken += 1
    steps.put(taken)


def test(args: argparse.Namespace, model: nn.Module, data: TensorDataset) -> None:
    torch.manual_seed(args.seed)
    loader = DataLoader(data, batch_size=args.test_batch_size)
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data_, target in loader:
            output = model(data_)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.max(1)[1].eq(target).sum().item()
    n = len(loader.dataset)  # type: ignore[arg-type]
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Hogwild training")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--samples", type=int, default=640)
    parser.add_argument("--start-method", default="spawn")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    mp.set_start_method(args.start_method, force=True)
    model = Net()
    # gradients are allocated lazily, so they are not shared here
    model.share_memory()
    train_data, test_data = dataset(args.samples, 0), dataset(args.samples // 2, 1)
    steps: mp.Queue[int] = mp.Queue()
    processes = []
    for rank in range(args.num_processes):
        p = mp.Process(target=train, args=(rank, args, model, train_data, steps))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print(f"HOGWILD_STEPS {sum(steps.get() for _ in processes)}")
    # Once training is complete, we can test the model
    test(args, model, test_data)


if __name__ == "__main__":
    main()
