"""A two-model (GAN-style) loop for the Module Summary tests: a Generator
and a Discriminator, each called by the script, and a BCEWithLogitsLoss
module. The real samples come from a DataLoader, so each step starts with a
fetch, before any model has been called. Per step the Generator is called
once and the Discriminator three times. `--names FILE` writes both models'
`named_modules()` names as {"Generator": [...], "Discriminator": [...]}."""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--names", default=None)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen, disc = Generator(), Discriminator()
    if args.names:
        names = {type(m).__name__: [n for n, _ in m.named_modules()] for m in (gen, disc)}
        with open(args.names, "w") as f:
            json.dump(names, f)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    loader = DataLoader(TensorDataset(torch.randn(args.steps * 4, 8)), batch_size=4)
    for (real,) in loader:
        fake = gen(torch.randn(4, 4))
        d_loss = bce(disc(real), torch.ones(4, 1)) + bce(disc(fake.detach()), torch.zeros(4, 1))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(disc(fake), torch.ones(4, 1))
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
    print("mod_gan done")


if __name__ == "__main__":
    main()
