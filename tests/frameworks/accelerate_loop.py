"""🤗 Accelerate, as its docs write the loop: `Accelerator(
gradient_accumulation_steps=2)`, `with accelerator.accumulate(model):`
around each micro-batch, `accelerator.backward(loss)`, `optimizer.step()`,
`scheduler.step()` and `optimizer.zero_grad()` every micro-batch (the
prepared optimizer only really steps when `accelerator.sync_gradients`), and
an evaluation loop after each epoch written as in accelerate's
examples/nlp_example.py: the fetch runs with gradients ON and only the
forward is inside `torch.no_grad()`; predictions are gathered with
`accelerator.gather_for_metrics`.

A classifier of Linear layers on synthetic features, on the CPU. Every
batch, training and evaluation, costs the same fixed CPU work in the
collate_fn (fetch_cost.py), so the Reader Ratio is the same from run to run.

Prints the loss and accuracy after each epoch and, last, one
FRAMEWORK_COUNTS line: the iterations where `accelerator.sync_gradients` was
true (the optimizer steps), the evaluation passes and batches.
"""

import json

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from fetch_cost import fixed_cost_collate
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 2  # one evaluation pass after each
STEPS_PER_EPOCH = 80  # optimizer steps
BATCH = 64
FEATURES = 256
HIDDEN = 512
ACCUM = 2
EVAL_BATCHES = 3


#: Every batch costs the same fixed work (fetch_cost.py).
FETCH_ROUNDS = 1
busy_collate = fixed_cost_collate(BATCH, HIDDEN, FETCH_ROUNDS)


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
    set_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 2),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    train_dataloader = DataLoader(
        dataset(STEPS_PER_EPOCH * ACCUM * BATCH, seed=1),
        batch_size=BATCH,
        shuffle=True,
        collate_fn=busy_collate,
    )
    eval_dataloader = DataLoader(
        dataset(EVAL_BATCHES * BATCH, seed=2), batch_size=BATCH, collate_fn=busy_collate
    )
    model, optimizer, train_dataloader, eval_dataloader, scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, scheduler
    )

    steps = eval_passes = eval_batches = 0
    for epoch in range(EPOCHS):
        model.train()
        for inputs, targets in train_dataloader:
            with accelerator.accumulate(model):
                outputs = model(inputs)
                loss = F.cross_entropy(outputs, targets)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                steps += 1

        model.eval()
        correct = total = 0
        for inputs, targets in eval_dataloader:
            with torch.no_grad():
                outputs = model(inputs)
            predictions = outputs.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, targets))
            correct += int((predictions == references).sum())
            total += references.numel()
            eval_batches += 1
        eval_passes += 1
        accelerator.print(f"epoch {epoch}: loss {loss.item():.6f} accuracy {correct / total:.4f}")

    counts = {
        "optimizer_steps": steps,
        "eval_passes": eval_passes,
        "eval_batches": eval_batches,
        "train_batch_size": BATCH,
        "accumulation": accelerator.gradient_accumulation_steps,
    }
    print("FRAMEWORK_COUNTS " + json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
