"""DistributedDataParallel written the way PyTorch's DDP tutorial writes it:
init_process_group on gloo, a ToyModel wrapped in DDP, a DataLoader with a
DistributedSampler (set_epoch each epoch), an optimizer, `ddp_model(x)`,
loss, backward, step. `--width` makes the model's layers wide, so that the
gradients' all-reduce in Backward is long beside a small batch's forward."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class ToyModel(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, width)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(width, width)
        self.net3 = nn.Linear(width, 5)

    def forward(self, x):
        return self.net3(self.relu(self.net2(self.relu(self.net1(x)))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(args.samples, 10), torch.randn(args.samples, 5))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = ToyModel(args.width)
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.Adam(ddp_model.parameters(), lr=0.001)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            outputs = ddp_model(x)
            loss_fn(outputs, y).backward()
            optimizer.step()
    print(f"ddp_tutorial rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
