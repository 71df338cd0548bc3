"""The per-rank results format: written atomically, read, validated, merged.

One JSON document per rank (`rank<R>.json`, `rank<R>.restart<K>.json` after an
elastic restart). Step records are stored as rows under named columns so that
later commands (`report`, `compare`) can recompute every number from raw
per-step timings. Times are seconds on the rank's monotonic clock, relative to
the moment perfrun started inside that rank.

Readers refuse versions they do not know: a newer file read by an older
perfrun must fail loudly, never be half-understood.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any, Optional

from .schema import (
    COL,
    FORMAT,
    GPU_COLUMNS,
    PHASES,
    RANK_FILE,
    RUN_META,
    STEP_COLUMNS,
    VERSION,
    SchemaError,
    check,
    rank_filename,
    shown,
    type_name,
)

__all__ = [
    "COL", "FORMAT", "GPU_COLUMNS", "PHASES", "STEP_COLUMNS", "VERSION", "rank_filename",
    "ResultsError", "RankResult", "RunResults", "atomic_write_text", "read_rank_file",
    "read_run", "resolve_run_dir", "find_rank_files", "validate", "rank_alive", "is_run_dir",
    "pid_alive",
]

_RANK_FILE = re.compile(r"^rank(\d+)(?:\.restart(\d+))?\.json$")


class ResultsError(Exception):
    """Results cannot be read; the message is one line for the user."""


_COUNTER = 0


def atomic_write_text(path: str, text: str, *, durable: bool = False) -> None:
    """Write via a temporary file and `os.replace`, so a reader (or a crash)
    never sees half a file. `durable` adds an fsync, kept for the final write:
    periodic flushes only need to survive the process, not the machine."""
    directory = os.path.dirname(os.path.abspath(path))
    global _COUNTER
    _COUNTER += 1
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{_COUNTER}-{os.path.basename(path)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class RankResult:
    """One rank's results as read back from disk.

    The steps are held as a (steps, STEP_COLUMNS) float64 array, `table`,
    with NaN for a value not recorded: for a rank in format 2 it is mapped
    from its step file, so reading a rank costs no memory until its steps
    are used. `rows` gives the same steps as lists (None for missing), made
    when first asked for: the analysis works on `table`; `rows` is for
    callers that want a few steps in hand, or hand-built results.
    """

    __slots__ = ("path", "data", "steps_file", "_rows", "_table", "_n")

    def __init__(
        self,
        path: str,
        data: dict[str, Any],
        rows: Optional[list[list[Any]]] = None,
        table: Any = None,
        steps_file: Optional[str] = None,
        n_steps: Optional[int] = None,
    ) -> None:
        self.path = path
        self.data = data
        #: The step file the steps are read from, when they are not held.
        self.steps_file = steps_file
        held = table is not None or steps_file is not None
        self._rows = None if rows is None and held else list(rows or [])
        self._table = table
        self._n = n_steps

    @property
    def table(self) -> Any:
        """The steps as an array. From a step file it is mapped again at
        each use and never kept: a report over many long ranks then holds
        only the rank it is working on."""
        if self._table is not None:
            return self._table
        if self.steps_file is not None and self._rows is None:
            table = load_step_table(self.steps_file)
            return table[: self._n] if self._n is not None else table
        from .analysis.columns import as_table

        self._table = as_table(self._rows or [])
        return self._table

    def take(self, index: Any) -> Any:
        """The steps at `index` (step indices below n_steps) as an array of
        their own; from a step file, mapped, so only those steps are read."""
        import numpy as np

        if self._table is None and self.steps_file is not None and self._rows is None:
            return np.array(load_step_table(self.steps_file, mapped=True)[index])
        return np.asarray(self.table)[index]

    @property
    def rows(self) -> list[list[Any]]:
        if self._rows is None:
            self._rows = table_rows(self.table)
        return self._rows

    @property
    def n_steps(self) -> int:
        if self._rows is not None:
            return len(self._rows)
        if self._n is not None:
            return self._n
        return int(self.table.shape[0])

    @property
    def rank(self) -> int:
        return int(self.data.get("rank", 0))

    @property
    def restart(self) -> int:
        return int(self.data.get("restart", 0))

    @property
    def status(self) -> str:
        return str(self.data.get("status", "unknown"))

    def column(self, name: str) -> list[Any]:
        i = COL[name]
        return [row[i] for row in self.rows]

    def inline(self) -> dict[str, Any]:
        """The rank document with its steps inside it (format 1's layout,
        which every reader takes): for a file that must stand alone, such
        as a baseline."""
        doc = dict(self.data)
        doc["steps"] = {"columns": list(STEP_COLUMNS), "rows": self.rows}
        return doc


def table_rows(table: Any) -> list[list[Any]]:
    import numpy as np

    values = table.tolist()
    missing = np.isnan(table)
    if missing.any():
        for i, j in zip(*np.nonzero(missing)):
            values[i][j] = None
    # Counts were written as floats: give them back as the integers they are.
    for j in _INT_COLUMNS:
        for row in values:
            v = row[j]
            if v is not None and v == v and float(v).is_integer():
                row[j] = int(v)
    return values


_INT_COLUMNS = tuple(COL[c] for c in STEP_COLUMNS if c.endswith("_calls") or c == "samples")


def load_json(path: str, missing: str = "cannot read {path}: no such file") -> Any:
    """A JSON file's content, or a one-line ResultsError (results files and
    baselines are read the same way). Every way a file can fail to be JSON
    ends here, so no reader has to know them."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ResultsError(missing.format(path=path)) from None
    except IsADirectoryError:
        raise ResultsError(f"cannot read {path}: it is a folder") from None
    except OSError as exc:
        raise ResultsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(
            f"cannot read {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
            f"at offset {exc.start}); perfrun writes its results as UTF-8 JSON"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(
            f"{path} is not valid JSON (truncated or corrupt at line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None
    except RecursionError:
        raise ResultsError(f"cannot read {path}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        raise ResultsError(f"cannot read {path}: {shown(str(exc))}") from None


def read_rank_file(path: str) -> RankResult:
    return validate(load_json(path), path)


def _step_file(data: dict[str, Any], path: str, where: str) -> tuple[str, int]:
    """The step file a format-2 rank names (beside the rank file), checked
    once, a block of steps at a time so that checking a long rank holds
    no more than a block: its path and how many whole steps it holds."""
    import numpy as np

    from .stepfile import StepFileError

    name = data["steps"]["file"]
    if not isinstance(name, str) or not name or os.path.basename(name) != name:
        raise SchemaError(f"{where}steps.file", "a file name beside the rank file", shown(name))
    step_path = os.path.join(os.path.dirname(os.path.abspath(path)), name)
    try:
        table = load_step_table(step_path, mapped=True)
    except StepFileError as exc:
        raise ResultsError(str(exc)) from None
    n = int(table.shape[0])
    block = 1 << 16
    for lo in range(0, n, block):
        part = table[lo:lo + block]
        for column in _REQUIRED_COLUMNS:
            bad = np.flatnonzero(np.isnan(part[:, COL[column]]))
            if bad.size:
                raise ResultsError(
                    f"cannot read {step_path}: step {lo + int(bad[0])} has no {column!r} time"
                )
    return step_path, n


def load_step_table(step_path: str, mapped: bool = False) -> Any:
    """A step file's steps in STEP_COLUMNS order (stepfile.read maps the
    file; columns it lacks are NaN, columns it has beyond them are left
    out). Raises stepfile.StepFileError."""
    import numpy as np

    from .stepfile import StepFileError, read

    columns, table = read(step_path, mapped)
    if columns == list(STEP_COLUMNS):
        return table
    missing = [c for c in _REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise StepFileError(f"{step_path} has no {missing[0]!r} column")
    index = {c: i for i, c in enumerate(columns)}
    out = np.full((table.shape[0], len(STEP_COLUMNS)), np.nan)
    for j, c in enumerate(STEP_COLUMNS):
        if c in index:
            out[:, j] = table[:, index[c]]
    return out


#: Step values are numbers or null (a phase not measured, no GPU timing).
_ROW_VALUE_TYPES = frozenset((int, float, type(None)))
#: Columns every step has: the step's span is computed from them.
_REQUIRED_COLUMNS = ("start", "end")


def validate(data: Any, path: str, where: str = "") -> RankResult:
    """Check a rank document by type (schema.RANK_FILE) before anything reads
    it, so a damaged file is one line naming the file and the field, never a
    traceback from deep inside a report. `where` prefixes field paths of a
    document held inside another file (`ranks[0]` of a baseline)."""
    label = f"{path} ({where})" if where else path
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultsError(f"{label} is not a perfrun results file")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ResultsError(f"{label} has no format version")
    if version > VERSION:
        raise ResultsError(
            f"{label} has results format version {version}; this perfrun reads up to "
            f"version {VERSION}: upgrade perfrun"
        )
    if version < 1:
        raise ResultsError(f"{label} has unknown results format version {version}")
    try:
        check(data, RANK_FILE, where)
        steps = data.get("steps") or {}
        if isinstance(steps, dict) and "file" in steps:
            step_path, n = _step_file(data, path, f"{where}." if where else "")
            return RankResult(path=path, data=data, steps_file=step_path, n_steps=n)
        rows = _checked_rows(steps, f"{where}.steps" if where else "steps")
    except SchemaError as exc:
        raise ResultsError(f"cannot read {path}: {exc}") from None
    return RankResult(path=path, data=data, rows=rows)


def _checked_rows(steps: dict[str, Any], where: str) -> list[list[Any]]:
    """The step rows in STEP_COLUMNS order, checked in bulk: a long run has
    100,000s of rows, so the common case costs a few passes at C speed and
    only a damaged file pays for finding the exact field."""
    columns = steps.get("columns", list(STEP_COLUMNS))
    rows = steps.get("rows", [])
    width = len(columns)
    if not all(type(row) is list and len(row) == width for row in rows):
        i, row = next(
            (i, r) for i, r in enumerate(rows) if type(r) is not list or len(r) != width
        )
        got = f"{len(row)} values" if type(row) is list else type_name(row)
        raise SchemaError(f"{where}.rows[{i}]", f"a list of {width} values", got)
    if not _ROW_VALUE_TYPES.issuperset(map(type, chain.from_iterable(rows))):
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                if type(value) not in _ROW_VALUE_TYPES:
                    raise SchemaError(
                        f"{where}.rows[{i}][{j}] ({columns[j]})", "a number or null",
                        type_name(value),
                    )
    if columns != list(STEP_COLUMNS):
        # Re-map by name, so a file with reordered or extra columns still reads.
        missing = [c for c in _REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise SchemaError(f"{where}.columns", f"a list naming {missing[0]!r}", "none")
        index = {name: i for i, name in enumerate(columns)}
        rows = [[row[index[c]] if c in index else None for c in STEP_COLUMNS] for row in rows]
    for name in _REQUIRED_COLUMNS:
        j = COL[name]
        if None in map(itemgetter(j), rows):
            i = next(i for i, row in enumerate(rows) if row[j] is None)
            raise SchemaError(f"{where}.rows[{i}] ({name})", "a number", "null")
    return rows


def find_rank_files(run_dir: str) -> list[str]:
    """The rank files of a run folder, ordered by rank then restart."""
    found = []
    for path in glob.glob(os.path.join(run_dir, "rank*.json")):
        m = _RANK_FILE.match(os.path.basename(path))
        if m:
            found.append((int(m.group(1)), int(m.group(2) or 0), path))
    return [p for _, _, p in sorted(found)]


@dataclass
class RunResults:
    """All ranks of one run, merged: for each rank its last restart's file."""

    run_dir: str
    ranks: list[RankResult]
    meta: dict[str, Any] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        sizes = [int(r.data.get("world_size", 1)) for r in self.ranks]
        return max(sizes + [int(self.meta.get("expected_ranks", 0) or 0), 1])


def read_run(run_dir: str) -> RunResults:
    """Read and merge a run folder (the live path and `perfrun report` both
    come through here, so what is printed after a run can be reproduced)."""
    if not os.path.isdir(run_dir):
        raise ResultsError(f"no such results folder: {run_dir}")
    paths = find_rank_files(run_dir)
    meta = read_run_meta(run_dir)
    if not paths and not meta:
        raise ResultsError(f"{run_dir} holds no perfrun results (no rank*.json)")
    by_rank: dict[int, RankResult] = {}
    for path in paths:
        result = read_rank_file(path)
        current = by_rank.get(result.rank)
        if current is None or result.restart >= current.restart:
            by_rank[result.rank] = result
    ranks = [by_rank[r] for r in sorted(by_rank)]
    expected = int(meta.get("expected_ranks") or 0)
    world = max([int(r.data.get("world_size", 1)) for r in ranks] + [expected, 0])
    missing = [r for r in range(world) if r not in by_rank]
    job = meta.get("job") if isinstance(meta.get("job"), dict) else {}
    if str(meta.get("nnodes") or "1") != "1" and not isinstance(job.get("world_size"), int):
        # Several nodes with no job-wide record (a folder from before job
        # folders, or an elastic MIN:MAX job): this folder may hold one
        # node's ranks only, and the others' are not missing, they are in
        # the other nodes' folders. A job folder's run.json counts the
        # job's ranks (expected_ranks), so its missing ranks are the job's.
        missing = []
    return RunResults(run_dir=run_dir, ranks=ranks, meta=meta, missing=missing)


def read_run_meta(run_dir: str) -> dict[str, Any]:
    """run.json, the launcher's record of the run. It only adds to the rank
    files, so one that cannot be parsed at all is left out; one that parses
    but has fields of the wrong type is refused like any other results file,
    since its values would be used."""
    meta_path = os.path.join(run_dir, "run.json")
    if not os.path.exists(meta_path):
        return {}
    try:
        meta = load_json(meta_path)
    except ResultsError:
        return {}
    if not isinstance(meta, dict):
        return {}
    try:
        check(meta, RUN_META)
    except SchemaError as exc:
        raise ResultsError(f"cannot read {meta_path}: {exc}") from None
    return meta


def _say_note(message: str) -> None:
    sys.stderr.write(f"perfrun: note: {message}\n")


def _run_started(run_dir: str) -> float:
    """When a run began: run.json's `started` (written before the script
    starts, so a run still in progress has it), else the folder's mtime."""
    try:
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as f:
            started = json.load(f).get("started")
        if isinstance(started, (int, float)) and not isinstance(started, bool):
            return float(started)
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    try:
        return os.stat(run_dir).st_mtime
    except OSError:
        return 0.0


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path) and (
        bool(find_rank_files(path)) or os.path.exists(os.path.join(path, "run.json"))
    )


def resolve_run_dir(path: str, note: Optional[Callable[[str], None]] = _say_note) -> str:
    """Accept a run folder, a log folder (its newest run), or a `latest` link.

    `latest` is where the launcher points each new run, but a link can go
    stale: its run deleted, or the folder copied without it, or a run
    started by a perfrun that could not make links. In a log folder the
    newest existing run wins, and `note` (one line) says when that is not
    what `latest` points to, so earlier runs are never hidden behind it."""
    if not os.path.isdir(path) or is_run_dir(path):
        return path
    latest = os.path.join(path, "latest")
    target = os.path.realpath(latest) if os.path.lexists(latest) else None
    try:
        names = os.listdir(path)
    except OSError:
        names = []
    # A name starting with "." is a folder being removed (--keep) or
    # assembled (combine): never the newest run.
    runs = [
        os.path.join(path, name) for name in names
        if name != "latest" and not name.startswith(".")
        and is_run_dir(os.path.join(path, name))
    ]
    if not runs:
        return target if target is not None and os.path.isdir(target) else path
    newest = max(runs, key=lambda d: (_run_started(d), os.path.basename(d)))
    if target is not None and is_run_dir(target):
        if _run_started(target) >= _run_started(newest):
            return target
        why = f"{latest} points to an older run ({os.path.basename(target)})"
    elif target is not None:
        why = f"{latest} points to a missing run ({os.path.basename(target)})"
    else:
        why = f"{path} has no latest link"
    if note is not None:
        note(f"{why}; reporting the newest run, {newest}")
    return newest


def rank_alive(rank: RankResult) -> Optional[bool]:
    """Whether the process that wrote `rank` is still running: True or False
    when it ran on this host, None when that cannot be told (another host,
    no pid recorded). A file whose status is "running" was written by a
    live rank's periodic flush; only a dead process makes it a rank that
    died. A pid can be reused after its process ends, so True is a strong
    hint rather than proof: pair it with the file's age when it matters."""
    env = rank.data.get("env")
    if not isinstance(env, dict):
        return None
    pid, host = env.get("pid"), env.get("hostname")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not host:
        return None
    if host != socket.gethostname():
        return None
    return pid_alive(pid)


def pid_alive(pid: int) -> Optional[bool]:
    """Whether a process of this host is running: None where it cannot be
    told. One that exists under another user is alive (the signal is
    refused, not the process missing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True
