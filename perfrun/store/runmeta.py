"""The launcher's record of a run, `run.json`, and a multi-node job's node
records, `nodes/node<K>.json`: spec, writers, readers.

`run.json` says what the rank files cannot: the command perfrun was given
and the child it started, how many ranks it expected, when it started and
how it ended (the exit status, the signals it passed on), the git state of
a gated run and what else the host was doing (launcher/hostload.py). It is
written before the script starts (a reader sees a run in progress) and again
at the end.

In a multi-node job's folder every node's launcher writes only its own
record, and `run.json` is rebuilt from all of them (`merge_node_metas`) by
each node that changes its own, so no lock is needed on a shared
filesystem (see `write_job_meta`).

Version history: unversioned; fields are only ever added, and a reader
takes what it knows (RUN_META declares the types of what readers use).

Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Optional

from . import layout
from .files import ResultsError, atomic_write_text, load_json
from .schema import INT, NUMBER, OBJ, STR, Kind, ListOf, Obj, Opt, SchemaError, check

#: What a launcher sampled of its host (launcher/hostload.py), in run.json
#: or a node's record. Optional: older files have none.
HOST_LOAD = Obj({
    "version": INT,
    "host": Opt(STR),
    "cpu_count": Opt(INT),
    "samples": INT,
    **{name: Opt(NUMBER) for name in (
        "seconds", "machine_busy_cores", "job_cores", "launcher_cores", "other_cores",
        "other_cores_max", "steal_fraction")},
    "cpu_freq": Opt(Obj(values=NUMBER)),
    "top_others": ListOf(Obj({"pid": INT, "name": Opt(STR), "cores": NUMBER})),
    "unavailable": ListOf(STR),
    "sample_cost": Opt(OBJ),
})

#: run.json, written by the launcher beside the rank files.
RUN_META = Obj({
    "git": Opt(OBJ),
    "command": Opt(ListOf(STR)),
    "child": Opt(ListOf(STR)),
    "expected_ranks": Opt(INT),
    "nnodes": Opt(Kind("a string or an integer", str, int)),
    "launcher": Opt(STR),
    "started": Opt(NUMBER),
    "returncode": Opt(INT),
    "elapsed": Opt(NUMBER),
    "host": Opt(STR),
    "pid": Opt(INT),
    "node_rank": Opt(INT),
    "signals": Opt(ListOf(STR)),
    # Processes the out-of-memory killer ended in the run's memory cgroup
    # while the run ran (absent where the kernel does not say).
    "oom_kills": Opt(INT),
    "combined_from": Opt(ListOf(STR)),
    "host_load": Opt(HOST_LOAD),
    # A multi-node job's folder (launcher/job.py): the job, and each node's
    # record.
    "job": Opt(Obj({
        "id": Opt(STR),
        "name": Opt(STR),
        "source": Opt(STR),
        "nnodes": Opt(Kind("a string or an integer", str, int)),
        "nproc_per_node": Opt(INT),
        "world_size": Opt(INT),
        "script": Opt(STR),
        # A job of tasks srun or mpirun started (launcher/external.py).
        "launcher": Opt(STR),
    })),
    "nodes": Opt(Obj(values=OBJ)),
})


def run_meta_path(run_dir: str) -> str:
    return os.path.join(run_dir, layout.RUN_META)


def write_run_meta(run_dir: str, meta: Mapping[str, Any]) -> None:
    """run.json of a run of one node."""
    atomic_write_text(run_meta_path(run_dir), json.dumps(meta, indent=1))


def read_run_meta(run_dir: str) -> dict[str, Any]:
    """run.json, the launcher's record of the run. It only adds to the rank
    files, so one that cannot be parsed at all is left out; one that parses
    but has fields of the wrong type is refused like any other results file,
    since its values would be used."""
    meta_path = run_meta_path(run_dir)
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


def peek_run_meta(run_dir: str) -> dict[str, Any]:
    """run.json as it stands, unchecked; empty when there is none or it
    cannot be read (for --keep, which must decide on any folder)."""
    try:
        with open(run_meta_path(run_dir), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def run_started(run_dir: str) -> float:
    """When a run began: run.json's `started` (written before the script
    starts, so a run still in progress has it), else the folder's mtime."""
    try:
        with open(run_meta_path(run_dir), encoding="utf-8") as f:
            started = json.load(f).get("started")
        if isinstance(started, (int, float)) and not isinstance(started, bool):
            return float(started)
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    try:
        return os.stat(run_dir).st_mtime
    except OSError:
        return 0.0


# -- torchrun's failed workers ------------------------------------------------------------


def write_torchrun_status(path: str, first: str, failures: Mapping[str, Any]) -> None:
    """How torchrun's failed workers ended (launcher/torchrun.py, in the
    torchrun agent): `first` the rank that failed first, `failures` each
    failed rank's exit code (negative: the signal that killed it), local
    rank and pid."""
    atomic_write_text(path, json.dumps({"first": first, "failures": dict(failures)}))


def first_failure_signal(path: str) -> Optional[int]:
    """The signal that killed the first failed worker (SIGKILL included),
    0 when it exited with a status, None when the record cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            status = json.load(f)
        first = status["failures"][status["first"]]["exitcode"]
        return -int(first) if int(first) < 0 else 0
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_exit_codes(run_dir: str) -> tuple[Optional[int], dict[int, int]]:
    """torchrun's record of its failed workers, every node's in a job folder:
    the rank it saw fail first (None when there is no record) and each
    failed rank's exit status (negative: the signal that ended it). A record
    that cannot be read adds nothing: it only adds to the rank files."""
    paths = [os.path.join(run_dir, layout.TORCHRUN_STATUS)]
    try:
        names = sorted(os.listdir(os.path.join(run_dir, layout.NODES_DIR)))
    except OSError:
        names = []
    paths += [os.path.join(run_dir, layout.NODES_DIR, n) for n in names
              if layout.is_node_torchrun_status(n)]
    first: Optional[int] = None
    codes: dict[int, int] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                status = json.load(f)
            failures = status["failures"]
            found = {int(rank): int(f["exitcode"]) for rank, f in failures.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue
        codes.update(found)
        if first is None and str(status.get("first", "")).isdigit():
            first = int(status["first"])
    return first, codes


def task_exit_codes(meta: Mapping[str, Any]) -> dict[int, int]:
    """Each failed rank's exit status in a job whose ranks srun or mpirun
    started, each task with its own perfrun (launcher/external.py): the
    status its task's launcher recorded (negative: the signal that ended
    it), from run.json's node records. The job's merged `returncode` is
    one task's, not every rank's."""
    nodes = meta.get("nodes")
    codes: dict[int, int] = {}
    if not isinstance(nodes, Mapping):
        return codes
    for node in nodes.values():
        task = node.get("task") if isinstance(node, Mapping) else None
        code = node.get("returncode") if isinstance(node, Mapping) else None
        rank = task.get("rank") if isinstance(task, Mapping) else None
        if (isinstance(rank, int) and isinstance(code, int) and not isinstance(code, bool)
                and code != 0):
            codes[rank] = code
    return codes


# -- a multi-node job's node records ------------------------------------------------------


def read_node_metas(run_dir: str) -> dict[str, dict[str, Any]]:
    """Every node record in a job folder; one that cannot be read (being
    replaced, or damaged) is left out."""
    folder = os.path.join(run_dir, layout.NODES_DIR)
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out = {}
    for name in names:
        key = layout.node_key_of(name)
        if key is None:
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(doc, dict):
            out[key] = doc
    return out


def write_node_meta(run_dir: str, key: str, meta: Mapping[str, Any]) -> None:
    atomic_write_text(layout.node_path(run_dir, key), json.dumps(meta, indent=1))


def write_job_meta(run_dir: str, key: str, meta: Mapping[str, Any],
                   job: Mapping[str, Any]) -> None:
    """Write this node's record, then run.json from every node's record.

    No lock: after writing run.json the records are read again, and if one
    changed in between (another node wrote its own), run.json is rebuilt.
    The last node to write has then seen every record written before its
    final read, so run.json ends up with all of them; a node's own record
    is never lost in any case."""
    write_node_meta(run_dir, key, meta)
    seen = read_node_metas(run_dir)
    for _ in range(20):
        write_run_meta(run_dir, merge_node_metas(seen, job))
        again = read_node_metas(run_dir)
        if again == seen:
            return
        seen = again


def merge_node_metas(nodes: Mapping[str, Mapping[str, Any]],
                     job: Mapping[str, Any]) -> dict[str, Any]:
    """run.json of a job folder: one launcher's view for the readers that
    know one (command, start, end), the job-wide facts (`job`), and every
    node's own record (`nodes`), so nothing a node said is lost.

    `returncode` stays unset while any node runs (a report then treats the
    run as in progress); when every node has ended it is the first failing
    node's status, else 0."""
    keys = sorted(nodes, key=_key_order)
    first = nodes[keys[0]] if keys else {}
    meta: dict[str, Any] = {
        "git": first.get("git") or {},
        "command": first.get("command"),
        "child": first.get("child"),
        "launcher": first.get("launcher", "torchrun"),
        "nnodes": job.get("nnodes"),
        "job": dict(job),
        "nodes": {k: dict(nodes[k]) for k in keys},
    }
    world = job.get("world_size")
    if isinstance(world, int):
        meta["expected_ranks"] = world
    elif first.get("expected_ranks") is not None:
        meta["expected_ranks"] = first.get("expected_ranks")
    starts = [n["started"] for n in nodes.values() if _number(n.get("started"))]
    if starts:
        meta["started"] = min(starts)
    codes = [n.get("returncode") for n in (nodes[k] for k in keys)]
    if keys and all(isinstance(c, int) for c in codes):
        meta["returncode"] = next((c for c in codes if c != 0), 0)
        elapsed = [n["elapsed"] for n in nodes.values() if _number(n.get("elapsed"))]
        if elapsed:
            meta["elapsed"] = max(elapsed)
    signals = sorted({s for n in nodes.values() for s in (n.get("signals") or [])})
    if signals:
        meta["signals"] = signals
    return meta


def _key_order(key: str) -> tuple[int, Any]:
    return (0, int(key)) if key.isdigit() else (1, key)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
