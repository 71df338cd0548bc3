"""Named ranges in torch.profiler's trace: perfrun's steps, phases and
modules during the detailed window.

`torch._C._profiler._RecordFunctionFast` opens and closes a range for about
1 us under an active profiler, where the dispatcher ops behind
`torch.profiler.record_function` cost about 40 us a pair on the same CPU.
That cost falls inside the ranges it draws, so with the ops every phase range
in the trace was tens of microseconds longer than the phase perfrun timed,
and every window step slower. The fast ranges are recorded with the
category `cpu_op`; `as_annotations` gives perfrun's own back the category
of a user annotation once the trace is exported, so the tables never count
them as operators. Torch builds without the fast class use the ops.
"""

from __future__ import annotations

from typing import Any, Callable

# Every range perfrun draws starts with one of these.
PREFIXES = ("perfrun: ", "perfrun.module: ", "perfrun.recompute: ")


def range_api(torch: Any) -> tuple[Callable[[str], Any], Callable[[Any], None]]:
    """(enter(name) -> handle, exit(handle)): ranges must close in the
    reverse order they opened, on the thread that opened them."""
    fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    if fast is not None:

        def enter(name: str) -> Any:
            handle = fast(name)
            handle.__enter__()
            return handle

        def leave(handle: Any) -> None:
            handle.__exit__(None, None, None)

        return enter, leave
    op_enter = torch.ops.profiler._record_function_enter_new
    op_exit = torch.ops.profiler._record_function_exit
    return (lambda name: op_enter(name, None)), op_exit


def as_annotations(events: list[dict[str, Any]]) -> int:
    """Mark perfrun's ranges in an exported trace as user annotations (what
    `record_function` ranges are). Returns how many were changed."""
    changed = 0
    for e in events:
        if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith(PREFIXES):
            e["cat"] = "user_annotation"
            args = e.get("args")
            if isinstance(args, dict):
                args.pop("External id", None)
            changed += 1
    return changed
