"""The experiment tracker runs a rank logged perfrun's figures into:
`trackers/rank<R>.json`, written by the rank at its final save.

The launcher reads it after the run to give each run the report's summary
and report.html where the tracker takes them after the process has ended
(an MLflow run, through its client; a TensorBoard log folder, in an event
file of its own), and the report's notes say what did not arrive.

    {"format": "perfrun-trackers", "version": 1, "rank": 0,
     "every": 50, "every_auto": true, "points": 12, "dropped": 0,
     "runs": [
       {"kind": "wandb", "id": "a1b2c3", "project": "demo", "dir": "...",
        "offline": true, "points": 12, "last_step": 599, "summary": true},
       {"kind": "mlflow", "run_id": "...", "tracking_uri": "file:///...",
        "points": 12, "last_step": 599},
       {"kind": "tensorboard", "library": "torch", "log_dir": "runs/exp",
        "points": 12, "last_step": 599}
     ],
     "problems": ["..."]}

`every` is N, the steps a point covers (`every_auto`: chosen by perfrun);
`points` the points the rank made, `dropped` those that found the queue to
the tracker full (a tracker slower than the run); a run's `points` those it
took, its `last_step` the step its last point was logged at. `problems`:
one line each for what did not reach a tracker (errors, timeouts).
Version history: 1, the only one.

Standard library only: written from inside the rank.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from . import layout

FORMAT = "perfrun-trackers"
VERSION = 1
KINDS = ("wandb", "mlflow", "tensorboard")


def write(run_dir: str, stem: str, record: dict[str, Any]) -> None:
    """Write a rank's record in one rename, so a reader never sees half."""
    path = layout.tracker_path(run_dir, stem)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "version": VERSION, **record}, f)
    os.replace(tmp, path)


def _run(entry: Any) -> Optional[dict[str, Any]]:
    if not isinstance(entry, dict) or entry.get("kind") not in KINDS:
        return None
    points = entry.get("points")
    if not isinstance(points, int) or isinstance(points, bool) or points < 0:
        return None
    last = entry.get("last_step")
    if last is not None and (not isinstance(last, int) or isinstance(last, bool)):
        return None
    where = {"wandb": "id", "mlflow": "run_id", "tensorboard": "log_dir"}[entry["kind"]]
    if not isinstance(entry.get(where), str) or not entry[where]:
        return None
    return entry


def validate(doc: Any) -> Optional[dict[str, Any]]:
    """The record, with only its valid runs; None for a file that is no
    record of this format and version."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return None
    runs = doc.get("runs")
    if not isinstance(runs, list):
        return None
    problems = doc.get("problems")
    out = dict(doc)
    out["runs"] = [r for r in (_run(e) for e in runs) if r is not None]
    out["problems"] = [p for p in problems if isinstance(p, str)] if isinstance(
        problems, list) else []
    return out


def read_trackers(run_dir: str) -> list[dict[str, Any]]:
    """Every rank's record in the run folder, rank order; a file that
    cannot be read or is not a record is left out."""
    folder = os.path.join(run_dir, layout.TRACKERS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        m = layout.RANK_FILE.match(name)
        if m is None:
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                doc = validate(json.load(f))
        except (OSError, ValueError):
            continue
        if doc is not None:
            out.append(doc)
    out.sort(key=_rank_order)
    return out


def _rank_order(doc: dict[str, Any]) -> int:
    """A record's rank, for sorting; one without a rank last."""
    rank = doc.get("rank")
    return rank if isinstance(rank, int) else 1 << 30
