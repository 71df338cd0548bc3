"""A script that listens on a port of its own before it imports torch, the
port perfrun's metrics endpoint was told to take (tests/test_metrics.py):
the launcher found it free, the rank finds it taken. It trains a few steps
and says so, and exits with the status given (`--exit N`)."""

import argparse
import socket
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--exit", type=int, default=0)
    args = parser.parse_args()
    own = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    own.bind(("0.0.0.0", args.port))
    own.listen()

    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(30):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
        optimizer.step()
    print(f"trained 30 steps beside my own server on port {args.port}", flush=True)
    own.close()
    sys.exit(args.exit)


if __name__ == "__main__":
    main()
