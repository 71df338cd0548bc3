"""The tutorial loop: an in-memory TensorDataset (MNIST-sized images made
up here), a small MLP, a shuffled DataLoader, Adam, an evaluation pass each
epoch. Its fetch is the per-sample indexing and `default_collate`: workers
would only add to it.

    python data_in_memory.py [--epochs N] [--workers N] [--batched]
    python data_in_memory.py --take-turns VERSION,VERSION... [--epochs N]

--batched indexes a whole batch at once (a BatchSampler, batch_size=None).

Prints `STEP <median ms> FETCH <median ms>` by its own stopwatch.

--take-turns times several loaders in one process, an epoch each in turn,
N epochs each (a version is `plain`, `batched` or `workers=K`): whatever
else runs on the machine, each version's epochs see the same load, where
one process per version would each see their own. Prints `TURN <version>
STEP <median ms> FETCH <median ms> CPU <ms>` for each version: the medians
over its epochs' steps from the 10th on (a worker's start-up and first
batches left out), and the CPU time its epochs' training took a step, this
process's and its workers' together (each epoch's workers are joined when
its iterator ends, so their time is in RUSAGE_CHILDREN).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def loader(data: TensorDataset, workers: int, batched: bool) -> DataLoader:
    if batched:
        return DataLoader(data, sampler=BatchSampler(RandomSampler(data), 64, drop_last=False),
                          batch_size=None, num_workers=workers)
    return DataLoader(data, batch_size=64, shuffle=True, num_workers=workers)


def version_loader(data: TensorDataset, version: str) -> DataLoader:
    if version == "plain":
        return loader(data, 0, False)
    if version == "batched":
        return loader(data, 0, True)
    if version.startswith("workers="):
        return loader(data, int(version.split("=", 1)[1]), False)
    raise SystemExit(f"unknown version {version!r}: plain, batched or workers=K")


def job_cpu() -> float:
    """CPU seconds of this process and of its children that have ended."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--take-turns", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    images = torch.rand(6400, 1, 28, 28)
    labels = torch.randint(0, 10, (6400,))
    data = TensorDataset(images[:5760], labels[:5760])
    if args.take_turns:
        versions = args.take_turns.split(",")
        loaders = [version_loader(data, v) for v in versions]
        epochs = [loaders[i] for _ in range(args.epochs) for i in range(len(versions))]
    else:
        versions = ["single"]
        loaders = [loader(data, args.workers, args.batched)]
        epochs = loaders * args.epochs
    test = DataLoader(TensorDataset(images[5760:], labels[5760:]), batch_size=256)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps: dict[int, list[float]] = {i: [] for i in range(len(loaders))}
    fetches: dict[int, list[float]] = {i: [] for i in range(len(loaders))}
    cpu: dict[int, list[float]] = {i: [] for i in range(len(loaders))}
    for train in epochs:
        turn = loaders.index(train)
        epoch_steps: list[float] = []
        epoch_fetches: list[float] = []
        model.train()
        cpu_start = job_cpu()
        t_end = time.perf_counter()
        for x, y in train:
            t_fetched = time.perf_counter()
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            now = time.perf_counter()
            epoch_steps.append(now - t_end)
            epoch_fetches.append(t_fetched - t_end)
            t_end = now
        cpu[turn].append((job_cpu() - cpu_start) / len(epoch_steps))
        # One process, one version: its steps from the 10th on. Taking
        # turns: each epoch's from its 10th on.
        steps[turn] += epoch_steps if args.take_turns is None else epoch_steps[10:]
        fetches[turn] += epoch_fetches if args.take_turns is None else epoch_fetches[10:]
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in test:
                correct += int((model(x).argmax(1) == y).sum())
    if args.take_turns is None:
        kept = slice(10, None)
        print(f"STEP {statistics.median(steps[0][kept]) * 1e3:.4f} "
              f"FETCH {statistics.median(fetches[0][kept]) * 1e3:.4f}")
        return
    for turn, version in enumerate(versions):
        print(f"TURN {version} STEP {statistics.median(steps[turn]) * 1e3:.4f} "
              f"FETCH {statistics.median(fetches[turn]) * 1e3:.4f} "
              f"CPU {statistics.mean(cpu[turn]) * 1e3:.4f}")


if __name__ == "__main__":
    main()
