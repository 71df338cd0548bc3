"""What does perfrun add to an ordinary step, in instructions? Counted, not timed.

    python scripts/bench_instructions.py [--workloads mlp[,small_transformer]]
                                         [--json OUT]

On a shared 2-core machine a 1-50 ms step varies by 7-25% from one step to
the next, and hundreds of interleaved pairs of blocks
(scripts/bench_inprocess.py) still leave an interval about a point wide
around what perfrun adds. Instructions do not vary so: this runs the
training step of each workload (scripts/workloads/: (g) the MNIST MLP,
(b) the small transformer) under valgrind's cachegrind, as plain torch and
with perfrun's hooks installed on a timer-only clock (what a CPU run pays
in either mode once its one FLOP-counted step has passed), and gives per
step: the instructions executed (user space, the process's threads), the
first-level data cache's misses and the last level's, each simulated the
same way for both sides.

Each side runs twice, for a short and a long count of steps, and a step's
figure is the difference over the steps between them: what the interpreter,
torch's import and the model's set-up cost falls out. Under cachegrind a
step takes 50-100 times as long, so the clock's time-paced replay would come
every few steps; instead the buffered edges are replayed every K steps, K
being how many steps a replay holds at the untraced pace (`clock.replay_wait`,
from a native run of the same step first), and the plain side calls a no-op
at the same points. The long count is the short one plus a whole number of
replays.

What this does not see: time the step waits (none here: no lock, no I/O,
no other thread), and what a cache miss costs on the real machine (the
simulated caches are the host's sizes). Read it beside bench_inprocess.py's
times. Needs valgrind (Debian's package), torch and perfrun. On 2 cores
(two runs at a time) the MLP takes about 40 minutes; the transformer's step
is six times as long, and each of its runs over 13 minutes, so it is
counted only when named.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
#: Steps run before anything is counted (the root search ends within a few).
WARM = 12
#: cachegrind's events, in the order of its output file's `events:` line.
EVENTS = ("Ir", "D1mr", "DLmr", "D1mw", "DLmw")


def parse_totals(text: str) -> dict[str, int]:
    """The program's totals from a cachegrind output file: its `events:`
    line names the columns of its `summary:` (or `totals:`) line."""
    names: list[str] = []
    values: list[int] = []
    for line in text.splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            values = [int(v) for v in line.split()[1:]]
    if not names or len(values) != len(names):
        raise ValueError("not a cachegrind output file (no events and summary lines)")
    return dict(zip(names, values))


def per_step(short: dict[str, int], long: dict[str, int], steps: int) -> dict[str, float]:
    """Each event a step: the difference of the two runs over the steps
    between them."""
    return {name: (long[name] - short[name]) / steps for name in short if name in long}


def steps_per_replay(step_s: float, edges_per_step: float) -> int:
    """How many steps the buffered clock holds between two replays at the
    untraced pace (at least 1)."""
    from perfrun.runtime.clock import replay_wait

    wait = replay_wait(step_s * 100, round(edges_per_step * 100))
    return max(1, round(wait / step_s))


def added(plain: dict[str, float], hooked: dict[str, float]) -> dict[str, Any]:
    """What perfrun adds a step, per event, and as a share of the plain step's."""
    out: dict[str, Any] = {}
    for name, value in plain.items():
        if name in hooked:
            more = hooked[name] - value
            out[name] = {"plain": value, "hooked": hooked[name], "added": more,
                         "added_pct": 100.0 * more / value if value else None}
    return out


# -- the child: one workload's steps, plain or hooked ----------------------------------

def _make_step(name: str) -> tuple[Callable[[int], None], Any]:
    sys.path.insert(0, os.path.join(HERE, "workloads"))
    import torch

    torch.set_num_threads(1)
    module = __import__(name)
    return module.make_step()


def _hooked(optimizer: Any) -> Any:
    """perfrun's hooks on a timer-only clock that replays only when told."""
    import torch

    sys.path.insert(0, HERE)
    from bench_hotpath import make_agent

    from perfrun.runtime import hooks

    agent = make_agent()
    hooks.install(torch, agent)
    type(optimizer)([torch.zeros(1, requires_grad=True)])  # its step is hooked
    agent.clock.interval = agent.clock.longest = float("inf")
    agent.clock.last = float("inf")
    return agent


def child(name: str, side: str, steps: int, every: int) -> None:
    step, optimizer = _make_step(name)
    agent = _hooked(optimizer) if side == "hooked" else None
    drain: Callable[[], None] = agent.clock.drain if agent is not None else (lambda: None)
    for i in range(WARM):
        step(i)
    drain()
    for i in range(steps):
        step(WARM + i)
        if (i + 1) % every == 0:
            drain()
    if agent is not None and agent.tracker.committed < steps:
        raise SystemExit(f"perfrun saw {agent.tracker.committed} steps of {steps + WARM}")


def probe(name: str) -> None:
    """Untraced: the step's time and the edges it buffers, printed as JSON."""
    step, optimizer = _make_step(name)
    for i in range(WARM):
        step(i)
    n = 30 if name == "mlp" else 10
    began = time.perf_counter()
    for i in range(n):
        step(i)
    seconds = (time.perf_counter() - began) / n
    agent = _hooked(optimizer)
    for i in range(WARM):
        step(i)
    agent.clock.drain()
    for i in range(n):
        step(i)
    print(json.dumps({"step_s": seconds, "edges": len(agent.clock.buf) / n}))


# -- the parent ---------------------------------------------------------------------------

def counted(name: str, side: str, steps: int, every: int, work: str) -> dict[str, int]:
    out = os.path.join(work, f"cg.{name}.{side}.{steps}")
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--cachegrind-out-file={out}",
           sys.executable, os.path.abspath(__file__), "--child", name, side, str(steps),
           str(every)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    with open(out, encoding="utf-8") as f:
        return parse_totals(f.read())


def measure(name: str, replays: int, work: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    seen = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", name],
                          capture_output=True, text=True, env=env, check=True)
    native = json.loads(seen.stdout.strip().splitlines()[-1])
    every = steps_per_replay(native["step_s"], native["edges"])
    short, long = every, every * (1 + replays)
    runs = [(side, n) for side in ("plain", "hooked") for n in (short, long)]
    workers = max(1, min(2, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        totals = dict(zip(runs, pool.map(lambda r: counted(name, r[0], r[1], every, work), runs)))
    plain = per_step(totals[("plain", short)], totals[("plain", long)], long - short)
    hooked = per_step(totals[("hooked", short)], totals[("hooked", long)], long - short)
    return {"step_us": native["step_s"] * 1e6, "edges_a_step": native["edges"],
            "steps_a_replay": every, "steps_counted": long - short,
            "events": added(plain, hooked)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1], argv[2], int(argv[3]), int(argv[4]))
        return 0
    if argv[:1] == ["--probe"]:
        probe(argv[1])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp")
    parser.add_argument("--replays", type=int, default=1,
                        help="replays between the short and the long run (default 1)")
    parser.add_argument("--json", dest="out")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench_instructions: valgrind is not installed (Debian: apt-get install valgrind)",
              file=sys.stderr)
        return 1
    began = time.perf_counter()
    result: dict[str, Any] = {"python": sys.version.split()[0], "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="perfrun-cg-") as work:
        for name in [w for w in args.workloads.split(",") if w]:
            got = result["workloads"][name] = measure(name, args.replays, work)
            print(f"{name}: a step of {got['step_us']:.0f} us untraced, "
                  f"{got['edges_a_step']:.1f} edges, a replay every {got['steps_a_replay']} steps; "
                  f"{got['steps_counted']} steps counted")
            for event in EVENTS:
                e = got["events"].get(event)
                if e is None:
                    continue
                pct = "" if e["added_pct"] is None else f" ({e['added_pct']:+.3f}%)"
                print(f"  {event:5s} a step: plain {e['plain']:14,.0f}  perfrun "
                      f"{e['hooked']:14,.0f}  added {e['added']:+12,.0f}{pct}")
    result["seconds"] = time.perf_counter() - began
    print(f"{result['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
