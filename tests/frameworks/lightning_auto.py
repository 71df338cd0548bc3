"""Lightning automatic optimization, as the Lightning docs write it.

A LightningModule of Linear layers, `accumulate_grad_batches=2`, and a
validation DataLoader checked every VAL_EVERY training batches
(`val_check_interval`), so validation runs twice during the epoch.
`num_sanity_val_steps` is left at its default (2): that is what users run,
and the sanity check is one more evaluation pass (2 batches, under no_grad,
after configure_optimizers has created the optimizer, before the first
training batch) that must stay out of the steps like the others; so this
script has 3 evaluation passes of 2 + 3 + 3 batches. (lightning_manual.py
sets it to 0, so both shapes are covered.) Progress bar, logger,
checkpointing and the model summary are off; the CPU is used. Every batch
costs the same fixed CPU work in the collate_fn (fetch_cost.py), so the Reader
Ratio is the same from run to run.

Lightning steps the optimizer as `optimizer.step(closure)`, the closure
running training_step, zero_grad and backward; on the batches that only
accumulate it runs the closure itself, without an optimizer step.

Prints the loss of each validation pass and, last, one FRAMEWORK_COUNTS line
with Lightning's own counters.
"""

import json
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from fetch_cost import fixed_cost_collate
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 160  # optimizer steps
BATCH = 64
FEATURES = 256
HIDDEN = 512
ACCUM = 2  # accumulate_grad_batches
VAL_EVERY = 120  # training batches: validation after batches 120 and 240 of 320
VAL_BATCHES = 3


#: Every batch costs the same fixed work (fetch_cost.py).
FETCH_ROUNDS = 1
busy_collate = fixed_cost_collate(BATCH, HIDDEN, FETCH_ROUNDS)


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, 1),
        )
        self.val_passes = 0
        self.val_batches = 0
        self.val_losses = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_batches += 1
        loss = F.mse_loss(self(x), y)
        self.val_losses.append(loss.item())
        return loss

    def on_validation_epoch_end(self):
        # Runs after the sanity check too: a pass is a pass.
        self.val_passes += 1
        what = "sanity check" if self.trainer.sanity_checking else f"step {self.global_step}"
        mean = sum(self.val_losses) / len(self.val_losses)
        print(f"validation after {what}: loss {mean:.6f}")
        self.val_losses.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, collate_fn=busy_collate)


def main() -> None:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        accumulate_grad_batches=ACCUM,
        val_check_interval=VAL_EVERY,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(
        model,
        train_dataloaders=loader(STEPS * ACCUM * BATCH, seed=1),
        val_dataloaders=loader(VAL_BATCHES * BATCH, seed=2),
    )
    print(f"train batches {trainer.fit_loop.epoch_loop.batch_progress.total.completed}")

    counts = {
        # With automatic optimization global_step counts optimizer steps.
        "optimizer_steps": trainer.global_step,
        "eval_passes": model.val_passes,
        "eval_batches": model.val_batches,
        "train_batch_size": BATCH,
        "accumulation": trainer.accumulate_grad_batches,
    }
    print("FRAMEWORK_COUNTS " + json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
