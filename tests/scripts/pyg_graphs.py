"""Graph classification with PyTorch Geometric, as its introduction
tutorial writes it (the GCN on TUDataset's MUTAG), on synthetic graphs of
random sizes (nothing downloaded): PyG's own DataLoader collates each
mini-batch of graphs into one `Batch`, whose tensors count nodes and
edges, not graphs; three GCNConv layers, a mean pool per graph and a
linear classifier; a test pass over both loaders after each epoch.

    python pyg_graphs.py [--graphs N] [--batch B] [--epochs E]

Prints `GRAPHS <n>` per training batch (the graphs it holds, as the
script counts them: `data.num_graphs`), then `TRAIN_GRAPHS <total>` and
`NODES_PER_BATCH <mean>`.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import GCNConv, global_mean_pool

FEATURES, CLASSES = 7, 2


def synthetic_graphs(n: int, seed: int) -> list[Data]:
    """Molecule-sized graphs (10 to 28 nodes), their class a function of
    their structure, as MUTAG's is."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        nodes = int(torch.randint(10, 29, (1,), generator=g))
        edges = torch.randint(0, nodes, (2, 2 * nodes), generator=g)
        edges = torch.cat([edges, edges.flip(0)], dim=1)
        x = F.one_hot(torch.randint(0, FEATURES, (nodes,), generator=g), FEATURES).float()
        y = torch.tensor([int(x[:, 0].sum() > nodes / FEATURES)])
        out.append(Data(x=x, edge_index=edges, y=y))
    return out


class GCN(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(FEATURES, hidden)
        self.conv2 = GCNConv(hidden, hidden)
        self.conv3 = GCNConv(hidden, hidden)
        self.lin = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                batch: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x, edge_index).relu()
        x = self.conv2(x, edge_index).relu()
        x = self.conv3(x, edge_index)
        x = global_mean_pool(x, batch)
        x = F.dropout(x, p=0.5, training=self.training)
        return self.lin(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graphs", type=int, default=150)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(12345)
    torch.set_num_threads(1)
    dataset = synthetic_graphs(args.graphs + 38, seed=0)
    train_loader = DataLoader(dataset[:args.graphs], batch_size=args.batch, shuffle=True)
    test_loader = DataLoader(dataset[args.graphs:], batch_size=args.batch, shuffle=False)
    model = GCN(hidden=64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()

    def train() -> None:
        model.train()
        for data in train_loader:
            print(f"GRAPHS {data.num_graphs}", flush=True)
            nodes.append(data.num_nodes)
            out = model(data.x, data.edge_index, data.batch)
            loss = criterion(out, data.y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    def test(loader: DataLoader) -> float:
        model.eval()
        correct = 0
        for data in loader:
            out = model(data.x, data.edge_index, data.batch)
            pred = out.argmax(dim=1)
            correct += int((pred == data.y).sum())
        return correct / len(loader.dataset)

    nodes: list[int] = []
    for epoch in range(1, args.epochs + 1):
        train()
        train_acc, test_acc = test(train_loader), test(test_loader)
        print(f"Epoch: {epoch:03d}, Train Acc: {train_acc:.4f}, Test Acc: {test_acc:.4f}")
    print(f"TRAIN_GRAPHS {args.graphs * args.epochs}")
    print(f"NODES_PER_BATCH {sum(nodes) / len(nodes):.1f}")


if __name__ == "__main__":
    main()
