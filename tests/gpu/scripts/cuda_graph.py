"""A whole training step captured in a CUDA graph and replayed.

    cuda_graph.py --replays N

The loop follows PyTorch's whole-network capture recipe: three eager
warm-up steps on a side stream, one step captured with `torch.cuda.graph`,
then N replays on fresh data copied into the static inputs, then three
eager steps again. Every `GRAPH ` line it prints depends only on the seeds
and the arithmetic, so a profiler that broke or changed the capture shows
as a different line (or a failed run), not as a number to interpret.
"""

import argparse

import torch
from torch import nn

WARMUP = 3
TAIL = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8)).to(device)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs = torch.randn(args.replays + TAIL, 64, 256, device=device)
    targets = torch.randn(args.replays + TAIL, 64, 8, device=device)
    static_input = torch.randn(64, 256, device=device)
    static_target = torch.randn(64, 8, device=device)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(static_input), static_target).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_input), static_target)
        static_loss.backward()
        optimizer.step()

    losses = []
    for i in range(args.replays):
        static_input.copy_(inputs[i])
        static_target.copy_(targets[i])
        graph.replay()
        losses.append(static_loss.item())
    print(f"GRAPH replays {args.replays} first {losses[0]:.5f} last {losses[-1]:.5f}", flush=True)

    for i in range(args.replays, args.replays + TAIL):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs[i]), targets[i])
        loss.backward()
        optimizer.step()
    print(f"GRAPH eager after replays {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
