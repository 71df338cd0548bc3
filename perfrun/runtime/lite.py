"""The first moments of a rank: as little as possible until torch arrives.

The boot `sitecustomize` calls `boot()` before the script runs. It writes the
rank's first results file (so the launcher knows the bootstrap ran, and a
rank that dies early still leaves a trace), and puts a post-import hook on
`torch`. Only when the script imports torch does the full agent load: a
script that never imports torch pays a few milliseconds, not perfrun's
import time.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from time import perf_counter
from typing import Any, Callable, Optional

from ..schema import FORMAT, STEP_COLUMNS, VERSION, rank_filename

#: Linux's prctl option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: The variable perfrun's torchrun agent leaves its pid in for its workers.
AGENT_PID_VAR = "PERFRUN_AGENT_PID"


def parent_death_signal() -> Optional[Callable[[], bool]]:
    """A function that asks the kernel to SIGKILL the calling process when
    its parent dies, or None where there is no such thing (not Linux).

    Made before a fork and called after it (in `preexec_fn`), so the child
    only calls into a library that is already loaded. SIGKILL rather than
    SIGTERM: a script that handles or ignores SIGTERM must not outlive
    perfrun, whose report it can no longer reach anyway; what a rank
    flushed before stays in its results file.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):
        return None
    kill = int(signal.SIGKILL)

    def arm() -> bool:
        return prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0) == 0

    return arm


def die_with(owner: Optional[int], wrapped: bool = False) -> None:
    """End this process when its parent ends, and now if `owner` (the
    process that started this run: perfrun, or torchrun's agent for a
    worker) has already gone.

    The parent's death is only noticed from the moment the signal is armed:
    a parent that died before (while this interpreter started) has left
    this process to init or a subreaper, so the parent is checked again
    afterwards. `wrapped`: a wrapper (nsys) may stand between `owner` and
    this process; then the wrapper is the parent, and `owner` itself must
    still be there.
    """
    arm = parent_death_signal()
    if arm is None or not arm() or owner is None or os.getppid() == owner:
        return
    if wrapped:
        try:
            os.kill(owner, 0)
            return
        except ProcessLookupError:
            pass
        except OSError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


def ended_status(last: Optional[BaseException], exit: dict[str, Any]) -> str:
    """The status of a rank whose script ended by itself (`last`: the
    uncaught exception, if any). An uncaught KeyboardInterrupt (Ctrl-C, or
    torchrun passing SIGINT on to its workers) makes Python end by SIGINT
    once the exit handlers ran: the rank was signalled, not finished, and
    `exit` is told by which signal. Any other exception keeps "finished",
    the status the report reads `exit.exception` under ("raised X")."""
    if isinstance(last, KeyboardInterrupt):
        if exit.get("signal") is None:
            exit["signal"] = int(signal.SIGINT)
        return "signalled"
    return "finished"


class TorchWatcher:
    """A meta path finder that runs a callback right after `import torch`
    (or the module named `name`) finishes executing (a post-import hook)."""

    def __init__(self, callback: Callable[[Any], None], name: str = "torch") -> None:
        self.callback = callback
        self.name = name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        loader = spec.loader
        original = loader.exec_module
        callback = self.callback

        def exec_module(module: Any) -> None:
            original(module)
            callback(module)

        loader.exec_module = exec_module
        return spec


def _int(value: Optional[str], default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


class Boot:
    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.t0 = perf_counter()
        self.t0_unix = time.time()
        env = os.environ
        self.rank = _int(env.get("RANK"), 0)
        self.restart = _int(env.get("TORCHELASTIC_RESTART_COUNT"), 0)
        self.path = os.path.join(payload["run_dir"], rank_filename(self.rank, self.restart))
        self.pid = os.getpid()
        self.agent: Any = None
        self.done = False

    def start(self) -> None:
        self._tie_to_owner()
        self._write("running")
        atexit.register(self._atexit)
        os.register_at_fork(after_in_child=self._forked)
        sys.meta_path.insert(0, TorchWatcher(self._on_torch))

    def _tie_to_owner(self) -> None:
        """A rank ends with the process that runs it: perfrun for a plain
        script, torchrun's agent for a worker. perfrun arms its own child
        before it starts; a torchrun worker, or a script under nsys, has
        another parent and arms itself here."""
        wrapped = bool(self.payload.get("nsys"))
        if self.payload.get("launcher") == "torchrun":
            owner = _int(os.environ.pop(AGENT_PID_VAR, None), 0) or None
        else:
            owner = self.payload.get("launcher_pid")
            if owner is None or (os.getppid() == owner and not wrapped):
                return
        try:
            die_with(owner, wrapped)
        except Exception:
            pass

    def _on_torch(self, torch: Any) -> None:
        try:
            from . import agent

            self.agent = agent.start(self.payload, self.t0, self.t0_unix)
            self.agent._on_torch(torch)
        except Exception as exc:  # profiling off; the script goes on
            try:
                sys.stderr.write(f"perfrun: profiling disabled: {type(exc).__name__}: {exc}\n")
            except Exception:
                pass

    def _forked(self) -> None:
        self.done = True  # a forked child is not a rank

    def _atexit(self) -> None:
        if self.done or self.agent is not None or os.getpid() != self.pid:
            return
        self.done = True
        try:
            self._write("finished")
        except Exception as exc:
            try:
                sys.stderr.write(f"perfrun: could not save results: {exc}\n")
            except Exception:
                pass

    def _write(self, status: str) -> None:
        """The results of a rank that has not imported torch (yet)."""
        last = getattr(sys, "last_value", None)
        exit_info = {"exception": type(last).__name__ if last is not None else None,
                     "signal": None}
        if status == "finished":
            status = ended_status(last, exit_info)
        env = os.environ
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "rank": self.rank,
            "local_rank": _int(env.get("LOCAL_RANK"), 0),
            "world_size": _int(env.get("WORLD_SIZE"), 1),
            "restart": self.restart,
            "status": status,
            "exit": exit_info,
            "started_unix": self.t0_unix,
            "elapsed": round(perf_counter() - self.t0, 6),
            "env": {
                "hostname": os.uname().nodename if hasattr(os, "uname") else None,
                "pid": self.pid,
                "python": sys.version.split()[0],
                "argv": list(getattr(sys, "argv", [])),
                "command": self.payload.get("command"),
                "cwd": os.getcwd(),
            },
            "settings": {
                k: v
                for k, v in self.payload.items()
                if k not in ("pythonpath", "boot_dir", "package_root", "command")
            },
            "window": self.payload.get("scheduler"),
            "torch_imported": False,
            "gpu": False,
            "extra": {},
            "dataloaders": [],
            "device": None,
            "faults": [],
            "notes": [],
            "steps": {"columns": list(STEP_COLUMNS), "rows": []},
        }
        tmp = f"{self.path}.tmp{self.pid}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(doc))
        os.replace(tmp, self.path)


def boot(payload: dict[str, Any]) -> Boot:
    b = Boot(payload)
    b.start()
    return b
