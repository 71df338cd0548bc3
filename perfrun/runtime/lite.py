"""The first moments of a rank: as little as possible until torch arrives.

The boot `sitecustomize` calls `boot()` before the script runs. It writes the
rank's first results file (so the launcher knows the bootstrap ran, and a
rank that dies early still leaves a trace), and puts a post-import hook on
`torch`. Only when the script imports torch does the full agent load: a
script that never imports torch pays a few milliseconds, not perfrun's
import time.

It also watches `os._exit`, which ends the process at once: no exit
handler runs, so without a save first every step since the last periodic
save (all of them, in a run shorter than one save interval) would be lost.
The save comes first, then `os._exit` itself with the script's own
arguments, whatever the save did: the exit status is the script's.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time
from time import perf_counter
from types import TracebackType
from typing import Any, Callable, Optional

from ..store.layout import descendant_settings_path, rank_filename
from ..store.rankfile import (
    PROFILING_DISABLED,
    env_int,
    environment,
    rank_document,
    rank_identity,
    write_rank_file,
)
from .importwatch import ImportWatcher
from .lifeline import AGENT_PID_VAR, die_with, ended_status, say_unsaved


class Boot:
    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.t0 = perf_counter()
        self.t0_unix = time.time()
        self.identity = rank_identity(os.environ)
        self.rank = self.identity["rank"]
        self.restart = self.identity["restart"]
        self.path = os.path.join(payload["run_dir"], rank_filename(self.rank, self.restart))
        self.pid = os.getpid()
        self.agent: Any = None
        self.done = False
        # Why the agent could not start when the script imported torch (a
        # full disk): the script trains on unseen, and the last save says so.
        self.disabled: Optional[str] = None

    def start(self) -> None:
        self._tie_to_owner()
        self._write("running")
        atexit.register(self._atexit)
        os.register_at_fork(after_in_child=self._forked)
        watch_os_exit(self._before_os_exit)
        sys.meta_path.insert(0, ImportWatcher(self._on_torch, "torch"))
        sys.meta_path.insert(0, ImportWatcher(self._on_ray, "ray"))

    def _tie_to_owner(self) -> None:
        """A rank ends with the process that runs it: perfrun for a plain
        script, torchrun's agent for a worker. perfrun arms its own child
        before it starts; a torchrun worker, or a script under nsys, has
        another parent and arms itself here, as does a rank of a launcher's
        command perfrun was put in front of (the launcher stands between
        them, as nsys does)."""
        wrapped = bool(self.payload.get("nsys")) or self.payload.get("launcher") == "command"
        if self.payload.get("launcher") == "torchrun":
            owner = env_int(os.environ.pop(AGENT_PID_VAR, None), 0) or None
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
            self.disabled = f"{type(exc).__name__}: {exc}"[:300]
            try:
                sys.stderr.write(f"perfrun: profiling disabled: {self.disabled}\n")
            except Exception:
                pass

    def _on_ray(self, ray: Any) -> None:
        """Ray: the workers of a Ray cluster the script starts (Ray Train's
        among them) run where perfrun cannot follow them as ranks; each is
        given, through the environment Ray hands its processes, what to
        count what it trains (runtime/children.py)."""
        try:
            wrap_ray_init(ray, self._descendant_environment)
        except Exception:
            pass  # the script's Ray comes first

    def _descendant_environment(self) -> dict[str, str]:
        """The variables a process of the script's cluster starts with: the
        boot first on its path, and where its settings are."""
        stem = rank_filename(self.rank, self.restart)[: -len(".json")]
        path = descendant_settings_path(self.payload["run_dir"], stem)
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            spec = {"run_dir": self.payload["run_dir"], "stem": stem,
                    "origin_wall": self.t0_unix, "started_by": "ray"}
            doc = {"descendant": spec, "package_root": self.payload.get("package_root")}
            tmp = f"{path}.tmp{self.pid}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, path)
        original = os.environ.get("PYTHONPATH")
        boot = self.payload.get("boot_dir") or ""
        return {"PERFRUN_SETTINGS": path,
                "PYTHONPATH": boot + (os.pathsep + original if original else "")}

    def _forked(self) -> None:
        self.done = True  # a forked child is not a rank

    def _atexit(self) -> None:
        if self.done or self.agent is not None or os.getpid() != self.pid:
            return
        self.done = True
        try:
            self._write("finished")
        except Exception as exc:
            say_unsaved(exc)

    def _before_os_exit(self, status: Any) -> None:
        """The script calls os._exit(status) in this rank: save now, as the
        exit handlers would have (the agent's final save once torch is in)."""
        if self.done or os.getpid() != self.pid:
            return
        if self.agent is not None:
            self.agent.before_os_exit(status)
            return
        self.done = True
        try:
            self._write("finished", os_exit=status)
        except Exception as exc:
            say_unsaved(exc)

    def _write(self, status: str, os_exit: Any = None) -> None:
        """The results of a rank that has not imported torch (yet)."""
        last = getattr(sys, "last_value", None)
        exit_info: dict[str, Any] = {
            "exception": type(last).__name__ if last is not None else None, "signal": None,
        }
        if type(os_exit) is int:
            exit_info["os_exit"] = os_exit
        start_error = not_started(last)
        if start_error is not None:
            exit_info["start_error"] = start_error
        if status == "finished":
            status = ended_status(last, exit_info)
        doc = rank_document(
            self.identity,
            status,
            exit_info,
            self.t0_unix,
            round(perf_counter() - self.t0, 6),
            environment(self.pid, self.payload.get("command")),
            {k: v for k, v in self.payload.items()
             if k not in ("pythonpath", "boot_dir", "package_root", "package_root_used",
                          "command")},
            window=self.payload.get("scheduler"),
            **({"torch_imported": True,
                "faults": [{"where": PROFILING_DISABLED, "count": 1, "error": self.disabled}]}
               if self.disabled is not None else {}),
        )
        write_rank_file(self.path, doc)


def not_started(exc: Optional[BaseException]) -> Optional[str]:
    """What kept the script from starting, when `exc` (the uncaught
    exception) did: a SyntaxError in the script's own file, raised while
    Python compiled it, before any line of it ran (no frame of the script's
    in its traceback: none at all for `python script.py`, only runpy's for
    `python -m`). The error's own words, with its file and line."""
    if not isinstance(exc, SyntaxError):
        return None
    tb: Optional[TracebackType] = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name == "<frozen runpy>" or os.path.basename(name) == "runpy.py"):
            return None
        tb = tb.tb_next
    return " ".join(str(exc).split())[:300]


def wrap_ray_init(ray: Any, environment: Callable[[], dict[str, str]]) -> None:
    """Have `ray.init` start its processes with `environment()` added to
    os.environ, for the length of the call alone: Ray's processes copy the
    environment they start in (its raylet, and the workers the raylet
    starts), and the script sees its own before and after. A call that
    connects to a cluster already running starts nothing, and changes
    nothing there."""
    original = getattr(ray, "init", None)
    if original is None or getattr(original, "__perfrun__", False):
        return

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        try:
            added = environment()
        except Exception:
            added = {}
        saved = {k: os.environ.get(k) for k in added}
        os.environ.update(added)
        try:
            return original(*args, **kwargs)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    init.__perfrun__ = True  # type: ignore[attr-defined]
    ray.init = init


def watch_os_exit(before: Callable[[Any], None]) -> None:
    """Call `before(status)` when the script calls os._exit(status), then
    os._exit itself with the same arguments. Whatever `before` does or
    raises (a KeyboardInterrupt included), the process ends as the script
    asked, with its status: os._exit never returns."""
    original = os._exit
    if getattr(original, "__perfrun__", False):
        return

    def _exit(*args: Any, **kwargs: Any) -> Any:
        try:
            before(args[0] if args else kwargs.get("status"))
        except BaseException:  # noqa: BLE001 - the script's exit comes first
            pass
        return original(*args, **kwargs)

    _exit.__perfrun__ = True  # type: ignore[attr-defined]
    _exit.__wrapped__ = original  # type: ignore[attr-defined]
    _exit.__name__ = original.__name__
    _exit.__qualname__ = original.__qualname__
    _exit.__doc__ = original.__doc__
    os._exit = _exit  # type: ignore[assignment]


def boot(payload: dict[str, Any]) -> Boot:
    b = Boot(payload)
    b.start()
    return b
