"""Baselines: a run's versioned results plus the fingerprint of the
environment that produced them, in one file a CI job can store and restore.

A comparison between runs on different hardware or software says nothing
about the change under test, so the gate refuses fingerprints that differ
(unless told otherwise). The git commit is recorded but never compared: it
is what is expected to differ.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Optional

import numpy as np

from .results import (
    COL,
    ResultsError,
    RunResults,
    atomic_write_text,
    load_json,
    read_run,
    resolve_run_dir,
    validate,
)
from .schema import BASELINE_FILE, SchemaError, check, shown

FORMAT = "perfrun-baseline"
VERSION = 1

# Fingerprint keys that must agree for a comparison to mean anything.
COMPARED = ("gpus", "driver", "cuda", "torch", "python", "world_size", "batch_size", "script")


def git_state(path: str) -> dict[str, Any]:
    """Commit and dirty flag of the repository holding `path`, if any."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        commit = subprocess.run(
            ["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {}
        status = subprocess.run(
            ["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {}


def fingerprint(run: RunResults) -> dict[str, Any]:
    ref = next((r for r in run.ranks if r.rank == 0), run.ranks[0] if run.ranks else None)
    data = ref.data if ref is not None else {}
    env = data.get("env") or {}
    settings = data.get("settings") or {}
    cuda = data.get("cuda") or {}
    device = data.get("device") or {}
    batch_size = None
    if ref is not None:
        column = ref.table[:, COL["samples"]]
        known = column[np.isfinite(column) & (column != 0)]
        if known.size:
            median = float(np.median(known))
            batch_size = int(median) if median.is_integer() else median
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
        "batch_size": batch_size,
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


def save_baseline(run_dir: str, path: str, keep: int = KEEP_RUNS) -> int:
    """Write `run_dir` as the baseline in `path`. An existing baseline of the
    same environment keeps its earlier runs (up to `keep`), so saving a few
    runs of the reference commit lets the gate see how much whole runs
    differ. Returns the number of runs the file now holds."""
    run = read_run(run_dir)
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
        "disturbed": [f.to_dict() for f in disturbed_flags(run)],
        "meta": run.meta,
        # Each rank with its steps inline: a baseline is one file that
        # stands alone, whatever format its run folder was written in.
        "ranks": [r.inline() for r in run.ranks],
        "missing": run.missing,
        "history": history,
    }
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    atomic_write_text(path, json.dumps(doc))
    return 1 + len(history)


def disturbed_flags(run: RunResults) -> list[Any]:
    from .analysis.disturbed import flags_of

    try:
        return flags_of(run)
    except Exception:  # noqa: BLE001 - a damaged record is no reason to lose the baseline
        return []


def stored_disturbed(path: str) -> list[str]:
    """The messages of the disturbance flags a baseline file recorded."""
    doc = _read_doc(path)
    if doc is None:
        return []
    return [str(f.get("message")) for f in doc.get("disturbed") or [] if isinstance(f, dict)]


def _read_doc(path: str) -> Optional[dict[str, Any]]:
    """The baseline document in `path`, or None when there is none to use:
    callers that merely consult a baseline (its history, its stored
    fingerprint) fall back rather than fail; load() is the one that says why."""
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


def load(path: str) -> RunResults:
    """A baseline file or a results folder (or a log folder's latest run)."""
    if os.path.isdir(path):
        return read_run(resolve_run_dir(path))
    doc = load_json(path, missing="no such file or results folder: {path}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        if isinstance(doc, dict) and doc.get("format") == "perfrun-results":
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


def stored_fingerprint(path: str, run: RunResults) -> dict[str, Any]:
    doc = None if os.path.isdir(path) else _read_doc(path)
    if doc is not None and isinstance(doc.get("fingerprint"), dict):
        return doc["fingerprint"]
    return fingerprint(run)
