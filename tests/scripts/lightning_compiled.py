"""Lightning with `torch.compile(model)`, as its docs write it: Lightning
unwraps the compiled module and compiles the LightningModule's own
`training_step` and `forward` on the instance, so Dynamo traces
`nn.Module.__call__` for `self(x)` (an instance `forward` rules out its
shortcut to `forward`). A metric-like module called eagerly after each batch
is a module call at depth 0 outside the compiled code, as perfrun's root
search counts them. Prints Dynamo's counters and Lightning's step count."""

import warnings

import lightning as L
import torch
import torch.nn.functional as F
from dynamo_counters import print_counters
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")


class Regressor(L.LightningModule):
    def __init__(self, probe: nn.Module) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.probe = [probe]  # not a submodule: called apart, eagerly

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, index: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def on_train_batch_end(self, *args: object) -> None:
        with torch.no_grad():
            self.probe[0](torch.ones(2, 16))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(640, 16), torch.randn(640, 1))
    model = torch.compile(Regressor(nn.Linear(16, 4)), backend="eager")
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", enable_progress_bar=False,
                        logger=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=16))
    print(f"STEPS {trainer.global_step}")
    print_counters()


if __name__ == "__main__":
    main()
