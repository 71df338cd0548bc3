"""Processes a rank's script starts itself, and what they trained:
`children/rank<R>.pid<P>.json`, one small document per process.

A script may train in processes of its own (`torch.multiprocessing`'s
`Process`: Hogwild training on a shared model) while its own process only
tests. perfrun profiles the processes it launches, not those (see
runtime/children.py for why), but the report must not read the parent's
test loop as the training: each child started with a target from the
script writes this document, with the optimizer steps it took, when its
target returns or raises.

    {"format": "perfrun-child", "version": 1, "pid": 1234,
     "target": "train", "started": 12.5, "seconds": 3.2,
     "optimizer_steps": 40, "status": "finished"}

`started` is the process's start on the rank's clock (seconds since the
rank started), `seconds` how long the target ran, `status` "finished" or
"raised". Version history: 1, the only one.

Standard library only: written from inside the child.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from . import layout

FORMAT = "perfrun-child"
VERSION = 1
STATUSES = ("finished", "raised")


def write(run_dir: str, stem: str, record: dict[str, Any]) -> None:
    """Write a child's document in one rename, so a reader never sees half."""
    path = layout.child_path(run_dir, stem, int(record["pid"]))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "version": VERSION, **record}, f)
    os.replace(tmp, path)


def _valid(doc: Any) -> Optional[dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return None
    if not isinstance(doc.get("pid"), int) or not isinstance(doc.get("target"), str):
        return None
    steps = doc.get("optimizer_steps")
    if not isinstance(steps, int) or steps < 0 or doc.get("status") not in STATUSES:
        return None
    seconds = doc.get("seconds")
    if not isinstance(seconds, (int, float)) or seconds < 0:
        return None
    return doc


def read_children(run_dir: str, stem: str) -> tuple[list[dict[str, Any]], int]:
    """A rank's children's documents, by pid, and how many files could not
    be read (damaged or of another version): those are counted, not
    guessed at."""
    folder = os.path.join(run_dir, layout.CHILDREN_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return [], 0
    out, bad = [], 0
    prefix = stem + ".pid"
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                doc = _valid(json.load(f))
        except (OSError, ValueError):
            doc = None
        if doc is None:
            bad += 1
        else:
            out.append(doc)
    out.sort(key=lambda d: d["pid"])
    return out, bad
