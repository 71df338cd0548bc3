"""Benchmark workload: a DataLoader whose Dataset decodes and augments each
sample on the CPU (a compressed image, decompressed, normalised, flipped
a number of times), feeding a small MLP: the loop where DataLoader workers
are meant to pay. Also an in-memory TensorDataset loop of the same shapes,
the loop where they are not.

    python decode_loader.py STEPS WARMUP [--workers N] [--flips K] [--hidden H]
                            [--in-memory] [--batched]

--flips sets the work per sample, --hidden the model's compute per step,
--in-memory swaps the decoding Dataset for a TensorDataset, --batched
indexes a whole batch at once (a BatchSampler with batch_size=None).
Ends with a BENCH line (benchline.py): the median step and fetch by the
script's own stopwatch.
"""

from __future__ import annotations

import argparse
import zlib
from time import perf_counter

import numpy as np
import torch
from benchline import report
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

SIZE = 32


class Decode(Dataset):
    """Compressed 32x32 RGB 'images': decompressed, normalised and flipped
    `flips` times per sample."""

    def __init__(self, n: int, flips: int) -> None:
        rng = np.random.default_rng(0)
        raw = (rng.integers(0, 64, (SIZE, SIZE, 3)) * 4).astype(np.uint8)
        self.blobs = [zlib.compress(np.roll(raw, i, axis=0).tobytes(), 6) for i in range(64)]
        self.labels = rng.integers(0, 10, n)
        self.n = n
        self.flips = flips

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        a = np.frombuffer(zlib.decompress(self.blobs[i % 64]), np.uint8)
        x = torch.from_numpy(a.reshape(SIZE, SIZE, 3).astype(np.float32) / 255.0)
        x = (x.permute(2, 0, 1) - 0.5) / 0.25
        for _ in range(self.flips):
            x = torch.flip(x, dims=[2]) * 1.0001
        return x, int(self.labels[i])


class _switch:
    """A worker_init_fn that shortens the worker's GIL switch interval."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, _worker: int) -> None:
        import sys

        sys.setswitchinterval(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("warmup", type=int)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--flips", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--in-memory", action="store_true")
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--switch", type=float, default=None,
                        help="sys.setswitchinterval in each worker (seconds)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = args.batch * (args.steps + args.warmup + 1)
    if args.in_memory:
        dataset: Dataset = TensorDataset(torch.randn(n, 3, SIZE, SIZE), torch.randint(0, 10, (n,)))
    else:
        dataset = Decode(n, args.flips)
    if args.batched:
        sampler = BatchSampler(RandomSampler(dataset), args.batch, drop_last=True)
        loader = DataLoader(dataset, sampler=sampler, batch_size=None,
                            num_workers=args.workers)
    else:
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, drop_last=True,
                            num_workers=args.workers,
                            worker_init_fn=_switch(args.switch) if args.switch else None)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * SIZE * SIZE, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    marks = [perf_counter()]
    fetches: list[float] = []
    it = iter(loader)
    while len(marks) <= args.steps + args.warmup:
        t0 = perf_counter()
        x, y = next(it)
        fetches.append(perf_counter() - t0)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        marks.append(perf_counter())
    name = "decode_loader" + ("_in_memory" if args.in_memory else "")
    report(name, marks, args.warmup, torch.__version__,
           {"fetch_median_s": float(np.median(fetches[args.warmup:])),
            "num_workers": args.workers})


if __name__ == "__main__":
    main()
