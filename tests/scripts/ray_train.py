"""Ray Train's PyTorch quickstart ("Get Started with Distributed Training
using PyTorch"), on the CPU: a `train_func` that each worker runs, the model
and DataLoader handed to `ray.train.torch.prepare_model` and
`prepare_data_loader`, metrics through `ray.train.report`, and a
`TorchTrainer` with `ScalingConfig(num_workers=2, use_gpu=False)`. A
synthetic dataset instead of FashionMNIST (nothing is downloaded); `ray.init`
starts a local cluster of 2 CPUs first, as the docs do on a laptop.

Each worker counts its optimizer steps and reports them; the driver prints
`RAY_TRAIN_STEPS [n0, n1]` last.
"""

import os
import tempfile

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 3


def train_func():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(512, 28 * 28)
    y = (x[:, :10].sum(dim=1) > 0).long()
    train_loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    train_loader = ray.train.torch.prepare_data_loader(train_loader)

    model = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 2))
    model = ray.train.torch.prepare_model(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)

    steps = 0
    for epoch in range(EPOCHS):
        if ray.train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        for images, labels in train_loader:
            outputs = model(images)
            loss = criterion(outputs, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        metrics = {"loss": loss.item(), "epoch": epoch, "steps": steps,
                   "rank": ray.train.get_context().get_world_rank()}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            torch.save(model.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
        print(metrics, flush=True)


def main():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    storage = os.path.abspath("ray_results")
    scaling_config = ScalingConfig(num_workers=2, use_gpu=False)
    trainer = TorchTrainer(
        train_func,
        scaling_config=scaling_config,
        run_config=ray.train.RunConfig(storage_path=storage, name="quickstart"),
    )
    result = trainer.fit()
    print("final metrics:", result.metrics, flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
