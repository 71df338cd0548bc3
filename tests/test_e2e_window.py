"""The detailed window (`--scheduler START END`) on real training loops: real
torch.profiler on CPU, real subprocesses.

One run of a DataLoader loop whose epoch boundaries fall before and inside
the window is read by several tests: its Operator table against
torch's own key_averages() of the same window, the exact number of steps
recorded, the exported trace, the Perf Summary and overhead line, and
`perfrun report` re-printing the tables from the saved files. Other runs
cover windows the script never reaches or leaves early,
`--stop-after-window`, and two gloo ranks all-reducing each step.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_TIMEOUT, PerfrunRun, e2e_environment, flat

import perfrun
from perfrun.analysis.window import sort_rows
from perfrun.runtime.window import PERFRUN_TRACK_TID
from perfrun.store.rankfile import RankResult
from perfrun.store.results import read_run

SCRIPTS = Path(__file__).parent / "scripts"
TRAIN = str(SCRIPTS / "win_train.py")
ALLREDUCE = str(SCRIPTS / "win_allreduce.py")

#: win_train.py by default: 5 epochs of 4 batches. Each epoch's end-of-data
#: fetch opens a step that StopIteration cancels, at steps 4, 8, 12, 16, 20.
TRAIN_STEPS = 20
START, END = 5, 10

pytestmark = pytest.mark.slow


def only_rank(run_dir: Path) -> RankResult:
    ranks = read_run(str(run_dir)).ranks
    assert [r.rank for r in ranks] == [0]
    return ranks[0]


def overview(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["type"]: o for o in summary["overview"]}


def section(out: str, title: str) -> str:
    """The printed table titled `title`, up to the next blank line."""
    assert title in out, out
    text = out[out.index(title) :]
    return text.split("\n\n", 1)[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the runs ----------------------------------------------------------------------
#
# Every run this file needs is started at once, in parallel (most of a run's
# wall time is torch's import and process start-up, not CPU), each writing
# its output to files; a test waits for the run it reads.

#: name -> perfrun arguments after `--log-dir`.
RUNS: dict[str, list[str]] = {
    # The epoch boundaries at steps 4 (the profiler's warm-up step) and 8
    # (inside the window) open and cancel a step each.
    "window": ["--scheduler", str(START), str(END), TRAIN],
    "after": ["--scheduler", "30", "35", TRAIN],
    # Starts on an epoch boundary, and the last one (step 20) falls after
    # the script's last step.
    "short": ["--scheduler", "16", "25", TRAIN],
    "stop": ["--scheduler", "2", "6", "--stop-after-window", TRAIN],
    # From the first step: no step before it for the profiler to warm up on.
    "first": ["--scheduler", "0", "2", TRAIN, "--lr-decay", "0.9"],
    "dist": ["--nproc-per-node", "2", "--master-port", "{port}", "--scheduler", "2", "5",
             ALLREDUCE, "--steps", "6"],
}


class Runs:
    def __init__(self, tmp: Path) -> None:
        self.key_averages = tmp / "window" / "key_averages.json"
        self.procs: dict[str, tuple[list[str], subprocess.Popen[bytes], Path]] = {}
        self.done: dict[str, PerfrunRun] = {}
        for name, args in RUNS.items():
            folder = tmp / name
            folder.mkdir()
            env = e2e_environment()
            if name == "window":
                env["PERFRUN_KEY_AVERAGES_OUT"] = str(self.key_averages)
            argv = ["--log-dir", str(folder / "log")]
            argv += [a.replace("{port}", str(free_port())) for a in args]
            with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "perfrun", *argv],
                    cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    start_new_session=True,  # its own group: torchrun's ranks stop with it
                )
            self.procs[name] = (argv, proc, folder)

    def __getitem__(self, name: str) -> PerfrunRun:
        if name not in self.done:
            argv, proc, folder = self.procs[name]
            try:
                returncode = proc.wait(timeout=E2E_TIMEOUT)
            except subprocess.TimeoutExpired:
                stop(proc)
                raise
            self.done[name] = PerfrunRun(
                argv, returncode, (folder / "stdout").read_bytes(),
                (folder / "stderr").read_bytes(), folder / "log", None,
            )
        return self.done[name]

    def close(self) -> None:
        for _argv, proc, _folder in self.procs.values():
            if proc.poll() is None:
                stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a run this file started, with the processes it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    started = Runs(tmp_path_factory.mktemp("window-runs"))
    try:
        yield started
    finally:
        started.close()


class WindowRun:
    def __init__(self, run: PerfrunRun, key_averages: Path) -> None:
        self.run = run
        self.key_averages = key_averages
        self.rank = only_rank(run.run_dir)
        self.summary: dict[str, Any] = self.rank.data["window_summary"]


@pytest.fixture(scope="module")
def window_run(runs: Runs) -> WindowRun:
    run = runs["window"]
    assert run.returncode == 0, run.describe()
    w = WindowRun(run, runs.key_averages)
    assert w.rank.data["faults"] == [], run.describe()
    assert len(w.rank.rows) == TRAIN_STEPS, run.describe()
    assert isinstance(w.summary, dict), run.describe()
    return w


def test_operator_table_agrees_with_torch_key_averages(window_run: WindowRun) -> None:
    # perfrun summarises the trace that torch.profiler exported; the
    # key_averages() table was written from the very same profiler object
    # in the same on_trace_ready call (PERFRUN_KEY_AVERAGES_OUT). Both
    # aggregate one recording, so every op's calls must match exactly and
    # its CPU total to within the trace's rounding of times.
    torch_table = json.loads(window_run.key_averages.read_text(encoding="utf-8"))
    ours = {o["name"]: o for o in window_run.summary["operators"]}
    assert ours, window_run.run.describe()
    for name, row in ours.items():
        assert name in torch_table, name
        theirs = torch_table[name]
        if name.startswith("aten::"):
            assert row["calls"] == theirs["count"], (name, row["calls"], theirs)
        total_us = row["total"] * 1e6
        tolerance = max(5.0, 0.01 * theirs["cpu_time_total_us"])
        assert total_us == pytest.approx(theirs["cpu_time_total_us"], abs=tolerance), name
    # And no aten op torch saw is missing from the Operator table.
    aten = {k for k in torch_table if k.startswith("aten::")}
    assert aten <= set(ours), aten - set(ours)
    # The model's two Linear layers run once a step: the window holds five
    # steps' worth, not four (an epoch boundary falls inside it).
    assert ours["aten::addmm"]["calls"] == 2 * (END - START)
    assert torch_table["aten::addmm"]["count"] == 2 * (END - START)


def test_window_holds_exactly_end_minus_start_steps(window_run: WindowRun) -> None:
    s = window_run.summary
    assert s["steps"] == END - START
    assert s["range"] == [START, END]
    o = overview(s)
    assert o["ProfileStep"]["calls"] == END - START
    for phase in ("Dataloader", "Forward", "Backward"):
        assert o[phase]["calls"] == END - START, phase
    # optimizer.step() and optimizer.zero_grad() are both Optimization.
    assert o["Optimization"]["calls"] == 2 * (END - START)
    # The user's own range, once a step; torch's annotations are not in it.
    assert [(u["name"], u["calls"]) for u in s["user_defined"]] == [
        ("win: bookkeeping", END - START)
    ]
    # No type is busier than the window.
    for row in s["overview"]:
        assert row["ratio"] is None or row["ratio"] <= 1.0 + 1e-9, row
    # A single CPU process: nothing is communication, nothing waits on a GPU.
    assert s["distributed"]["cpu"]["communication"] == 0.0
    assert s["memory_manipulation"]["sync_calls"] == 0
    assert not any("detailed window" in n for n in window_run.rank.data["notes"])
    assert "Distributed Summary" not in window_run.run.out


def test_trace_file_holds_perfrun_steps_and_phases(window_run: WindowRun) -> None:
    run_dir = window_run.run.run_dir
    path = run_dir / window_run.summary["trace"]
    assert path.parent == run_dir / "trace"
    assert path.name in ("rank0.pt.trace.json", "rank0.pt.trace.json.gz")
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    trace = json.loads(data)
    events = trace["traceEvents"]
    track = [e for e in events if e.get("tid") == PERFRUN_TRACK_TID and e.get("ph") == "X"]
    names = [e["name"] for e in track]
    steps = sorted(n for n in names if n.startswith("ProfileStep#"))
    assert steps == [f"ProfileStep#{i}" for i in range(START, END)]
    assert names.count("Dataloader") == END - START
    assert names.count("Forward") == END - START
    assert names.count("Backward") == END - START
    assert names.count("Optimization") == 2 * (END - START)
    # The step opened by the end-of-data fetch at step 8 and cancelled is
    # shown as what it was.
    assert names.count("DataLoader end of data") == 1
    # Every phase lies inside one of the steps.
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in track if e["name"].startswith("ProfileStep#")]
    for e in track:
        if e["name"] in ("Dataloader", "Forward", "Backward", "Optimization"):
            assert any(a - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= b + 1e-3 for a, b in spans), e
    # The track is named, and torch's own events are there too.
    assert any(
        e.get("ph") == "M" and e.get("tid") == PERFRUN_TRACK_TID
        and e["args"]["name"] == PERFRUN_TRACK_TID
        for e in events
    )
    assert any(e.get("cat") == "cpu_op" and e["name"] == "aten::addmm" for e in events)


def test_perf_summary_excludes_window_and_reports_overhead(window_run: WindowRun) -> None:
    out = window_run.run.out
    perf = section(out, "Perf Summary")
    # The window's steps and the profiler's warm-up step before it (profiled
    # too, its events discarded): all run under torch.profiler.
    assert f"window steps excluded: {END - START + 1}" in perf, perf
    # Quoted with how many steps each median is over and the others' spread
    # (or said not measurable, within that spread).
    assert re.search(
        r"profiler overhead: (not measurable: )?window steps [+-]\d+\.\d% vs steps outside"
        r".*\(median \d+\.\d{3} ms over \d+ steps vs \d+\.\d{3} ms over \d+, which "
        r"spread by ±\d+%\)",
        flat(out),
    ), out
    for title in ("Overview Summary", "Model Summary (window)", "Operator Summary",
                  "UserDefined Summary"):
        assert title in out, title


OP_ROW = re.compile(
    r"^(?P<name>\S.*?)\s+(?P<calls>\d+)\s+(?P<total>\d+\.\d{3})\s+(?P<avg>\d+\.\d{3})"
    r"\s+(?P<max>\d+\.\d{3})\s+(?P<min>\d+\.\d{3})\s+"
)


def test_report_reprints_window_tables_with_view_options(window_run: WindowRun) -> None:
    run_dir = window_run.run.run_dir
    proc = subprocess.run(
        [sys.executable, "-m", "perfrun", "report", str(run_dir), "--sort-by", "calls",
         "--row-limit", "3", "--time-unit", "us"],
        cwd=run_dir.parent,
        env=e2e_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=E2E_TIMEOUT,
    )
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    table = section(out, "Operator Summary")
    assert "sorted by calls" in table and "time unit: us" in table, table
    rows = [m for m in map(OP_ROW.match, table.splitlines()) if m]
    assert len(rows) == 3, table
    expected = sort_rows(window_run.summary["operators"], "calls")[:3]
    assert [int(m["calls"]) for m in rows] == [r["calls"] for r in expected], table
    calls = [int(m["calls"]) for m in rows]
    assert calls == sorted(calls, reverse=True)
    for m, r in zip(rows, expected):
        assert r["name"].startswith(m["name"].rstrip(".")), (m["name"], r["name"])
        # Microseconds, to three decimals.
        assert float(m["total"]) == pytest.approx(r["total"] * 1e6, abs=0.0015)
    assert "Overview Summary" in out
    assert "Time (us)" in section(out, "Overview Summary")


# -- windows the script does not fill ---------------------------------------------


def test_window_after_the_last_step_warns(runs: Runs) -> None:
    run = runs["after"]
    assert run.returncode == 0, run.describe()
    assert "Traceback" not in run.err
    assert "the detailed window [30, 35) starts after the script's last step" in run.out, (
        run.describe()
    )
    assert f"only {TRAIN_STEPS} steps ran" in " ".join(run.out.split())  # notes wrap at 80
    rank = run.rank0()
    assert rank.data["faults"] == []
    assert rank.data["window_summary"] is None
    assert f"detailed window [30, 35) never opened: the script ran {TRAIN_STEPS} steps" in (
        rank.data["notes"]
    )


def test_window_cut_short_by_the_end_warns(runs: Runs) -> None:
    run = runs["short"]
    assert run.returncode == 0, run.describe()
    assert "the script ended inside the detailed window [16, 25)" in run.out, run.describe()
    rank = run.rank0()
    assert rank.data["faults"] == []
    s = rank.data["window_summary"]
    # Steps 16..19 were recorded; the steps opened and cancelled by the
    # end-of-data fetches at 16 and 20 are not steps.
    assert s["steps"] == TRAIN_STEPS - 16
    assert s["range"] == [16, 25]
    assert overview(s)["ProfileStep"]["calls"] == TRAIN_STEPS - 16
    assert overview(s)["Forward"]["calls"] == TRAIN_STEPS - 16
    assert overview(s)["Dataloader"]["calls"] == TRAIN_STEPS - 16
    assert by_name(s["operators"])["aten::addmm"]["calls"] == 2 * (TRAIN_STEPS - 16)
    assert "detailed window [16, 25) ended early: the script's last step was 19" in (
        rank.data["notes"]
    )
    assert "Overview Summary" in run.out


def test_stop_after_window_ends_the_script_after_a_complete_window(runs: Runs) -> None:
    run = runs["stop"]
    assert run.returncode == 0, run.describe()
    assert "done" not in run.out  # the script's own last line never ran
    rank = run.rank0()
    assert rank.status == "stopped"
    assert rank.data["faults"] == []
    assert len(rank.rows) == 6
    s = rank.data["window_summary"]
    assert s["steps"] == 4
    assert s["range"] == [2, 6]
    assert overview(s)["ProfileStep"]["calls"] == 4
    assert overview(s)["Forward"]["calls"] == 4
    assert by_name(s["operators"])["aten::addmm"]["calls"] == 2 * 4
    assert not any("detailed window" in n for n in rank.data["notes"])
    assert (run.run_dir / s["trace"]).is_file()


def test_a_window_from_step_zero_warns_nothing_of_its_own(runs: Runs) -> None:
    """`--scheduler 0 2`: torch's schedule warns of a window with no warm-up
    step, from perfrun's file, in the script's output; perfrun's own
    schedule does not, and the script's own warning is untouched."""
    run = runs["first"]
    assert run.returncode == 0, run.describe()
    assert "UserWarning: --lr-decay is retired and ignored" in run.err, run.describe()
    warned = [line for line in run.err.splitlines() if "Warning:" in line]
    assert len(warned) == 1 and "win_train.py" in warned[0], run.describe()
    assert str(Path(perfrun.__file__).parent) not in run.err, run.describe()
    s = run.rank0().data["window_summary"]
    assert s["steps"] == 2 and s["range"] == [0, 2]
    assert overview(s)["ProfileStep"]["calls"] == 2


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in rows}


# -- two ranks -----------------------------------------------------------------


def test_two_gloo_ranks_show_communication(runs: Runs) -> None:
    run = runs["dist"]
    assert run.returncode == 0, run.describe()
    table = section(run.out, "Distributed Summary")
    assert "rank 0 (CPU)" in table and "rank 1 (CPU)" in table, table
    ranks = run.results().ranks
    assert sorted(r.rank for r in ranks) == [0, 1]
    for rank in ranks:
        assert rank.data["faults"] == [], rank.rank
        s = rank.data["window_summary"]
        assert s["steps"] == 3
        cpu = s["distributed"]["cpu"]
        assert cpu["communication"] > 0.0, rank.rank
        # The all-reduces (two parameters, three steps) are communication,
        # not computation: communication covers at least their own time.
        ops = by_name(s["operators"])
        allreduce = ops["c10d::allreduce_"]
        assert allreduce["calls"] == 2 * 3
        assert cpu["communication"] >= allreduce["total"] - 1e-6, (cpu, allreduce)
        assert cpu["computation"] >= ops["aten::addmm"]["total"] - 1e-6
        assert 0.0 <= cpu["overlap"] <= min(cpu["communication"], cpu["computation"])
