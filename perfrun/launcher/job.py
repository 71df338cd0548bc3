"""One run folder for every node of a multi-node job.

Under `torchrun --nnodes N` each node runs its own perfrun launcher. Were
each to name its run folder by its own clock and pid, a job on a shared
filesystem would leave N folders, each with one node's ranks, and no report
of the whole job. So every launcher of one job derives the same folder name
from what the nodes share: the rendezvous id (`--rdzv-id`), else the batch
scheduler's job id (`SLURM_JOB_ID`), else a hash of the rendezvous address
and the command line, which every node is given alike.

Several launchers then write into one folder, on several machines, with no
lock that a shared filesystem would honour. Each node writes only files no
other node writes: its own record, `nodes/node<K>.json`, and its ranks'
files (ranks are numbered job-wide). `run.json` is rebuilt from the node
records by each node that changes its own, and checked again after the
write, so the last writer has seen every record (store/runmeta.py,
`write_job_meta`).

An id used again by a later job (a fixed `--rdzv-id` in a launch script)
must not pour the new job into the old folder: a folder whose records show
an ended launcher, or this node's slot taken, belongs to an earlier job,
and every node of the new job moves on to the same next name
(`job-X`, `job-X.2`, `job-X.3`, ...), since they see the same records.

The same folders hold a job whose ranks another launcher started, each
task with a perfrun of its own (`srun -n 8 perfrun train.py`, `mpirun`;
external.py): each task is a "node" of one rank, named `task<R>`. Such
tasks have no rendezvous to wait for before the script starts, so one may
end before another has chosen its folder; their records carry what only
that launch of the job shares (`launch`, e.g. srun's own address), and a
folder holding a record of the same launch is this job's, ended or not.

Everything that decides is a pure function over plain data; the few reads
and writes are at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from ..store.layout import JOB_PREFIX, NODES_DIR, RUN_META
from ..store.results import pid_alive
from ..store.runmeta import read_node_metas

#: torchrun's default `--rdzv-id`: no id at all.
NO_ID = "none"
#: The most folders one job name is tried under before giving up.
MAX_SUFFIX = 1000
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class JobName:
    """What the nodes of one job agree on without talking to each other."""

    #: The run folder's name in the log folder (without a `.K` suffix).
    folder: str
    #: The id a user gave or a scheduler set; None when derived.
    id: Optional[str]
    #: Where it came from: "rdzv-id", "SLURM_JOB_ID" or "derived"; for a
    #: job of tasks (external.py) also the MPI launcher's own variable.
    source: str


def safe_name(text: str) -> str:
    """`text` as one path component: characters a filesystem or a shell
    would trip on replaced, and a short hash added where anything was
    changed, so two ids that differ only there stay two folders."""
    cleaned = _SAFE.sub("_", text).strip("._") or "_"
    if cleaned != text or len(cleaned) > 64:
        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cleaned = f"{cleaned[:55]}-{digest}"
    return cleaned


def job_name(
    rdzv_id: Optional[str],
    environ: Mapping[str, str],
    endpoint: Optional[str],
    master_addr: Optional[str],
    master_port: Optional[int],
    nnodes: Any,
    nproc_per_node: Optional[int],
    target: list[str],
) -> JobName:
    """The job's name, the same on every node of the job.

    The derived name hashes only what every node is given alike (the
    rendezvous address, node and process counts, the script and its
    arguments); a node's own rank, host or clock never enters it."""
    if rdzv_id is not None and rdzv_id.strip() and rdzv_id != NO_ID:
        return JobName(JOB_PREFIX + safe_name(rdzv_id), rdzv_id, "rdzv-id")
    slurm = environ.get("SLURM_JOB_ID", "").strip()
    if slurm:
        step = environ.get("SLURM_STEP_ID", "").strip()
        ident = f"slurm{slurm}" + (f".{step}" if step else "")
        return JobName(JOB_PREFIX + safe_name(ident), ident, "SLURM_JOB_ID")
    shared = json.dumps(
        [endpoint, master_addr, master_port, str(nnodes), nproc_per_node, target]
    )
    digest = hashlib.sha1(shared.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return JobName(f"{JOB_PREFIX}{digest}", None, "derived")


def candidate(folder: str, k: int) -> str:
    """The k-th name tried for a job's folder: `job-X`, `job-X.2`, ..."""
    return folder if k <= 1 else f"{folder}.{k}"


def node_key(node_rank: Optional[int], host: str, pid: int) -> str:
    """How a node's record is named. `--node-rank` where given (torchrun's
    c10d rendezvous may number the nodes otherwise, but the launcher knows
    only this); without it, the host and the launcher's pid, unique to the
    launch."""
    return str(node_rank) if node_rank is not None else safe_name(f"{host}-{pid}")


@dataclass(frozen=True)
class NodeState:
    """What a node's record says about its launcher."""

    #: The launcher recorded its end (a return code).
    ended: bool
    #: Whether the launcher's process is alive: known only on its own host.
    alive: Optional[bool]
    #: What the task's launch shares with every other task of it and with
    #: no other launch (external.py, `launch_token`); None for a torchrun
    #: node, or where the launcher gives nothing of the kind.
    launch: Optional[str] = None


def folder_is_open(
    exists: bool,
    is_job_folder: bool,
    nodes: Mapping[str, NodeState],
    me: str,
    launch: Optional[str] = None,
) -> Optional[str]:
    """None when this node may join the folder; else why it belongs to
    another (earlier) job.

    A node of the current job cannot have ended when another node of it
    starts: no node trains before all have joined the rendezvous, which
    each launcher starts only after choosing its folder. So an ended record
    (a return code, or a launcher found dead on this host) marks an earlier
    job, as does this node's own slot already taken.

    Tasks of an external launcher (`launch` given) have no rendezvous: a
    task whose script failed at once may have ended before its sibling
    chose. A record of the same launch makes the folder this job's, ended
    or not; a record of another launch, running or not, another job's."""
    if not exists:
        return None
    if not is_job_folder:
        return "it is not a job folder"
    if me in nodes:
        return f"node {me} already ran there"
    if launch is not None:
        theirs = {state.launch for state in nodes.values()}
        if launch in theirs:
            return None
        if theirs - {None}:
            return "another launch of the job wrote there"
    for key, state in sorted(nodes.items()):
        if state.ended or state.alive is False:
            return f"its node {key} has ended"
    return None


def job_facts(
    name: JobName, nnodes: Any, nproc_per_node: Optional[int], target: list[str]
) -> dict[str, Any]:
    """The `job` entry of run.json: what every node of the job shares, and
    the whole job's world size where it is fixed (for ranks to be counted
    missing across all nodes)."""
    world: Optional[int] = None
    text = str(nnodes).strip() if nnodes is not None else "1"
    parts = text.split(":")
    if nproc_per_node is not None and all(p.isdigit() for p in parts) and len(set(parts)) == 1:
        world = int(parts[0]) * nproc_per_node
    return {
        "id": name.id,
        "name": name.folder,
        "source": name.source,
        "nnodes": text,
        "nproc_per_node": nproc_per_node,
        "world_size": world,
        "script": target[0] if target else None,
    }


# -- reads -----------------------------------------------------------------------------


def node_state(meta: Mapping[str, Any], host: Optional[str] = None) -> NodeState:
    """A node record read as NodeState; its launcher asked directly when it
    ran on this host."""
    ended = isinstance(meta.get("returncode"), int)
    alive: Optional[bool] = None
    pid = meta.get("pid")
    here = host if host is not None else socket.gethostname()
    if not ended and meta.get("host") == here and isinstance(pid, int) and pid > 0:
        alive = pid_alive(pid)
    task = meta.get("task")
    launch = task.get("launch") if isinstance(task, dict) else None
    return NodeState(ended=ended, alive=alive,
                     launch=launch if isinstance(launch, str) else None)


def choose_job_folder(log_dir: str, name: JobName, me: str,
                      launch: Optional[str] = None) -> tuple[str, list[str]]:
    """The folder this node joins (created if new), and why each earlier
    name was passed over. Raises OSError when the log folder cannot be
    written. `launch`: a task's launch token (folder_is_open)."""
    skipped = []
    for k in range(1, MAX_SUFFIX + 1):
        path = os.path.join(log_dir, candidate(name.folder, k))
        exists = os.path.isdir(path)
        is_job = exists and (
            os.path.isdir(os.path.join(path, NODES_DIR)) or not _has_results(path)
        )
        nodes = {key: node_state(m) for key, m in read_node_metas(path).items()} if exists else {}
        why = folder_is_open(exists, is_job, nodes, me, launch)
        if why is None:
            os.makedirs(os.path.join(path, NODES_DIR), exist_ok=True)
            return path, skipped
        skipped.append(f"{os.path.basename(path)} ({why})")
    raise OSError(f"more than {MAX_SUFFIX} earlier runs of job {name.folder}")


def _has_results(path: str) -> bool:
    try:
        return any(n == RUN_META or n.startswith("rank") for n in os.listdir(path))
    except OSError:
        return False
