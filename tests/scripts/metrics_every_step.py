"""A classifier's loop that logs its metrics every step, as many examples
do from their first version: the batch's accuracy, a running confusion
matrix, and each layer's gradient and weight norm (what a W&B or
TensorBoard dashboard plots), each read back with `.item()`. All of it
runs between the optimizer's step and the next fetch: the step's Others.

    python metrics_every_step.py [--steps N] [--log-every K]

`--log-every K` computes the metrics every K steps only, the change the
CPU-bound advice asks for. Prints `STEP <i> MS <step ms> METRICS <ms>` per
step (the script's own stopwatch, the metrics part 0 where skipped), and
`MEAN_STEP_MS <ms>` over the steps from the fifth on.
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
    parser.add_argument("--log-every", type=int, default=1)
    args = parser.parse_args()
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
    step, times = 0, []
    t0 = perf_counter()
    while step < args.steps:
        for x, y in loader:
            logits = model(x)
            loss = criterion(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            m0 = perf_counter()
            if step % args.log_every == 0:
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
            m1 = perf_counter()
            t1 = perf_counter()
            times.append((t1 - t0) * 1e3)
            print(f"STEP {step} MS {times[-1]:.4f} METRICS {(m1 - m0) * 1e3:.4f}", flush=True)
            t0 = t1
            step += 1
            if step == args.steps:
                break
    later = times[4:]
    print(f"MEAN_STEP_MS {sum(later) / len(later):.4f}", flush=True)


if __name__ == "__main__":
    main()
