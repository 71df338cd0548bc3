"""A long run of short steps, for scripts/bench_scale.py.

    python long_run.py STEPS STATS.json

A tiny model trained for STEPS steps (each well under a millisecond), timed
by its own stopwatch: per second of the run, the number of steps, their mean
and their slowest, so the bench can tell whether steps slow down as the run
goes on or near perfrun's saves, without trusting perfrun's own figures.
"""

import json
import sys
import time

import torch

steps, out = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)

buckets = []  # [second, steps, total, slowest]
began = time.perf_counter()
current = [0, 0, 0.0, 0.0]
clock = time.perf_counter
last = clock()
for _ in range(steps):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    now = clock()
    took = now - last
    last = now
    second = int(now - began)
    if second != current[0]:
        buckets.append(current)
        current = [second, 0, 0.0, 0.0]
    current[1] += 1
    current[2] += took
    if took > current[3]:
        current[3] = took
buckets.append(current)
with open(out, "w") as f:
    json.dump({"steps": steps, "seconds": clock() - began, "end_unix": time.time(),
               "buckets": buckets}, f)
