"""Benchmark workload (b): a small transformer language model (embedding,
nn.TransformerEncoder with a causal mask, output head) whose training step
takes a few tens of milliseconds on one CPU thread.

    python small_transformer.py [STEPS] [WARMUP]

Batches of random tokens come from a plain list. The script times its own
steady-state steps with time.perf_counter and ends with one line:
    BENCH {"median_step_s": ..., "steps": N, ..., "step_s": [each timed step]}
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
from benchline import mark, parse, report
from torch import nn

VOCAB, D_MODEL, HEADS, FFN, LAYERS, SEQ, BATCH = 1000, 128, 4, 256, 2, 64, 8


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        layer = nn.TransformerEncoderLayer(
            D_MODEL, HEADS, FFN, dropout=0.1, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos
        h = self.encoder(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def make_step() -> tuple[Callable[[int], None], torch.optim.Optimizer]:
    """One training step on batch `i`, and its optimizer: the loop main()
    times, and scripts/bench_inprocess.py runs in blocks."""
    torch.manual_seed(0)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1)) for _ in range(16)]
    model = TinyLM()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model.train()

    def step(i: int) -> None:
        tokens = data[i % len(data)]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = loss_fn(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()

    return step, optimizer


def main(argv: list[str]) -> None:
    steps, warmup = parse(argv, __doc__, 60, 5)

    torch.set_num_threads(1)
    step, _ = make_step()

    marks: list[float] = []
    for i in range(warmup + steps):
        step(i)
        marks.append(mark())
    report("small_transformer", marks, warmup, torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1:])
