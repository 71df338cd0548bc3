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
from dataclasses import dataclass, field
from typing import Any

from .schema import COL, FORMAT, GPU_COLUMNS, PHASES, STEP_COLUMNS, VERSION, rank_filename

__all__ = [
    "COL", "FORMAT", "GPU_COLUMNS", "PHASES", "STEP_COLUMNS", "VERSION", "rank_filename",
    "ResultsError", "RankResult", "RunResults", "atomic_write_text", "read_rank_file",
    "read_run", "resolve_run_dir", "find_rank_files", "validate",
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


@dataclass
class RankResult:
    """One rank's results as read back from disk."""

    path: str
    data: dict[str, Any]
    rows: list[list[Any]] = field(default_factory=list)

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


def load_json(path: str, missing: str = "cannot read {path}: no such file") -> Any:
    """A JSON file's content, or a one-line ResultsError (results files and
    baselines are read the same way)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ResultsError(missing.format(path=path)) from None
    except OSError as exc:
        raise ResultsError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(
            f"{path} is not valid JSON (truncated or corrupt at line {exc.lineno}, "
            f"column {exc.colno})"
        ) from None


def read_rank_file(path: str) -> RankResult:
    return validate(load_json(path), path)


def validate(data: Any, path: str) -> RankResult:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultsError(f"{path} is not a perfrun results file")
    version = data.get("version")
    if not isinstance(version, int):
        raise ResultsError(f"{path} has no format version")
    if version > VERSION:
        raise ResultsError(
            f"{path} has results format version {version}; this perfrun reads up to "
            f"version {VERSION}: upgrade perfrun"
        )
    if version < 1:
        raise ResultsError(f"{path} has unknown results format version {version}")
    steps = data.get("steps") or {}
    columns = steps.get("columns", list(STEP_COLUMNS))
    rows = steps.get("rows", [])
    if not isinstance(rows, list) or not isinstance(columns, list):
        raise ResultsError(f"{path}: malformed step records")
    if list(columns) != list(STEP_COLUMNS):
        # Re-map by name, so a file with reordered or extra columns still reads.
        index = {name: i for i, name in enumerate(columns)}
        rows = [[row[index[c]] if c in index else None for c in STEP_COLUMNS] for row in rows]
    for row in rows:
        if not isinstance(row, list) or len(row) != len(STEP_COLUMNS):
            raise ResultsError(f"{path}: malformed step record {row!r:.60}")
    return RankResult(path=path, data=data, rows=rows)


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
    meta: dict[str, Any] = {}
    meta_path = os.path.join(run_dir, "run.json")
    if os.path.exists(meta_path):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, json.JSONDecodeError):
            meta = {}
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
    if str(meta.get("nnodes") or "1") != "1":
        # Several nodes: each node's perfrun sees its own ranks only; the
        # others' are not missing, they are in the other nodes' run folders.
        missing = []
    return RunResults(run_dir=run_dir, ranks=ranks, meta=meta, missing=missing)


def resolve_run_dir(path: str) -> str:
    """Accept a run folder, a log folder (its `latest` run), or a `latest` link."""
    if (
        os.path.isdir(path)
        and not find_rank_files(path)
        and not os.path.exists(os.path.join(path, "run.json"))
    ):
        latest = os.path.join(path, "latest")
        if os.path.exists(latest):
            return os.path.realpath(latest)
    return path
