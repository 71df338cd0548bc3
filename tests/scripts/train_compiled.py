"""A small model under torch.compile (backend "eager": Dynamo's guards and
recompiles are what the tests look at, and no C++ toolchain is needed).

`--mode wrap` compiles with `torch.compile(model)`, `--mode inplace` with
`model.compile()`; a second call site with a different batch size and a
no-grad evaluation pass give Dynamo reasons to recompile that are the
script's own, so the tests see the same recompiles with and without perfrun.
"""

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["wrap", "inplace"], default="wrap")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(Block(16), Block(16), nn.Linear(16, 2))
    if args.mode == "wrap":
        run = torch.compile(model, backend="eager")
    else:
        model.compile(backend="eager")
        run = model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(args.steps):
        x = torch.randn(8, 16)
        optimizer.zero_grad()
        loss = run(x).sum()
        loss.backward()
        optimizer.step()
        if i % 5 == 4:
            with torch.no_grad():
                run(torch.randn(4, 16))
    print(f"train_compiled done: loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
