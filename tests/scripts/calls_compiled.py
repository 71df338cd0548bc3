"""An eager training loop whose model is also called inside compiled
functions (backend "eager"): a compiled loss module, a compiled optimizer
step and a compiled no-grad evaluation of the model, each step. The model's
class is one perfrun times (its first call is eager), so Dynamo meets
perfrun's timing `__call__` when it traces the evaluation. Prints Dynamo's
own counters on its last line, `DYNAMO {...}`.
"""

import torch
from dynamo_counters import print_counters
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = torch.compile(nn.MSELoss(), backend="eager")

    @torch.compile(backend="eager")
    def optimizer_step() -> None:
        optimizer.step()

    @torch.compile(backend="eager")
    def evaluate(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(x).sum()

    data = torch.utils.data.TensorDataset(torch.randn(192, 8), torch.randn(192, 1))
    for x, y in torch.utils.data.DataLoader(data, batch_size=16):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer_step()
        evaluate(x)

    print_counters()


if __name__ == "__main__":
    main()
