"""A tiny GPT-shaped model for the Module Summary tests: `transformer.wte`,
`transformer.h.0..N-1` (each an `attn` Linear and an `mlp` Sequential),
`transformer.ln_f`, `lm_head`, and an `nn.CrossEntropyLoss` module (a root
with no submodules). Block `--slow-block` busy-waits `--slow-ms` in its
forward, so the tests know which block costs the most and by how much.

`--names FILE` writes the model's `named_modules()` names; `--direct` calls
`model.forward(x)` instead of `model(x)`; `--checkpoint` runs each block
under activation checkpointing (`torch.utils.checkpoint`, non-reentrant),
so its forward runs again inside backward. One optimizer step per iteration,
no DataLoader: the run is deterministic in its steps and module calls.
"""

import argparse
import json
import time

import torch
import torch.utils.checkpoint
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, slow_s: float) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )
        self.slow_s = slow_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow_s:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < self.slow_s:
                pass
        return x + self.mlp(x + self.attn(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, width: int, blocks: int, slow_block: int, slow_s: float,
                 checkpoint: bool = False):
        super().__init__()
        self.checkpoint = checkpoint
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, width),
                h=nn.ModuleList(
                    [Block(width, slow_s if i == slow_block else 0.0) for i in range(blocks)]
                ),
                ln_f=nn.LayerNorm(width),
            )
        )
        self.lm_head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--slow-block", type=int, default=2)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--names", default=None)
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--checkpoint", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    vocab = 50
    model = TinyGPT(vocab, 16, args.blocks, args.slow_block, args.slow_ms / 1e3, args.checkpoint)
    if args.names:
        with open(args.names, "w") as f:
            json.dump([name for name, _ in model.named_modules()], f)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    for _ in range(args.steps):
        idx = torch.randint(0, vocab, (2, 8))
        logits = model.forward(idx) if args.direct else model(idx)
        loss = criterion(logits.view(-1, vocab), idx.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("mod_blocks done")


if __name__ == "__main__":
    main()
