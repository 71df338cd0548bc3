"""Trains on a thread of its own; the main thread only starts and joins it."""

import threading

import torch
from torch import nn


def train() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    print("trained on a thread", flush=True)


if __name__ == "__main__":
    thread = threading.Thread(target=train, name="trainer")
    thread.start()
    thread.join()
