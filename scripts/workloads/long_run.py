"""A long run of short steps, for scripts/bench_scale.py.

    python long_run.py STEPS STATS.json

A tiny model trained for STEPS steps (each well under a millisecond), timed
by its own stopwatch: per second of the run, the number of steps, their mean
and their slowest, and per tenth of its steps their mean, median, 99th and
99.9th percentiles, slowest and how many took over 5 ms, so the bench can
tell whether steps slow down as the run goes on or near perfrun's saves,
without trusting perfrun's own figures. Every step's time goes into an
array made before the loop (8 bytes a step, the same in every mode).
"""

import json
import sys
import time
from array import array

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
times = array("d", bytes(8 * steps))
last = clock()
for i in range(steps):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
    now = clock()
    took = now - last
    last = now
    times[i] = took
    second = int(now - began)
    if second != current[0]:
        buckets.append(current)
        current = [second, 0, 0.0, 0.0]
    current[1] += 1
    current[2] += took
    if took > current[3]:
        current[3] = took
buckets.append(current)
seconds, end_unix = clock() - began, time.time()

SLOW = 0.005  # a step over 5 ms: a stall, on a step of a fraction of a millisecond


def tenth(part):
    ordered = sorted(part)
    n = len(ordered)
    return {"steps": n, "mean_us": round(sum(ordered) / n * 1e6, 2),
            "median_us": round(ordered[n // 2] * 1e6, 2),
            "p99_us": round(ordered[min(n - 1, int(n * 0.99))] * 1e6, 2),
            "p999_us": round(ordered[min(n - 1, int(n * 0.999))] * 1e6, 2),
            "slowest_ms": round(ordered[-1] * 1e3, 3),
            "over_5ms": n - next((i for i in range(n - 1, -1, -1) if ordered[i] <= SLOW), -1) - 1}


by_step = [tenth(times[k * steps // 10:(k + 1) * steps // 10]) for k in range(10)
           if (k + 1) * steps // 10 > k * steps // 10]
with open(out, "w") as f:
    json.dump({"steps": steps, "seconds": seconds, "end_unix": end_unix,
               "buckets": buckets, "tenths_by_step": by_step}, f)
