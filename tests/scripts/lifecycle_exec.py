"""Trains a few steps, then replaces itself with another program
(os.execv), as a script that re-executes itself at its end does."""

import os
import sys

import torch
from torch import nn

torch.set_num_threads(1)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    optimizer.zero_grad()
    nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
    optimizer.step()
    print(f"step {step} done", flush=True)
os.execv(sys.executable, [sys.executable, "-c", "print('after exec')"])
