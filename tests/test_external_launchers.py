"""Ranks that srun or mpirun starts, each task running its own perfrun
(perfrun/launcher/external.py): who a task is, which folder it joins, which
task reports and how long it waits, and which processes of the host are
the job's. All on plain data: the environments below are what a real
Slurm 22.05 (Debian's slurm-wlm) and Open MPI 4.1 (openmpi-bin) gave their
tasks, trimmed to the variables of the launcher; the real launchers run
in test_e2e_slurm_mpi.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from builders import make_rank, make_run

from perfrun import commands
from perfrun.analysis.ranks import run_endings
from perfrun.launcher import external, hostload, job, launch
from perfrun.settings import Settings
from perfrun.store import runmeta
from perfrun.store.rankfile import launch_identity, rank_identity
from perfrun.store.results import live_ranks, read_run

# -- what the launchers set ----------------------------------------------------------

#: Task 1 of `srun -n 2` (one node, two CPUs).
SRUN_TASK1 = {
    "SLURMD_NODENAME": "localhost", "SLURM_CLUSTER_NAME": "perfrun", "SLURM_CPUS_ON_NODE": "2",
    "SLURM_GTIDS": "0,1", "SLURM_JOBID": "1", "SLURM_JOB_ID": "1", "SLURM_JOB_NAME": "bash",
    "SLURM_JOB_NUM_NODES": "1", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "1",
    "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NPROCS": "2", "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1", "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_SRUN_COMM_PORT": "38615",
    "SLURM_STEPID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_LAUNCHER_PORT": "38615",
    "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2", "SLURM_TASK_PID": "5586",
}
SRUN_TASK0 = {**SRUN_TASK1, "SLURM_LOCALID": "0", "SLURM_PROCID": "0", "SLURM_TASK_PID": "5585"}
#: The batch shell of `sbatch -n 2`: one process, though SLURM_PROCID and
#: SLURM_NTASKS are there; no step.
SBATCH_SHELL = {
    "SLURMD_NODENAME": "localhost", "SLURM_CLUSTER_NAME": "perfrun", "SLURM_CPUS_ON_NODE": "2",
    "SLURM_GTIDS": "0", "SLURM_JOBID": "2", "SLURM_JOB_ID": "2", "SLURM_JOB_NAME": "b.sh",
    "SLURM_JOB_NUM_NODES": "1", "SLURM_LOCALID": "0", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
    "SLURM_NPROCS": "2", "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "2",
    "SLURM_TASK_PID": "5704",
}
#: The shell `salloc -n 2` starts.
SALLOC_SHELL = {
    "SLURM_CLUSTER_NAME": "perfrun", "SLURM_JOBID": "3", "SLURM_JOB_ID": "3",
    "SLURM_JOB_NAME": "interactive", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
    "SLURM_NPROCS": "2", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2",
}
#: Rank 1 of `mpirun -n 2` (Open MPI 4.1.4).
MPIRUN_RANK1 = {
    "OMPI_APP_CTX_NUM_PROCS": "2", "OMPI_COMMAND": "bash", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_FIRST_RANKS": "0",
    "OMPI_MCA_ess": "^singleton", "OMPI_MCA_ess_base_jobid": "2052521985",
    "OMPI_MCA_ess_base_vpid": "1", "OMPI_MCA_orte_ess_num_procs": "2",
    "OMPI_MCA_orte_hnp_uri": "2052521984.0;tcp://192.0.2.2:38691;tcp6://[fd00::2]:34241",
    "OMPI_UNIVERSE_SIZE": "2", "PMIX_ID": "2052521985.1", "PMIX_NAMESPACE": "2052521985",
    "PMIX_RANK": "1", "PMIX_VERSION": "4.2.2rc2",
}
#: Rank 1 of `mpirun -n 2` inside `sbatch -n 2`: the batch shell's
#: SLURM_PROCID (0) is inherited by every rank.
MPIRUN_IN_SBATCH = {**SBATCH_SHELL, **MPIRUN_RANK1}
#: A rank of MPICH's hydra (`mpiexec -n 4`).
HYDRA_RANK2 = {"PMI_RANK": "2", "PMI_SIZE": "4", "PMI_FD": "6", "MPI_LOCALRANKID": "2",
               "MPI_LOCALNRANKS": "4"}
#: A torchrun worker inside an srun task (perfrun --nproc-per-node under srun).
TORCHRUN_IN_SRUN = {**SRUN_TASK1, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                    "TORCHELASTIC_RUN_ID": "none"}


@pytest.mark.parametrize(
    "environ, rank, local, world, source",
    [
        ({}, 0, 0, 1, None),
        (SRUN_TASK1, 1, 1, 2, "slurm"),
        (SRUN_TASK0, 0, 0, 2, "slurm"),
        (SBATCH_SHELL, 0, 0, 1, None),  # one process: never rank 0 of 2
        (SALLOC_SHELL, 0, 0, 1, None),
        (MPIRUN_RANK1, 1, 1, 2, "openmpi"),
        (MPIRUN_IN_SBATCH, 1, 1, 2, "openmpi"),  # Open MPI's own, not the batch shell's
        (HYDRA_RANK2, 2, 2, 4, "pmi"),
        (TORCHRUN_IN_SRUN, 3, 1, 4, "torchrun"),  # torchrun's own, not the task's
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, 1, 0, 2, "pmi"),  # no local rank given
        # Not a rank of the job the variables describe: the next launcher, or none.
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2", **SRUN_TASK1},
         1, 1, 2, "slurm"),
        ({"PMI_RANK": "x", "PMI_SIZE": "2"}, 0, 0, 1, None),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}, 0, 0, 1, "slurm"),
    ],
)
def test_a_rank_is_told_by_the_launcher_that_started_it(
    environ: dict[str, str], rank: int, local: int, world: int, source: Any
) -> None:
    ident = launch_identity(environ)
    assert (ident.rank, ident.local_rank, ident.world_size, ident.source) == (
        rank, local, world, source)
    assert rank_identity(environ) == {"rank": rank, "local_rank": local, "world_size": world,
                                      "restart": 0}


def test_torchruns_variables_are_read_as_they_always_were() -> None:
    assert rank_identity({"RANK": "2", "WORLD_SIZE": "4", "TORCHELASTIC_RESTART_COUNT": "1"}) \
        == {"rank": 2, "local_rank": 0, "world_size": 4, "restart": 1}
    assert rank_identity({"RANK": "bad"}) == {"rank": 0, "local_rank": 0, "world_size": 1,
                                              "restart": 0}


def test_reading_the_identity_changes_nothing_the_script_sees() -> None:
    environ = dict(SRUN_TASK1)
    rank_identity(environ)
    external.external_task(environ, False, ["train.py"])
    assert environ == SRUN_TASK1


# -- which job, which folder -----------------------------------------------------------


def _task(environ: dict[str, str], target: Any = ("train.py",)) -> external.ExternalTask:
    task = external.external_task(environ, False, list(target))
    assert task is not None
    return task


def test_a_task_of_srun_is_a_rank_of_the_slurm_job_step() -> None:
    task = _task(SRUN_TASK1)
    assert (task.rank, task.world_size, task.key, task.launcher) == (1, 2, "task1", "srun")
    assert (task.job.folder, task.job.id, task.job.source) == (
        "job-slurm1.0", "slurm1.0", "SLURM_JOB_ID")
    # Both tasks of the step agree on everything but who they are.
    zero = _task(SRUN_TASK0)
    assert (zero.job, zero.launch) == (task.job, task.launch) and zero.launch is not None


def test_a_rank_of_mpirun_is_named_by_open_mpis_job_id() -> None:
    task = _task(MPIRUN_RANK1)
    assert (task.job.folder, task.job.source, task.launcher) == (
        "job-ompi2052521985", "OMPI_MCA_ess_base_jobid", "mpirun")
    assert _task(MPIRUN_IN_SBATCH).job == task.job
    # Open MPI 5: no ORTE variables, a PMIx namespace naming mpirun.
    five = {k: v for k, v in MPIRUN_RANK1.items() if "ess_base" not in k and "orte" not in k}
    five["PMIX_NAMESPACE"] = "prterun-node1-4242@1"
    assert _task(five).job.folder == "job-" + job.safe_name("prterun-node1-4242@1")
    assert _task(five).launch == "PMIX_NAMESPACE:prterun-node1-4242@1"


def test_a_pmi_rank_takes_the_slurm_job_else_a_name_from_the_command() -> None:
    in_batch = _task({**SBATCH_SHELL, **HYDRA_RANK2})
    assert in_batch.job.folder == "job-slurm2" and in_batch.launch is None
    alone = _task(HYDRA_RANK2)
    assert alone.job.source == "derived" and alone.job.id is None
    assert _task({**HYDRA_RANK2, "PMI_RANK": "0"}).job == alone.job
    assert _task(HYDRA_RANK2, ["train.py", "--lr", "1"]).job != alone.job


@pytest.mark.parametrize(
    "environ, starts_ranks",
    [({}, False), (SBATCH_SHELL, False), (SALLOC_SHELL, False), (SRUN_TASK1, True),
     ({**SRUN_TASK1, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}, False)],
)
def test_no_job_of_tasks_where_one_process_runs_or_perfrun_starts_the_ranks(
    environ: dict[str, str], starts_ranks: bool
) -> None:
    # A batch script, a one-task step, or torchrun started by perfrun itself.
    assert external.external_task(environ, starts_ranks, ["train.py"]) is None


def test_each_launch_has_its_own_token() -> None:
    other_srun = {**SRUN_TASK1, "SLURM_SRUN_COMM_PORT": "40001"}
    assert _task(other_srun).launch != _task(SRUN_TASK1).launch
    assert _task(other_srun).job == _task(SRUN_TASK1).job  # a restarted controller's ids


RUN = job.NodeState(ended=False, alive=None, launch="A")
ENDED_A = job.NodeState(ended=True, alive=None, launch="A")
ENDED_B = job.NodeState(ended=True, alive=None, launch="B")
RUN_B = job.NodeState(ended=False, alive=None, launch="B")


@pytest.mark.parametrize(
    "nodes, me, launch, open_",
    [
        ({"task1": ENDED_A}, "task0", "A", True),  # a sibling failed at once: still this job
        ({"task1": RUN}, "task0", "A", True),
        ({"task0": ENDED_A}, "task0", "A", False),  # my slot is taken
        ({"task0": ENDED_B, "task1": ENDED_B}, "task0", "A", False),  # an earlier launch
        ({"task1": RUN_B}, "task0", "A", False),  # another launch, still running
        ({"task1": job.NodeState(True, None)}, "task0", None, False),  # no token: ends decide
        ({"task1": job.NodeState(False, None)}, "task0", None, True),
    ],
)
def test_a_task_joins_the_folder_of_its_own_launch(
    nodes: dict, me: str, launch: Any, open_: bool
) -> None:
    why = job.folder_is_open(True, True, nodes, me, launch)
    assert (why is None) is open_, why


def _write_task(run_dir: str, task: external.ExternalTask, facts: dict, **meta: Any) -> None:
    (Path(run_dir) / "nodes").mkdir(exist_ok=True)
    runmeta.write_job_meta(run_dir, task.key, {"started": 1.0, "task": external.task_record(
        task), "host": "elsewhere", "pid": 1, **meta}, facts)


def test_tasks_of_two_launches_of_one_job_id_get_two_folders(tmp_path: Path) -> None:
    first = [_task(SRUN_TASK0), _task(SRUN_TASK1)]
    facts = external.task_job_facts(first[0], ["train.py"])
    folder, _ = job.choose_job_folder(str(tmp_path), first[0].job, "task0", first[0].launch)
    # Rank 1's script failed before rank 0 chose: rank 0 still joins it.
    _write_task(folder, first[1], facts, returncode=1)
    again, skipped = job.choose_job_folder(str(tmp_path), first[0].job, "task0",
                                           first[0].launch)
    assert again == folder and skipped == []
    _write_task(folder, first[0], facts, returncode=0)
    # The same job id from a new srun (a controller whose ids started over).
    later = _task({**SRUN_TASK1, "SLURM_SRUN_COMM_PORT": "40001"})
    moved, skipped = job.choose_job_folder(str(tmp_path), later.job, "task1", later.launch)
    assert moved == str(tmp_path / "job-slurm1.0.2")
    assert skipped == ["job-slurm1.0 (node task1 already ran there)"]


def test_run_json_counts_the_jobs_tasks_as_its_ranks(tmp_path: Path) -> None:
    tasks = [_task(SRUN_TASK0), _task(SRUN_TASK1)]
    facts = external.task_job_facts(tasks[0], ["train.py"])
    assert (facts["world_size"], facts["nnodes"], facts["launcher"]) == (2, "2", "srun")
    _write_task(str(tmp_path), tasks[0], facts)
    meta = runmeta.read_run_meta(str(tmp_path))
    assert meta["expected_ranks"] == 2 and "returncode" not in meta
    _write_task(str(tmp_path), tasks[1], facts, returncode=0)
    _write_task(str(tmp_path), tasks[0], facts, returncode=3)
    meta = runmeta.read_run_meta(str(tmp_path))
    assert meta["returncode"] == 3 and sorted(meta["nodes"]) == ["task0", "task1"]


def test_each_rank_ends_with_its_own_tasks_status(tmp_path: Path) -> None:
    # Rank 1's script exited 3; srun then ended rank 0 with SIGTERM. run.json's
    # merged status is one task's: each rank's comes from its own record.
    tasks = [_task(SRUN_TASK0), _task(SRUN_TASK1)]
    facts = external.task_job_facts(tasks[0], ["train.py"])
    _write_task(str(tmp_path), tasks[0], facts, returncode=-15, launcher="srun")
    _write_task(str(tmp_path), tasks[1], facts, returncode=3, launcher="srun")
    meta = runmeta.read_run_meta(str(tmp_path))
    assert runmeta.task_exit_codes(meta) == {0: -15, 1: 3}
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(make_rank(rank=r, world_size=2).data))
    run = read_run(str(tmp_path))
    assert run.exit_codes == {0: -15, 1: 3}
    assert {r: e.status for r, e in run_endings(run).items()} == {0: -15, 1: 3}


# -- the launcher's side: the folder, the notice, the expected ranks ----------------------


def test_the_launcher_decides_before_the_script_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(launch.os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI", "RANK", "WORLD_SIZE")):
            monkeypatch.delenv(name)
    for name, value in SRUN_TASK1.items():
        monkeypatch.setenv(name, value)
    settings = Settings(script="train.py", log_dir=str(tmp_path / "log"))
    folder = launch.run_folder(settings)
    assert folder.path == str(tmp_path / "log" / "job-slurm1.0")
    assert folder.node == "task1" and folder.task is not None
    assert folder.job is not None and folder.job["world_size"] == 2
    assert launch.expected_ranks(settings, folder.task) == 2
    notice = launch.start_notice(settings, folder)
    assert notice == (f"perfrun: profiling train.py; results in {folder.path} (job slurm1.0 "
                      "from $SLURM_JOB_ID; rank 1 of 2, tasks of srun; every task writes "
                      "here, and rank 0 prints the report)")
    # torchrun, or a launcher's command, started by perfrun inside the task:
    # the task is a node, not a rank.
    assert launch.external_task(Settings(script="t.py", nproc_per_node=2)) is None
    assert launch.external_task(Settings(script="t.py", launch=("torchrun",),
                                         launch_kind="torchrun")) is None
    # nsys names its report for torchrun's RANK or rank 0: refused, not overwritten.
    with pytest.raises(launch.LaunchError, match="--nsys is not supported yet for ranks "
                       "that srun started"):
        launch.run_folder(Settings(script="train.py", log_dir=str(tmp_path / "n"), nsys=True))
    assert not (tmp_path / "n").exists()


def test_a_rank_on_another_host_is_running_while_its_own_task_is(tmp_path: Path) -> None:
    # Two tasks on one other host: each rank goes with its own task's record.
    ranks = []
    for r in (0, 1):
        path = tmp_path / f"rank{r}.json"
        path.write_text("{}")
        rank = make_rank(rank=r, world_size=2, status="running", hostname="elsewhere")
        rank.path = str(path)
        ranks.append(rank)
    nodes = {"task0": {"host": "elsewhere", "returncode": 0, "task": {"rank": 0}},
             "task1": {"host": "elsewhere", "task": {"rank": 1}}}
    assert live_ranks(make_run(ranks, meta={"nodes": nodes})) == {1}


# -- rank 0 waits, the others say where ------------------------------------------------


def _states(**kw: job.NodeState) -> dict[str, job.NodeState]:
    return dict(kw)


def test_which_tasks_rank_0_still_waits_for() -> None:
    nodes = _states(task0=RUN, task1=ENDED_A, task2=RUN,
                    task3=job.NodeState(ended=False, alive=False))
    # task3's launcher died on this host: it has ended; task4 has no record.
    assert external.unfinished_tasks(nodes, 5, 0) == ([2], [4])


@pytest.mark.parametrize(
    "running, absent, waited, done",
    [([], [], 0.0, True), ([2], [], 10.0, False), ([2], [], 180.0, True),
     ([], [4], 3.0, False), ([], [4], 10.0, True), ([2], [4], 60.0, False)],
)
def test_the_wait_is_bounded(running: list, absent: list, waited: float, done: bool) -> None:
    assert external.done_waiting(running, absent, waited) is done


def test_ranks_are_listed_as_runs() -> None:
    assert external.rank_list([3]) == "rank 3"
    assert external.rank_list([7, 1, 4, 5, 6, 2]) == "ranks 1, 2, 4-7"


def test_the_report_says_which_ranks_it_did_not_wait_for() -> None:
    assert external.unwaited_note([], [], 1.0) is None
    note = external.unwaited_note([2], [5, 6], 180.2)
    assert note == ("the job's report without waiting for rank 2 (their tasks had not ended "
                    "180 s after rank 0's script did: the report has them as they were); nor "
                    "for ranks 5, 6 (no record of their tasks in this folder: a log folder the "
                    "nodes do not share, or tasks that never started)")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_rank_0_waits_until_every_task_has_recorded_its_end(tmp_path: Path) -> None:
    tasks = [_task(SRUN_TASK0), _task(SRUN_TASK1)]
    facts = external.task_job_facts(tasks[0], ["train.py"])
    _write_task(str(tmp_path), tasks[0], facts, returncode=0)
    _write_task(str(tmp_path), tasks[1], facts)
    clock, told = Clock(), []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 7.0:  # rank 1 ends 7 s after rank 0
            _write_task(str(tmp_path), tasks[1], facts, returncode=0)

    waited = external.wait_for_tasks(str(tmp_path), tasks[0], told.append, clock=clock,
                                     sleep=sleep)
    assert (waited.running, waited.absent, waited.note) == ([], [], None)
    assert 7.0 <= waited.seconds <= 8.0
    assert told == ["rank 0 of job slurm1.0: waiting for rank 1 to end before the job's "
                    "report (at most 180 s)"]


def test_rank_0_stops_waiting_at_the_bound(tmp_path: Path) -> None:
    tasks = [_task(SRUN_TASK0), _task(SRUN_TASK1)]
    _write_task(str(tmp_path), tasks[1], external.task_job_facts(tasks[1], ["train.py"]))
    clock = Clock()
    waited = external.wait_for_tasks(str(tmp_path), tasks[0], lambda m: None, wait=30.0,
                                     clock=clock, sleep=clock.sleep)
    assert waited.running == [1] and 30.0 <= waited.seconds < 31.0
    assert waited.note is not None and "rank 1 (their tasks had not ended 30 s" in waited.note


def _outcome(task: external.ExternalTask, returncode: int, **kw: Any) -> launch.Outcome:
    return launch.Outcome(run_dir="log/job-slurm1.0", returncode=returncode,
                          command=["python", "train.py"], elapsed=1.0, task=task, **kw)


def test_a_task_other_than_rank_0_prints_one_line_and_keeps_its_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands.api, "run", lambda s, c: _outcome(_task(SRUN_TASK1), 3))
    monkeypatch.setattr(commands, "warm_report", lambda: None)
    code = commands._run_and_report(Settings(script="train.py"), None)
    out, err = capsys.readouterr()
    assert code == 3 and out == ""
    assert err == ("perfrun: rank 1 of 2 (a task of srun): results in log/job-slurm1.0; the "
                   "task of rank 0 prints the job's report\n")


def test_rank_0_says_what_its_report_did_not_wait_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    waited = external.Waited(running=[1], absent=[], seconds=180.0)
    monkeypatch.setattr(commands.api, "run",
                        lambda s, c: _outcome(_task(SRUN_TASK0), 0, waited=waited))
    monkeypatch.setattr(commands, "warm_report", lambda: None)
    shown: list[str] = []
    monkeypatch.setattr(commands, "show_report", lambda run_dir, *a, **k: shown.append(run_dir))
    monkeypatch.setattr(commands, "send_to_trackers", lambda *a: None)
    monkeypatch.setattr(commands, "write_report_html", lambda *a: None)
    code = commands._run_and_report(Settings(script="train.py"), None)
    err = capsys.readouterr().err
    assert code == 0 and shown == ["log/job-slurm1.0"]
    assert "perfrun: note: the job's report without waiting for rank 1" in err


# -- the host's load: the job's other tasks are the job ----------------------------------


def test_the_task_starter_is_the_nearest_launcher_daemon_above() -> None:
    # slurmstepd (10) started two perfruns (11, 12), each its script (13,
    # 14); task 2 through a wrapper shell (15). sshd (2) is unrelated.
    parents = {10: 1, 11: 10, 12: 10, 13: 11, 14: 12, 15: 10, 16: 15, 17: 16, 2: 1, 20: 2}
    names = {10: "slurmstepd", 11: "perfrun", 12: "perfrun", 13: "python3", 14: "python3",
             15: "bash", 16: "perfrun", 17: "python3", 2: "sshd", 20: "bash"}
    assert hostload.task_starter(parents, names, 11) == 10
    assert hostload.task_starter(parents, names, 16) == 10  # through the wrapper
    assert hostload.job_processes(parents, 11, 10) == {10, 12, 13, 14, 15, 16, 17}
    # No launcher daemon above: the launcher's own tree, as for a plain run.
    assert hostload.task_starter(parents, names, 20) is None
    assert hostload.job_processes(parents, 11) == {13}
    # mpirun's daemons started by srun: the nearest, so each host counts its own.
    parents.update({30: 10, 31: 30, 32: 31})
    names.update({30: "orted", 31: "perfrun", 32: "python3"})
    assert hostload.task_starter(parents, names, 31) == 30


def test_the_report_waits_for_the_warming_thread_before_it_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The report is built only once the thread that imports its modules
    during the run has finished: two threads importing the same package in
    opposite orders can deadlock on Python's module locks."""
    events: list[str] = []

    class Warming:
        def join(self, timeout: float) -> None:
            events.append(f"joined within {timeout:g} s")

    monkeypatch.setattr(commands, "warm_report", Warming)
    monkeypatch.setattr(commands.api, "run", lambda s, c: _outcome(_task(SRUN_TASK0), 0))
    monkeypatch.setattr(commands, "show_report",
                        lambda run_dir, *a, **k: events.append("report"))
    monkeypatch.setattr(commands, "send_to_trackers", lambda *a: None)
    monkeypatch.setattr(commands, "write_report_html", lambda *a: None)
    assert commands._run_and_report(Settings(script="train.py"), None) == 0
    assert events == [f"joined within {commands.WARM_WAIT:g} s", "report"]
