"""A graph convolutional network trained full-batch, as pygcn writes it: a
sparse normalised adjacency, `torch.spmm(adj, support)` in each layer, one
optimizer step an epoch over the whole graph, evaluation every epoch
unless `--fastmode`. A random graph stands in for Cora (nothing is
downloaded).

Prints `GCN_FLOPS <n>`: the multiply-adds of one training step (forward
and backward) counted by hand from the shapes and the adjacency's
non-zeros, for perfrun's count to be held to.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parameter import Parameter


class GraphConvolution(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = Parameter(torch.FloatTensor(in_features, out_features))
        self.bias = Parameter(torch.FloatTensor(out_features))
        stdv = 1.0 / math.sqrt(self.weight.size(1))
        self.weight.data.uniform_(-stdv, stdv)
        self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        support = torch.mm(input, self.weight)
        output = torch.spmm(adj, support)
        return output + self.bias


class GCN(nn.Module):
    def __init__(self, nfeat: int, nhid: int, nclass: int, dropout: float) -> None:
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        x = self.gc2(x, adj)
        return F.log_softmax(x, dim=1)


def load_data(nodes: int, features: int, classes: int, degree: int):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, nodes, (nodes * degree,), generator=g)
    dst = torch.randint(0, nodes, (nodes * degree,), generator=g)
    idx = torch.cat([torch.stack([src, dst]), torch.stack([dst, src]),
                     torch.arange(nodes).repeat(2, 1)], dim=1)
    adj = torch.sparse_coo_tensor(idx, torch.ones(idx.shape[1]), (nodes, nodes)).coalesce()
    # Row-normalise, as pygcn does.
    rowsum = torch.sparse.sum(adj, 1).to_dense()
    values = adj.values() / rowsum[adj.indices()[0]]
    adj = torch.sparse_coo_tensor(adj.indices(), values, adj.shape).coalesce()
    feats = torch.rand(nodes, features, generator=g)
    labels = torch.randint(0, classes, (nodes,), generator=g)
    return adj, feats, labels


def accuracy(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    preds = output.max(1)[1].type_as(labels)
    return preds.eq(labels).double().sum() / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fastmode", action="store_true", default=False)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--weight_decay", type=float, default=5e-4)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--nodes", type=int, default=2708)
    parser.add_argument("--features", type=int, default=1433)
    args = parser.parse_args()
    torch.manual_seed(42)

    classes = 7
    adj, features, labels = load_data(args.nodes, args.features, classes, 2)
    idx_train, idx_val = torch.arange(140), torch.arange(200, 500)
    model = GCN(nfeat=features.shape[1], nhid=args.hidden, nclass=classes, dropout=args.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def train(epoch: int) -> None:
        t = time.time()
        model.train()
        optimizer.zero_grad()
        output = model(features, adj)
        loss_train = F.nll_loss(output[idx_train], labels[idx_train])
        acc_train = accuracy(output[idx_train], labels[idx_train])
        loss_train.backward()
        optimizer.step()
        if not args.fastmode:
            # Evaluate validation set performance separately,
            # deactivates dropout during validation run.
            model.eval()
            output = model(features, adj)
        loss_val = F.nll_loss(output[idx_val], labels[idx_val])
        acc_val = accuracy(output[idx_val], labels[idx_val])
        if epoch % 20 == 0:
            print(f"Epoch: {epoch + 1:04d} loss_train: {loss_train.item():.4f} "
                  f"acc_train: {acc_train.item():.4f} loss_val: {loss_val.item():.4f} "
                  f"acc_val: {acc_val.item():.4f} time: {time.time() - t:.4f}s")

    for epoch in range(args.epochs):
        train(epoch)
    # One training step's multiply-adds, twice each: the dense matmuls by
    # their shapes, the sparse ones by the adjacency's non-zeros. Forward:
    # x W1, adj (x W1), h W2, adj (h W2). Backward: W1's gradient (x is no
    # parameter), adj^T times the gradient of each layer's support, W2's
    # gradient and h's.
    n, f, h, c, nnz = args.nodes, args.features, args.hidden, classes, adj._nnz()
    forward = 2 * n * f * h + 2 * nnz * h + 2 * n * h * c + 2 * nnz * c
    backward = 2 * n * f * h + 2 * nnz * h + 2 * (2 * n * h * c) + 2 * nnz * c
    print(f"GCN_FLOPS {forward + backward}")
    print(f"GCN_DENSE_FLOPS {forward + backward + 4 * (n * n - nnz) * (h + c)}")


if __name__ == "__main__":
    main()
