"""How a rank's life is tied to perfrun's: the few helpers and names the
launcher and the rank share.

perfrun and its run live and die together. The launcher asks the kernel to
kill its child when it dies (`parent_death_signal`, armed between fork and
exec); a torchrun worker, or a rank under nsys, has another parent and ties
itself to its owner at boot (`die_with`). The launcher asks a hung rank for
its Python stacks with STACK_SIGNAL, on which the rank registered
faulthandler.

Standard library only, and nothing here runs at import: the launcher, the
torchrun wrapper, nsys's rank selector and the boot all import it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable, Optional

#: Linux's prctl option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: The variable perfrun's torchrun agent leaves its pid in for its workers.
AGENT_PID_VAR = "PERFRUN_AGENT_PID"
#: The signal on which a rank dumps its Python stacks (runtime/agent.py),
#: sent by the launcher's hang report (launcher/hang.py).
STACK_SIGNAL = getattr(signal, "SIGUSR2", signal.SIGTERM)


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


def say_unsaved(exc: BaseException) -> None:
    """The one line a rank prints when its save at exit fails: never a
    traceback, and never an exception out of the exit path that would
    change how the script ends."""
    try:
        sys.stderr.write(f"perfrun: could not save results: {exc}\n")
    except Exception:
        pass
