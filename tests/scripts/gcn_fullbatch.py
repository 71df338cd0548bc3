"""Full-batch node classification as PyTorch Geometric's examples write it:
the whole graph is one batch, `train()` takes one optimizer step an epoch,
and `test()` (under `@torch.no_grad()`) evaluates the validation and test
masks every epoch, one forward each. A dense, symmetrically normalised
adjacency stands in for GCNConv's message passing and a random graph for
Cora (nothing is downloaded).

Prints `EVAL_FORWARDS <n>` and `TRAIN_STEPS <n>` at the end, for the
window's tables to be held to.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class GCNConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return adj @ self.lin(x) + self.bias


class GCN(nn.Module):
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, adj).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, adj)


def random_graph(nodes: int, features: int, classes: int):
    g = torch.Generator().manual_seed(0)
    adj = (torch.rand(nodes, nodes, generator=g) < 4.0 / nodes).float()
    adj = ((adj + adj.t()) > 0).float() + torch.eye(nodes)
    deg = adj.sum(1)
    norm = deg.pow(-0.5)
    adj = norm[:, None] * adj * norm[None, :]
    x = torch.rand(nodes, features, generator=g)
    y = torch.randint(0, classes, (nodes,), generator=g)
    perm = torch.randperm(nodes, generator=g)
    masks = [torch.zeros(nodes, dtype=torch.bool) for _ in range(3)]
    masks[0][perm[:140]] = True
    masks[1][perm[140:640]] = True
    masks[2][perm[640:1640]] = True
    return x, adj, y, masks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--features", type=int, default=500)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)

    x, adj, y, (train_mask, val_mask, test_mask) = random_graph(args.nodes, args.features, 7)
    model = GCN(args.features, args.hidden, 7)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    evals = 0

    def train() -> float:
        model.train()
        optimizer.zero_grad()
        out = model(x, adj)
        loss = F.cross_entropy(out[train_mask], y[train_mask])
        loss.backward()
        optimizer.step()
        return float(loss)

    @torch.no_grad()
    def test() -> list[float]:
        nonlocal evals
        model.eval()
        accs = []
        for mask in (val_mask, test_mask):
            pred = model(x, adj).argmax(dim=-1)
            evals += 1
            accs.append(int((pred[mask] == y[mask]).sum()) / int(mask.sum()))
        return accs

    best_val_acc = test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        loss = train()
        val_acc, tmp_test_acc = test()
        if val_acc > best_val_acc:
            best_val_acc, test_acc = val_acc, tmp_test_acc
        if epoch % 10 == 0:
            print(f"Epoch: {epoch:03d}, Loss: {loss:.4f}, Val: {val_acc:.4f}, Test: {test_acc:.4f}")
    print(f"TRAIN_STEPS {args.epochs}")
    print(f"EVAL_FORWARDS {evals}")


if __name__ == "__main__":
    main()
