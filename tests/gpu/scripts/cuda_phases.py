"""Ground truth for perfrun's GPU phase times: the script's own CUDA events.

    cuda_phases.py --steps N --out FILE

A small MLP trains on the GPU; around each call that perfrun counts as a
phase (the forward call, `loss.backward()`, `optimizer.zero_grad()` and
`optimizer.step()`) the script records a pair of `torch.cuda.Event`s on the
current stream, right next to where perfrun records its own. After the loop
it synchronises once and writes, per step, the GPU time of each phase in
seconds (zero_grad and step summed into `optimization`, as perfrun counts
them) to FILE, with the CUDA device's UUID so the test can find the GPU
perfrun sampled.

The layers are large enough that every phase keeps the GPU busy for a
fraction of a millisecond or more, so a phase landing in the wrong column
or a missing event is a visible difference, not noise.
"""

import argparse
import json

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    width = args.width
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, 1),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(width, width, device=device)
    y = torch.randn(width, 1, device=device)

    def pair() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    events: list[dict[str, tuple[torch.cuda.Event, torch.cuda.Event]]] = []
    for _ in range(args.steps):
        ev = {name: pair() for name in ("zero_grad", "forward", "backward", "step")}
        ev["zero_grad"][0].record()
        optimizer.zero_grad()
        ev["zero_grad"][1].record()
        ev["forward"][0].record()
        out = model(x)
        ev["forward"][1].record()
        loss = (out - y).pow(2).mean()
        ev["backward"][0].record()
        loss.backward()
        ev["backward"][1].record()
        ev["step"][0].record()
        optimizer.step()
        ev["step"][1].record()
        events.append(ev)
    torch.cuda.synchronize()

    def seconds(e: tuple[torch.cuda.Event, torch.cuda.Event]) -> float:
        return e[0].elapsed_time(e[1]) / 1000.0

    truth = {
        "forward": [seconds(ev["forward"]) for ev in events],
        "backward": [seconds(ev["backward"]) for ev in events],
        "optimization": [seconds(ev["zero_grad"]) + seconds(ev["step"]) for ev in events],
        "device_uuid": str(getattr(torch.cuda.get_device_properties(device), "uuid", "")),
        "device_name": torch.cuda.get_device_name(device),
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(truth, f)
    print(f"cuda_phases: {args.steps} steps, last loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
