"""Every name in a log folder and a run folder, in one place.

A run folder is read by more than the code that wrote it: `perfrun report`
and `watch` long after the run, `combine` on a copy gathered from several
nodes, `--keep` deciding what is perfrun's to delete, a user with `ls`. A
name spelt in two modules drifts; spelt here once, the writers and every
reader agree by construction.

A log folder (`--log-dir`, default `./perfrun_log`) holds one folder per
run, named `YYYYMMDD-HHMMSS-PID` (or `job-NAME[.K]` for a multi-node job
whose nodes share the folder), and `latest`, a link to the newest. A run
folder holds:

    run.json                       the launcher's record (runmeta.py)
    settings.json                  what the ranks boot with (settings.child_settings;
                                   nodes/settings.node<K>.json in a job folder)
    rank<R>.json                   a rank's document (rankfile.py); after an
    rank<R>.restart<K>.json          elastic restart, one per restart
    rank<R>.steps                  its steps, appended (stepfile.py)
    stack.rank<R>.txt              its Python stacks, dumped on a hang
    trace/rank<R>.pt.trace.json[.gz]   its detailed window's trace
    nsys/rank<R>.nsys-rep          its Nsight Systems report (--nsys)
    pipeline/rank<R>.loader<L>.fetches      its DataLoaders' fetches, and
    pipeline/rank<R>.loader<L>.pid<P>.batches  each worker's batches
                                   (pipelinefile.py)
    children/rank<R>.pid<P>.json   a process the rank's script started
                                   itself, and what it trained (childfile.py)
    trackers/rank<R>.json          the experiment tracker runs the rank logged
                                   its figures into (trackerfile.py)
    nodes/node<K>.json             each node's launcher record (multi-node)
    torchrun-status.json           how torchrun's failed workers ended
    hang.txt                       the hang report (--hang-timeout)
    report.html                    the page written at the end of the run
    .reserve-<owner>               disk space a writer holds for its last save
                                   (files.Reserve; a rank's stem, `launcher`,
                                   or `node<K>`), gone when the run has ended

Standard library only: the rank imports this module at start.
"""

from __future__ import annotations

import os
import re

#: The link to the newest run in a log folder.
LATEST = "latest"
#: The launcher's record of the run (runmeta.py).
RUN_META = "run.json"
#: The settings the ranks boot with, read by boot/sitecustomize.py (a file,
#: not the environment: the argument list is in it, of any length).
SETTINGS_FILE = "settings.json"
#: Each node's own launcher record, in a multi-node job's folder.
NODES_DIR = "nodes"
#: The detailed window's traces.
TRACE_DIR = "trace"
#: Nsight Systems reports.
NSYS_DIR = "nsys"
#: The input pipelines' tables (pipelinefile.py).
PIPELINE_DIR = "pipeline"
#: Processes a rank's script started itself (childfile.py).
CHILDREN_DIR = "children"
#: The tracker runs (W&B, MLflow, TensorBoard) each rank logged into
#: (trackerfile.py).
TRACKERS_DIR = "trackers"
#: The hang report (launcher/hang.py).
HANG_FILE = "hang.txt"
#: The page written into every run folder at the end of a run.
REPORT_FILE = "report.html"
#: How torchrun's failed workers ended (launcher/torchrun.py).
TORCHRUN_STATUS = "torchrun-status.json"
#: The step file's suffix, beside its rank file's stem.
STEPS_SUFFIX = ".steps"
#: A multi-node job's run folder name starts so (launcher/job.py).
JOB_PREFIX = "job-"
#: A run folder being removed by --keep is first renamed to start so.
REMOVING = ".perfrun-removing-"
#: The space a writer holds back for its last save (files.Reserve), named
#: after its owner: hidden, so no reader takes it for results.
RESERVE_PREFIX = ".reserve-"
#: A folder written by `perfrun combine` before it is renamed into place
#: starts with a dot too: no name starting with "." is ever a run.
HIDDEN = "."

#: A rank file's name: rank, restart.
RANK_FILE = re.compile(r"^rank(\d+)(?:\.restart(\d+))?\.json$")
#: A rank's stem at the start of any file of that rank: `rank3.` or
#: `rank3.restart1.` (its rank file, step file, trace, nsys report).
RANK_STEM = re.compile(r"^rank(\d+)(?:\.restart(\d+))?\.")
#: Sub-folders whose files belong to ranks by the same stem.
RANK_SUBFOLDERS = (TRACE_DIR, NSYS_DIR, PIPELINE_DIR, CHILDREN_DIR, TRACKERS_DIR)
#: The names perfrun gives run folders: `YYYYMMDD-HHMMSS-PID`, and a
#: multi-node job's `job-NAME[.K]`. Only these are --keep's to remove.
MANAGED = re.compile(r"^(\d{8}-\d{6}-\d+|job-.+)$")


def is_multinode(nnodes: object, distributed: bool = True) -> bool:
    """A job of several nodes (or an elastic MIN:MAX range), whose nodes
    share one run folder. `--nnodes 1` and plain runs keep a folder of
    their own."""
    return distributed and nnodes is not None and str(nnodes).strip() not in ("", "1", "1:1")


def run_folder_name(stamp: str, pid: int) -> str:
    """A one-node run's folder: its start time (`YYYYMMDD-HHMMSS`) and the
    launcher's pid, so two runs started in one second do not collide."""
    return f"{stamp}-{pid}"


def rank_stem(rank: int, restart: int = 0) -> str:
    """`rank3`, or `rank3.restart1` after an elastic restart."""
    return f"rank{rank}" if restart == 0 else f"rank{rank}.restart{restart}"


def rank_filename(rank: int, restart: int = 0) -> str:
    return rank_stem(rank, restart) + ".json"


def steps_path(json_path: str) -> str:
    """The step file that goes with a rank's `rank<R>[.restart<K>].json`."""
    stem = json_path[:-5] if json_path.endswith(".json") else json_path
    return stem + STEPS_SUFFIX


def stack_path(run_dir: str, rank: int, restart: int = 0) -> str:
    """Where a rank dumps its Python stacks when the launcher asks."""
    return os.path.join(run_dir, f"stack.{rank_stem(rank, restart)}.txt")


def memory_snapshot_path(run_dir: str, stem: str) -> str:
    """A rank's CUDA allocator snapshot (--memory-snapshot): PyTorch's own
    pickle, for its memory visualiser; perfrun only names it."""
    return os.path.join(run_dir, f"{stem}.memory.pickle")


def trace_path(run_dir: str, stem: str) -> str:
    """A rank's window trace (`.gz` is added when it is compressed)."""
    return os.path.join(run_dir, TRACE_DIR, f"{stem}.pt.trace.json")


def raw_trace_path(run_dir: str, stem: str) -> str:
    """Where torch.profiler exports before perfrun rewrites the trace: a
    hidden name, so `combine` and a reader never take it for the trace."""
    return os.path.join(run_dir, TRACE_DIR, f".{stem}.raw.json")


def nsys_output(run_dir: str, distributed: bool) -> str:
    """nsys's `--output`: `%q{RANK}` is expanded by nsys in each worker."""
    return os.path.join(run_dir, NSYS_DIR, "rank%q{RANK}" if distributed else "rank0")


def nsys_report(rank: int | str) -> str:
    """A rank's Nsight Systems report, relative to the run folder."""
    return f"{NSYS_DIR}/rank{rank}.nsys-rep"


def fetches_path(run_dir: str, stem: str, loader: int) -> str:
    """A rank's fetches of its DataLoader number `loader` (in the order the
    rank first iterated its loaders)."""
    return os.path.join(run_dir, PIPELINE_DIR, f"{stem}.loader{loader}.fetches")


def batches_path(run_dir: str, stem: str, loader: int, pid: int) -> str:
    """The batches one worker process (`pid`) made for a rank's loader."""
    return os.path.join(run_dir, PIPELINE_DIR, f"{stem}.loader{loader}.pid{pid}.batches")


_BATCHES = re.compile(r"^(.+)\.loader(\d+)\.pid(\d+)\.batches$")


def batches_pid(name: str, stem: str, loader: int) -> int | None:
    """The worker pid of a batch table's file name, when it is `stem`'s
    loader `loader`'s; else None."""
    m = _BATCHES.match(name)
    if m is None or m.group(1) != stem or int(m.group(2)) != loader:
        return None
    return int(m.group(3))


def node_filename(key: str) -> str:
    return f"node{key}.json"


def node_key_of(name: str) -> str | None:
    """The node key of a node record's file name, or None."""
    if name.startswith("node") and name.endswith(".json"):
        return name[len("node"):-len(".json")]
    return None


def node_path(run_dir: str, key: str) -> str:
    return os.path.join(run_dir, NODES_DIR, node_filename(key))


def settings_path(run_dir: str, node: str | None = None) -> str:
    """Where a launcher leaves the settings its ranks boot with: one file
    per run, or per node in a job folder (each node's paths may differ)."""
    if node is None:
        return os.path.join(run_dir, SETTINGS_FILE)
    return os.path.join(run_dir, NODES_DIR, f"settings.node{node}.json")


def reserve_path(run_dir: str, owner: str) -> str:
    """The reserve of one writer of the run folder: a rank (its stem), the
    launcher of a one-node run (`launcher`), or a job's node (`node<K>`)."""
    return os.path.join(run_dir, RESERVE_PREFIX + owner)


def node_torchrun_status(key: str) -> str:
    """A node's torchrun record in a job folder (every node's agent writes
    its own), relative to the run folder."""
    return f"{NODES_DIR}/torchrun-status.node{key}.json"


def is_node_torchrun_status(name: str) -> bool:
    return name.startswith("torchrun-status.") and name.endswith(".json")


def child_path(run_dir: str, stem: str, pid: int) -> str:
    """What a process a rank's script started (`pid`) reports of itself."""
    return os.path.join(run_dir, CHILDREN_DIR, f"{stem}.pid{pid}.json")


def descendant_settings_path(run_dir: str, stem: str) -> str:
    """What the processes of a cluster a rank's script starts (Ray's) read
    at their start: where to count what they train (runtime/children.py)."""
    return os.path.join(run_dir, CHILDREN_DIR, f"{stem}.descendants.json")


def tracker_path(run_dir: str, stem: str) -> str:
    """The tracker runs a rank (`stem`) logged its figures into."""
    return os.path.join(run_dir, TRACKERS_DIR, f"{stem}.json")
