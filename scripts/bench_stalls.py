"""Which of perfrun's own work lands on the script's slowest steps?

    python scripts/bench_stalls.py [STEPS]                     (plain)
    python -m perfrun --timer-only scripts/bench_stalls.py [STEPS]
    python -m perfrun scripts/bench_stalls.py [STEPS]          (default mode)

A tiny training loop (a step of a few hundred microseconds, no DataLoader)
times each of its own steps with time.perf_counter. Under perfrun it also
records when perfrun's saves (`Agent.write`, in the flush thread), replays
of buffered edges (`BufferedClock._replay`, in the script's thread) and
device samples ran, and the garbage collector's passes in any mode. At the
end it prints the median step, its 99.99th percentile and slowest step, and
for each kind of span the slowest step that overlapped one: a save that
stalls the script shows there, in the script's own stopwatch.

It reaches into perfrun's runtime (perfrun.runtime.agent.current()) to wrap
those methods: a diagnostic, not something a script should do.
"""

from __future__ import annotations

import gc
import sys
from array import array
from time import perf_counter
from typing import Any, Callable

import torch
from torch import nn

SPANS: dict[str, list[tuple[float, float]]] = {"save": [], "replay": [], "sample": [], "gc": []}


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPANS[name].append((t, perf_counter()))

    return wrapper


def watch_gc() -> None:
    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = perf_counter()
        else:
            SPANS["gc"].append((started[0], perf_counter()))

    gc.callbacks.append(callback)


def watch_perfrun() -> bool:
    try:
        from perfrun.runtime import agent as agent_mod
    except ImportError:
        return False
    agent = agent_mod.current()
    if agent is None:
        return False
    agent.write = timed("save", agent.write)
    cls = type(agent.clock)
    cls._replay = timed("replay", cls._replay)
    if agent.sampler is not None:
        agent.sampler.sample = timed("sample", agent.sampler.sample)
    return True


def overlapping(steps: list[tuple[float, float, float]],
                spans: list[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """The steps (time, start, end), in time order, that overlap any of
    `spans` (start, end): one pass over both, sorted, so that a million
    steps against thousands of spans stays linear."""
    spans = sorted(spans)
    found = []
    j = 0
    for t, s, e in steps:
        # Spans that end before this step starts end before every later one.
        while j < len(spans) and spans[j][1] <= s:
            j += 1
        k = j
        while k < len(spans) and spans[k][0] < e:
            if spans[k][1] > s:
                found.append((t, s, e))
                break
            k += 1
    return found


def main(argv: list[str]) -> None:
    steps = int(argv[0]) if argv else 200_000
    torch.set_num_threads(1)
    model = nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    watch_gc()
    # An array, not a list: a list of a million floats is a container the
    # garbage collector traverses, and it stays in the young generations
    # until a generation-1 pass promotes it. A loop this steady allocates so
    # little that such a pass may come only near the loop's end, and then
    # walks the whole list: 4 to 20 ms of the script's own, which perfrun's
    # few allocations only move in time (an earlier version of this script
    # saw it under perfrun and not plain, and took it for perfrun's).
    marks = array("d")
    under = False
    for i in range(steps):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
        marks.append(perf_counter())
        if i == 5:
            under = watch_perfrun()
    # Steady steps only: the first hundred pay one-off costs.
    timed_steps = [(marks[i + 1] - marks[i], marks[i], marks[i + 1])
                   for i in range(100, len(marks) - 1)]
    times = sorted(t for t, _, _ in timed_steps)
    print(f"STALLS {'under perfrun' if under else 'plain'}: {len(times)} steps, "
          f"median {times[len(times) // 2] * 1e6:.1f} us, "
          f"99.99th percentile {times[int(len(times) * 0.9999)] * 1e3:.2f} ms, "
          f"slowest {times[-1] * 1e3:.2f} ms")
    # The garbage collector's passes over the steps' own objects, not the
    # ones this analysis makes after the loop.
    end = marks[-1]
    gc_spans = [span for span in SPANS["gc"] if span[0] < end]
    collected = set(overlapping(timed_steps, gc_spans))
    for name, spans in SPANS.items():
        if name == "gc":
            spans = gc_spans
        if not spans:
            continue
        steps = overlapping(timed_steps, spans)
        near = sorted(t for t, _, _ in steps)
        longest = max(b - a for a, b in spans)
        if near:
            line = (f"STALLS {name}: {len(spans)} spans, longest {longest * 1e3:.2f} ms; "
                    f"{len(near)} steps overlap one, slowest {near[-1] * 1e3:.2f} ms, "
                    f"median {near[len(near) // 2] * 1e3:.2f} ms")
            if name != "gc":
                # A collection can fall in the same step: the slowest of
                # those without one says what the span itself cost.
                alone = [t for t, s, e in steps if (t, s, e) not in collected]
                line += f"; slowest without a gc pass {max(alone, default=0.0) * 1e3:.2f} ms"
            print(line)

if __name__ == "__main__":
    main(sys.argv[1:])
