"""A training loop whose GPU work has every kind the window tables name.

    cuda_window.py --steps N

Each step copies its batch from pinned host memory to the GPU (Memcpy
HtoD), runs `nn.Linear` layers with a bias (aten::addmm forward, aten::mm
in backward) and an explicit `torch.mm`, clears a scratch buffer with
`zero_()` and reduces a large tensor to one number, and reads the loss back
(Memcpy DtoH). On CUDA `zero_()` is a fill kernel, not a memset; the memset
comes from the reduction: a full reduction of a tensor this large is split
over many blocks, and PyTorch clears their semaphores with
`cudaMemsetAsync` before launching it.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=14)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 64)).to(device)
    mix = torch.randn(64, 64, device=device, requires_grad=True)
    optimizer = torch.optim.SGD([*model.parameters(), mix], lr=1e-3)
    batches = [
        (torch.randn(256, 512).pin_memory(), torch.randn(256, 64).pin_memory())
        for _ in range(4)
    ]
    scratch = torch.empty(1 << 24, device=device)
    big = torch.rand(1 << 24, device=device)
    total = 0.0
    for step in range(args.steps):
        x_cpu, y_cpu = batches[step % len(batches)]
        x = x_cpu.to(device, non_blocking=True)
        y = y_cpu.to(device, non_blocking=True)
        scratch.zero_()
        scale = big.sum() / big.numel()
        optimizer.zero_grad()
        out = torch.mm(model(x), mix) * scale
        loss = (out - y).pow(2).mean()
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"cuda_window: {args.steps} steps, loss sum {total:.4f}", flush=True)


if __name__ == "__main__":
    main()
