"""Host memory over the run: the bounded series the flush thread keeps
(runtime/memory.py), the creep rule on hand-made points (analysis/memory.py),
the advice it gives, and real runs of two scripts that creep the way
training scripts do, each against its flat twin."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import RunPerfrun

from perfrun.analysis.advice import AdviceInputs, memory_creep
from perfrun.analysis.memory import (
    CREEP_MIN_BYTES,
    creep,
    memory_summary,
    steady_points,
)
from perfrun.runtime.memory import MAX_POINTS, HostMemory, Series, private_bytes

MIB = 1 << 20
SCRIPTS = Path(__file__).parent / "scripts"


# -- the series --------------------------------------------------------------------------


def test_a_series_stays_bounded_and_covers_the_whole_run() -> None:
    s = Series("main")
    for step in range(1_000_000):
        s.add(step, 100 + step)
    assert len(s.points) < MAX_POINTS
    assert s.points[0] == [0, 100]
    # The last point kept is near the end, and the points are evenly spread.
    assert s.points[-1][0] > 1_000_000 - 2 * s.stride
    gaps = {b[0] - a[0] for a, b in zip(s.points, s.points[1:])}
    assert gaps == {s.stride}
    assert s.peak == 100 + 999_999


def test_host_memory_samples_this_process_and_its_children() -> None:
    import subprocess
    import sys

    memory = HostMemory()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        for step in range(3):
            memory.sample(step * 0.01)
    finally:
        child.kill()
        child.wait()
    out = memory.summary()
    assert out["process"]["measure"] == "rss"
    assert [p[0] for p in out["process"]["points"]] == [0, 10, 20]
    assert out["process"]["peak"] > 10 * MIB
    (entry,) = [v for k, v in out["children"].items() if int(k) == child.pid]
    assert entry["measure"] in ("uss", "rss")
    assert len(entry["points"]) == 3
    assert out["limit"] and out["limit"] > out["process"]["peak"]


def test_private_bytes_of_this_process() -> None:
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        pytest.skip("no /proc/PID/smaps_rollup on this kernel")
    mine = private_bytes(os.getpid())
    assert mine is not None and mine > MIB
    assert private_bytes(2**22 + 1) is None


# -- the rule ----------------------------------------------------------------------------


def line(steps: range, start: float, per_step: float) -> list[tuple[int, int]]:
    return [(s, int(start + per_step * (s - steps.start))) for s in steps]


def test_steady_growth_is_creep_with_its_slope_and_projection() -> None:
    points = line(range(100, 1100, 20), 400 * MIB, 0.25 * MIB)  # 250 MiB per 1,000 steps
    c = creep(points, limit=4096 * MIB)
    assert c is not None
    assert c.per_1000_steps == pytest.approx(250 * MIB, rel=1e-3)
    assert c.r2 == pytest.approx(1.0)
    # From about 645 MiB at step 1080, (4096 - 645) / 0.25 steps more.
    assert c.full_at == pytest.approx(1080 + (4096 - 645) / 0.25, abs=2)


def test_a_flat_run_a_single_jump_and_small_growth_are_not_creep() -> None:
    flat = [(s, 500 * MIB + (s % 7) * 100_000) for s in range(0, 1000, 10)]
    assert creep(flat) is None
    jump = [(s, (500 if s < 500 else 800) * MIB) for s in range(0, 1000, 10)]
    assert creep(jump) is None
    small = line(range(0, 1000, 10), 500 * MIB, (CREEP_MIN_BYTES / 2) / 1000)
    assert creep(small) is None
    # Growth that stops after the first third: not steady.
    plateau = [(s, int((400 + min(s, 300) * 0.5) * MIB)) for s in range(0, 1000, 10)]
    assert creep(plateau) is None
    assert creep(line(range(0, 20, 10), 0, MIB)) is None  # too few points
    assert creep(line(range(0, 15, 5), 0, 8 * MIB)) is None  # over too few steps


def test_a_short_run_s_steady_growth_is_creep() -> None:
    """A DataLoader worker of a short run, read at each flush: 50 -> 194 MiB
    in four readings (a cache filled in `__getitem__`)."""
    worker = [(40, 50 * MIB), (120, 98 * MIB), (200, 146 * MIB), (280, 194 * MIB)]
    c = creep(worker)
    assert c is not None
    assert c.per_1000_steps == pytest.approx(600 * MIB, rel=1e-3)
    assert (c.first_step, c.last_step) == (40, 280)
    # Three readings are enough; a noisy but rising series too.
    assert creep(worker[1:]) is not None
    noisy = [(40, 50 * MIB), (120, 110 * MIB), (200, 135 * MIB), (280, 194 * MIB)]
    assert creep(noisy) is not None
    # Seven readings, 0 -> 60 MiB: below CREEP_MIN_POINTS, the short rule's.
    assert creep(line(range(0, 70, 10), 0, MIB)) is not None


def test_a_short_run_that_allocates_once_or_grows_a_little_is_not_creep() -> None:
    steps = range(40, 360, 80)  # four readings
    flat = [(s, 50 * MIB + (s % 3) * 200_000) for s in steps]
    assert creep(flat) is None
    # Loads its data once (a file opened lazily in the worker), then flat.
    for at in range(1, 4):
        jump = [(s, (50 if k < at else 194) * MIB) for k, s in enumerate(steps)]
        assert creep(jump) is None, at
    # Fills, then stops: growth between the last two readings is missing.
    plateau = [(40, 50 * MIB), (120, 120 * MIB), (200, 190 * MIB), (280, 191 * MIB)]
    assert creep(plateau) is None
    # Under CREEP_MIN_BYTES (30 MiB), and under a quarter of the start (a
    # rank's 300 -> 360 MiB: the long rule's 5% needs more readings).
    assert creep([(s, int((14 + (s - 40) / 320 * 40) * MIB)) for s in steps]) is None
    assert creep([(s, int((300 + (s - 40) / 320 * 80) * MIB)) for s in steps]) is None
    assert creep(line(range(100, 1100, 20), 300 * MIB, 0.06 * MIB)) is not None


def test_one_reading_is_neither_flat_nor_creep() -> None:
    """A worker read once (it lived through one flush): the table says so."""
    from perfrun.report.memory_blocks import memory_block

    steps = ([k * 0.01 for k in range(500)], 5.0)
    once = [[2500, 60 * MIB]]
    flat = [[10 * s, 500 * MIB] for s in range(0, 500, 10)]
    section = {
        "limit": 16 << 30,
        "process": {"name": "main", "measure": "rss", "peak": 500 * MIB, "points": flat},
        "children": {"101": {"name": "child process", "measure": "uss", "peak": 0,
                             "points": once}},
    }
    summary = memory_summary([(0, section, steps)], 3, {101: "DataLoader 0 worker"})
    assert summary is not None
    rank, worker = summary.processes
    assert (rank.judged, rank.steady, rank.creep) == (True, 45, None)
    assert (worker.judged, worker.steady, worker.samples, worker.creep) == (False, 1, 1, None)
    assert worker.to_dict()["judged"] is False
    rows = memory_block(summary).rows
    assert rows[0][-1] == "no creep"
    assert rows[1][-1] == "too few samples"


def test_the_warm_up_and_the_first_tenth_are_not_steady() -> None:
    points = [[s, s] for s in range(0, 1000, 50)]
    assert steady_points(points, warmup=3, last_step=999)[0] == (100, 100)
    assert steady_points(points, warmup=3, last_step=500)[-1] == (500, 500)
    assert steady_points(points, warmup=300, last_step=999)[0] == (300, 300)


def test_readings_are_placed_in_the_step_running_then() -> None:
    from perfrun.analysis.memory import placed

    # Steps of 10 ms from 1 s; readings in milliseconds on the same clock.
    starts = [1.0 + 0.01 * k for k in range(100)]
    ends = [s + 0.01 for s in starts]
    readings = [[500, 1], [1000, 2], [1055, 3], [1999, 4], [2000, 5], [2500, 6]]
    # Before the first step: start-up; after the last: the epilogue.
    assert placed(readings, starts, ends[-1]) == [(0, 2), (5, 3), (99, 4), (99, 5)]
    assert placed(readings, [], float("-inf")) == []


def test_workers_are_named_and_their_creep_given_once_for_all_of_them() -> None:
    # 500 steps of 10 ms; a reading every 100 ms.
    steps = ([k * 0.01 for k in range(500)], 5.0)
    growing = [[10 * s, int(20 * MIB + s * 0.15 * MIB)] for s in range(0, 500, 10)]
    flat = [[10 * s, 500 * MIB] for s in range(0, 500, 10)]
    section = {
        "limit": 16 << 30,
        "process": {"name": "main", "measure": "rss", "peak": 500 * MIB, "points": flat},
        "children": {
            "101": {"name": "child process", "measure": "uss", "peak": 0, "points": growing},
            "102": {"name": "child process", "measure": "uss", "peak": 0, "points": growing},
        },
    }
    summary = memory_summary([(0, section, steps)], 3, {101: "DataLoader 0 worker",
                                                     102: "DataLoader 0 worker"})
    assert summary is not None
    labels = [p.label for p in summary.processes]
    assert labels == ["rank 0", "rank 0 DataLoader 0 worker (pid 101)",
                      "rank 0 DataLoader 0 worker (pid 102)"]
    assert [p.pid for p in summary.creeping] == [101, 102]
    (advice,) = memory_creep(AdviceInputs(memory=summary))
    assert advice.kind == "memory-creep"
    assert "2 DataLoader 0 workers (pids 101, 102): private memory grew steadily" in advice.message
    assert "numpy arrays or tensors" in advice.actions[0]
    assert len(advice.evidence["processes"]) == 2
    assert memory_creep(AdviceInputs()) == []


# -- real runs ---------------------------------------------------------------------------


def printed(out: str, key: str) -> int:
    found = re.search(rf"{key} (\d+)", out)
    assert found, out
    return int(found.group(1))


def creeping(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in report["memory"]["processes"] if p["creep"]]


@pytest.mark.slow
def test_kept_outputs_creep_and_counted_ones_do_not(run_perfrun: RunPerfrun) -> None:
    """Every step's logits appended to a list for the epoch's metrics: the
    rank grows by one batch of logits a step, which the script prints."""
    script = str(SCRIPTS / "mem_outputs.py")
    run = run_perfrun("--flush-interval", "0.05", script)
    assert run.returncode == 0, run.describe()
    report = run.report()
    (rank,) = creeping(report)
    assert rank["label"] == "rank 0" and rank["measure"] == "rss"
    # The script's own reading after each step is the ground truth; what
    # it keeps is the floor (the heap grows by a little more than that).
    per_step = rank["creep"]["slope_bytes_per_step"]
    assert per_step == pytest.approx(printed(run.out, "RSS_SLOPE"), rel=0.1)
    assert per_step > 0.95 * printed(run.out, "LOGITS_BYTES")
    kinds = [a["kind"] for a in report["advice"]]
    assert "memory-creep" in kinds

    flat = run_perfrun("--flush-interval", "0.05", script, "--count")
    assert flat.returncode == 0, flat.describe()
    report = flat.report()
    assert report["memory"]["processes"][0]["samples"] >= 8
    assert creeping(report) == []
    assert "memory-creep" not in [a["kind"] for a in report["advice"]]


@pytest.mark.slow
def test_dataloader_workers_copying_python_objects_creep(run_perfrun: RunPerfrun) -> None:
    """A corpus held as lists of Python ints, read by two workers: each
    copies the pages of the rows it reads (half the batches each)."""
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        pytest.skip("a worker's private memory needs /proc/PID/smaps_rollup")
    script = str(SCRIPTS / "mem_workers.py")
    run = run_perfrun("--flush-interval", "0.1", script)
    assert run.returncode == 0, run.describe()
    report = run.report()
    workers = creeping(report)
    assert [w["kind"] for w in workers] == ["DataLoader 0 worker"] * 2
    assert all(w["measure"] == "uss" for w in workers)
    # Each worker reads half of each step's rows, and copies their pages.
    expected = printed(run.out, "BATCH_SIZE") / 2 * printed(run.out, "ROW_BYTES")
    for w in workers:
        assert w["creep"]["slope_bytes_per_step"] == pytest.approx(expected, rel=0.25)
    (advice,) = [a for a in report["advice"] if a["kind"] == "memory-creep"]
    assert "DataLoader 0 workers" in advice["message"]

    flat = run_perfrun("--flush-interval", "0.1", script, "--numpy")
    assert flat.returncode == 0, flat.describe()
    report = flat.report()
    assert [p["kind"] for p in report["memory"]["processes"]].count("DataLoader 0 worker") == 2
    assert creeping(report) == []


@pytest.mark.slow
def test_a_cache_filled_in_getitem_creeps_in_a_short_run(run_perfrun: RunPerfrun) -> None:
    """A few hundred steps, a few seconds: each of two workers caches the
    samples it decodes (about 130 MiB by the end) and is flagged; the same
    workers loading their table once, at their first sample, are not."""
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        pytest.skip("a worker's private memory needs /proc/PID/smaps_rollup")
    script = str(SCRIPTS / "mem_cache.py")
    run = run_perfrun("--flush-interval", "0.5", script)
    assert run.returncode == 0, run.describe()
    report = run.report()
    workers = [p for p in report["memory"]["processes"] if p["kind"] == "DataLoader 0 worker"]
    assert len(workers) == 2
    assert creeping(report) == workers
    cached = printed(run.out, "CACHED_BYTES")
    for w in workers:
        assert w["judged"] and w["steady_samples"] >= 3
        c = w["creep"]
        # The line over the steady steps: most of what the cache took.
        assert 0.5 * cached < c["last"] - c["first"] < 1.5 * cached
    (advice,) = [a for a in report["advice"] if a["kind"] == "memory-creep"]
    assert "a cache filled in __getitem__" in " ".join(advice["actions"])

    once = run_perfrun("--flush-interval", "0.5", script, "--load-once")
    assert once.returncode == 0, once.describe()
    report = once.report()
    workers = [p for p in report["memory"]["processes"] if p["kind"] == "DataLoader 0 worker"]
    assert len(workers) == 2 and all(w["judged"] for w in workers)
    assert creeping(report) == []


# -- the out-of-memory killer --------------------------------------------------------------


@pytest.fixture
def memory_cgroup(tmp_path: Path):
    """A memory cgroup of 1 GiB under this process's own, for a run the
    out-of-memory killer ends for real; skipped where one cannot be made
    (not root, no writable memory controller)."""
    from perfrun.runtime.memory import cgroup_dirs

    with open("/proc/self/cgroup", encoding="ascii") as f:
        dirs = cgroup_dirs(f.read())
    if not dirs:
        pytest.skip("no memory cgroup")
    folder = os.path.join(dirs[0], f"perfrun-oom-{os.getpid()}")
    try:
        os.mkdir(folder)
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    try:
        for name in ("memory.limit_in_bytes", "memory.max"):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                with open(path, "w", encoding="ascii") as f:
                    f.write(str(1 << 30))
                break
        else:
            pytest.skip("the memory cgroup has no limit to set")
        yield folder
    finally:
        try:
            os.rmdir(folder)
        except OSError:
            pass


@pytest.mark.slow
def test_a_rank_the_oom_killer_ends_is_named_with_its_step(memory_cgroup: str,
                                                           tmp_path: Path) -> None:
    """The kept-logits loop in a 1 GiB cgroup: the kernel's out-of-memory
    killer ends the script. perfrun's exit is the script's (SIGKILL: 137),
    and the report says who killed it, after how many steps, and its memory
    then."""
    import subprocess
    import sys

    from perfrun.analysis.build import build_report
    from perfrun.store.results import read_run

    log = tmp_path / "log"
    procs = os.path.join(memory_cgroup, "cgroup.procs")
    command = (f"echo $$ > {procs} && exec {sys.executable} -m perfrun --log-dir {log} "
               f"{SCRIPTS / 'mem_outputs.py'} --steps 5000")
    done = subprocess.run(["sh", "-c", command], capture_output=True, timeout=300)
    assert done.returncode in (137, -9), done.stderr.decode()
    (run_dir,) = [p for p in log.iterdir() if p.is_dir() and not p.is_symlink()]
    run = read_run(str(run_dir))
    assert run.meta["oom_kills"] >= 1
    report = build_report(run)
    (problem,) = report.problems
    steps = report.title.steps_recorded
    assert problem.startswith(
        f"rank 0: killed by the out-of-memory killer (SIGKILL) after {steps} steps")
    assert "its resident memory was" in problem and "it may use 1.0 GiB" in problem
    # The rank saw its cgroup's limit, not the machine's memory.
    assert report.memory is not None and report.memory.limit == 1 << 30


def test_cgroup_folders_innermost_first() -> None:
    from perfrun.runtime.memory import cgroup_dirs

    v1 = "4:memory:/process_api/abc\n1:cpu:/\n0::/\n"
    assert cgroup_dirs(v1, "/cg") == ["/cg/memory/process_api/abc", "/cg/memory/process_api",
                                      "/cg/memory"]
    v2 = "0::/system.slice/job.scope\n"
    assert cgroup_dirs(v2, "/cg") == ["/cg/system.slice/job.scope", "/cg/system.slice", "/cg"]
    assert cgroup_dirs("", "/cg") == []


def test_a_sigkill_with_an_oom_kill_in_the_cgroup_names_the_oom_killer() -> None:
    from builders import make_rank, make_rows

    from perfrun.analysis.ranks import Ending, rank_problem

    rank = make_rank(make_rows([{"forward": 0.01}] * 40), status="running")
    rank.data["memory"] = {"limit": 1 << 30, "process": {
        "name": "main", "measure": "rss", "peak": 900 << 20, "points": [[39, 900 << 20]]}}
    killed = rank_problem(rank, Ending(status=-9, oom_kills=1))
    assert killed is not None and killed.startswith(
        "killed by the out-of-memory killer (SIGKILL) after 40 steps (its resident memory was "
        "900 MiB at its last sample; it may use 1.0 GiB)")
    plain = rank_problem(rank, Ending(status=-9, oom_kills=0))
    assert plain is not None and plain.startswith("killed by SIGKILL after 40 steps")
