"""Lightning manual optimization with two optimizers, as the Lightning docs
write a GAN: `self.automatic_optimization = False`, both optimizers stepped
every batch with `self.manual_backward`, `opt.step()`, `opt.zero_grad()`.

A small generator and discriminator of Linear layers learn a shifted
Gaussian; a validation DataLoader (the discriminator's accuracy on real
against generated samples) is checked every VAL_EVERY batches.
`num_sanity_val_steps=0` here (lightning_auto.py keeps the default), so both
shapes are covered: here every evaluation pass comes after training started.
Progress bar, logger, checkpointing and the model summary are off; the CPU
is used. Every batch costs the same fixed CPU work in the collate_fn
(fetch_cost.py), so the Reader Ratio is the same from run to run.

Prints the discriminator's accuracy at each validation and, last, one
FRAMEWORK_COUNTS line (see the comment there on what a step is).
"""

import json
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from fetch_cost import fixed_cost_collate
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCHES = 100  # training batches: one step each (two optimizer steps)
BATCH = 64
FEATURES = 256
HIDDEN = 512
VAL_EVERY = 40  # validation after batches 40 and 80
VAL_BATCHES = 3
LATENT = 64


#: Every batch costs the same fixed work (fetch_cost.py).
FETCH_ROUNDS = 2
busy_collate = fixed_cost_collate(BATCH, HIDDEN, FETCH_ROUNDS)


class GAN(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(
            nn.Linear(LATENT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, FEATURES),
        )
        self.discriminator = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, 1),
        )
        self.train_batches = 0
        self.val_passes = 0
        self.val_batches = 0
        self.val_accuracy = []

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], LATENT)
        ones = torch.ones(real.shape[0], 1)
        zeros = torch.zeros(real.shape[0], 1)

        # Generator: make the discriminator call generated samples real.
        fake = self(z)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()

        # Discriminator: real against (detached) generated samples.
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake.detach()), zeros)
        d_loss = (real_loss + fake_loss) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.train_batches += 1

    def validation_step(self, batch, batch_idx):
        (real,) = batch
        self.val_batches += 1
        fake = self(torch.randn(real.shape[0], LATENT))
        right = (self.discriminator(real) > 0).sum() + (self.discriminator(fake) <= 0).sum()
        self.val_accuracy.append(right.item() / (2 * real.shape[0]))

    def on_validation_epoch_end(self):
        self.val_passes += 1
        accuracy = sum(self.val_accuracy) / len(self.val_accuracy)
        print(f"validation after batch {self.train_batches}: discriminator accuracy {accuracy:.4f}")
        self.val_accuracy.clear()

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=1e-3)
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=1e-3)
        return opt_g, opt_d


def loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    real = torch.randn(n, FEATURES, generator=g) * 0.5 + 2.0
    return DataLoader(TensorDataset(real), batch_size=BATCH, collate_fn=busy_collate)


def main() -> None:
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    model = GAN()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        val_check_interval=VAL_EVERY,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(
        model,
        train_dataloaders=loader(BATCHES * BATCH, seed=1),
        val_dataloaders=loader(VAL_BATCHES * BATCH, seed=2),
    )
    print(f"lightning global_step {trainer.global_step}")

    counts = {
        # With manual optimization Lightning's global_step counts every
        # optimizer.step(): two per batch here (the line above prints it).
        # A user counts training steps, one per batch with both optimizers
        # stepped (perfrun's README: "a GAN that steps two optimizers per
        # batch is one step per batch"), which is also
        # global_step / len(optimizers).
        "optimizer_steps": model.train_batches,
        "eval_passes": model.val_passes,
        "eval_batches": model.val_batches,
        "train_batch_size": BATCH,
        "accumulation": 1,
    }
    assert trainer.global_step == 2 * model.train_batches
    print("FRAMEWORK_COUNTS " + json.dumps(counts, sort_keys=True))


if __name__ == "__main__":
    main()
