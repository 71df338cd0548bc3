"""A whole training step under torch.compile: zero_grad, the model, the loss,
backward and optimizer.step inside one compiled function, fed by a DataLoader
outside it (backend "eager": Dynamo's graphs, guards and graph breaks are
what the tests look at, and no C++ toolchain is needed).

The step makes hooked calls Dynamo either traces (the model, optimizer.step)
or breaks the graph at and runs eagerly (zero_grad, which torch marks
untraceable, and backward). Prints Dynamo's own counters on its last line,
`DYNAMO {...}`, for the tests to compare with and without perfrun.
"""

import torch
from dynamo_counters import print_counters
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    data = torch.utils.data.TensorDataset(torch.randn(192, 8), torch.randn(192, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)

    @torch.compile(backend="eager")
    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(2):
        for x, y in loader:
            train_step(x, y)

    print_counters()


if __name__ == "__main__":
    main()
