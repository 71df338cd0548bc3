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
    `exit` is told by which signal. A KeyboardInterrupt the script raised
    itself (`raise KeyboardInterrupt`, no signal) ends Python the same way,
    but nothing killed the rank: it raised, as for any other exception,
    which keeps "finished", the status the report reads `exit.exception`
    under ("raised X")."""
    if isinstance(last, KeyboardInterrupt) and not raised_by_script(last):
        if exit.get("signal") is None:
            exit["signal"] = int(signal.SIGINT)
        return "signalled"
    return "finished"


def raised_by_script(exc: BaseException) -> bool:
    """Whether `exc` came from a `raise` statement of the script's rather
    than from a signal. Python's SIGINT handler raises KeyboardInterrupt
    from C, wherever the interpreter next checks for signals (a call, a
    loop's jump back, a blocking call it interrupts), never at a `raise`;
    so the innermost frame of its traceback stands at a RAISE_VARARGS
    instruction only when Python code raised it, unless that code is the
    script's own SIGINT handler, called with the signal's number and a
    frame (the signal's, then). An exception raised
    while handling a signal's KeyboardInterrupt (`raise KeyboardInterrupt
    from exc` in an `except`) is the signal's too. Without a traceback
    it cannot be told: not the script's."""
    import opcode

    raise_op = opcode.opmap.get("RAISE_VARARGS")
    seen = 0
    while exc is not None and seen < 8:
        seen += 1
        tb = exc.__traceback__
        if tb is None:
            return False
        while tb.tb_next is not None:
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        lasti = tb.tb_lasti
        if not (0 <= lasti < len(code.co_code) and code.co_code[lasti] == raise_op):
            return False
        if _signal_handler_frame(tb.tb_frame):
            return False
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        if not isinstance(exc, KeyboardInterrupt):
            return True
    return True


def _signal_handler_frame(frame: Any) -> bool:
    """Whether `frame` is a call of a signal handler with SIGINT: a function
    (or method) whose last two arguments are the signal's number and the
    frame it interrupted."""
    code = frame.f_code
    if code.co_argcount not in (2, 3):
        return False
    try:
        names = code.co_varnames[code.co_argcount - 2:code.co_argcount]
        first, second = (frame.f_locals.get(name) for name in names)
    except Exception:
        return False
    return (type(first) is int and first == signal.SIGINT
            and (second is None or type(second).__name__ == "frame"))


def say_unsaved(exc: BaseException, lost: int = 0, ran: int = 0) -> None:
    """The one line a rank prints when its save at exit fails: never a
    traceback, and never an exception out of the exit path that would
    change how the script ends. `lost` of the `ran` steps the rank ran are
    not in its step file: said, since no file of the run can say it now."""
    try:
        tail = (f" ({lost:,} of the {ran:,} steps that ran are not saved)"
                if lost > 0 and ran >= lost else "")
        sys.stderr.write(f"perfrun: could not save results: {exc}{tail}\n")
    except Exception:
        pass
