"""Baselines: a run's versioned results plus the fingerprint of the
environment that produced them, in one file a CI job can store and restore:
its spec, writer and reader.

A comparison between runs on different hardware or software says nothing
about the change under test, so the gate refuses fingerprints that differ
(unless told otherwise). The git commit is recorded but never compared: it
is what is expected to differ.

Version history: 1, the only one. Each of `ranks` (and of each `history`
entry's) is a rank document with its steps inline (rankfile.py, format 1's
layout), so a baseline stands alone whatever format its run folder had.

Standard library only at import; the fingerprint's batch size uses numpy,
imported where it is computed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from .files import MISSING, ResultsError, load_json, write_named_file
from .rankfile import FORMAT as RESULTS_FORMAT
from .rankfile import validate
from .results import RunResults, read_run, resolve_run_dir
from .runmeta import RUN_META
from .schema import INT, OBJ, STR, ListOf, Obj, Opt, SchemaError, check, shown
from .stepfile import COL

FORMAT = "perfrun-baseline"
VERSION = 1

BASELINE_FILE = Obj({
    "format": STR,
    "version": INT,
    "fingerprint": OBJ,
    # Whether the baseline run was disturbed, as decided when it was saved.
    "disturbed": Opt(ListOf(Obj({"kind": STR, "message": STR}))),
    "meta": Opt(RUN_META),
    "ranks": ListOf(OBJ),
    "missing": ListOf(INT),
    "history": ListOf(Obj({
        "fingerprint": Opt(OBJ),
        "meta": Opt(RUN_META),
        "ranks": Opt(ListOf(OBJ)),
        "missing": Opt(ListOf(INT)),
    })),
})


# Fingerprint keys that must agree for a comparison to mean anything.
COMPARED = ("gpus", "driver", "cuda", "torch", "python", "world_size", "batch_size", "script")


def batch_size(samples: Any, counts: Any = None) -> Optional[float]:
    """The batch size a fingerprint records: the median of the samples per
    step of the steps that know theirs (not NaN, not 0), an int when whole;
    None when none does. `samples`: the column, or with `counts` the
    distinct values and how many steps had each (a pass over a long rank
    tallies them rather than hold the column): the same median, taken
    from the tally."""
    import numpy as np

    values = np.asarray(samples, dtype=np.float64)
    known = np.isfinite(values) & (values != 0)
    if counts is None:
        values = values[known]
        if not values.size:
            return None
        median = float(np.median(values))
    else:
        values, counts = values[known], np.asarray(counts, dtype=np.int64)[known]
        total = int(counts.sum())
        if not total:
            return None
        order = np.argsort(values, kind="stable")
        values, ends = values[order], np.cumsum(counts[order])
        # The middle value(s) of the sorted steps, as numpy's median takes
        # them: the one at total // 2, and for an even count the mean of it
        # and the one before.
        upper = float(values[np.searchsorted(ends, total // 2, side="right")])
        if total % 2:
            median = upper
        else:
            lower = float(values[np.searchsorted(ends, total // 2 - 1, side="right")])
            median = float(np.mean([lower, upper]))
    return int(median) if median.is_integer() else median


#: fingerprint()'s `batch`: not given, so read from rank 0's steps.
READ = object()


def fingerprint(run: RunResults, table: Any = None, batch: Any = READ) -> dict[str, Any]:
    """The environment a run was measured in: what must agree for two runs
    to be compared (COMPARED), and what helps a reader (host, command, git
    state), from rank 0's document and run.json. `table`: rank 0's steps,
    when the caller has read them already; `batch`: their batch_size, when
    the caller has found it already."""
    ref = next((r for r in run.ranks if r.rank == 0), run.ranks[0] if run.ranks else None)
    data = ref.data if ref is not None else {}
    env = data.get("env") or {}
    settings = data.get("settings") or {}
    cuda = data.get("cuda") or {}
    device = data.get("device") or {}
    found = None if batch is READ else batch
    if ref is not None and batch is READ:
        found = batch_size((ref.table if table is None else table)[:, COL["samples"]])
    script = settings.get("script") or (
        f"-m {settings.get('module')}" if settings.get("module") else None
    )
    return {
        "hostname": env.get("hostname"),
        "gpus": sorted(g.get("name") or "" for g in device.get("gpus") or []),
        "driver": device.get("driver"),
        "cuda": cuda.get("version"),
        "torch": env.get("torch"),
        "python": env.get("python"),
        "world_size": run.world_size,
        "batch_size": found,
        "script": script,
        "script_args": list(settings.get("script_args") or []),
        "command": env.get("command"),
        "git": run.meta.get("git") or {},
    }


def mismatches(base: dict[str, Any], current: dict[str, Any]) -> list[str]:
    out = []
    for key in COMPARED:
        a, b = base.get(key), current.get(key)
        if key == "script" and a and b:
            a, b = os.path.basename(str(a)), os.path.basename(str(b))
        if a != b:
            out.append(f"{key}: baseline {shown(a)}, current {shown(b)}")
    return out


#: Earlier runs a baseline file keeps, for the gate's run-to-run spread.
KEEP_RUNS = 10


def unfit(run: RunResults) -> Optional[str]:
    """Why `run` cannot be a baseline, or None. A run without a single step
    (the script failed before its loop, never imported torch, or was given
    `--help`) would be saved as a baseline that every later gate must refuse
    (exit 67): refused here instead, so the job that records it fails and
    the baseline already in the file, if any, is kept."""
    if not run.ranks:
        return "the run has no results: no rank wrote any"
    if not any(r.n_steps for r in run.ranks):
        return ("the run recorded no steps (no training loop was seen): a baseline needs "
                "steps to compare against")
    return None


def write_baseline(
    run: RunResults,
    path: str,
    disturbed: Sequence[Mapping[str, Any]] = (),
    keep: int = KEEP_RUNS,
) -> int:
    """Write `run` as the baseline in `path`. An existing baseline of the
    same environment keeps its earlier runs (up to `keep`), so saving a few
    runs of the reference commit lets the gate see how much whole runs
    differ. `disturbed`: what disturbed the run's measurement, as decided
    now (analysis/disturbed.py; each a kind and a message). Returns the
    number of runs the file now holds. A run `unfit` refuses raises
    ResultsError (MISSING: no measurement was made) and writes nothing."""
    problem = unfit(run)
    if problem is not None:
        raise ResultsError(problem, MISSING)
    fp = fingerprint(run)
    history: list[dict[str, Any]] = []
    previous = _read_doc(path)
    if previous is not None and not mismatches(previous.get("fingerprint") or {}, fp):
        # An earlier file that cannot be read is replaced, not merged.
        earlier = {k: previous.get(k) for k in ("fingerprint", "meta", "ranks", "missing")}
        history = [earlier, *(previous.get("history") or [])][: max(0, keep - 1)]
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": fp,
        # Whether the baseline run itself was disturbed, as decided when it
        # was saved (the gate decides again from the evidence in meta and
        # ranks, with the perfrun that reads it).
        "disturbed": [dict(f) for f in disturbed],
        "meta": run.meta,
        # Each rank with its steps inline: a baseline is one file that
        # stands alone, whatever format its run folder was written in.
        "ranks": [r.inline() for r in run.ranks],
        "missing": run.missing,
        "history": history,
    }
    folder = os.path.dirname(os.path.realpath(path))
    os.makedirs(folder, exist_ok=True)
    write_named_file(path, json.dumps(doc))
    return 1 + len(history)


def stored_disturbed(path: str) -> list[str]:
    """The messages of the disturbance flags a baseline file recorded."""
    doc = _read_doc(path)
    if doc is None:
        return []
    return [str(f.get("message")) for f in doc.get("disturbed") or [] if isinstance(f, dict)]


def _read_doc(path: str) -> Optional[dict[str, Any]]:
    """The baseline document in `path`, or None when there is none to use:
    callers that merely consult a baseline (its history, its stored
    fingerprint) fall back rather than fail; load() is the one that says why.
    Only a regular file is read: a FIFO or a device named as the baseline
    to save holds no history (reading a FIFO would wait for a writer)."""
    if not os.path.isfile(path):
        return None
    try:
        doc = load_json(path)
    except ResultsError:
        return None
    if isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("version") == VERSION:
        try:
            check(doc, BASELINE_FILE)
        except SchemaError:
            return None
        return doc
    return None


def load_history(path: str) -> list[RunResults]:
    """The earlier runs a baseline file keeps (none for a results folder)."""
    if os.path.isdir(path):
        return []
    doc = _read_doc(path)
    if doc is None:
        return []
    out = []
    for i, entry in enumerate(doc.get("history") or []):
        try:
            ranks = [
                validate(d, path, f"history[{i}].ranks[{j}]")
                for j, d in enumerate(entry.get("ranks") or [])
            ]
        except ResultsError:
            continue
        out.append(
            RunResults(
                run_dir=f"{path}#{i + 1}",
                ranks=ranks,
                meta=entry.get("meta") or {},
                missing=list(entry.get("missing") or []),
            )
        )
    return out


def load(path: str, note: Optional[Callable[[str], None]] = None,
         check_steps: bool = True) -> RunResults:
    """A baseline file or a results folder (or a log folder's newest run;
    `note` as for results.resolve_run_dir; `check_steps` as for
    results.read_run)."""
    if os.path.isdir(path):
        return read_run(resolve_run_dir(path, note), check_steps)
    doc = load_json(path, missing="no such file or results folder: {path}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        if isinstance(doc, dict) and doc.get("format") == RESULTS_FORMAT:
            rank = validate(doc, path)
            return RunResults(run_dir=path, ranks=[rank])
        raise ResultsError(f"{path} is neither a perfrun baseline nor a results folder")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
        raise ResultsError(
            f"{path} has baseline format version {shown(version)}; this perfrun reads "
            f"up to version {VERSION}: upgrade perfrun"
        )
    if version < 1:
        raise ResultsError(f"{path} has unknown baseline format version {version}")
    try:
        check(doc, BASELINE_FILE)
    except SchemaError as exc:
        raise ResultsError(f"cannot read {path}: {exc}") from None
    ranks = [validate(data, path, f"ranks[{i}]") for i, data in enumerate(doc.get("ranks", []))]
    return RunResults(
        run_dir=path,
        ranks=ranks,
        meta=doc.get("meta") or {},
        missing=list(doc.get("missing") or []),
    )


def stored_fingerprint(path: str, run: RunResults,
                       found: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The fingerprint a baseline file stored, else the run's (`found`: the
    one the caller took already)."""
    doc = None if os.path.isdir(path) else _read_doc(path)
    if doc is not None and isinstance(doc.get("fingerprint"), dict):
        stored: dict[str, Any] = doc["fingerprint"]
        return stored
    return found if found is not None else fingerprint(run)
