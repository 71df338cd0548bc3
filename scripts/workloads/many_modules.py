"""Benchmark workload (e): a model whose forward calls 1,000 submodules
(100 blocks, each calling nine parameter-free modules) and little else, so
that what a profiler adds to each module call shows a thousand times a
step, over a step of about half a millisecond.

    python many_modules.py [STEPS] [WARMUP] [BLOCKS]

BLOCKS (default 100) sets the submodule calls, ten a block; with 0 the loop
is the same but its model calls no submodule (the benchmark's baseline for
what those calls cost).

Batches come from a plain list (no DataLoader). The script times its own
steady-state steps with time.perf_counter and ends with one line:
    BENCH {"median_step_s": ..., "steps": N, ..., "step_s": [each timed step]}
"""

from __future__ import annotations

import sys

import torch
from benchline import mark, parse, report
from torch import nn

BLOCKS, WIDTH = 100, 8


class Block(nn.Module):
    """Ten module calls: its own and nine of parameter-free modules."""

    def __init__(self) -> None:
        super().__init__()
        self.rest = nn.ModuleList([nn.Identity() for _ in range(9)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.rest:
            x = module(x)
        return x


class Deep(nn.Module):
    def __init__(self, blocks: int = BLOCKS) -> None:
        super().__init__()
        # 100 block calls and 900 calls inside them: 1,000 below the root.
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        # The head is a parameter, not a module: no 1,001st call.
        self.head = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return torch.nn.functional.linear(x, self.head)


def build(blocks: int = BLOCKS) -> tuple[list, nn.Module, nn.Module]:
    """The batches, the model and the loss (scripts/bench_hotpath.py and
    bench_inprocess.py build the same loop); the optimizer is the caller's,
    built where perfrun's hooks can see it."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = [(torch.randn(4, WIDTH), torch.randint(0, WIDTH, (4,))) for _ in range(16)]
    return data, Deep(blocks), nn.CrossEntropyLoss()


def main(argv: list[str]) -> None:
    blocks = int(argv[2]) if len(argv) > 2 else BLOCKS
    steps, warmup = parse(argv[:2], __doc__, 1000, 100)

    data, model, loss_fn = build(blocks)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    marks: list[float] = []
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        marks.append(mark())
    report("many_modules" if blocks else "no_submodules", marks, warmup, torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1:])
