"""Leaves its pid (and its parent's) in a file, then waits, for the tests of
how perfrun and its run live and die together.

    lifecycle_wait.py --pid-dir DIR [--steps N] [--dist] [--exit-on SIGNAME CODE]

`--steps N` trains N steps first (so torch, and perfrun's agent, are
loaded); `--dist` joins a gloo process group first (under torchrun);
`--exit-on USR1 3` prints a line and exits 3 when SIGUSR1 arrives. The pid
file, `<rank>.pid`, holds "PID PPID" and appears whole (renamed into place)
once the script is ready.
"""

import argparse
import os
import signal
import sys
import time


def train(steps: int) -> None:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-dir", required=True)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--dist", action="store_true")
    parser.add_argument("--exit-on", nargs=2, metavar=("SIGNAME", "CODE"))
    parser.add_argument("--wait", type=float, default=120.0)
    args = parser.parse_args()

    if args.exit_on:
        name, code = args.exit_on

        def leave(signum: int, frame: object) -> None:
            print(f"got {signal.Signals(signum).name}, exiting {code}", flush=True)
            sys.exit(int(code))

        signal.signal(getattr(signal, "SIG" + name), leave)
    if args.dist:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    if args.steps:
        train(args.steps)
    rank = os.environ.get("RANK", "0")
    path = os.path.join(args.pid_dir, f"{rank}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    os.replace(path + ".tmp", path)
    print(f"rank {rank} ready", flush=True)
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"rank {rank} waited to the end", flush=True)


if __name__ == "__main__":
    main()
