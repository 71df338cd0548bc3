"""What does perfrun add to a step? Timed in one process, hooks in and out.

    python scripts/bench_inprocess.py [--rounds N] [--block STEPS] [--workloads W,...]
                                      [--json OUT]

scripts/bench_overhead.py times whole runs, plain against perfrun, one
process each: on a shared machine two plain runs differ by more than the few
microseconds perfrun adds to a step, so its per-step figures scatter by
tens of microseconds. This benchmark pairs closer. One process runs the
loops of the benchmark workloads in blocks of steps, and between blocks
installs perfrun's hooks (`perfrun.runtime.hooks.install`, on the buffered
clock of `--timer-only`, replaying as often as in a run) or takes them
out again (`hooks.uninstall`). The kinds of block come in a new random
order each round, so that the machine's drift favours none. Each block's
median step is taken after its first steps (the root search); per round,
perfrun's block less the plain one is what the hooks add to a step.

The kinds of block:

* plain: torch as it is;
* perfrun: the hooks in place, recording every edge (timer-only);
* batch-size: the same, as in a run given `--batch-size N`, where the
  fetch's hook counts no samples (the batch size says how many);
* off: the hooks in place, switched off once the root search has ended
  (`HookState.block = OFF`, as after a run's end), so that each hooked
  call pays the wrapper's call and one test and nothing else: the share of
  the cost that is a Python wrapper at all, rather than what it records;
* floor: not perfrun's hooks but the least a Python wrapper can do and
  still time the same calls (`install_floor`): a thread check, a nesting
  count for the models, two clock readings and two appends, nothing
  replayed. What perfrun adds beyond it is its bookkeeping (which call,
  gradients on or not, the root search, samples, FLOPs, the replay).

The loops, as in scripts/workloads/:

* (d) loader_mlp: a tiny MLP fed by a DataLoader, six hooked calls a step
  (the fetch, zero_grad, the model, the loss module, backward,
  optimizer.step); each call is also timed on its own, with a clock read
  around it, so that the cost splits by hooked call;
* (e) many_modules: a model whose forward calls 1,000 submodules, and (f)
  the same loop with none: (e) less (f), round by round, is what perfrun
  adds to 1,000 submodule calls;
* (g) mlp and (b) small_transformer (`--workloads mlp,small_transformer`):
  ordinary steps of a few and a few tens of milliseconds, plain against
  perfrun only, in blocks of about a second; what the hooks add is given as
  a share of the step with a confidence interval for its median over
  rounds. Whole runs on a shared 2-core machine differ by several percent
  from one process to the next (more on the MLP); blocks a second apart
  in one process do not, so this resolves the per-step share that
  scripts/bench_overhead.py's whole runs cannot.

Public tools only; needs torch and perfrun importable. Quiet the machine
first: the quartiles of the rounds say how much to trust a median.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from typing import Any, Callable

import torch

from perfrun.runtime import hooks
from perfrun.runtime.hooks import OFF

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "workloads"))
import loader_mlp  # noqa: E402  (workload (d))
import many_modules  # noqa: E402  (workloads (e) and (f))
import mlp  # noqa: E402  (workload (g))
import small_transformer  # noqa: E402  (workload (b))
from bench_hotpath import make_agent  # noqa: E402
from bench_overhead import median_interval  # noqa: E402

KINDS = ("plain", "perfrun", "batch-size", "off", "floor")
#: Steps at the start of each block left out: the root search runs on the
#: first outermost module calls (hooks.SEARCH_CALLS), a few steps.
SKIP = 30
#: (d)'s hooked calls, as its loop times them (the loss module and backward
#: run back to back, so they are timed together).
CALLS = ("fetch", "zero_grad", "model", "loss+backward", "optimizer.step")


Loop = Callable[[Callable[[], None]], list[tuple[float, ...]]]


def loader_loop(block: int) -> Loop:
    """Workload (d): returns a function that runs one block of steps and
    returns, per step, the step's time and each hooked call's; `switch` is
    called once, after the steps not counted."""
    loader, model, loss_fn, _ = loader_mlp.build(block, shuffle=False)

    def run(switch: Callable[[], None]) -> list[tuple[float, ...]]:
        # Built in the block, so that with the hooks in place its step is
        # hooked (perfrun wraps an optimizer class's step when it is built).
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        clock = time.perf_counter
        marks = []
        it = iter(loader)
        t = clock()
        for i in range(block):
            if i == SKIP:
                switch()
                t = clock()
            xb, yb = next(it)
            a = clock()
            optimizer.zero_grad()
            b = clock()
            out = model(xb)
            c = clock()
            loss_fn(out, yb).backward()
            d = clock()
            optimizer.step()
            e = clock()
            marks.append((e - t, a - t, b - a, c - b, d - c, e - d))
            t = e
        return marks

    run.roots = (type(model), type(loss_fn))  # type: ignore[attr-defined]
    return run


def modules_loop(block: int, blocks: int) -> Loop:
    """Workload (e) (blocks=100: 1,000 submodule calls a forward) or (f)
    (blocks=0): one block of steps, each step's time."""
    data, model, loss_fn = many_modules.build(blocks)

    def run(switch: Callable[[], None]) -> list[tuple[float, ...]]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        clock = time.perf_counter
        marks = []
        t = clock()
        for i in range(block):
            if i == SKIP:
                switch()
                t = clock()
            x, y = data[i % len(data)]
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            e = clock()
            marks.append((e - t,))
            t = e
        return marks

    run.roots = (type(model), type(loss_fn))  # type: ignore[attr-defined]
    return run


def ordinary_pairs(name: str, pairs: int, block: int, rng: random.Random) -> dict[str, Any]:
    """What the hooks add to an ordinary step (1-50 ms), as a share of it.

    On a CPU run the default mode's hooks are --timer-only's once its one
    counted step of FLOPs has passed (the agent's _update_listener: no
    listener, the clock buffered), so what is timed here is both modes'
    cost on the script's thread; the flush thread's work is left out here
    and kept in scripts/bench_overhead.py's whole runs.

    A step of these loops varies by 7% (the transformer) to 25% (the MLP)
    from one step to the next on a shared 2-core machine, and by several
    percent from one second, or one process, to the next: whole runs do not
    resolve 1%. So one process alternates short blocks (a few hundred
    milliseconds) with the hooks in and out, in a random order within each
    pair, on the same model and optimizer throughout; each block's first
    SKIP_ORDINARY steps (the root search that follows an install) are not
    counted. Per pair, the ratio of the blocks' mean steps; over pairs, the
    median and mean ratio with their intervals.

    The same ratios are taken of the script thread's CPU time a step
    (`time.thread_time`): a step that the scheduler set aside for another
    process waits in wall time but not in CPU time, so these ratios scatter
    less on a shared machine; they leave out what the hooks would cost in
    waits (none on this loop: no lock, no I/O, no other thread). Every
    block's step times are kept (`blocks`), for other estimators."""
    step, optimizer = (mlp if name == "mlp" else small_transformer).make_step()
    agent = make_agent()
    clock = time.perf_counter
    for i in range(10):
        step(i)
    cpu_clock = time.thread_time
    walls: list[float] = []
    cpus: list[float] = []
    plain_means: list[float] = []
    kept: list[dict[str, Any]] = []
    i = 0
    for _ in range(pairs):
        means: dict[bool, tuple[float, float]] = {}
        order = (True, False) if rng.random() < 0.5 else (False, True)
        raw: dict[str, Any] = {"hooked_first": order[0]}
        for hooked in order:
            undo = None
            if hooked:
                undo = hooks.install(torch, agent)
                # perfrun wraps an optimizer class's step when one is built:
                # build one, so that the script's optimizer is timed too.
                type(optimizer)([torch.zeros(1, requires_grad=True)])
            times, cpu = [], []
            t, c = clock(), cpu_clock()
            for j in range(SKIP_ORDINARY + block):
                step(i)
                i += 1
                e, d = clock(), cpu_clock()
                if j >= SKIP_ORDINARY:
                    times.append(e - t)
                    cpu.append(d - c)
                t, c = e, d
            if undo is not None:
                hooks.uninstall(undo)
            means[hooked] = (statistics.fmean(times), statistics.fmean(cpu))
            raw["hooked" if hooked else "plain"] = {"wall": times, "cpu": cpu}
        walls.append(means[True][0] / means[False][0])
        cpus.append(means[True][1] / means[False][1])
        plain_means.append(means[False][0])
        kept.append(raw)
    plain = statistics.median(plain_means)
    agent.clock.drain()  # what is still buffered: the steps seen below
    return {"plain_step_us": plain * 1e6, "pairs": pairs, "block": block,
            # Steps perfrun's tracker committed in the hooked blocks: that
            # the hooks were in place and timing (about pairs x block).
            "steps_seen": agent.tracker.committed,
            **share(walls, plain), "cpu": share(cpus, plain), "blocks": kept}


def share(ratios: list[float], plain: float) -> dict[str, float]:
    """Ratios of pairs' mean steps as what the hooks add, in % of the step:
    the median with its distribution-free interval, and the mean with its
    normal one."""
    pcts = [(r - 1) * 100 for r in ratios]
    lo, hi, coverage = median_interval(pcts)
    mean = statistics.fmean(pcts)
    half = 1.96 * statistics.stdev(pcts) / math.sqrt(len(pcts)) if len(pcts) > 1 else math.inf
    return {"added_pct": statistics.median(pcts), "pct_lo": lo, "pct_hi": hi,
            "confidence": coverage, "mean_pct": mean, "mean_pct_lo": mean - half,
            "mean_pct_hi": mean + half, "added_us": statistics.median(pcts) / 100 * plain * 1e6}


def install_floor(roots: tuple[type, ...]) -> list[tuple[Any, str, Any]]:
    """The floor: wrappers on the calls perfrun hooks (the fetch, zero_grad,
    the root modules' `__call__`, backward, SGD's step) that do the least
    that still times each call on the script's thread: a thread check, a
    nesting count (so that a model's nested calls of its own class pass
    through), a clock reading and an append at each edge. No ident, no
    gradient flag, no root search, no sample count, no replay: the edges
    pile up in a list for the block. Returns what `hooks.uninstall` puts
    back."""
    import torch.utils.data.dataloader as dataloader_mod

    edges: list[Any] = []
    record = edges.append
    now = time.perf_counter
    get_ident = threading.get_ident
    main = get_ident()
    depth = [0]
    undo: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, code: int) -> None:
        orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if get_ident() != main:
                return orig(*args, **kwargs)
            record((code, now()))
            result = orig(*args, **kwargs) if kwargs else orig(*args)
            record(now())
            return result

        # Copies torch's `hooked` mark of an optimizer step, so that torch
        # does not wrap the wrapper again when the block builds its optimizer.
        setattr(owner, name, functools.wraps(orig)(timed))
        undo.append((owner, name, orig))

    wrap(dataloader_mod._BaseDataLoaderIter, "__next__", 0)
    wrap(torch.optim.Optimizer, "zero_grad", 4)
    wrap(torch.optim.SGD, "step", 3)
    wrap(torch.autograd, "backward", 2)
    module_call = torch.nn.Module.__call__
    for cls in dict.fromkeys(roots):

        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0] or get_ident() != main:
                return module_call(*args, **kwargs) if kwargs else module_call(*args)
            depth[0] += 1
            record((1, now()))
            try:
                result = module_call(*args, **kwargs) if kwargs else module_call(*args)
            finally:
                depth[0] -= 1
            record(now())
            return result

        undo.append((cls, "__call__", cls.__dict__.get("__call__")))
        cls.__call__ = call
    return undo


def run_block(run: Loop, kind: str) -> list[float]:
    """One block of `kind`: the median of each timed column, in us."""
    undo = None
    switch = _nothing
    if kind == "floor":
        undo = install_floor(run.roots)  # type: ignore[attr-defined]
    elif kind != "plain":
        agent = make_agent()
        if kind == "batch-size":
            agent.count_samples = False
        undo = hooks.install(torch, agent)
        if kind == "off":
            def switch() -> None:
                agent.hooks_state.block = OFF
    try:
        marks = run(switch)
    finally:
        if undo is not None:
            hooks.uninstall(undo)
    kept = marks[SKIP:]
    return [statistics.median(m[j] for m in kept) * 1e6 for j in range(len(kept[0]))]


def _nothing() -> None:
    pass


def spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2]}


def fmt(s: dict[str, float]) -> str:
    return f"{s['median']:+7.2f} us  (quartiles {s['q1']:+.1f} to {s['q3']:+.1f})"


#: The loops: (name, kinds of block). The short steps run every kind; the
#: ordinary ones (1-50 ms) only perfrun against plain, the question there
#: being the share of the step.
SHORT = ("loader_mlp", "many_modules", "no_submodules")
ORDINARY = ("mlp", "small_transformer")
#: Steps a block of the ordinary loops: a few hundred milliseconds each.
ORDINARY_BLOCK = {"mlp": 60, "small_transformer": 8}
#: Steps not counted at the start of each of their blocks: the root search
#: an install starts lasts hooks.SEARCH_CALLS outermost calls (the model's
#: and the loss module's: four steps).
SKIP_ORDINARY = 5


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds (default 40)")
    parser.add_argument("--block", type=int, default=300,
                        help=f"steps a block of the short loops (default 300; the first {SKIP} "
                        "not counted)")
    parser.add_argument("--workloads", default=",".join(SHORT),
                        help=f"comma-separated, of {','.join(SHORT + ORDINARY)} (default "
                        "%(default)s)")
    parser.add_argument("--pairs", type=int, default=200,
                        help="pairs of blocks of each ordinary loop (default 200)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON to OUT")
    args = parser.parse_args(argv)
    if args.block <= SKIP + 10 or args.rounds < 1:
        parser.error(f"--block must exceed {SKIP + 10} and --rounds be at least 1")
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(chosen) - set(SHORT + ORDINARY))
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)}")

    torch.set_num_threads(1)
    builders: dict[str, tuple[str, Callable[[], Loop]]] = {
        "loader_mlp": ("(d) loader_mlp", lambda: loader_loop(args.block)),
        "many_modules": ("(e) many_modules",
                         lambda: modules_loop(args.block, many_modules.BLOCKS)),
        "no_submodules": ("(f) no_submodules", lambda: modules_loop(args.block, 0)),
    }
    loops = {builders[k][0]: builders[k][1]() for k in chosen if k in builders}
    results: dict[str, dict[str, list[list[float]]]] = {
        name: {kind: [] for kind in KINDS} for name in loops
    }
    rng = random.Random(0)
    began = time.perf_counter()
    for _ in range(args.rounds if loops else 0):
        order = [(name, kind) for name in loops for kind in KINDS]
        rng.shuffle(order)
        for name, kind in order:
            results[name][kind].append(run_block(loops[name], kind))
    ordinary = {
        label: ordinary_pairs(key, args.pairs, ORDINARY_BLOCK[key], rng)
        for key, label in (("mlp", "(g) mlp"), ("small_transformer", "(b) small_transformer"))
        if key in chosen
    }
    elapsed = time.perf_counter() - began

    out: dict[str, Any] = {
        "torch": torch.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count(),
        "rounds": args.rounds, "block": args.block, "pairs": args.pairs,
        "seconds": round(elapsed, 1),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "workloads": {},
    }
    blocks = f"{args.rounds} rounds of the short loops, " if loops else ""
    print(f"perfrun's hooks in and out of one process: torch {out['torch']}, python "
          f"{out['python']}, {out['cpus']} CPUs, {blocks}{elapsed:.0f} s, load "
          f"average {out['load_average']:.2f} at the end")
    print()
    added: dict[str, list[float]] = {}
    for name, kinds in results.items():
        plain = kinds["plain"]
        entry: dict[str, Any] = {"plain_step_us": statistics.median(r[0] for r in plain)}
        print(f"{name}: plain step {entry['plain_step_us']:.1f} us")
        for kind, label in (("perfrun", "perfrun (timer-only) adds"),
                            ("batch-size", "  with --batch-size N"),
                            ("off", "wrappers switched off add"),
                            ("floor", "the floor's wrappers add")):
            diffs = [k[0] - p[0] for k, p in zip(kinds[kind], plain)]
            if kind == "perfrun":
                added[name] = diffs
            entry[kind] = spread(diffs)
            print(f"  {label:27s} {fmt(entry[kind])}")
        beyond = spread([a[0] - b[0] for a, b in zip(kinds["perfrun"], kinds["floor"])])
        entry["perfrun_less_floor"] = beyond
        print(f"  {'perfrun less the floor':27s} {fmt(beyond)}")
        count = spread([a[0] - b[0] for a, b in zip(kinds["perfrun"], kinds["batch-size"])])
        entry["sample_count"] = count
        print(f"  {'the sample count':27s} {fmt(count)}")
        if len(plain[0]) > 1:
            entry["calls"] = {}
            for j, call in enumerate(CALLS, start=1):
                diffs = [k[j] - p[j] for k, p in zip(kinds["perfrun"], plain)]
                entry["calls"][call] = spread(diffs)
                print(f"    {call:25s} {fmt(entry['calls'][call])}")
        out["workloads"][name] = entry
    for name, entry in ordinary.items():
        print(f"{name}: plain step {entry['plain_step_us']:.1f} us; {entry['pairs']} pairs of "
              f"{entry['block']}-step blocks ({entry['steps_seen']} steps seen by perfrun)")
        for label, fig in (("wall time", entry), ("thread CPU time", entry["cpu"])):
            print(f"  in {label}, perfrun's hooks add {fig['added_pct']:+.3f}% of the step, "
                  f"{fig['added_us']:+.2f} us (median over pairs; {fig['confidence']:.0%} "
                  f"interval {fig['pct_lo']:+.3f} to {fig['pct_hi']:+.3f}%); mean "
                  f"{fig['mean_pct']:+.3f}% ({fig['mean_pct_lo']:+.3f} to "
                  f"{fig['mean_pct_hi']:+.3f}%)")
        out["workloads"][name] = entry
    if "(e) many_modules" in added and "(f) no_submodules" in added:
        e, f = added["(e) many_modules"], added["(f) no_submodules"]
        sub = spread([a - b for a, b in zip(e, f)])
        out["submodules_1000"] = sub
        print()
        print(f"1,000 submodule calls, (e) less (f), round by round: {fmt(sub)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
