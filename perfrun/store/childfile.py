"""Processes a rank's script starts itself, and what they trained:
`children/rank<R>.pid<P>.json`, one small document per process.

A script may train in processes of its own (`torch.multiprocessing`'s
`Process`: Hogwild training on a shared model; Ray Train's workers, which
the Ray cluster the script starts runs) while its own process only tests
or waits. perfrun profiles the processes it launches, not those (see
runtime/children.py for why), but the report must not read the parent's
loop as the training, nor say that no training ran: each such process
writes this document, with the optimizer steps it took.

    {"format": "perfrun-child", "version": 2, "pid": 1234,
     "target": "train", "started": 12.5, "seconds": 3.2,
     "optimizer_steps": 40, "status": "finished",
     "started_by": "multiprocessing", "command": ["python", "..."]}

`started` is the process's start on the rank's clock (seconds since the
rank started), `seconds` how long it ran (its target, or since torch was
imported), `status` "finished" or "raised" (a target's end), or "running"
(a process that writes as it goes and had not ended at its last write:
killed, or still running). `started_by` says how the script started it
("multiprocessing", or "ray": a worker of the Ray cluster the script
started), `command` the process's command line where it is not the
script's own.

Version history: 1, without `started_by` (multiprocessing, always),
`command` and the "running" status; 2, with them. Both are read.

Standard library only: written from inside the child.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from . import layout

FORMAT = "perfrun-child"
VERSION = 2
#: The versions read.
VERSIONS = (1, 2)
STATUSES = ("finished", "raised", "running")
#: How the script started a child (`started_by`).
STARTERS = ("multiprocessing", "ray")


def write(run_dir: str, stem: str, record: dict[str, Any]) -> None:
    """Write a child's document in one rename, so a reader never sees half."""
    path = layout.child_path(run_dir, stem, int(record["pid"]))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "version": VERSION, **record}, f)
    os.replace(tmp, path)


def _valid(doc: Any) -> Optional[dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or \
            doc.get("version") not in VERSIONS:
        return None
    if doc["version"] == 1 and doc.get("status") == "running":
        return None
    doc.setdefault("started_by", "multiprocessing")
    if doc.get("started_by") not in STARTERS:
        return None
    command = doc.get("command")
    if command is not None and not (isinstance(command, list)
                                    and all(isinstance(c, str) for c in command)):
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
