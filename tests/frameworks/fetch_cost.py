"""The fixed cost of fetching a batch, shared by the framework scripts.

Every batch costs the same CPU work, of the same kind and size as the
model's own: `rounds` products of a batch of activations with a matrix the
size of the model's largest weight. A wall-clock busy-wait keeps its length
while a loaded machine slows the model down, and a small product that stays
in cache slows down less than the model under memory contention: either way
the Reader Ratio would move with the load of the machine (by 2 to 18 points
from run to run on a 2-core machine running pytest -n 2). This slows down
with the model, so the Reader Ratio is a property of the script.
"""

from typing import Any, Callable

import torch


def fixed_cost_collate(batch: int, width: int, rounds: int = 1) -> Callable[[Any], Any]:
    """A collate_fn: the default collate plus the fixed work."""
    activations = torch.randn(batch, width, generator=torch.Generator().manual_seed(0))
    weight = torch.randn(width, width, generator=torch.Generator().manual_seed(1))

    def collate(samples: Any) -> Any:
        out = torch.utils.data.default_collate(samples)
        for _ in range(rounds):
            torch.mm(activations, weight)
        return out

    return collate
