"""A classifier's loop that logs its metrics every step, as many examples
do from their first version: the batch's accuracy, a running confusion
matrix, and each layer's gradient and weight norm (what a W&B or
TensorBoard dashboard plots), each read back with `.item()`. All of it
runs between the optimizer's step and the next fetch: the step's Others.

    python metrics_every_step.py [--steps N] [--log-every K[,K2...]] [--block B]

`--log-every K` computes the metrics every K steps only, the change the
CPU-bound advice asks for. Several values take turns, B steps each (20 by
default): the same process times the loop as it was and as changed, in
interleaved blocks, where two processes of the same loop here can differ
by a third in their mean step. Prints `STEP <i> MS <step ms> METRICS <ms>
EVERY <k>` per step (the script's own stopwatch, the metrics part 0 where
skipped), and `MEAN_STEP_MS <k> <ms>` for each K over its steps from the
fifth on.
"""

from __future__ import annotations

import argparse
from time import perf_counter

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CLASSES = 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-every", default="1")
    parser.add_argument("--block", type=int, default=20)
    args = parser.parse_args()
    settings = [int(k) for k in args.log_every.split(",")]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, CLASSES, (4096,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    layers: list[nn.Module] = []
    width = 64
    for _ in range(6):
        layers += [nn.Linear(width, 64), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(64, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    confusion = torch.zeros(CLASSES, CLASSES, dtype=torch.long)
    history: list[dict[str, float]] = []
    step, times = 0, {k: [] for k in settings}
    t0 = perf_counter()
    while step < args.steps:
        for x, y in loader:
            logits = model(x)
            loss = criterion(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            every = settings[step // args.block % len(settings)]
            m0 = perf_counter()
            if step % every == 0:
                with torch.no_grad():
                    pred = logits.argmax(dim=1)
                    record = {"loss": loss.item(), "acc": (pred == y).float().mean().item()}
                    confusion += torch.bincount(y * CLASSES + pred,
                                                minlength=CLASSES * CLASSES).view(CLASSES, CLASSES)
                    recall = confusion.diag() / confusion.sum(dim=1).clamp(min=1)
                    record["mean_recall"] = recall.mean().item()
                    for name, p in model.named_parameters():
                        record[f"grad_norm/{name}"] = p.grad.norm().item()
                        record[f"weight_norm/{name}"] = p.norm().item()
                    history.append(record)
            t1 = m1 = perf_counter()
            ms = (t1 - t0) * 1e3
            if step >= 4:
                times[every].append(ms)
            print(f"STEP {step} MS {ms:.4f} METRICS {(m1 - m0) * 1e3:.4f} EVERY {every}",
                  flush=True)
            t0 = t1
            step += 1
            if step == args.steps:
                break
    for k, later in times.items():
        print(f"MEAN_STEP_MS {k} {sum(later) / len(later):.4f}", flush=True)


if __name__ == "__main__":
    main()
