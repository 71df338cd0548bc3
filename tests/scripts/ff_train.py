"""Forward-forward training, written as the public examples of Hinton's
algorithm write it: the whole training set is fetched once, as one batch,
from a DataLoader; then each layer trains on it for a number of epochs with
an optimizer of its own, calling itself as `self.forward(x)`, never through
`__call__`. A layer class overrides `nn.Module.train` with its training
loop.

Prints `FF_STEPS <n>` (optimizer steps taken, counted by the script) and
`FF_STEP_MS <median>` and `FF_MEAN_MS <mean>` (the time between two
optimizer steps of the same layer, by a stopwatch in the loop: its median,
and its mean).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

steps_taken = 0
gaps: list[float] = []


def overlay_y_on_x(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Replace the first 10 pixels of x with a one-hot of y."""
    x_ = x.clone()
    x_[:, :10] *= 0.0
    x_[range(x.shape[0]), y] = x.max()
    return x_


class Layer(torch.nn.Linear):
    def __init__(self, in_features: int, out_features: int, epochs: int) -> None:
        super().__init__(in_features, out_features)
        self.relu = torch.nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)
        self.threshold = 2.0
        self.num_epochs = epochs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor):  # type: ignore[override]
        global steps_taken
        last = None
        for _ in range(self.num_epochs):
            g_pos = self.forward(x_pos).pow(2).mean(1)
            g_neg = self.forward(x_neg).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([
                -g_pos + self.threshold,
                g_neg - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            steps_taken += 1
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
        return self.forward(x_pos).detach(), self.forward(x_neg).detach()


class Net(torch.nn.Module):
    def __init__(self, dims: list[int], epochs: int) -> None:
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1], epochs) for d in range(len(dims) - 1)]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        goodness_per_label = []
        for label in range(10):
            h = overlay_y_on_x(x, torch.full((x.shape[0],), label, dtype=torch.long))
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness += [h.pow(2).mean(1)]
            goodness_per_label += [sum(goodness).unsqueeze(1)]
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train(self, x_pos: torch.Tensor, x_neg: torch.Tensor) -> None:  # type: ignore[override]
        h_pos, h_neg = x_pos, x_neg
        for i, layer in enumerate(self.layers):
            print("training layer", i, "...")
            h_pos, h_neg = layer.train(h_pos, h_neg)


def loaders(n: int) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(n, 784, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    train = DataLoader(TensorDataset(images, labels), batch_size=n, shuffle=True)
    test = DataLoader(TensorDataset(images[: n // 5], labels[: n // 5]), batch_size=n // 5)
    return train, test


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(1234)
    train_loader, test_loader = loaders(args.samples)
    net = Net([784, 128, 128], args.epochs)
    x, y = next(iter(train_loader))
    x_pos = overlay_y_on_x(x, y)
    x_neg = overlay_y_on_x(x, y[torch.randperm(x.size(0))])
    net.train(x_pos, x_neg)
    print("train error:", 1.0 - net.predict(x).eq(y).float().mean().item())
    x_te, y_te = next(iter(test_loader))
    print("test error:", 1.0 - net.predict(x_te).eq(y_te).float().mean().item())
    print(f"FF_STEPS {steps_taken}")
    print(f"FF_STEP_MS {statistics.median(gaps) * 1e3:.4f}")
    print(f"FF_MEAN_MS {statistics.fmean(gaps) * 1e3:.4f}")


if __name__ == "__main__":
    main()
