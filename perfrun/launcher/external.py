"""A job whose ranks another launcher started, each task running its own
perfrun: `srun -n 8 perfrun train.py`, `mpirun -n 8 perfrun train.py`.

There each task's perfrun sees one script of one process, and left to
itself would call it rank 0 of 1, write a folder of its own and print a
report of its own: eight reports interleaved on the job's output, each
counting the other seven ranks as other processes taking the CPU. The task
knows better from the environment its launcher gave it, before the script
starts: which rank it is and of how many (store/rankfile.py,
`launch_identity`: Open MPI's, PMI's or a Slurm step's variables), and an
id the job's tasks share (Slurm's job and step, Open MPI's job id). So
every task joins one job folder named after the job, as the nodes of a
multi-node torchrun job do (job.py: each task is a "node" `task<R>` of one
rank, with its own record in `nodes/`), and only the task of rank 0 prints
the job's report, once every task's record says it ended (or `WAIT`
seconds after its own script did); every other task says in one line
where the results are and who reports them.

perfrun reads these variables and never sets any: the script sees what its
launcher gave it, and reads its rank from it as it always did.

Everything that decides is a pure function of the environment or of the
node records; `wait_for_tasks` alone reads the folder, in a loop.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..store.layout import JOB_PREFIX
from ..store.rankfile import launch_identity
from ..store.runmeta import read_node_metas
from .job import JobName, NodeState, node_state, safe_name

#: Seconds the task of rank 0 waits, once its own script has ended, for
#: the other tasks to record their end before it prints the job's report
#: without them (naming them). The ranks of one job end within seconds of
#: each other; one that has not after three minutes is hung or stopped, and
#: the report says it is still running.
WAIT = 180.0
#: Seconds it waits for a task that has written no record at all: every
#: task writes its record before its script starts, so one missing when
#: rank 0's script has run to its end writes elsewhere (a log folder the
#: nodes do not share) or never started.
ABSENT_WAIT = 10.0
#: Seconds between two looks at the records, and before the first notice
#: that rank 0 is waiting.
POLL = 0.5
TELL_AFTER = 5.0
#: How each source's launcher is named to the user.
LAUNCHERS = {"slurm": "srun", "openmpi": "mpirun", "pmi": "an MPI launcher (PMI)",
             "torchrun": "a launcher that set RANK and WORLD_SIZE"}
#: And in run.json's `launcher` (the report reads each rank's exit status
#: from its task's record under any launcher but "python").
LAUNCHER_IDS = {"slurm": "srun", "openmpi": "mpirun", "pmi": "mpiexec", "torchrun": "tasks"}


@dataclass(frozen=True)
class ExternalTask:
    """This perfrun is task `rank` of `world_size`, each task one rank."""

    rank: int
    local_rank: int
    world_size: int
    #: Whose variables said so: "slurm", "openmpi", "pmi" or "torchrun"
    #: (RANK and WORLD_SIZE set by whatever started perfrun).
    source: str
    #: The job's folder name, the same in every task.
    job: JobName
    #: What this launch of the job shares and no other launch does (a
    #: folder holding a record of it is this job's: job.folder_is_open),
    #: or None where the launcher gives nothing of the kind.
    launch: Optional[str] = None

    @property
    def key(self) -> str:
        """The task's record in the job folder: `nodes/nodetask<R>.json`."""
        return task_key(self.rank)

    @property
    def launcher(self) -> str:
        return LAUNCHERS.get(self.source, self.source)

    @property
    def launcher_id(self) -> str:
        return LAUNCHER_IDS.get(self.source, self.source)


def task_key(rank: int) -> str:
    return f"task{rank}"


def external_task(environ: Mapping[str, str], starts_ranks: bool,
                  target: list[str]) -> Optional[ExternalTask]:
    """This perfrun as a task of an externally launched job, or None: a run
    of its own (no launcher's variables, or a job of one task), or one
    where perfrun starts the ranks itself (`starts_ranks`: torchrun, or a
    launcher's command after perfrun; the variables a Slurm task has then
    describe the task, a node of that job, not a rank)."""
    if starts_ranks:
        return None
    ident = launch_identity(environ)
    if ident.source is None or ident.world_size <= 1:
        return None
    return ExternalTask(
        rank=ident.rank, local_rank=ident.local_rank, world_size=ident.world_size,
        source=ident.source, job=task_job_name(environ, ident.source, ident.world_size, target),
        launch=launch_token(environ, ident.source),
    )


def _slurm_step(environ: Mapping[str, str]) -> Optional[str]:
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    step = environ.get("SLURM_STEP_ID", "").strip()
    return f"slurm{job}" + (f".{step}" if step else "")


def task_job_name(environ: Mapping[str, str], source: str, world_size: int,
                  target: list[str]) -> JobName:
    """The job's name, the same in every task: the MPI launcher's job id
    (Open MPI 4's `OMPI_MCA_ess_base_jobid`, else the PMIx namespace of
    Open MPI 5), else torchrun's run id, else the Slurm job and step
    (`slurm<JOB>.<STEP>`, as a multi-node torchrun job under Slurm is
    named), else a hash of what every task is given alike."""
    tried: list[tuple[str, Optional[str]]] = []
    if source == "openmpi":
        tried += [("OMPI_MCA_ess_base_jobid", "ompi"), ("PMIX_NAMESPACE", "")]
    if source == "torchrun":
        tried.append(("TORCHELASTIC_RUN_ID", ""))
    for var, prefix in tried:
        value = environ.get(var, "").strip()
        if value and value != "none":
            ident = f"{prefix}{value}"
            return JobName(JOB_PREFIX + safe_name(ident), ident, var)
    slurm = _slurm_step(environ)
    if slurm is not None:
        return JobName(JOB_PREFIX + safe_name(slurm), slurm, "SLURM_JOB_ID")
    shared = json.dumps([source, world_size, environ.get("MASTER_ADDR"),
                         environ.get("MASTER_PORT"), target])
    digest = hashlib.sha1(shared.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return JobName(f"{JOB_PREFIX}{digest}", None, "derived")


def launch_token(environ: Mapping[str, str], source: str) -> Optional[str]:
    """What every task of this launch is given alike and no other launch
    is: the address srun listens on for its tasks, with the job and step;
    the address of Open MPI's mpirun (its HNP), else its PMIx namespace
    (Open MPI 5's holds mpirun's pid). None where the launcher gives
    nothing of the kind: then a folder of the same name is told apart by
    its records' ends alone, as a torchrun job's is."""
    if source == "slurm":
        port = environ.get("SLURM_SRUN_COMM_PORT", "").strip()
        if port:
            return "srun:" + ":".join(environ.get(v, "").strip() for v in (
                "SLURM_CLUSTER_NAME", "SLURM_JOB_ID", "SLURM_STEP_ID",
                "SLURM_SRUN_COMM_HOST")) + f":{port}"
        return None
    if source == "openmpi":
        for var in ("OMPI_MCA_orte_hnp_uri", "PMIX_NAMESPACE"):
            value = environ.get(var, "").strip()
            if value:
                return f"{var}:{value}"
    return None


def task_job_facts(task: ExternalTask, target: list[str]) -> dict[str, Any]:
    """The `job` entry of run.json for a job of tasks: each task one node
    of one rank, so the world size is the task count."""
    return {
        "id": task.job.id,
        "name": task.job.folder,
        "source": task.job.source,
        "nnodes": str(task.world_size),
        "nproc_per_node": 1,
        "world_size": task.world_size,
        "script": target[0] if target else None,
        "launcher": task.launcher,
    }


def task_record(task: ExternalTask) -> dict[str, Any]:
    """What a task's own record adds to the launcher's: who it is."""
    return {"rank": task.rank, "local_rank": task.local_rank,
            "world_size": task.world_size, "source": task.source, "launch": task.launch}


# -- rank 0 waits for the others -------------------------------------------------------


def unfinished_tasks(nodes: Mapping[str, NodeState], world_size: int,
                     me: int) -> tuple[list[int], list[int]]:
    """(ranks whose task is running, ranks whose task has no record) among
    the job's other tasks. A task whose launcher is found dead on this
    host has ended too (killed outright: it could not record its end)."""
    running, absent = [], []
    for rank in range(world_size):
        if rank == me:
            continue
        state = nodes.get(task_key(rank))
        if state is None:
            absent.append(rank)
        elif not state.ended and state.alive is not False:
            running.append(rank)
    return running, absent


def done_waiting(running: list[int], absent: list[int], waited: float,
                 wait: float = WAIT, absent_wait: float = ABSENT_WAIT) -> bool:
    """Whether rank 0 stops waiting, `waited` seconds after its own script
    ended: every other task has ended, or the bound is reached (a task
    with no record is waited for `absent_wait` only)."""
    if waited >= wait:
        return True
    return not running and (not absent or waited >= absent_wait)


def rank_list(ranks: Iterable[int]) -> str:
    """`rank 3`, `ranks 1, 4-7`: a run of ranks as its first and last."""
    items = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else
                     f"{items[i]}, {items[j]}" if j == i + 1 else f"{items[i]}-{items[j]}")
        i = j + 1
    return ("rank " if len(items) == 1 else "ranks ") + ", ".join(parts)


def unwaited_note(running: list[int], absent: list[int], waited: float) -> Optional[str]:
    """What rank 0's report was printed without, or None."""
    parts = []
    if running:
        parts.append(f"{rank_list(running)} (their tasks had not ended {waited:.0f} s after "
                     "rank 0's script did: the report has them as they were)")
    if absent:
        parts.append(f"{rank_list(absent)} (no record of their tasks in this folder: a log "
                     "folder the nodes do not share, or tasks that never started)")
    if not parts:
        return None
    return "the job's report without waiting for " + "; nor for ".join(parts)


def waiting_notice(task: ExternalTask, running: list[int], absent: list[int],
                   wait: float = WAIT) -> str:
    return (f"rank 0 of job {task.job.id or task.job.folder}: waiting for "
            f"{rank_list(running + absent)} to end before the job's report (at most "
            f"{wait:.0f} s)")


def other_task_line(task: ExternalTask, run_dir: str) -> str:
    """What a task other than rank 0 prints, instead of a report."""
    return (f"rank {task.rank} of {task.world_size} (a task of {task.launcher}): results in "
            f"{run_dir}; the task of rank 0 prints the job's report")


@dataclass(frozen=True)
class Waited:
    #: Other tasks still running when rank 0 stopped waiting, and tasks
    #: with no record in the folder.
    running: list[int]
    absent: list[int]
    seconds: float

    @property
    def note(self) -> Optional[str]:
        return unwaited_note(self.running, self.absent, self.seconds)


def wait_for_tasks(
    run_dir: str,
    task: ExternalTask,
    tell: Callable[[str], None],
    wait: float = WAIT,
    absent_wait: float = ABSENT_WAIT,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Waited:
    """Rank 0's wait, after its own script ended and its record says so,
    for every other task's record to say the same (done_waiting). `tell`
    says once, after TELL_AFTER seconds, that it is waiting."""
    start = clock()
    told = False
    while True:
        nodes = {key: node_state(meta) for key, meta in read_node_metas(run_dir).items()}
        running, absent = unfinished_tasks(nodes, task.world_size, task.rank)
        waited = clock() - start
        if done_waiting(running, absent, waited, wait, absent_wait):
            return Waited(running, absent, waited)
        if not told and waited >= TELL_AFTER:
            tell(waiting_notice(task, running, absent if waited < absent_wait else [], wait))
            told = True
        sleep(POLL)
