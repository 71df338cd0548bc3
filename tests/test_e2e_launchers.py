"""perfrun in front of the user's own launch command, as one writes
`nsys profile torchrun ...`: torchrun, `python -m torch.distributed.run`,
`perfrun -m torch.distributed.run`, `accelerate launch` (its torch elastic
agent for several processes, a plain subprocess for one) and a program
perfrun does not know. Real launchers, real ranks on gloo; each rank's
steps are checked against the script's own count of its optimizer steps,
and every run is one folder with one report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import PerfrunRun, RunPerfrun, e2e_environment
from test_frameworks import FRAMEWORK_ENV, FRAMEWORKS

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
DDP = str(SCRIPTS / "ddp_torchrun.py")


def optimizer_steps(run: PerfrunRun) -> dict[int, int]:
    """Each rank's own count (ddp_torchrun.py's last line). Two ranks
    print to one stdout: their lines may interleave, so no line anchors."""
    found = re.findall(r"OPTIMIZER_STEPS rank=(\d+) world=\d+ steps=(\d+)", run.out)
    return {int(rank): int(steps) for rank, steps in found}


def check_ranks(run: PerfrunRun, steps: dict[int, int]) -> None:
    """One folder, one report, and each rank's steps the script's own."""
    assert run.returncode == 0, run.describe()
    results = run.results()
    seen = {r.rank: r.n_steps for r in results.ranks}
    assert seen == steps, run.describe()
    assert {r.data["world_size"] for r in results.ranks} == {len(steps)}
    assert run.out.count("Perf Summary") == 1, run.describe()
    assert "never imported torch" not in run.out and "no training loop" not in run.out


@pytest.mark.parametrize("spelling", ["torchrun", "python -m", "perfrun -m"])
def test_a_torchrun_command_gives_every_rank(
        run_perfrun: RunPerfrun, spelling: str) -> None:
    head = {"torchrun": ["torchrun"],
            "python -m": ["python", "-m", "torch.distributed.run"],
            "perfrun -m": ["-m", "torch.distributed.run"]}[spelling]
    run = run_perfrun("--timer-only", *head, "--nproc-per-node", "2", "--max-restarts", "0",
                      DDP, "2", "1", "--batch_size", "32", json_report=False)
    steps = optimizer_steps(run)
    assert steps == {0: 16, 1: 16}, run.describe()  # 512 samples / 2 ranks / 32, 2 epochs
    check_ranks(run, steps)
    assert "Ranks" in run.out
    # torchrun's agent is not a rank, and the option after the script was
    # the script's, not perfrun's --batch-size.
    meta = json.loads((run.run_dir / "run.json").read_text())
    assert meta["launcher"] == "torchrun" and meta["expected_ranks"] == 2
    assert "--max-restarts" in meta["child"]


def _accelerate_counts(run: PerfrunRun) -> list[dict[str, int]]:
    # Each process prints one; two processes' lines may interleave.
    return [json.loads(m) for m in re.findall(r"FRAMEWORK_COUNTS (\{[^{}]*\})", run.out)]


@pytest.mark.parametrize("processes", [2, 1])
def test_accelerate_launch_gives_the_processes_that_run_the_script(
        run_perfrun: RunPerfrun, processes: int) -> None:
    pytest.importorskip("accelerate")
    # Several processes on the CPU: accelerate's multi-process launcher
    # (its torch elastic agent, gloo); one: its plain subprocess.
    mode = ["--multi_gpu"] if processes > 1 else ["--cpu"]
    env = {**e2e_environment(), **FRAMEWORK_ENV}
    run = run_perfrun("--timer-only", "accelerate", "launch", *mode, "--num_processes",
                      str(processes), str(FRAMEWORKS / "accelerate_loop.py"),
                      json_report=False, env=env)
    counts = _accelerate_counts(run)
    assert len(counts) == processes, run.describe()
    check_ranks(run, {r: counts[r]["optimizer_steps"] for r in range(processes)})
    assert "under accelerate: its processes that run" in run.err


def test_a_launcher_perfrun_does_not_know_is_said_and_followed(
        run_perfrun: RunPerfrun, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch\n"
        "assert os.environ['FROM_ENV'] == '1'\n"
        "m = torch.nn.Linear(4, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(7):\n"
        "    o.zero_grad(); m(torch.randn(2, 4)).sum().backward(); o.step()\n"
    )
    run = run_perfrun("--timer-only", "env", "FROM_ENV=1", "python", str(script),
                      json_report=False)
    check_ranks(run, {0: 7})
    assert "env is no launcher perfrun knows" in run.err


def test_ray_trains_workers_are_named_with_their_optimizer_steps(
        run_perfrun: RunPerfrun, tmp_path: Path) -> None:
    """Ray Train's quickstart: `ray.init` starts a local cluster, whose
    workers run the training function. perfrun does not profile them as
    ranks, but counts what each trains and says where the training went,
    rather than that no training loop ran."""
    pytest.importorskip("ray.train")
    env = {**e2e_environment(), "RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    run = run_perfrun("--timer-only", str(SCRIPTS / "ray_train.py"), json_report=False,
                      env=env, timeout=600)
    assert run.returncode == 0, run.describe()
    # Each worker's own count, as it reported it after its last epoch.
    reported = {int(r): int(s) for s, r in
                re.findall(r"'steps': (\d+), 'rank': (\d+)\}", run.out + run.err)}
    assert reported == {0: 24, 1: 24}, run.describe()
    from perfrun.store.childfile import read_children

    found, bad = read_children(str(run.run_dir), "rank0")
    workers = [d for d in found if d["started_by"] == "ray" and d["optimizer_steps"]]
    assert bad == 0 and sorted(d["optimizer_steps"] for d in workers) == [24, 24], found
    assert {d["target"] for d in workers} == {"ray::RayTrainWorker"}
    text = " ".join(run.out.split())
    assert ("no training loop in the script's own process: 48 optimizer steps ran in 2 "
            "processes it started (ray::RayTrainWorker") in text, run.describe()
    assert "no forward, backward or optimizer step ran" not in text
    assert "never imported torch" not in text


def test_mpirun_with_perfrun_in_front_gives_every_rank(run_perfrun: RunPerfrun) -> None:
    """`perfrun mpirun -n 2 python train.py`: Open MPI starts the ranks
    (Debian's openmpi-bin), each reads its place from OMPI_COMM_WORLD_*;
    one folder, one report."""
    import shutil
    import socket

    if shutil.which("mpirun") is None:
        pytest.skip("needs Open MPI's mpirun (Debian's openmpi-bin; .ci/run installs it)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run = run_perfrun("--timer-only", "mpirun", "-n", "2", "--allow-run-as-root",
                      "--oversubscribe", "python", str(SCRIPTS / "ext_ddp.py"), "--port",
                      str(port), json_report=False)
    found = re.findall(r"rank (\d) of 2: (\d+) optimizer steps", run.out)
    steps = {int(r): int(s) for r, s in found}
    assert len(steps) == 2, run.describe()
    check_ranks(run, steps)
    assert "under mpirun: its processes that run" in run.err
    meta = json.loads((run.run_dir / "run.json").read_text())
    assert meta["expected_ranks"] == 2
