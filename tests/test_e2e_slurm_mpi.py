"""A DDP job whose ranks a real launcher starts, each task with its own
perfrun (perfrun/launcher/external.py): `srun -n 2 perfrun ...` under a
real single-node Slurm, and `mpirun -n 2 perfrun ...` from Open MPI.

The Slurm is started by the `slurm` fixture from Debian's slurm-wlm and
munge: munged, slurmctld and slurmd on localhost, with a slurm.conf, a
munge key and every state and spool folder in a temporary folder, on
free ports, stopped after. The script (tests/scripts/ext_ddp.py) reads its
rank from the launcher's variables as Lightning and Megatron do, sets
MASTER_ADDR and MASTER_PORT itself, and prints how many optimizer steps it
took. Each run must leave one folder with both ranks, each rank counting
the script's own steps, and exactly one report across the two tasks'
output, with its Ranks table.

The pure parts (who a task is, which folder, who waits) are checked in
test_external_launchers.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from conftest import E2E_TIMEOUT, e2e_environment

from perfrun.store.results import read_run

SCRIPT = str(Path(__file__).parent / "scripts" / "ext_ddp.py")
#: The script's own count of its optimizer steps, one line a rank; the
#: ranks print to one output, so two lines may interleave: no anchors.
STEPS_LINE = re.compile(r"rank (\d+) of (\d+): (\d+) optimizer steps")
#: The report's first line: printed once for the whole job.
REPORT_HEAD = re.compile(r"^Command: ", re.M)
#: mpirun gives each rank a terminal for its stdout: colours and \r\n.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: How long a two-rank job of a few dozen steps may take on a busy machine.
JOB_TIMEOUT = 2 * E2E_TIMEOUT


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def perfrun_argv() -> list[str]:
    """`perfrun` as a task runs it: the console script beside this python."""
    script = Path(sys.executable).parent / "perfrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "perfrun"]


def launcher_environment(extra: dict[str, str]) -> dict[str, str]:
    """The tests' environment without any launcher's variables of the
    machine the tests run on (a CI job inside Slurm, or MPI), plus `extra`."""
    env = {k: v for k, v in e2e_environment().items()
           if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "PMI_"))}
    env.update(extra)
    return env


@dataclass
class Launched:
    argv: list[str]
    returncode: int
    out: str
    err: str

    def describe(self) -> str:
        return f"{self.argv} -> {self.returncode}\n--- stdout ---\n{self.out}\n" \
               f"--- stderr ---\n{self.err}"


def launch(argv: list[str], env: dict[str, str], cwd: Path,
           timeout: float = JOB_TIMEOUT) -> Launched:
    """Run a launcher in a session of its own, so that a hung job is ended
    whole (its tasks and ranks too), not only the launcher."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} ran past {timeout} s\n{out.decode()}\n{err.decode()}")
    clean = [ANSI.sub("", b.decode("utf-8", "replace")).replace("\r\n", "\n")
             for b in (out, err)]
    return Launched(argv, proc.returncode, clean[0], clean[1])


# -- a single-node Slurm ----------------------------------------------------------------

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")


@dataclass
class Slurm:
    conf: Path

    def environment(self) -> dict[str, str]:
        return launcher_environment({"SLURM_CONF": str(self.conf)})


def _slurm_conf(folder: Path, ctld_port: int, slurmd_port: int) -> str:
    return "\n".join([
        "ClusterName=perfrun",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder / 'munge' / 'munge.socket'}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "MpiDefault=none",
        "ReturnToService=2",
        # The node as configured, whatever this machine has.
        "SlurmdParameters=config_overrides",
        "NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
        "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """munged, slurmctld and slurmd on localhost, in the foreground as
    children of the tests (so they are stopped whatever happens), with
    everything they write in a temporary folder."""
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"no Slurm here ({', '.join(missing)} not on PATH): "
                    "apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("the test Slurm runs as root (SlurmUser=root)")
    folder = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log"):
        (folder / sub).mkdir(mode=0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = folder / "slurm.conf"
    conf.write_text(_slurm_conf(folder, free_port(), free_port()))
    munge = folder / "munge"
    logs = open(folder / "log" / "daemons.out", "wb")  # noqa: SIM115 - closed at teardown
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge / 'munge.socket'}",
             f"--key-file={key}", f"--log-file={munge / 'munged.log'}",
             f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}"],
            stdout=logs, stderr=subprocess.STDOUT))
        _wait_for(lambda: (munge / "munge.socket").exists(), 20, "munged's socket", folder)
        env = {**os.environ, "SLURM_CONF": str(conf)}
        procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                      stdout=logs, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(["slurmd", "-D", "-N", "localhost", "-f", str(conf)],
                                      env=env, stdout=logs, stderr=subprocess.STDOUT))

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                 text=True, timeout=20)
            return out.stdout.strip() == "idle"

        _wait_for(idle, 60, "the node to come up idle", folder)
        yield Slurm(conf)
    finally:
        _stop(procs)
        logs.close()


def _wait_for(ready: object, seconds: float, what: str, folder: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.3)
    logs = "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((folder / "log").iterdir()) if p.is_file())
    pytest.fail(f"the test Slurm did not start: no {what} after {seconds} s\n{logs}")


# -- what every run must leave -------------------------------------------------------------


def check_one_job(done: Launched, log_dir: Path, launcher: str) -> Path:
    """One folder with both ranks, each counting the script's own steps,
    one report across both tasks' output, and the job's other rank saying
    where the results are. Returns the folder."""
    assert done.returncode == 0, done.describe()
    runs = [p for p in log_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1, f"{runs}\n{done.describe()}"
    folder = runs[0]
    assert folder.name.startswith("job-"), folder

    run = read_run(str(folder))
    assert [r.rank for r in run.ranks] == [0, 1], done.describe()
    assert [r.data["world_size"] for r in run.ranks] == [2, 2]
    assert {r.status for r in run.ranks} == {"finished"} and run.missing == []
    own = {int(r): int(n) for r, world, n in STEPS_LINE.findall(done.out) if world == "2"}
    assert sorted(own) == [0, 1], done.describe()
    assert all(n > 20 for n in own.values()), own
    assert {r.rank: r.n_steps for r in run.ranks} == own, done.describe()

    assert len(REPORT_HEAD.findall(done.out)) == 1, done.describe()
    assert "Ranks: 2" in done.out
    table = done.out[done.out.index("\nRanks\n"):]
    assert re.search(r"^0 +finished", table, re.M) and re.search(r"^1 +finished", table, re.M), \
        done.describe()
    assert done.err.count("perfrun: profiling ") == 1, done.describe()
    other = (f"perfrun: rank 1 of 2 (a task of {launcher}): results in "
             f"{os.path.relpath(folder, log_dir.parent)}; the task of rank 0 prints the job's "
             "report")
    assert done.err.count(other) == 1, done.describe()
    assert done.err.count("perfrun: results saved in ") == 1

    meta = json.loads((folder / "run.json").read_text())
    assert meta["expected_ranks"] == 2 and meta["returncode"] == 0
    assert meta["job"]["launcher"] == launcher and meta["job"]["world_size"] == 2
    assert meta["launcher"] == launcher  # each rank's exit status is its own task's
    assert sorted(meta["nodes"]) == ["task0", "task1"]
    # One sampler on the host, which took the job's other rank for the job.
    sampled = [k for k, n in meta["nodes"].items() if n.get("host_load")]
    assert sampled == ["task0"], meta["nodes"]
    ours = {r.data["env"]["pid"] for r in run.ranks} | {n["pid"] for n in meta["nodes"].values()}
    others = {t["pid"] for t in meta["nodes"]["task0"]["host_load"]["top_others"]}
    assert not ours & others, meta["nodes"]["task0"]["host_load"]
    return folder


# -- the tests ---------------------------------------------------------------------------


@pytest.mark.slow
def test_srun_tasks_each_with_perfrun_make_one_job(slurm: Slurm, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    argv = ["srun", "-n", "2", "--kill-on-bad-exit=1", "-W", "120", *perfrun_argv(),
            "--log-dir", "log", SCRIPT, "--port", str(free_port())]
    done = launch(argv, slurm.environment(), tmp_path)
    folder = check_one_job(done, log_dir, "srun")
    assert re.fullmatch(r"job-slurm\d+\.0", folder.name), folder


@pytest.mark.slow
def test_a_batch_script_of_one_process_stays_rank_0_of_1(slurm: Slurm, tmp_path: Path) -> None:
    # `sbatch -n 2` gives the batch shell SLURM_PROCID=0 and SLURM_NTASKS=2,
    # yet the shell is one process: perfrun there is a run of its own.
    (tmp_path / "plain.py").write_text("print('plain run')\n")
    batch = tmp_path / "batch.sh"
    batch.write_text("#!/bin/sh\nexec " + " ".join(perfrun_argv())
                     + " --log-dir log plain.py\n")
    batch.chmod(0o755)
    done = launch(["sbatch", "--wait", "-n", "2", "-o", "batch.out", str(batch)],
                  slurm.environment(), tmp_path)
    output = (tmp_path / "batch.out").read_text()
    assert done.returncode == 0, done.describe() + output
    runs = [p for p in (tmp_path / "log").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1 and not runs[0].name.startswith("job-"), runs
    run = read_run(str(runs[0]))
    assert [(r.rank, r.data["world_size"]) for r in run.ranks] == [(0, 1)]
    assert "job" not in json.loads((runs[0] / "run.json").read_text())
    assert "plain run" in output and "results saved in" in output


def open_mpi() -> Optional[str]:
    """Why Open MPI's mpirun cannot be used here, or None."""
    if shutil.which("mpirun") is None:
        return "no mpirun on PATH: apt-get install openmpi-bin"
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                             timeout=30)
    if "Open MPI" not in version.stdout + version.stderr:
        return f"mpirun is not Open MPI's: {version.stdout.strip()[:80]}"
    return None


@pytest.mark.slow
def test_mpirun_ranks_each_with_perfrun_make_one_job(tmp_path: Path) -> None:
    why = open_mpi()
    if why is not None:
        pytest.skip(why)
    log_dir = tmp_path / "log"
    argv = ["mpirun", "-n", "2", "--allow-run-as-root", "--oversubscribe", *perfrun_argv(),
            "--log-dir", "log", SCRIPT, "--port", str(free_port())]
    done = launch(argv, launcher_environment({}), tmp_path)
    folder = check_one_job(done, log_dir, "mpirun")
    assert re.fullmatch(r"job-ompi\d+", folder.name), folder


@pytest.mark.slow
def test_perfrun_in_front_of_srun_follows_its_tasks(slurm: Slurm, tmp_path: Path) -> None:
    """`perfrun srun -n 2 python train.py`: one perfrun, srun starting the
    ranks (launchcommand.py); each task's python is a rank by what it runs
    and knows its place from SLURM_PROCID. One run folder, one report."""
    argv = [*perfrun_argv(), "--log-dir", "log", "--timer-only", "srun", "-n", "2", "-W",
            "120", sys.executable, SCRIPT, "--port", str(free_port())]
    done = launch(argv, slurm.environment(), tmp_path)
    assert done.returncode == 0, done.describe()
    runs = [p for p in (tmp_path / "log").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1, runs
    run = read_run(str(runs[0]))
    own = {int(r): int(n) for r, world, n in STEPS_LINE.findall(done.out) if world == "2"}
    assert sorted(own) == [0, 1] and {r.rank: r.n_steps for r in run.ranks} == own, \
        done.describe()
    assert [r.data["world_size"] for r in run.ranks] == [2, 2]
    assert len(REPORT_HEAD.findall(done.out)) == 1 and "Ranks: 2" in done.out, done.describe()
    assert "perfrun: under srun: its processes that run" in done.err
    assert json.loads((runs[0] / "run.json").read_text())["expected_ranks"] == 2
