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
                    "started_by": "multiprocessing",
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


# -- processes of a cluster the script starts (Ray) -----------------------------------------

#: Seconds between a counting process's writes of its document while its
#: count changes: a worker its cluster kills at the end (Ray's are) keeps
#: what it counted up to its last write.
SAVE_EVERY = 0.5


class Descendant:
    """A process of a cluster the rank's script started (a Ray worker),
    counting its optimizer steps for the rank's report. It is no rank: it
    has no rank identity of perfrun's, and the cluster runs processes that
    never train (Ray's dashboard, its idle workers); so nothing is loaded
    until torch is, and then only torch's own global optimizer step hook
    counts, writing `children/<stem>.pid<P>.json` at the first step, every
    SAVE_EVERY seconds after and at exit."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.run_dir = str(spec["run_dir"])
        self.stem = str(spec["stem"])
        self.started_by = str(spec.get("started_by") or "ray")
        self.started = time.time() - float(spec.get("origin_wall") or time.time())
        self.t0 = time.perf_counter()
        self.pid = os.getpid()
        self.steps = [0]
        self.saved = 0
        self.done = False
        self.handle: Any = None

    def on_torch(self, _torch: Any) -> None:
        optimizer = sys.modules.get("torch.optim.optimizer")
        register = getattr(optimizer, "register_optimizer_step_post_hook", None)
        if register is None:
            return
        steps, start = self.steps, self._start_saving

        def counted(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
            steps[0] += 1
            if steps[0] == 1:
                start()

        self.handle = register(counted)

    def _start_saving(self) -> None:
        """From the first step on, a thread writes the count whenever it
        changed, every SAVE_EVERY seconds: the step itself only adds one."""
        import threading

        self.save("running")

        def loop() -> None:
            while not self.done:
                time.sleep(SAVE_EVERY)
                if self.steps[0] != self.saved and not self.done:
                    self.save("running")

        threading.Thread(target=loop, name="perfrun-child-count", daemon=True).start()

    def save(self, status: str) -> None:
        if os.getpid() != self.pid or not self.steps[0]:
            return  # a fork of it, or a process that never trained
        command = process_command()
        steps = self.steps[0]
        try:
            childfile.write(self.run_dir, self.stem, {
                "pid": self.pid, "target": process_title(command),
                "started": self.started, "seconds": time.perf_counter() - self.t0,
                "optimizer_steps": steps, "status": status,
                "started_by": self.started_by, "command": command[:20],
            })
            self.saved = steps
        except Exception:
            pass  # the process's own work comes first

    def at_exit(self) -> None:
        if not self.done:
            self.done = True
            self.save("finished")


def process_command() -> list[str]:
    """The process's command line as the system shows it now: Ray names its
    workers there (`ray::RayTrainWorker.train_func`) by rewriting it."""
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            raw = f.read()
        words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
        if words:
            return words
    except OSError:
        pass
    return [sys.executable, *sys.argv]


def process_title(command: list[str]) -> str:
    """A process's short name, from its command line, that tells a
    cluster's processes apart where a cut command line would not: Ray's
    title for its worker (`ray::RayTrainWorker`, `ray::IDLE`; the method
    after a dot left out: it changes with the task), `python -m MODULE`,
    a Python script's file name, else the program's name."""
    words = [w for w in command if w.strip()]
    if len(words) == 1:
        words = words[0].split()
    if not words:
        return "process"
    first = words[0]
    if "::" in first:
        return first.split(".")[0]
    name = os.path.basename(first)
    if name.startswith("python"):
        rest = words[1:]
        for i, word in enumerate(rest):
            if word == "-m" and i + 1 < len(rest):
                return f"python -m {rest[i + 1]}"
            if not word.startswith("-"):
                return os.path.basename(word)
    return name


def watch_descendant(spec: dict[str, Any]) -> Descendant:
    """Count what this process trains, once it imports torch (the boot
    calls this in a process of a cluster the script started)."""
    import atexit

    from .importwatch import ImportWatcher

    counter = Descendant(spec)
    if "torch" in sys.modules:
        counter.on_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, ImportWatcher(counter.on_torch, "torch"))
    atexit.register(counter.at_exit)
    return counter

