"""Which part of the default mode costs a GPU step?

    python scripts/bench_gpu_parts.py [--rounds N] [--steps N] [--json OUT]

On a GPU the default mode attaches what `--timer-only` does not: CUDA
events at every phase edge (runtime/gpu.py), the allocator's per-phase peaks
on a sampled step every half second (runtime/allocator.py), one step's FLOP
count (runtime/flops.py), and, because the events must be recorded as the
edges happen, a phase clock that handles every edge at once instead of
buffering it. This benchmark times the GPU workload of the GPU checks
(tests/gpu/scripts/cuda_overhead.py, a ~9 ms bf16 step on an H100 that
reads its loss every step, so the CPU waits for the GPU each step and what
perfrun adds between two steps adds to the step) under these arms:

    plain        python WORKLOAD
    timer-only   perfrun --timer-only WORKLOAD
    default      perfrun WORKLOAD
    no-flops     perfrun --no-flops WORKLOAD
    no-peaks     the default mode, the allocator's peaks never sampled
    no-events    the default mode, the CUDA timer's edges kept but no event
                 recorded (its CUDA calls out, its bookkeeping in)
    no-cuda      the default mode, nothing of CUDA attached (the clock
                 buffers its edges as in --timer-only)
    no-flush     the default mode, its flush thread asleep until the end
                 (--flush-interval 3600): the saves' and samplers' share,
                 and their turns at the GIL while the script's thread waits

    python scripts/bench_gpu_parts.py --calls

times instead, on the GPU, each call perfrun makes into torch at a phase
edge of the default mode (microseconds a call, a matmul in flight as in a
step): whether their sum over a step's edges is the step's added time.

    python scripts/bench_gpu_parts.py --python-path [--steps N]

needs no GPU: it times perfrun's own Python on the default mode's GPU path
(the live clock, the step callbacks, the CUDA timer's bookkeeping) in
microseconds a step of four phases, with each CUDA call stood in for by the
cheapest Python call that takes its place (the real calls are what --calls
times), against the buffered clock of --timer-only.

An arm that takes a part out runs the workload through this file,
`bench_gpu_parts.py --inside ARM WORKLOAD ARGS`: perfrun profiles that as
it profiles any script; before the workload imports torch it switches the
part off in perfrun's runtime classes, then runs the workload as __main__.

Rounds run every arm once, in an order that rotates from round to round,
so that drift in the machine's speed falls on every arm. Per arm: the
median over rounds of its step (the workload's own STEP_MS) over the
round's plain step, and the range of that ratio. Needs a CUDA GPU,
CUDA PyTorch and perfrun installed in this interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "..", "tests", "gpu", "scripts", "cuda_overhead.py")


def _no_peaks() -> None:
    from perfrun.runtime.allocator import AllocatorPhases

    def step_begin(self: Any, index: int, t: float) -> None:
        return None

    AllocatorPhases.step_begin = step_begin  # type: ignore[method-assign]


def _no_events() -> None:
    from perfrun.runtime.gpu import CudaPhaseTimer

    def record(self: Any) -> None:
        return None

    CudaPhaseTimer._record = record  # type: ignore[method-assign]


def _no_cuda() -> None:
    from perfrun.runtime.cudaside import CudaSide

    def never(self: Any) -> None:
        self._cuda_possible = False
        self._update_listener()  # the clock buffers from now on

    CudaSide._maybe_start_cuda = never  # type: ignore[method-assign]


#: What each arm that takes a part out switches off, inside the profiled
#: process; the other arms are command lines alone.
PARTS: dict[str, Callable[[], None]] = {
    "no-peaks": _no_peaks,
    "no-events": _no_events,
    "no-cuda": _no_cuda,
}
ARMS = ("plain", "timer-only", "default", "no-flops", *PARTS, "no-flush")
#: Arms that are the default mode with perfrun options added.
OPTIONS = {"no-flops": ["--no-flops"], "no-flush": ["--flush-interval", "3600"]}


def inside(arm: str, argv: list[str]) -> None:
    """Run the workload `argv` as __main__ with `arm`'s part switched off."""
    PARTS[arm]()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


def command(arm: str, workload_args: list[str], log_dir: str) -> list[str]:
    if arm == "plain":
        return [sys.executable, WORKLOAD, *workload_args]
    perfrun = [sys.executable, "-m", "perfrun", "-q", "--log-dir", log_dir,
               "--format", "json", "--output", os.devnull]
    if arm == "timer-only":
        return [*perfrun, "--timer-only", WORKLOAD, *workload_args]
    if arm in OPTIONS:
        return [*perfrun, *OPTIONS[arm], WORKLOAD, *workload_args]
    if arm == "default":
        return [*perfrun, WORKLOAD, *workload_args]
    return [*perfrun, os.path.abspath(__file__), "--inside", arm, WORKLOAD, *workload_args]


def step_ms(cmd: list[str]) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("STEP_MS ")]
    if out.returncode != 0 or len(lines) != 1:
        raise SystemExit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return float(lines[0].split()[1])


def per_call_us(call: Callable[[], Any], n: int, clock: Callable[[], float]) -> float:
    """Microseconds a call of `call`, over `n` calls."""
    began = clock()
    for _ in range(n):
        call()
    return (clock() - began) / n * 1e6


def edge_calls(torch: Any, n: int = 2000) -> dict[str, float]:
    """Each torch call the default mode makes at a phase edge, timed on
    the GPU with a matmul of the workload's size queued behind it (the
    calls return before it ends)."""
    from perfrun.runtime.allocator import PeakView
    from perfrun.runtime.gpu import work_device
    from perfrun.runtime.modules import RootTracker

    cuda = torch.cuda
    model = torch.nn.Linear(8192, 8192, bias=False).to("cuda", torch.bfloat16)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    roots = RootTracker()
    roots.see(model)
    events = [cuda.Event(enable_timing=True) for _ in range(n)]
    stream = cuda.current_stream(0)
    it = iter(events)
    view = PeakView(torch)
    clock = time.perf_counter
    out: dict[str, float] = {}
    try:
        for name, call in (
            ("is_current_stream_capturing", cuda.is_current_stream_capturing),
            ("current_stream(device)", lambda: cuda.current_stream(0)),
            ("Event(enable_timing=True)", lambda: cuda.Event(enable_timing=True)),
            ("Event.record(stream)", lambda: next(it).record(stream)),
            ("work_device (first parameter)", lambda: work_device(torch, roots, 0)),
            ("allocator read_and_reset", lambda: view.read_and_reset(0)),
        ):
            model(x)  # queued: the calls run while the GPU is busy
            out[name] = per_call_us(call, n, clock)
            cuda.synchronize()
    finally:
        view.undo()
    return out


class _Event:
    """Stands in for torch.cuda.Event in --python-path: recording costs a
    Python call, the CUDA call itself is --calls' to time."""

    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        return None


def _stand_in_torch() -> Any:
    from types import SimpleNamespace

    cuda = SimpleNamespace(Event=_Event, current_stream=lambda device=None: None,
                           is_current_stream_capturing=lambda: False,
                           current_device=lambda: 0)
    return SimpleNamespace(cuda=cuda)


def python_path(steps: int, run_dir: str) -> dict[str, float]:
    """Microseconds a step of four phases through a real rank agent: the
    buffered clock (--timer-only, replayed), the live clock with no
    listener, and the live clock with the CUDA timer attached as
    cudaside.py attaches it."""
    import dataclasses

    from perfrun.runtime.agent import Agent
    from perfrun.runtime.gpu import CudaPhaseTimer
    from perfrun.runtime.steps import BWD, DATA, FWD, OPT
    from perfrun.settings import Settings

    def agent(arm: str) -> Any:
        payload = dataclasses.asdict(Settings(script="train.py", nvtx=False,
                                              timer_only=arm == "buffered"))
        payload["run_dir"] = tempfile.mkdtemp(dir=run_dir)
        made = Agent(payload)
        if arm == "live":
            made._cuda_possible = True  # live, as until the script's CUDA exists
        elif arm == "live+timer":
            timer = CudaPhaseTimer(_stand_in_torch(), device_of=lambda: 0,
                                   on_fault=made._gpu_fault)
            made.gpu_timer = timer
            made._begin_listeners.append(timer.step_begin)
            made._end_listeners.append(timer.step_end)
        made._update_listener()
        return made

    def loop(made: Any, n: int) -> None:
        clock = made.phase_clock
        for _ in range(n):
            for kind in (DATA, FWD, BWD, OPT):
                clock.enter(kind)
                clock.exit()
        made.clock.drain()

    out: dict[str, float] = {}
    for arm in ("buffered", "live", "live+timer"):
        made = agent(arm)
        loop(made, 200)
        out[arm] = per_call_us(lambda made=made: loop(made, steps), 1, time.perf_counter) / steps
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inside"]:
        inside(argv[1], argv[2:])
        return 0
    if argv[:1] == ["--calls"]:
        import torch

        if not torch.cuda.is_available():
            print("bench_gpu_parts.py --calls: no CUDA GPU here", file=sys.stderr)
            return 2
        calls = edge_calls(torch)
        for name, us in calls.items():
            print(f"{name:32s} {us:8.2f} us a call")
        return 0
    if argv[:1] == ["--python-path"]:
        steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 20000
        with tempfile.TemporaryDirectory(prefix="perfrun-gpu-parts-") as run_dir:
            for arm, us in python_path(steps, run_dir).items():
                print(f"{arm:12s} {us:7.2f} us a step")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--json", dest="out")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if "plain" not in arms:
        arms.insert(0, "plain")
    workload_args = ["--item", "--steps", str(args.steps), "--skip", "30"]
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="perfrun-gpu-parts-") as log_dir:
        for r in range(args.rounds):
            k = r % len(arms)
            for arm in arms[k:] + arms[:k]:
                times[arm].append(step_ms(command(arm, workload_args, log_dir)))
                print(f"round {r + 1} {arm:10s} {times[arm][-1]:.4f} ms", flush=True)
    plain = times["plain"]
    result: dict[str, Any] = {"rounds": args.rounds, "steps": args.steps, "arms": {}}
    print(f"\nplain step: median {statistics.median(plain):.4f} ms over {len(plain)} runs")
    for arm in arms:
        ratios = [t / p for t, p in zip(times[arm], plain)]
        med = statistics.median(ratios)
        result["arms"][arm] = {"step_ms": times[arm], "ratios": ratios, "median_ratio": med}
        print(f"{arm:10s} {(med - 1) * 100:+6.2f}%  (range {(min(ratios) - 1) * 100:+.2f} "
              f"to {(max(ratios) - 1) * 100:+.2f}%)  median step "
              f"{statistics.median(times[arm]):.4f} ms")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
