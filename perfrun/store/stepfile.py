"""A rank's step records: their columns, and the step file they are
appended to during the run.

`rank<R>.json` (rankfile.py) holds what a rank knows of itself, rewritten
whole at each flush; it stays a few kilobytes however long the run. The
steps go beside it, in `rank<R>.steps`, appended in chunks: a flush costs
what is new since the last one, never the run's length, and the rank keeps in
memory only the steps it has not yet written.

Layout, chosen so that a kill at any moment leaves a readable file and a
reader needs no parser for the bulk of it:

* one header line of JSON (``{"format": "perfrun-steps", "version": 1,
  "columns": [...], "dtype": "<f8"}``), padded with spaces so that the rows
  after it start on an 8-byte boundary, ending in a newline;
* then the rows, each `len(columns)` float64 values in the byte order the
  header names, null written as NaN (no value perfrun records is ever NaN).

A row cut short by a kill in the middle of a write is dropped by the reader;
every whole row before it is kept. What the rows may hold is checked on
reading (`damage`): a rank writes finite times in time order, durations
that fit in the run and whole counts, so a row that holds anything else
was not written by a rank, and the file is refused rather than averaged.

Binary rather than JSON lines: 1,000,000 steps of 17 columns are 136 MB
read in one call (numpy.fromfile, or a memory map that costs no memory of
its own), where parsing the same as JSON takes seconds; float64 rather
than float32 keeps times exact as recorded (a float32 loses microseconds
on a phase minutes long).

Version history: 1, the only one.

The writer side is imported inside the training process and uses only the
standard library; readers use numpy, on the launcher's side only, imported
inside the reading functions so the rank never pays for it.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Sequence
from typing import Any, Optional

from ..errors import PerfrunError
from .files import DAMAGED, MISSING

# Step columns, in row order. Phase times are exclusive (a phase nested in
# another is subtracted from its parent); `excluded` is time inside the step's
# span that is not part of the step (evaluation passes, DataLoader iterator
# creation and exhaustion), so step time = end - start - excluded. The same
# columns name the rows of a rank file of format 1 (rankfile.py).
STEP_COLUMNS = (
    "start",
    "end",
    "dataloader",
    "forward",
    "backward",
    "optimization",
    "excluded",
    "dataloader_calls",
    "forward_calls",
    "backward_calls",
    "optimization_calls",
    "samples",
    "gpu_dataloader",
    "gpu_forward",
    "gpu_backward",
    "gpu_optimization",
    "gpu_step",
)
COL = {name: i for i, name in enumerate(STEP_COLUMNS)}
PHASES = ("dataloader", "forward", "backward", "optimization")
GPU_COLUMNS = tuple("gpu_" + p for p in PHASES) + ("gpu_step",)
#: Columns every step has: the step's span is computed from them.
REQUIRED_COLUMNS = ("start", "end")

#: Columns holding how long something took in a step, in seconds.
DURATION_COLUMNS = PHASES + ("excluded",) + GPU_COLUMNS
#: Columns holding how many times something happened in a step.
COUNT_COLUMNS = tuple(c for c in STEP_COLUMNS if c.endswith("_calls")) + ("samples",)

FORMAT = "perfrun-steps"
VERSION = 1
#: The longest header a reader accepts: a file that has no newline this
#: early is no step file.
MAX_HEADER = 65536
_NAN = math.nan


class StepFileError(PerfrunError):
    """A step file cannot be read; the message is one line for the user,
    `kind` why (files.MISSING or files.DAMAGED)."""

    slug = "step-file"

    def __init__(self, message: str, kind: str = DAMAGED) -> None:
        super().__init__(message)
        self.kind = kind


def header(columns: Sequence[str]) -> bytes:
    """The header line for `columns`, padded to a multiple of 8 bytes."""
    dtype = ("<" if sys.byteorder == "little" else ">") + "f8"
    text = json.dumps(
        {"format": FORMAT, "version": VERSION, "columns": list(columns), "dtype": dtype},
        separators=(",", ":"),
    )
    pad = (-(len(text) + 1)) % 8
    return (text + " " * pad + "\n").encode("ascii")


def encode(rows: Sequence[Sequence[Any]], width: int) -> bytes:
    """Rows as packed float64, None as NaN. A row of another width would
    shift every row after it, so it is refused (struct.error) rather than
    written. Rows of numbers only (the tracker's: NaN, never None) are packed
    as they are, about half a microsecond a row."""
    row = _row_struct(width)
    try:
        return b"".join([row.pack(*r) for r in rows])
    except struct.error:
        for r in rows:
            if len(r) != width:
                raise ValueError(f"a step row of {len(r)} values, not {width}") from None
        return b"".join([row.pack(*[_NAN if v is None else v for v in r]) for r in rows])


_STRUCTS: dict[int, struct.Struct] = {}


def _row_struct(width: int) -> struct.Struct:
    found = _STRUCTS.get(width)
    if found is None:
        found = _STRUCTS[width] = struct.Struct(("<" if sys.byteorder == "little" else ">")
                                                + "d" * width)
    return found


#: Rows packed and written at a time. The writer runs in the rank's flush
#: thread and holds the GIL while it packs; each write gives it back, so
#: the script's thread never waits for more than one block's packing
#: (a fraction of a millisecond) however many steps a save carries.
BLOCK = 512


class StepWriter:
    """Appends rows to one step file. Not thread-safe: the agent calls it
    under its write lock."""

    def __init__(self, path: str, columns: Sequence[str]) -> None:
        self.path = path
        self.width = len(columns)
        self.written = 0
        self.bytes = 0
        # O_APPEND: each chunk lands at the end even if a reader or an
        # earlier process touched the file; not inherited across exec.
        self._fd: Optional[int] = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666
        )
        self._write(header(columns))

    def _write(self, data: Any) -> None:
        fd = self._fd
        if fd is None:
            raise ValueError(f"{self.path} is closed")
        view = memoryview(data)
        try:
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except OSError:
            # A full disk takes what fits and then refuses: a part of a row
            # left at the end would shift every row appended once there is
            # room again. Taken back (shrinking needs no space), the file
            # ends on a whole row, as the rows `written` counts.
            try:
                os.ftruncate(fd, self.bytes)
            except OSError:
                pass
            raise
        self.bytes += len(data)

    def append(self, rows: Sequence[Sequence[Any]]) -> None:
        for lo in range(0, len(rows), BLOCK):
            block = rows[lo:lo + BLOCK]
            self._write(encode(block, self.width))
            self.written += len(block)

    def append_held(self, rows: Any, n: int) -> None:
        """The first `n` rows of `rows`, the tracker's packed array (this
        machine's byte order), copied and written a block at a time: each
        copy holds the GIL for tens of microseconds and each write gives it
        back, where one copy of a fast loop's 2 s of rows (megabytes) held
        it for milliseconds and stalled the script's step. `written` counts
        the blocks as they land, so after a failed write it says how many
        rows made it."""
        width = self.width
        if len(rows) < n * width:
            raise ValueError(f"{len(rows)} values are not {n} rows of {width}")
        for lo in range(0, n, BLOCK):
            hi = min(n, lo + BLOCK)
            self._write(rows[lo * width:hi * width].tobytes())
            self.written += hi - lo

    def sync(self) -> None:
        """Make what was written survive the machine (the final save)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


# -- reading (launcher side) -----------------------------------------------------


def read_header(path: str) -> tuple[dict[str, Any], int]:
    """The header of a step file and the offset of its first row."""
    try:
        with open(path, "rb") as f:
            head = f.read(MAX_HEADER)
    except FileNotFoundError:
        raise StepFileError(f"cannot read {path}: no such file (the step file of a rank "
                            "file; copy both)", MISSING) from None
    except OSError as exc:
        raise StepFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    end = head.find(b"\n")
    if end < 0:
        raise StepFileError(f"{path} is not a perfrun step file (no header)")
    try:
        meta = json.loads(head[:end].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise StepFileError(f"{path} is not a perfrun step file (bad header)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise StepFileError(f"{path} is not a perfrun step file")
    version = meta.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StepFileError(f"{path} has no step file version")
    if version > VERSION:
        raise StepFileError(
            f"{path} has step file version {version}; this perfrun reads up to version "
            f"{VERSION}: upgrade perfrun"
        )
    columns = meta.get("columns")
    if (not isinstance(columns, list) or not columns
            or not all(isinstance(c, str) for c in columns)):
        raise StepFileError(f"{path} has no column names in its header")
    if meta.get("dtype") not in ("<f8", ">f8"):
        raise StepFileError(f"{path} has values of type {meta.get('dtype')!r}, not float64")
    if (end + 1) % 8:
        raise StepFileError(f"{path} has a damaged header (rows not aligned)")
    return meta, end + 1


def read(path: str, mapped: bool = False) -> tuple[list[str], Any]:
    """The column names and the rows of a step file, as a (rows, columns)
    float64 array. A partial last row (a write cut short) is left out.

    `mapped`: a read-only memory map of the file, which costs no memory of
    its own (for a pass over the file in blocks); else the rows are read
    into memory in one call, several times faster to compute on than the
    page faults of a map touched everywhere."""
    import numpy as np

    meta, offset = read_header(path)
    columns = list(meta["columns"])
    width = len(columns)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise StepFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    n = max(0, size - offset) // (8 * width)
    dtype = np.dtype(meta["dtype"])
    if n == 0:
        return columns, np.empty((0, width), dtype=np.float64)
    try:
        data: np.ndarray[Any, Any]
        if mapped:
            data = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(n, width))
        else:
            data = np.fromfile(path, dtype=dtype, count=n * width, offset=offset)
            data = data.reshape(n, width)
    except (OSError, ValueError) as exc:
        raise StepFileError(f"cannot read {path}: {exc}") from None
    if dtype != np.float64:  # the other byte order: convert (a copy)
        return columns, np.asarray(data, dtype=np.float64)
    return columns, data


#: Rows read at a time by `blocks`: 16,384 rows of 17 columns are 2.2 MB,
#: which stay in the processor's cache while every quantity is computed on
#: them (a column of a whole million-step table is a strided read across
#: 136 MB, once per quantity).
READ_ROWS = 16384


def blocks(path: str, stop: Optional[int] = None, rows: int = READ_ROWS) -> Any:
    """The steps of a step file in STEP_COLUMNS order (as read_table), `rows`
    at a time: an iterator of (index of the block's first step, array of
    (rows, STEP_COLUMNS)), up to step `stop`. The file is read once, into
    one buffer used again for every block, so a pass over a step file of
    any length holds one block: an array given is valid until the next is
    asked for (copy what is kept). Raises StepFileError."""
    import numpy as np

    meta, offset = read_header(path)
    columns = list(meta["columns"])
    width = len(columns)
    dtype = np.dtype(meta["dtype"])
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise StepFileError(f"{path} has no {missing[0]!r} column")
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise StepFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    n = max(0, size - offset) // (8 * width)
    stop = n if stop is None else min(stop, n)
    rows = max(1, min(rows, stop))
    raw = np.empty((rows, width), dtype=dtype)
    same = columns == list(STEP_COLUMNS)
    out = None
    if not same:
        # Columns the file lacks stay NaN: they are never written below.
        out = np.full((rows, len(STEP_COLUMNS)), np.nan)
        pairs = [(j, columns.index(c)) for j, c in enumerate(STEP_COLUMNS) if c in columns]
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            lo = 0
            while lo < stop:
                k = min(rows, stop - lo)
                view = memoryview(raw[:k]).cast("B")  # type: ignore[arg-type]
                got = 0
                while got < len(view):
                    part = f.readinto(view[got:])
                    if not part:
                        raise StepFileError(f"cannot read {path}: it was cut short while "
                                            "being read")
                    got += part
                block = raw[:k]
                if out is not None:
                    for j, i in pairs:
                        out[:k, j] = block[:, i]
                    block = out[:k]
                elif dtype != np.float64:  # the other byte order: convert
                    block = block.astype(np.float64)
                yield lo, block
                lo += k
    except OSError as exc:
        raise StepFileError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_table(step_path: str, mapped: bool = False) -> Any:
    """A step file's steps in STEP_COLUMNS order (`read` maps the file;
    columns it lacks are NaN, columns it has beyond them are left out).
    Raises StepFileError."""
    import numpy as np

    columns, table = read(step_path, mapped)
    if columns == list(STEP_COLUMNS):
        return table
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise StepFileError(f"{step_path} has no {missing[0]!r} column")
    index = {c: i for i, c in enumerate(columns)}
    out = np.full((table.shape[0], len(STEP_COLUMNS)), np.nan)
    for j, c in enumerate(STEP_COLUMNS):
        if c in index:
            out[:, j] = table[:, index[c]]
    return out


# -- what a rank can have written --------------------------------------------------------

#: How far below zero a duration may read: phase times are exclusive, one
#: clock difference less another, which can leave a rounding error.
NEGATIVE_SLACK = 1e-6
#: How much longer than the rank had been running a duration of a step may
#: read: GPU work can finish after the step that queued it ended on the
#: CPU, by the depth of the GPU's queue (seconds at most, never a minute).
DURATION_SLACK = 60.0
#: The largest count a float64 holds exactly.
MAX_COUNT = float(2**53)


def damage(table: Any, first: int = 0, previous_end: Optional[float] = None,
           limit: Optional[float] = None) -> Optional[str]:
    """Why the first row of `table` (steps in STEP_COLUMNS order, the first
    being step `first`) that no rank could have written is not one, or
    None when every row could be.

    A rank writes times in seconds since it started: finite, not negative,
    each step ending after it starts and starting where the one before it
    ended or later (`previous_end`, the end of step `first - 1`); durations
    no longer than the time since the rank started (plus DURATION_SLACK);
    counts that are whole numbers. `limit`: the rank's own time at a save
    that came after every one of these steps (its final save), which no
    step can end after. NaN is a value not recorded, allowed except in the
    times every step has. Bulk operations only: a block of 65,536 steps
    costs a few milliseconds."""
    import numpy as np

    n = int(table.shape[0])
    if not n or not _suspect(table, previous_end, limit):
        return None
    found: list[tuple[int, str]] = []

    def first_bad(mask: Any, why: Any) -> None:
        bad = np.flatnonzero(mask)
        if bad.size:
            i = int(bad[0])
            found.append((i, why(i)))

    with np.errstate(all="ignore"):
        start = table[:, COL["start"]]
        end = table[:, COL["end"]]
        for name, values in (("start", start), ("end", end)):
            first_bad(np.isnan(values), lambda i, name=name: f"has no {name!r} time")
            first_bad(~np.isfinite(values) | (values < 0),
                      lambda i, name=name, v=values: f"has {name} = {_shown(v[i])} s")
        first_bad(end < start, lambda i: f"ends ({_shown(end[i])} s) before it starts "
                                         f"({_shown(start[i])} s)")
        before = end[:-1]
        if previous_end is not None:
            before = np.concatenate(([previous_end], before))
            later = start < before
        else:
            later = np.concatenate(([False], start[1:] < before))
        first_bad(later, lambda i: f"starts ({_shown(start[i])} s) before the step before "
                                   "it ended: the steps are out of time order")
        if limit is not None:
            first_bad(end > limit, lambda i: f"ends at {_shown(end[i])} s, after the rank's "
                                             f"last save ({_shown(limit)} s)")
        horizon = end + DURATION_SLACK
        for name in DURATION_COLUMNS:
            values = table[:, COL[name]]
            first_bad(np.isinf(values) | (values < -NEGATIVE_SLACK) | (values > horizon),
                      lambda i, name=name, v=values: f"has {name} = {_shown(v[i])} s")
        for name in COUNT_COLUMNS:
            values = table[:, COL[name]]
            first_bad(np.isinf(values) | (values < 0) | (values > MAX_COUNT)
                      | (values != np.floor(values)) & ~np.isnan(values),
                      lambda i, name=name, v=values: f"has {name} = {_shown(v[i])}")
    if not found:
        return None
    i, why = min(found, key=lambda f: f[0])
    return f"step {first + i} {why}"


_DURATIONS = [COL[c] for c in DURATION_COLUMNS]
_COUNTS = [COL[c] for c in COUNT_COLUMNS]


def _suspect(table: Any, previous_end: Optional[float], limit: Optional[float]) -> bool:
    """Whether any row of `table` may break a rule `damage` checks: the
    same rules over whole blocks of columns at once, with no search for
    where. A file a rank wrote passes this in a few operations per block
    of steps; only one that fails it is searched for its first bad row,
    column by column, for the message."""
    import numpy as np

    with np.errstate(all="ignore"):
        start = table[:, COL["start"]]
        end = table[:, COL["end"]]
        if not (np.isfinite(start).all() and np.isfinite(end).all()):
            return True
        if (start < 0).any() or (end < start).any() or (start[1:] < end[:-1]).any():
            return True
        if previous_end is not None and start[0] < previous_end:
            return True
        if limit is not None and (end > limit).any():
            return True
        values = table[:, _DURATIONS]
        horizon = (end + DURATION_SLACK)[:, None]
        if (np.isinf(values) | (values < -NEGATIVE_SLACK) | (values > horizon)).any():
            return True
        values = table[:, _COUNTS]
        whole = (values == np.floor(values)) | np.isnan(values)
        return bool((np.isinf(values) | (values < 0) | (values > MAX_COUNT) | ~whole).any())


def _shown(value: Any) -> str:
    return f"{float(value):.6g}"
