"""Where does perfrun's per-step cost go? Counted, not timed.

    python scripts/bench_hotpath.py [--steps N]

Runs the loop of benchmark workload (d) (scripts/workloads/loader_mlp.py: a
tiny MLP fed by a DataLoader, six hooked calls a step) in this process, once
as plain torch and once with perfrun's hooks installed on a timer-only
clock, and counts per step, with and without perfrun:

* Python bytecodes executed (sys.settrace opcode events), by file and
  function, so perfrun's share is split between its wrappers (run at each
  hooked call, inside the step) and the replay of buffered edges through
  the step state machine (run in batches, as often as the clock would);
* Python function calls (sys.setprofile), perfrun's by name;
* memory blocks allocated (sys.getallocatedblocks before and after a step
  whose buffer is not replayed: what the step leaves held);
* perfrun's bytecodes a step in the loops of workloads (e) and (f): a
  forward of 1,000 submodule calls and the same loop with none, which run
  the same bytecodes of perfrun's when no submodule call runs any.

Counts do not depend on how busy the machine is, unlike the microseconds of
scripts/bench_overhead.py, which on a shared machine scatter by tens of
microseconds between runs: read the two together. Public tools only; needs
torch and perfrun importable.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable

import torch

from perfrun.runtime import hooks
from perfrun.runtime.clock import BufferedClock, PhaseClock, replay_wait
from perfrun.runtime.hooks import HookState
from perfrun.runtime.modules import RootTracker
from perfrun.runtime.steps import StepTracker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads"))
import loader_mlp  # noqa: E402  (workload (d), from the folder above)
import many_modules  # noqa: E402  (workloads (e) and (f))

#: Untraced steps timed to set how many steps a replay holds.
TIMED = 200
#: Edges workload (d) makes a step: an enter and an exit at each of its six
#: hooked calls.
EDGES = 12
_NEVER = float("inf")

PERFRUN_DIR = os.path.dirname(os.path.abspath(hooks.__file__))


def is_wrapper(key: tuple) -> bool:
    """perfrun's wrappers are its hooks (hooks.py), run at each hooked call;
    the rest of its code in the step runs in the replay of buffered edges."""
    return os.path.basename(key[0]) == "hooks.py"


def make_agent() -> SimpleNamespace:
    """What hooks.install reads of perfrun's agent, with a timer-only clock."""
    tracker = StepTracker("auto")
    phase_clock = PhaseClock(tracker)
    return SimpleNamespace(
        hooks_state=HookState(), tracker=tracker, phase_clock=phase_clock,
        clock=BufferedClock(phase_clock), record_fault=lambda where, exc: None,
        roots=RootTracker(), count_samples=True, note_dataloader=lambda loader, grad=True: None,
        note_once=lambda note: None,
    )


def make_loop(steps: int, drain: Callable[[], None], every: list[int]) -> Callable[[int], None]:
    """Workload (d)'s loop over `steps` batches; the optimizer is built when
    the loop is, so that with perfrun in place its step is hooked. `drain`
    is called every `every[0]` steps, in place of the replays that the
    clock makes every 20 ms, which under a tracer would come every step or
    two (see main); the plain loop calls a no-op, so both loops run the
    same code of their own."""
    loader, model, loss_fn, optimizer = loader_mlp.build(steps, shuffle=False)
    it = iter(loader)

    def run(n: int) -> None:
        for i in range(n):
            xb, yb = next(it)
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            if i % every[0] == every[0] - 1:
                drain()

    return run


def count_opcodes(run: Callable[[int], None], n: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_name)] += 1
        return tracer

    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        run(n)
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    return counts


def count_calls(run: Callable[[int], None], n: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            counts[(code.co_filename, code.co_name)] += 1
        elif event == "c_call":
            counts[("<c>", getattr(arg, "__qualname__", getattr(arg, "__name__", "?")))] += 1

    sys.setprofile(profiler)
    try:
        run(n)
    finally:
        sys.setprofile(None)
    return counts


def held_blocks(run: Callable[[int], None], n: int) -> float:
    before = sys.getallocatedblocks()
    run(n)
    return (sys.getallocatedblocks() - before) / n


def ours(key: tuple[str, str]) -> bool:
    return key[0].startswith(PERFRUN_DIR)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps counted (default 200)")
    args = parser.parse_args(argv)
    warm = 20  # the root search ends within a few steps

    # The replay runs as often as the clock would run it untraced
    # (clock.replay_wait, 12 edges a step here): as many steps as
    # that holds are replayed at once here too, and at least that many
    # steps counted.
    every = [1]
    timed = make_loop(warm + TIMED, lambda: None, every)
    timed(warm)
    began = time.perf_counter()
    timed(TIMED)
    step = (time.perf_counter() - began) / TIMED
    every[0] = batch = max(1, round(replay_wait(step * TIMED, EDGES * TIMED) / step))
    n = max(args.steps, batch)

    plain = make_loop(warm + 3 * n + 10, lambda: None, every)
    plain(warm)
    plain_ops = count_opcodes(plain, n)
    plain_calls = count_calls(plain, n)
    plain_held = held_blocks(plain, n)

    agent = make_agent()
    undo = hooks.install(torch, agent)
    try:
        hooked = make_loop(warm + 3 * n + 10, agent.clock.drain, every)
        hooked(warm)
        agent.clock.interval = _NEVER
        agent.clock.last = _NEVER
        agent.clock.drain()
        hooked_ops = count_opcodes(hooked, n)
        agent.clock.drain()
        hooked_calls = count_calls(hooked, n)
        agent.clock.drain()
        # Blocks a step leaves held until the next replay: its edges.
        every[0] = n + 1
        held = held_blocks(hooked, n) - plain_held
        edges = len(agent.clock.buf) / n
        agent.clock.interval = 0.02
        agent.clock.drain()
    finally:
        hooks.uninstall(undo)

    total_plain = sum(plain_ops.values()) / n
    total_hooked = sum(hooked_ops.values()) / n
    mine = {k: v / n for k, v in hooked_ops.items() if ours(k)}
    replay = sum(v for k, v in mine.items() if not is_wrapper(k))
    wrappers = sum(v for k, v in mine.items() if is_wrapper(k))
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {n} steps of workload (d)")
    print(f"a step takes {step * 1e6:.0f} us untraced: edges replayed every {batch} steps")
    print()
    print("Python bytecodes a step")
    print(f"  plain loop                      {total_plain:8.0f}")
    added = total_hooked - total_plain
    print(f"  with perfrun (timer-only)       {total_hooked:8.0f}  (+{added:.0f})")
    print(f"    in perfrun's wrappers         {wrappers:8.0f}")
    print(f"    in the replay of edges        {replay:8.0f}")
    print()
    print("perfrun's functions, bytecodes a step (calls a step)")
    for key, ops in sorted(mine.items(), key=lambda kv: -kv[1]):
        calls = hooked_calls.get(key, 0) / n
        where = "wrapper" if is_wrapper(key) else "replay"
        print(f"  {os.path.basename(key[0])}:{key[1]:24s} {ops:7.1f}  ({calls:.2f})  {where}")
    extra_c = collections.Counter()
    for key, v in hooked_calls.items():
        if key[0] == "<c>":
            extra_c[key[1]] = (v - plain_calls.get(key, 0)) / n
    print()
    print("C functions called more often with perfrun, a step")
    for name, v in extra_c.most_common(8):
        if v >= 0.5:
            print(f"  {name:40s} +{v:.1f}")
    print()
    print(f"edges buffered a step: {edges:.1f}; memory blocks a step holds until the replay: "
          f"{held:+.1f}")
    print()
    with_modules, without = submodule_bytecodes(many_modules.BLOCKS), submodule_bytecodes(0)
    print("perfrun's bytecodes a step, 1,000 submodule calls a forward or none")
    print(f"  (e) many_modules                {with_modules:8.1f}")
    print(f"  (f) no_submodules               {without:8.1f}  "
          f"(difference {with_modules - without:+.1f})")
    return 0


def submodule_bytecodes(blocks: int, steps: int = 40) -> float:
    """perfrun's bytecodes a step in the loop of workload (e) (blocks=100:
    1,000 submodule calls a forward) or (f) (blocks=0), the hooks on a
    timer-only clock that never replays, outside the root search: what the
    hooked calls run, and nothing that depends on how many modules the
    model calls."""
    data, model, loss_fn = many_modules.build(blocks)
    agent = make_agent()
    undo = hooks.install(torch, agent)
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def run(n: int) -> None:
            for i in range(n):
                x, y = data[i % len(data)]
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()

        run(20)  # the root search ends within a few steps
        agent.clock.interval = _NEVER
        agent.clock.drain()
        agent.clock.last = _NEVER
        # The next search, SEARCH_BACKOFF seconds on (doubling each time),
        # would fall in the counted steps, which the tracer slows: a search
        # passes every module call through perfrun for a few steps.
        agent.hooks_state.due = _NEVER
        counts = count_opcodes(run, steps)
    finally:
        hooks.uninstall(undo)
    return sum(v for k, v in counts.items() if ours(k)) / steps


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
