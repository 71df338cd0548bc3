"""nanoGPT's way of loading data: no DataLoader, a `get_batch` that slices
random windows of a token array into a batch, then a tiny causal model."""

from __future__ import annotations

import torch
from torch import nn

BLOCK = 32
BATCH = 16
VOCAB = 64


def get_batch(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - BLOCK, (BATCH,))
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
    return x, y


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.mix = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.embed(idx)))


def main() -> None:
    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (20_000,))
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _it in range(40):
        x, y = get_batch(data)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print("done")


if __name__ == "__main__":
    main()
