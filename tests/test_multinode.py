"""Several nodes of one torchrun job in one run folder (perfrun/launcher/job.py).

The deciders (the job's name, which folder a node joins, run.json merged
from the nodes' records) are checked on plain data; then two perfrun
launchers, started at once on this machine as nodes 0 and 1 of a c10d
rendezvous, each with one gloo rank, write one folder that `perfrun report`
reads as the whole job; and two with a log folder each are merged by
`perfrun combine`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import make_rank, make_run
from conftest import E2E_TIMEOUT, e2e_environment

from perfrun.cli import main
from perfrun.exitcodes import ExitCode
from perfrun.launcher import job as jobs
from perfrun.store import layout, runmeta
from perfrun.store.results import live_ranks, read_run

SCRIPTS = Path(__file__).parent / "scripts"
DDP = str(SCRIPTS / "proc_ddp.py")


# -- the job's name ------------------------------------------------------------------


def _name(rdzv_id: Any = None, env: Any = None, **kw: Any) -> jobs.JobName:
    args = {"endpoint": "10.0.0.1:29400", "master_addr": None, "master_port": None,
            "nnodes": "2", "nproc_per_node": 8, "target": ["train.py", "--lr", "3"]}
    args.update(kw)
    return jobs.job_name(rdzv_id, env or {}, **args)


def test_the_rendezvous_id_names_the_job() -> None:
    name = _name("exp42")
    assert (name.folder, name.id, name.source) == ("job-exp42", "exp42", "rdzv-id")


def test_torchruns_default_id_is_no_id() -> None:
    assert _name("none").source == "derived"


def test_a_slurm_job_id_names_the_job_when_no_id_is_given() -> None:
    name = _name(None, {"SLURM_JOB_ID": "123", "SLURM_STEP_ID": "0"})
    assert (name.folder, name.source) == ("job-slurm123.0", "SLURM_JOB_ID")
    assert _name("mine", {"SLURM_JOB_ID": "123"}).id == "mine"


def test_a_derived_name_is_the_same_on_every_node_and_differs_by_command() -> None:
    # Nothing node-specific (rank, host, clock) enters it.
    assert _name().folder == _name().folder
    assert _name().folder.startswith("job-")
    assert _name(target=["train.py", "--lr", "4"]).folder != _name().folder
    assert _name(endpoint="10.0.0.2:29400").folder != _name().folder


@pytest.mark.parametrize(
    "text, safe",
    [("exp-1.a_b", "exp-1.a_b"), ("a/b", None), ("..", None), ("x" * 80, None)],
)
def test_an_id_becomes_one_safe_path_component(text: str, safe: Any) -> None:
    out = jobs.safe_name(text)
    assert "/" not in out and out not in (".", "..") and len(out) <= 64
    if safe is not None:
        assert out == safe
    else:
        assert out != text and jobs.safe_name(text) == out
    # Ids that differ only in the replaced characters stay apart.
    assert jobs.safe_name("a/b") != jobs.safe_name("a:b")


@pytest.mark.parametrize(
    "nnodes, distributed, multi",
    [(None, True, False), ("1", True, False), (1, True, False), ("2", True, True),
     ("1:4", True, True), ("2", False, False)],
)
def test_which_runs_share_a_job_folder(nnodes: Any, distributed: bool, multi: bool) -> None:
    assert layout.is_multinode(nnodes, distributed) is multi


def test_job_facts_give_the_whole_jobs_world_size_where_it_is_fixed() -> None:
    name = _name("x")
    assert jobs.job_facts(name, "2", 8, ["t.py"])["world_size"] == 16
    assert jobs.job_facts(name, "1:4", 8, ["t.py"])["world_size"] is None
    assert jobs.job_facts(name, "3:3", 2, ["t.py"])["world_size"] == 6


# -- which folder a node joins -------------------------------------------------------

RUNNING = jobs.NodeState(ended=False, alive=None)
ENDED = jobs.NodeState(ended=True, alive=None)


@pytest.mark.parametrize(
    "exists, is_job, nodes, me, open_",
    [
        (False, False, {}, "0", True),  # a new job
        (True, True, {}, "1", True),  # another node just made it
        (True, True, {"0": RUNNING}, "1", True),  # node 0 of this job is there
        (True, True, {"0": RUNNING}, "0", False),  # my slot is taken: an earlier job
        (True, True, {"1": ENDED}, "0", False),  # a node has ended: an earlier job
        (True, True, {"1": jobs.NodeState(False, False)}, "0", False),  # its launcher died
        (True, False, {}, "0", False),  # some other run's folder
    ],
)
def test_a_node_joins_only_a_folder_of_its_own_job(
    exists: bool, is_job: bool, nodes: dict, me: str, open_: bool
) -> None:
    why = jobs.folder_is_open(exists, is_job, nodes, me)
    assert (why is None) is open_, why


def test_a_reused_id_moves_every_node_of_the_new_job_to_the_same_next_folder(
    tmp_path: Path,
) -> None:
    name = _name("fixed")
    job = jobs.job_facts(name, "2", 1, ["t.py"])
    first, _ = jobs.choose_job_folder(str(tmp_path), name, "0")
    second, _ = jobs.choose_job_folder(str(tmp_path), name, "1")
    assert first == second == str(tmp_path / "job-fixed")
    for key in ("0", "1"):
        runmeta.write_job_meta(first, key, {"started": 1.0, "returncode": 0}, job)
    # The same id again: both nodes see the earlier job ended and move on.
    again0, skipped = jobs.choose_job_folder(str(tmp_path), name, "0")
    again1, _ = jobs.choose_job_folder(str(tmp_path), name, "1")
    assert again0 == again1 == str(tmp_path / "job-fixed.2")
    assert skipped == ["job-fixed (node 0 already ran there)"]


# -- run.json from every node's record -----------------------------------------------


def _node(started: float, returncode: Any = None, **kw: Any) -> dict:
    return {"started": started, "returncode": returncode, "command": ["perfrun", "t.py"],
            "launcher": "torchrun", "expected_ranks": 1, **kw}


def test_run_meta_stays_open_until_every_node_has_ended() -> None:
    job = {"nnodes": "2", "world_size": 2}
    meta = runmeta.merge_node_metas({"1": _node(5.0, 0), "0": _node(3.0)}, job)
    assert "returncode" not in meta
    assert meta["started"] == 3.0 and meta["expected_ranks"] == 2
    assert list(meta["nodes"]) == ["0", "1"]
    ended = runmeta.merge_node_metas({"0": _node(3.0, 0, elapsed=9.0),
                                   "1": _node(5.0, 1, elapsed=4.0)}, job)
    assert ended["returncode"] == 1 and ended["elapsed"] == 9.0


def _write_node(run_dir: str, key: str) -> None:
    for i in range(5):
        runmeta.write_job_meta(run_dir, key, {"started": float(i), "n": i}, {"nnodes": "8"})


@pytest.mark.slow
def test_nodes_writing_at_once_all_end_up_in_run_json(tmp_path: Path) -> None:
    # Eight "nodes" rewrite their records at once, with no lock: the last
    # writer's re-check leaves every record in run.json.
    (tmp_path / "nodes").mkdir()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_node, args=(str(tmp_path), str(k))) for k in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    meta = json.loads((tmp_path / "run.json").read_text())
    assert sorted(meta["nodes"], key=int) == [str(k) for k in range(8)]
    assert all(n["n"] == 4 for n in meta["nodes"].values())


# -- a report during the run -----------------------------------------------------------


def test_a_rank_on_another_host_is_running_while_its_node_is(tmp_path: Path) -> None:
    path = tmp_path / "rank1.json"
    path.write_text("{}")
    rank = make_rank(rank=1, world_size=2, status="running", hostname="elsewhere",
                     settings={"node_rank": 1})
    rank.path = str(path)
    nodes = {"0": {"host": "here", "returncode": 0}, "1": {"host": "elsewhere"}}
    run = make_run([rank], meta={"nodes": nodes})
    assert live_ranks(run) == {1}
    # Its file not written for minutes: no longer taken for running.
    assert live_ranks(run, now=time.time() + 600) == set()
    nodes["1"]["returncode"] = 0
    assert live_ranks(make_run([rank], meta={"nodes": nodes})) == set()


# -- two nodes on this machine ----------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_nodes(work: Path, log_dirs: tuple[str, str], rdzv_id: Any = "X",
              script_args: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess[str]]:
    """Two perfrun launchers at once, nodes 0 and 1 of one c10d rendezvous,
    one gloo rank each; their exit statuses and output."""
    port = free_port()
    procs = []
    for node, log in enumerate(log_dirs):
        argv = [sys.executable, "-m", "perfrun", "--log-dir", log, "--nnodes", "2",
                "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}"]
        if rdzv_id is not None:
            argv += ["--rdzv-id", rdzv_id]
        argv += [DDP, "--steps", "3", *script_args]
        procs.append(subprocess.Popen(
            argv, cwd=work, env=e2e_environment(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=E2E_TIMEOUT)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def described(done: list[subprocess.CompletedProcess[str]]) -> str:
    return "\n".join(f"{d.args} -> {d.returncode}\n{d.stdout}\n{d.stderr}" for d in done)


def perfrun(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`perfrun ARGS` in this process (report and combine import no torch and
    start nothing: a subprocess would only add start-up time), from `work`."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["perfrun", *args], code, out.getvalue(), err.getvalue())


@pytest.mark.slow
def test_two_nodes_write_one_folder_that_reports_every_rank(tmp_path: Path) -> None:
    done = two_nodes(tmp_path, ("shared", "shared"))
    assert [d.returncode for d in done] == [0, 0], described(done)
    runs = [p for p in (tmp_path / "shared").iterdir() if p.is_dir() and not p.is_symlink()]
    assert [p.name for p in runs] == ["job-X"], described(done)
    folder = runs[0]
    assert (folder / "rank0.json").exists() and (folder / "rank1.json").exists()
    for node, d in enumerate(done):
        assert (f"results in shared{os.sep}job-X (job X from --rdzv-id; node {node} of 2; "
                "every node of the job writes here)") in d.stderr, d.stderr
    meta = json.loads((folder / "run.json").read_text())
    assert sorted(meta["nodes"]) == ["0", "1"]
    assert meta["returncode"] == 0 and meta["job"]["world_size"] == 2
    run = read_run(str(folder))
    assert [r.rank for r in run.ranks] == [0, 1]
    assert {r.status for r in run.ranks} == {"finished"}

    report = perfrun(tmp_path, "report", "shared")
    assert report.returncode == 0, report.stderr
    assert "Ranks: 2" in report.stdout
    table = report.stdout[report.stdout.index("\nRanks\n"):]
    assert "\n0 " in table and "\n1 " in table and "finished" in table, report.stdout


@pytest.mark.slow
def test_two_nodes_with_a_folder_each_are_combined_into_one(tmp_path: Path) -> None:
    # No --rdzv-id: both launchers derive the same job name from what they share.
    done = two_nodes(tmp_path, ("node0", "node1"), rdzv_id=None)
    assert [d.returncode for d in done] == [0, 0], described(done)
    folders = [next(p for p in (tmp_path / log).iterdir() if not p.is_symlink())
               for log in ("node0", "node1")]
    assert folders[0].name == folders[1].name and folders[0].name.startswith("job-")
    assert "named from the rendezvous address" in done[1].stderr
    assert len(list(folders[0].glob("rank*.json"))) == 1
    # A copy of node 0's folder given too: its rank is a duplicate.
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(folders[0]), str(copy)], check=True)

    combined = perfrun(tmp_path, "combine", str(folders[0]), str(folders[1]), str(copy),
                       "-o", "all")
    assert combined.returncode == 0, combined.stderr
    assert "combined ranks 0-1 from 3 folders into all; dropped 1 identical duplicate copy" \
        in combined.stderr
    run = read_run(str(tmp_path / "all"))
    assert [r.rank for r in run.ranks] == [0, 1]
    assert sorted(run.meta["nodes"]) == ["0", "1"] and run.meta["returncode"] == 0
    report = perfrun(tmp_path, "report", "all")
    assert report.returncode == 0 and "Ranks: 2" in report.stdout, report.stdout

    # Never over an existing folder.
    again = perfrun(tmp_path, "combine", str(folders[0]), str(folders[1]), "-o", "all")
    assert again.returncode == ExitCode.CONFIG
    assert again.stderr.strip().splitlines() == [
        "perfrun: error: all already exists; combine writes a new folder: give another -o or "
        "remove it first"
    ]
