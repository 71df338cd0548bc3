"""Ground truth for perfrun's GPU memory: the script's own allocator readings.

    cuda_memory.py --mode phases --steps N --out FILE
    cuda_memory.py --mode creep|flat --steps N
    cuda_memory.py --mode oom --oom-step K

An MLP trains on a batch drawn from a DataLoader over tensors already on the
GPU (indexing and collating them allocates on the device, in the fetch).

phases: around each phase (the fetch, the forward call, `loss.backward()`,
`optimizer.zero_grad()` and `optimizer.step()`) the script resets the
allocator's peak and reads `torch.cuda.max_memory_allocated()` after it, as
a user measuring memory would, and writes the per-step peaks to FILE
(zero_grad and step as one `optimization`, as perfrun counts them).

creep: every step's logits are kept in a list (a common slip:
`outputs.append(out)` for a metric at the end), so what the allocator holds
grows by a batch of logits a step (4 MiB at the defaults). flat: the same
loop keeping `out.detach().cpu()`.

oom: at step K the forward of the `bloat` block asks for more memory than
the device has; the script does not catch the error.
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Bloat(nn.Module):
    """A block that, once armed, asks for twice the device's memory."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            total = torch.cuda.get_device_properties(x.device).total_memory
            x = x + torch.empty(2 * total // 4, device=x.device).sum()
        return self.proj(x)


class Net(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, width), nn.ReLU(),
                                  nn.Linear(width, width), nn.ReLU())
        self.bloat = Bloat(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bloat(self.body(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("phases", "creep", "flat", "oom"), required=True)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--oom-step", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Net(args.width, args.classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = TensorDataset(torch.randn(args.batch * 8, args.width, device=device),
                         torch.randint(0, args.classes, (args.batch * 8,), device=device))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True)

    truth: list[dict[str, int]] = []
    outputs = []
    step = 0

    def peak_of(fn, *args):
        torch.cuda.reset_peak_memory_stats()
        result = fn(*args)
        return result, torch.cuda.max_memory_allocated()

    while step < args.steps:
        it = iter(loader)
        while step < args.steps:
            if args.mode == "phases":
                try:
                    (x, y), fetch = peak_of(next, it)
                except StopIteration:
                    break
                _, zero = peak_of(optimizer.zero_grad)
                out, forward = peak_of(model, x)
                loss = nn.functional.cross_entropy(out, y)
                _, backward = peak_of(loss.backward)
                _, update = peak_of(optimizer.step)
                truth.append({"step": step, "dataloader": fetch, "forward": forward,
                              "backward": backward, "optimization": max(zero, update)})
            else:
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                if args.mode == "oom" and step == args.oom_step:
                    model.bloat.armed = True
                optimizer.zero_grad()
                out = model(x)
                loss = nn.functional.cross_entropy(out, y)
                loss.backward()
                optimizer.step()
                outputs.append(out if args.mode == "creep" else out.detach().cpu())
            step += 1
    torch.cuda.synchronize()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"steps": truth, "total": torch.cuda.get_device_properties(0).total_memory},
                      f)
    print(f"cuda_memory {args.mode}: {step} steps, max allocated "
          f"{torch.cuda.max_memory_allocated()} bytes", flush=True)


if __name__ == "__main__":
    main()
