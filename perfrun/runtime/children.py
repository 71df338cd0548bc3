"""Processes the script starts itself with `multiprocessing.Process` (or
torch's re-export of it): named, and what they trained counted, not
profiled.

Hogwild training (PyTorch's `mnist_hogwild` example and its kin) starts N
processes on a model in shared memory, each running its own optimizer
loop, and tests in the parent. perfrun profiles the parent, so without a
word its report reads the parent's test loop as the training.

Naming them rather than profiling them as ranks, because a child is no
rank: it has no rank identity, shares the parent's model and often its
GPU, and may be anything the script starts (a data server, an
environment's simulator); profiling it would put perfrun's hooks, threads
and files in processes the user never asked to profile, where torchrun
(`perfrun --nproc-per-node N`) profiles each one that is a rank. What
the report needs is whether the children trained, and how much: each
child whose target is the script's own function runs it through
`ChildTarget`, which counts its optimizer steps with torch's own global
step hook (no patching in the child) and writes them to
`children/rank<R>.pid<P>.json` (store/childfile.py) when the target
returns or raises.

Only targets defined by the script (its `__main__`, or a module beside
it) are wrapped: DataLoader workers, compile workers and a framework's
own processes are left as they are. A target is wrapped only where the
child can import perfrun the way the parent did (a spawned child
unpickles `ChildTarget` by name), and a Process subclass with its own
`run` is named but not counted.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

from perfrun.store import childfile


class ChildTarget:
    """The script's target, run in the child with its optimizer steps
    counted. Pickled with the Process when the start method is spawn or
    forkserver: a plain object of module-level class, holding the target
    (pickled by reference, as it was) and where to write."""

    def __init__(self, target: Callable[..., Any], run_dir: str, stem: str,
                 origin_wall: float) -> None:
        self.target = target
        self.run_dir = run_dir
        self.stem = stem
        # The wall time of the rank's start: `started` is since then.
        self.origin_wall = origin_wall

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        steps = [0]
        handle = _count_steps(steps)
        t0 = time.perf_counter()
        started = time.time() - self.origin_wall
        status = "raised"
        try:
            result = self.target(*args, **kwargs)
            status = "finished"
            return result
        finally:
            try:
                if handle is not None:
                    handle.remove()
                childfile.write(self.run_dir, self.stem, {
                    "pid": os.getpid(), "target": target_name(self.target),
                    "started": started, "seconds": time.perf_counter() - t0,
                    "optimizer_steps": steps[0], "status": status,
                })
            except Exception:
                pass  # the child's own outcome is what matters here


def _count_steps(steps: list[int]) -> Any:
    """torch's global optimizer step hook, counting into `steps`; None
    where torch is not imported or has no such hook."""
    optimizer = sys.modules.get("torch.optim.optimizer")
    register = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if register is None:
        return None

    def counted(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        steps[0] += 1

    return register(counted)


def target_name(target: Any) -> str:
    return getattr(target, "__qualname__", None) or type(target).__name__


def is_scripts(target: Any, script_dir: str) -> bool:
    """A target the script defined: in its `__main__`, or in a module in
    the script's folder."""
    module = getattr(target, "__module__", None)
    if module in ("__main__", "__mp_main__"):
        return True
    mod = sys.modules.get(module or "")
    path = getattr(mod, "__file__", None)
    if not path or not script_dir:
        return False
    return os.path.dirname(os.path.abspath(path)) == script_dir


def spawn_note(fn: Any, nprocs: Any, script: str) -> str:
    """What the report says of `torch.multiprocessing.start_processes(fn,
    nprocs=...)` (and `spawn`, which calls it): the DDP tutorials' launcher.
    perfrun profiles the process it starts, or each rank torchrun starts:
    every child's environment loses perfrun's variables, or each DataLoader
    worker would be a rank. A run that trains only in such children would
    say "no training loop was seen" and not why."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return (
        f"the script started {nprocs} process(es) with torch.multiprocessing ({name}): "
        "perfrun profiles the process it starts (or each rank torchrun starts), not "
        "processes the script spawns, so what they ran is not in these results; to "
        f"profile each of them, start them with torchrun: perfrun --nproc-per-node "
        f"{nprocs} {script or 'SCRIPT'}, the script taking its rank from the RANK and "
        "WORLD_SIZE environment variables"
    )


def process_note(target: str) -> str:
    """What the report says of a process the script starts with
    `multiprocessing.Process` (Hogwild): perfrun profiles the processes it
    launches, not theirs (the module's docstring says why); what they trained is
    counted and reported beside it."""
    return (
        f"the script started processes of its own with multiprocessing ({target}): perfrun "
        "profiles the process it starts (or each rank torchrun starts), not processes the "
        "script starts, so their steps are not in these tables; what they trained is listed "
        "under Child processes"
    )


def start_method() -> str:
    """The start method a Process without one of its own uses."""
    import multiprocessing

    # (Without allow_none, asking would fix the method for the script.)
    return (multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_all_start_methods()[0])
