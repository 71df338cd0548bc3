"""A text classifier whose Dataset holds its tokenised corpus as a list of
Python lists of token ids, as many tutorials build it, read by two
DataLoader workers. Each worker starts with the parent's pages and copies
every page of the corpus it reads (reading a Python object writes its
reference count): its private memory grows with what it has read, the
copy-on-read that the PyTorch documentation warns about. `--numpy` holds
the same corpus in one numpy array: nothing is copied.

Prints `BATCH_SIZE <n>` and `ROW_BYTES <n>`: what one row of the corpus
takes in memory (its ints, its list and the list's item array), the pages a
worker copies as it reads it.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class TokenDataset(Dataset):
    def __init__(self, sequences, labels) -> None:
        self.sequences = sequences
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return torch.tensor(self.sequences[index]), int(self.labels[index])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=120_000)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=5_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--numpy", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ids = rng.integers(1_000, args.vocab, size=(args.samples, args.length))
    labels = rng.integers(0, 4, size=args.samples).tolist()
    if args.numpy:
        sequences = ids
    else:
        # Token ids as Python ints in Python lists (above 256: no cached ints).
        sequences = [[int(t) * 1000 for t in row] for row in ids.tolist()]
    row = args.length * 8 if args.numpy else (
        sys.getsizeof(sequences[0]) + sum(sys.getsizeof(t) for t in sequences[0]))
    dataset = TokenDataset(sequences, labels)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=2)

    model = nn.EmbeddingBag(args.vocab, 32)
    head = nn.Linear(32, 4)
    optimizer = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=1e-3)
    for tokens, target in loader:
        optimizer.zero_grad()
        logits = head(model(tokens // 1000))
        loss = nn.functional.cross_entropy(logits, target)
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}")
    print(f"BATCH_SIZE {args.batch_size}")
    print(f"ROW_BYTES {row}")


if __name__ == "__main__":
    main()
