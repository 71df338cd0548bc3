"""A plain PyTorch loop whose optimizer step takes a closure.

`optimizer.step(closure)` with torch.optim.SGD, the closure running
zero_grad, forward, loss and backward: the shape Lightning's automatic
optimization gives every training step, without Lightning. A validation pass
under torch.no_grad() runs every EVAL_EVERY steps. Every batch costs the
same fixed CPU work in the collate_fn (fetch_cost.py), so the share of the step
spent fetching (the Reader Ratio) is the same from run to run.

Prints the losses at each validation and, last, one FRAMEWORK_COUNTS line:
the optimizer steps, evaluation passes and batches the loop counted.
"""

import json

import torch
import torch.nn.functional as F
from fetch_cost import fixed_cost_collate
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 160
BATCH = 128
FEATURES = 256
HIDDEN = 512
EVAL_EVERY = 60
VAL_BATCHES = 3


#: Every batch costs the same fixed work (fetch_cost.py).
FETCH_ROUNDS = 1
busy_collate = fixed_cost_collate(BATCH, HIDDEN, FETCH_ROUNDS)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, xb, yb) -> torch.Tensor:
    def closure():
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        return loss

    return optimizer.step(closure)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(STEPS * BATCH, FEATURES)
    y = x[:, :4].sum(dim=1, keepdim=True)
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH, collate_fn=busy_collate)
    vx = torch.randn(VAL_BATCHES * BATCH, FEATURES)
    val = DataLoader(
        TensorDataset(vx, vx[:, :4].sum(dim=1, keepdim=True)),
        batch_size=BATCH,
        collate_fn=busy_collate,
    )
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    steps = eval_passes = eval_batches = 0
    for xb, yb in train:
        loss = train_step(model, optimizer, xb, yb).detach()
        steps += 1
        if steps % EVAL_EVERY == 0:
            model.eval()
            total = 0.0
            with torch.no_grad():
                for vxb, vyb in val:
                    total += float(F.mse_loss(model(vxb), vyb))
                    eval_batches += 1
            eval_passes += 1
            model.train()
            print(f"step {steps}: train loss {loss.item():.6f} val loss {total / len(val):.6f}")

    counts = {
        "optimizer_steps": steps,
        "eval_passes": eval_passes,
        "eval_batches": eval_batches,
        "train_batch_size": BATCH,
        "accumulation": 1,
    }
    print("FRAMEWORK_COUNTS " + json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
