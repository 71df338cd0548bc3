"""A script that picks its GPU by setting CUDA_VISIBLE_DEVICES itself, after
`import torch` and before any CUDA call, as many training scripts do.

    cuda_visible.py last|none

`last` keeps only the last GPU the script was given, `none` hides every GPU
("-1"). Either works under plain Python because CUDA reads the variable
when it initialises, on first use, not when torch is imported; a profiler
that touched CUDA at import time would fix the device list too early, and
`none` shows it even on a machine with a single GPU (the script would still
see one device). The script prints what it sees and trains a few steps on
whatever is left.
"""

import os
import sys

import torch
from torch import nn


def last_visible() -> str:
    given = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if given:
        return given.split(",")[-1].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return str(max(count - 1, 0))
    except Exception:
        return "0"


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "last"
    value = "-1" if mode == "none" else last_visible()
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    count = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0) if count else "-"
    print(f"VISIBLE {mode} device_count {count} name {name}", flush=True)

    torch.manual_seed(0)
    device = torch.device("cuda" if count else "cpu")
    model = nn.Linear(32, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(16, 32).to(device)
    y = torch.randn(16, 1).to(device)
    for _ in range(5):
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        optimizer.step()
    print(f"VISIBLE trained 5 steps on {device.type}, loss {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
