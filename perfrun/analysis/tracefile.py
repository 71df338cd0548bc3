"""Reading torch.profiler traces (Chrome trace JSON, gzipped or not) into the
compact events the window tables are computed from.

A trace of a few training steps on a GPU is tens of megabytes of JSON; as
Python dicts it takes five times that. The tables need eight fields and a
handful of arguments per event, so events are made compact while the JSON
is parsed (json's `object_hook` sees each object as it is finished): every
argument the tables never read is dropped before the next event is parsed,
and a kernel's long name is stored once however often it ran. The cyclic
garbage collector is paused while parsing: the parser makes only acyclic
objects, and without the pause the collector's passes over the growing heap
take most of the load time.

The window's own analysis (runtime/window.py) has the trace as dicts
already: `compact()` makes the same events from them, so `perfrun analyze`
and the window tables are one computation.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterable
from typing import Any, Optional

from ..errors import PerfrunError

# Arguments kept beyond the ids and device: an op's flops, a memory event's
# sizes and device. Everything else (shapes, grid, occupancy, call stacks)
# is dropped at parse time.
EXTRA_ARGS = ("flops", "Bytes", "Total Allocated", "Total Reserved", "Device Type", "Device Id")

# Flow arrows (op -> kernel, forward -> backward): the tables link events by
# their ids instead, so these are not kept.
_UNUSED_PHASES = frozenset(("s", "f", "t"))


class TraceError(PerfrunError):
    """A trace file that cannot be read (missing, not JSON, not a trace)."""

    slug = "trace"


class Event:
    """One trace event, with only what the tables use. `dur` is None for
    events that are not complete ("X") spans; `ext` and `corr` are the
    External id and correlation id (None where absent); `device` the GPU
    index of a GPU event; `args` the few other arguments kept (EXTRA_ARGS)."""

    __slots__ = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "ext", "corr", "device", "args")

    def __init__(
        self,
        ph: Any,
        cat: Any,
        name: str,
        ts: float,
        dur: Optional[float],
        pid: Any,
        tid: Any,
        ext: Any = None,
        corr: Any = None,
        device: Any = None,
        args: Optional[dict[str, Any]] = None,
    ) -> None:
        self.ph = ph
        self.cat = cat
        self.name = name
        self.ts = ts
        self.dur = dur
        self.pid = pid
        self.tid = tid
        self.ext = ext
        self.corr = corr
        self.device = device
        self.args = args if args is not None else _NO_ARGS

    @property
    def end(self) -> float:
        return self.ts + (self.dur or 0.0)

    def __repr__(self) -> str:
        return f"Event({self.cat}:{self.name!r} @{self.ts}+{self.dur})"


_NO_ARGS: dict[str, Any] = {}
_NUMBERS = (float, int)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    return None


class _Compactor:
    """Turns event dicts into Events, sharing repeated name strings."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.skipped = 0

    def event(self, o: dict[str, Any]) -> Any:
        """The Event of an event dict; None for one not kept; any other
        object (as json's object_hook sees them all) is returned as it is."""
        ph = o.get("ph")
        if ph is None:
            return o
        if ph in _UNUSED_PHASES:
            return None
        ts = o.get("ts")
        if ts.__class__ not in _NUMBERS and _number(ts) is None:
            if ph != "M":
                self.skipped += 1
            return None
        dur = o.get("dur") if ph == "X" else None
        if ph == "X" and (dur.__class__ not in _NUMBERS and _number(dur) is None or dur < 0):
            self.skipped += 1
            return None
        name = o.get("name")
        if name.__class__ is not str:
            name = str(name or "")
        name = self.names.setdefault(name, name)
        args = o.get("args")
        if args.__class__ is not dict:
            return Event(ph, o.get("cat"), name, ts, dur, o.get("pid"), o.get("tid"))
        extra = None
        if ph == "i" or "flops" in args:  # the only events with extras
            extra = {key: args[key] for key in EXTRA_ARGS if key in args}
        return Event(
            ph, o.get("cat"), name, ts, dur, o.get("pid"), o.get("tid"),
            args.get("External id"), args.get("correlation"), args.get("device"), extra,
        )


def compact(events: Iterable[Any]) -> list[Event]:
    """Events from a trace's event dicts (already-compact Events pass)."""
    c = _Compactor()
    out = []
    for e in events:
        if isinstance(e, Event):
            out.append(e)
        elif isinstance(e, dict) and "ph" in e:
            x = c.event(e)
            if x is not None:
                out.append(x)
    return out


class Trace:
    """A loaded trace: its events, its top-level metadata (without the
    event list), and how many malformed events were skipped."""

    def __init__(self, path: str, events: list[Event], meta: dict[str, Any], skipped: int):
        self.path = path
        self.events = events
        self.meta = meta
        self.skipped = skipped

    @property
    def rank(self) -> Optional[int]:
        info = self.meta.get("distributedInfo")
        if isinstance(info, dict) and isinstance(info.get("rank"), int):
            return int(info["rank"])
        return None


def load_trace(path: str) -> Trace:
    """Read a torch.profiler trace (`.json` or `.json.gz`). Raises TraceError
    with a one-line reason for anything that is not a readable trace."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise TraceError(f"cannot read {path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"cannot read {path}: it is a folder, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            import gzip  # only for a gzipped trace: `perfrun` loads this module at start

            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise TraceError(f"cannot read {path}: damaged gzip data ({exc})") from None
    c = _Compactor()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"cannot read {path}: not UTF-8 text") from None
    del raw  # the text and the parsed events are all that is held at once
    enabled = gc.isenabled()
    gc.disable()
    try:
        doc = json.loads(text, object_hook=c.event)
    except ValueError as exc:
        raise TraceError(f"cannot read {path}: not JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"cannot read {path}: nested too deeply to be a trace") from None
    finally:
        del text
        if enabled:
            gc.enable()
    if isinstance(doc, dict):
        events = doc.pop("traceEvents", None)
        meta = doc
    else:
        events, meta = doc, {}
    if not isinstance(events, list):
        raise TraceError(
            f"cannot read {path}: not a torch.profiler trace (no traceEvents list)"
        )
    kept = [e for e in events if isinstance(e, Event)]
    if not any(e.dur is not None for e in kept):
        # Every table is made of spans: without one they would print zeros
        # as if something ran in no time.
        what = "no events" if not events else "no timed events (no complete \"X\" spans)"
        raise TraceError(f"cannot read {path}: the trace holds {what}: the profiler recorded "
                         "nothing (a trace exported before its first step, or cut short)")
    return Trace(os.fspath(path), kept, meta, c.skipped + sum(1 for e in events if e is not None
                                                               and not isinstance(e, Event)))
