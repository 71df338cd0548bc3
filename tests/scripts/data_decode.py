"""A training loop whose Dataset decodes and augments every sample on the
CPU, the way an image pipeline does: each sample is a compressed image,
decompressed, cropped at random, flipped, normalised. Workers are what this
loop needs; the tests take perfrun's word for how many, and time it.

    python data_decode.py [--steps N] [--workers N] [--context spawn]
                          [--slow-worker ID] [--work K] [--read-us U]
    python data_decode.py --take-turns N,N... [--turns T] [--steps N] ...

--read-us waits U microseconds a sample before decoding it: the image read
from a network file system rather than from memory.

Prints `STEP <median ms> FETCH <median ms>` by its own stopwatch (the last
steps, the first ones left out); without workers, `GETITEM <ms> COLLATE
<ms>`, the dataset's and the collate's mean time a batch by the same
stopwatch (the dataset's: from its batch's first `__getitem__` to the
collate; the first batch left out); with workers, `WORKER <id> <pid>` as
each starts; and `done`.

--take-turns times several numbers of workers in one process, an epoch of N
steps each in turn, T epochs each (3 by default): whatever else runs on the
machine, each version's epochs see the same load, where one process per
version would each see their own. Prints `TURN <workers> STEP <median ms>
FETCH <median ms>` for each, over its epochs' steps from the 10th on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

SIZE = 40
CROP = 32


class CompressedImages(Dataset):
    """`n` compressed RGB images with labels; `work` rounds of augmentation a
    sample, after `read` seconds waiting for it. A slow worker (`slow`: its
    id) takes 3 ms more a sample."""

    def __init__(self, n: int, work: int, slow: int = -1, read: float = 0.0) -> None:
        rng = np.random.default_rng(0)
        base = (rng.integers(0, 64, (SIZE, SIZE, 3)) * 4).astype(np.uint8)
        self.blobs = [zlib.compress(np.roll(base, k, axis=1).tobytes(), 6) for k in range(32)]
        self.labels = rng.integers(0, 10, n)
        self.n = n
        self.work = work
        self.slow = slow
        self.read = read
        self.began: float | None = None  # the batch's first __getitem__

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.began is None:
            self.began = time.perf_counter()
        return self._sample(i)

    def _sample(self, i: int) -> tuple[torch.Tensor, int]:
        if self.read:
            time.sleep(self.read)
        raw = np.frombuffer(zlib.decompress(self.blobs[i % 32]), np.uint8)
        img = torch.from_numpy(raw.reshape(SIZE, SIZE, 3).astype(np.float32) / 255.0)
        img = img.permute(2, 0, 1)
        top, left = (i * 7) % (SIZE - CROP), (i * 3) % (SIZE - CROP)
        img = img[:, top:top + CROP, left:left + CROP]
        for _ in range(self.work):
            img = torch.flip(img, dims=[2]) * 1.0001
        img = (img - 0.5) / 0.25
        info = get_worker_info()
        if info is not None and info.id == self.slow:
            time.sleep(0.003)
        return img.contiguous(), int(self.labels[i])


class TimedCollate:
    """default_collate, with the dataset's and its own time per batch."""

    def __init__(self, data: CompressedImages) -> None:
        self.data = data
        self.batches: list[tuple[float, float]] = []

    def __call__(self, samples: list) -> object:
        t0 = time.perf_counter()
        out = default_collate(samples)
        began = self.data.began if self.data.began is not None else t0
        self.batches.append((t0 - began, time.perf_counter() - t0))
        self.data.began = None
        return out


def announce(worker_id: int) -> None:
    print(f"WORKER {worker_id} {os.getpid()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--context", default=None)
    parser.add_argument("--slow-worker", type=int, default=-1)
    parser.add_argument("--work", type=int, default=50)
    parser.add_argument("--read-us", type=float, default=0.0)
    parser.add_argument("--take-turns", default=None)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch = 32
    data = CompressedImages(batch * (args.steps + 2), args.work, args.slow_worker,
                            args.read_us * 1e-6)
    collate = TimedCollate(data)

    def loader(workers: int) -> DataLoader:
        return DataLoader(data, batch_size=batch, shuffle=True, drop_last=True,
                          num_workers=workers, multiprocessing_context=args.context,
                          collate_fn=collate, worker_init_fn=announce if workers else None)

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(8 * 16 * 16, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def epoch(train: DataLoader) -> tuple[list[float], list[float]]:
        """One pass over `train`: each step's time and its fetch's, the
        first steps left out."""
        steps: list[float] = []
        fetches: list[float] = []
        t_end = time.perf_counter()
        for images, labels in train:
            t_fetched = time.perf_counter()
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            steps.append(now - t_end)
            fetches.append(t_fetched - t_end)
            t_end = now
        kept = slice(min(10, len(steps) // 3), None)
        return steps[kept], fetches[kept]

    if args.take_turns:
        versions = [int(w) for w in args.take_turns.split(",")]
        loaders = [loader(w) for w in versions]
        seen: list[tuple[list[float], list[float]]] = [([], []) for _ in versions]
        for _ in range(args.turns):
            for i, train in enumerate(loaders):
                steps, fetches = epoch(train)
                seen[i][0].extend(steps)
                seen[i][1].extend(fetches)
        for w, (steps, fetches) in zip(versions, seen):
            print(f"TURN {w} STEP {statistics.median(steps) * 1e3:.4f} "
                  f"FETCH {statistics.median(fetches) * 1e3:.4f}")
        print("done")
        return
    steps, fetches = epoch(loader(args.workers))
    print(f"STEP {statistics.median(steps) * 1e3:.4f} "
          f"FETCH {statistics.median(fetches) * 1e3:.4f}")
    if collate.batches[1:]:  # made in this process
        made = collate.batches[1:]
        print(f"GETITEM {sum(b[0] for b in made) / len(made) * 1e3:.4f} "
              f"COLLATE {sum(b[1] for b in made) / len(made) * 1e3:.4f}")
    print("done")


if __name__ == "__main__":
    main()
