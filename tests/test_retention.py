"""A log folder that does not grow without bound: `--keep N` runs
(perfrun/launcher/retention.py), and a window's trace file bounded by
`--max-trace-mb` (runtime/window.py). The deciders on plain data, pruning
on hand-made folders, then real runs."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import E2E_TIMEOUT, e2e_environment, flat

from perfrun.cli import main
from perfrun.config import load_config
from perfrun.exitcodes import ExitCode
from perfrun.launcher import retention
from perfrun.launcher.retention import RunState, in_progress, runs_to_remove
from perfrun.runtime import window
from perfrun.settings import SettingsError
from perfrun.store.stepfile import STEP_COLUMNS

SCRIPTS = Path(__file__).parent / "scripts"
NOW = 1_000_000.0


def _run(name: str, started: float, ended: bool = True, alive: Any = None,
         last_write: float = 0.0, steps: int = 10) -> RunState:
    return RunState(name, started, ended, alive, last_write, steps)


# -- which runs go -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run, running",
    [
        (_run("a", 1.0, ended=True, alive=True), False),  # its launcher recorded the end
        (_run("a", 1.0, ended=False, alive=True), True),  # a process of it is alive here
        (_run("a", 1.0, ended=False, alive=False), False),  # all here, all dead
        (_run("a", 1.0, ended=False, last_write=NOW - 60), True),  # elsewhere, writing
        (_run("a", 1.0, ended=False, last_write=NOW - 7200), False),  # elsewhere, silent
    ],
)
def test_a_run_in_progress_is_one_that_may_still_write(run: RunState, running: bool) -> None:
    assert in_progress(run, NOW) is running


def test_all_but_the_newest_n_go_oldest_first() -> None:
    runs = [_run(f"r{i}", float(i)) for i in range(6)]
    assert runs_to_remove(runs, 3, "r5", NOW) == ["r0", "r1"]
    assert runs_to_remove(runs, 5, "r5", NOW) == []
    assert runs_to_remove(runs, 0, "r5", NOW) == []  # 0 keeps all


def test_the_current_run_is_kept_besides_n_and_never_goes() -> None:
    """Its steps are not known when it starts: it is not counted, and a
    clock set back, which makes it look oldest, does not remove it."""
    runs = [_run("now", 0.0, ended=False, alive=True, steps=0)] + [
        _run(f"r{i}", float(i)) for i in range(1, 4)]
    assert runs_to_remove(runs, 1, "now", NOW) == ["r1", "r2"]
    assert runs_to_remove(runs, 2, "now", NOW) == ["r1"]


def test_a_run_in_progress_is_kept_beyond_n() -> None:
    runs = [_run("old", 1.0, ended=False, alive=True), _run("mid", 2.0), _run("new", 3.0),
            _run("cur", 4.0)]
    assert runs_to_remove(runs, 1, "cur", NOW) == ["mid"]


def test_runs_without_steps_never_push_out_a_run_with_steps() -> None:
    """Twenty mistakes (a syntax error, --help, no torch: no step each)
    after twenty real runs: --keep 20 keeps the twenty real runs and drops
    the mistakes, oldest first, the real runs never."""
    real = [_run(f"real{i:02d}", float(i)) for i in range(20)]
    mistakes = [_run(f"oops{i:02d}", 100.0 + i, steps=0) for i in range(20)]
    current = _run("cur", 200.0, ended=False, alive=True, steps=0)
    assert runs_to_remove([*real, *mistakes, current], 20, "cur", NOW) == [
        f"oops{i:02d}" for i in range(20)]
    # With room to spare, the newest mistakes stay in it.
    assert runs_to_remove([*real[:5], *mistakes, current], 20, "cur", NOW) == [
        f"oops{i:02d}" for i in range(5)]
    # Over the limit on both counts: the runs without steps go first.
    assert runs_to_remove([*real, mistakes[0], current], 18, "cur", NOW) == [
        "oops00", "real00", "real01"]
    # A run without steps in progress is kept like any other.
    busy = _run("busy", 150.0, ended=False, alive=True, steps=0)
    assert runs_to_remove([*real, busy, current], 20, "cur", NOW) == []


# -- pruning a log folder ---------------------------------------------------------------------


def _made(log: Path, name: str, started: float, steps: int = 4, **meta: Any) -> Path:
    """A run folder: run.json and a rank file written by the same pid,
    which recorded `steps` steps."""
    folder = log / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"started": started, **meta}))
    row = [0.0, 1.0] + [0.0] * (len(STEP_COLUMNS) - 2)
    rank = {"format": "perfrun-results", "version": 1, "rank": 0, "status": "finished",
            "env": {"hostname": meta.get("host", "elsewhere"), "pid": meta.get("pid", 1)},
            "steps": {"columns": list(STEP_COLUMNS), "rows": [row] * steps}}
    if "returncode" not in meta:
        rank["status"] = "running"
    (folder / "rank0.json").write_text(json.dumps(rank))
    return folder


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.slow
def test_prune_removes_the_oldest_runs_perfrun_made(tmp_path: Path) -> None:
    log = tmp_path / "log"
    for i in range(4):
        _made(log, f"2026010{i + 1}-000000-{100 + i}", 10.0 + i, returncode=0)
    _made(log, "job-x", 5.0, returncode=0)  # a job folder, oldest of all
    _made(log, "mine", 1.0, returncode=0)  # a user's folder: never counted nor removed
    _made(log, "combined-job-x", 1.0, returncode=0)  # perfrun combine's: the same
    here = socket.gethostname()
    _made(log, "20250101-000000-1", 2.0, host=here, pid=os.getpid())  # in progress here
    _made(log, "20250101-000000-2", 3.0, host=here, pid=_dead_pid())  # died here
    current = _made(log, "20260201-000000-999", 20.0, host=here, pid=os.getpid())
    (log / "latest").symlink_to(current.name)
    _made(log, "20260105-000000-104", 14.5, steps=0, returncode=1)  # a newer mistake
    removed = retention.prune(str(log), 3, current.name)
    assert removed == ["20260105-000000-104", "20250101-000000-2", "job-x",
                       "20260101-000000-100"]
    assert sorted(p.name for p in log.iterdir()) == [
        "20250101-000000-1", "20260102-000000-101", "20260103-000000-102",
        "20260104-000000-103", "20260201-000000-999", "combined-job-x", "latest", "mine",
    ]
    note = retention.removal_note(removed, str(log), 3)
    assert note.startswith(f"removed 4 old runs from {log} (20260105-000000-104, "
                           "20250101-000000-2, job-x, ")
    assert note.endswith("keeping the newest 3 with steps, runs without steps first to go "
                         "(--keep N to change, --keep 0 keeps all)")


def test_a_half_removed_folder_is_cleared_and_never_read_as_a_run(tmp_path: Path) -> None:
    log = tmp_path / "log"
    leftover = log / f"{retention.REMOVING}20250101-000000-5-77"
    leftover.mkdir(parents=True)
    (leftover / "rank0.json").write_text("{")
    current = _made(log, "20260201-000000-9", 20.0)
    assert retention.prune(str(log), 5, current.name) == []
    assert [p.name for p in log.iterdir()] == [current.name]


# -- the options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--keep", "-1", "t.py"], "--keep cannot be negative (-1); 0 keeps every run"),
        (["--max-trace-mb", "-5", "t.py"], "--max-trace-mb cannot be negative"),
    ],
)
def test_negative_bounds_are_refused(capsys, argv: list[str], fragment: str) -> None:
    assert main(argv) == ExitCode.CONFIG
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and fragment in err[0]


def test_the_config_sets_both(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("Profiler:\n  keep: 5\n  max_trace_mb: 0.5\n")
    assert load_config(str(path)) == {"keep": 5, "max_trace_mb": 0.5}
    path.write_text("Profiler:\n  keep: many\n")
    with pytest.raises(SettingsError, match="Profiler.keep: expected an integer, got 'many'"):
        load_config(str(path))


@pytest.mark.slow
def test_keep_prunes_when_a_run_starts(tmp_path: Path) -> None:
    log = tmp_path / "log"
    for i in range(3):
        _made(log, f"2025010{i + 1}-000000-{i}", 1.0 + i, returncode=0)
    proc = subprocess.run(
        [sys.executable, "-m", "perfrun", "-q", "--log-dir", str(log), "--keep", "2",
         str(SCRIPTS / "no_torch.py")],
        cwd=tmp_path, env=e2e_environment(), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=E2E_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    # Laid out at 80 columns in a pipe, with a hanging indent (prose.note_for_stream).
    assert (
        f"perfrun: note: removed 1 old run from {log} (20250101-000000-0): keeping the newest "
        "2 with steps, runs without steps first to go (--keep N to change, --keep 0 keeps all)"
    ) in flat(proc.stderr)
    lines = proc.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("perfrun: note: removed"))
    note = lines[start:start + 1]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        note.append(line)
    assert len(note) > 1 and note[-1].endswith("keeps all)"), note
    # A line runs past 80 only where a path alone is longer.
    assert all(len(line) <= 80 or " " not in line.strip() for line in note), note
    names = sorted(p.name for p in log.iterdir() if not p.is_symlink())
    assert len(names) == 3 and names[:2] == ["20250102-000000-1", "20250103-000000-2"], names


MISTAKES = [
    ["{bad}"],  # a syntax error
    ["{train}", "--help"],  # the script's own help, exit 0
    ["{no_torch}"],  # never imports torch
    ["{train}", "--update", "sgd"],  # argparse refuses the choice, exit 2
]


@pytest.mark.slow
def test_twenty_failed_runs_keep_every_real_run(tmp_path: Path) -> None:
    """Two real runs, then twenty mistakes, each run by perfrun with
    --keep 2: the real runs are both kept, with their pages; the mistakes
    have no page and only the newest of them is left, beside the real ones."""
    log = tmp_path / "log"
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\ndef train(:\n    pass\n")
    paths = {"bad": str(bad), "train": str(SCRIPTS / "train_tensors.py"),
             "no_torch": str(SCRIPTS / "no_torch.py")}

    def perfrun(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perfrun", "--log-dir", str(log), "--keep", "2", *args],
            cwd=tmp_path, env=e2e_environment(), stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=E2E_TIMEOUT)

    for _ in range(2):
        real = perfrun(paths["train"], "--steps", "30")
        assert real.returncode == 0, real.stderr
    runs = sorted(p for p in log.iterdir() if not p.is_symlink())
    assert [(p / "report.html").is_file() for p in runs] == [True, True]
    for i in range(20):
        done = perfrun(*[a.format(**paths) for a in MISTAKES[i % len(MISTAKES)]])
        assert "internal error" not in done.stderr, done.stderr
        assert "report.html" not in os.listdir(log / "latest"), done.stderr
    left = sorted(p for p in log.iterdir() if not p.is_symlink())
    assert left[:2] == runs, [p.name for p in left]
    assert len(left) == 3 and left[2] == (log / "latest").resolve()



# -- the window's trace file ----------------------------------------------------------------


def _trace(steps: int, ops_per_step: int = 50) -> dict[str, Any]:
    """A trace shaped as the window exports it: perfrun's step ranges, CPU
    ops, a CUDA launch per step and the kernel it launched (running after
    its step ended), metadata."""
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1,
                                     "args": {"name": "python"}}]
    for s in range(steps):
        t0 = s * 1000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"{window.STEP_PREFIX}{s}",
                       "pid": 1, "tid": 1, "ts": t0, "dur": 1000.0})
        for k in range(ops_per_step):
            events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{k}", "pid": 1,
                           "tid": 1, "ts": t0 + 10 + k * 15, "dur": 10.0,
                           "args": {"Input Dims": [[64, 64]] * 4}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                       "tid": 1, "ts": t0 + 900, "dur": 5.0, "args": {"correlation": s}})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                       "ts": t0 + 1100, "dur": 50.0, "args": {"correlation": s}})
    return {"schemaVersion": 1, "traceEvents": events}


def _steps_in(events: list[dict[str, Any]]) -> list[int]:
    return sorted(int(e["name"][len(window.STEP_PREFIX):]) for e in events
                  if str(e.get("name", "")).startswith(window.STEP_PREFIX))


def test_a_trace_within_its_bound_is_written_whole() -> None:
    trace = _trace(5)
    data, gz, cut = window.fit_trace(trace, 10 << 20)
    assert cut is None and not gz and json.loads(data) == trace
    assert window.fit_trace(trace, 0)[2] is None  # 0: no bound


def test_a_trace_over_its_bound_keeps_its_first_steps_whole() -> None:
    trace = _trace(40)
    full, _ = window.encode_trace(trace)
    limit = len(full) // 4
    data, gz, cut = window.fit_trace(trace, limit)
    assert len(data) <= limit and not gz and cut is not None
    events = json.loads(data)["traceEvents"]
    kept = _steps_in(events)
    assert cut.steps == [0, len(kept)] and kept == list(range(len(kept)))
    assert 5 <= len(kept) < 10, kept  # near a quarter, never over the bound
    assert cut.full_bytes == len(full)
    # Metadata stays; each kept step has all its ops, and the kernel its
    # launch made although it ran after the step ended.
    assert events[0]["ph"] == "M"
    last = kept[-1]
    assert sum(1 for e in events if e.get("cat") == "cpu_op") == 50 * len(kept)
    assert {e["args"]["correlation"] for e in events if e.get("cat") == "kernel"} == set(kept)
    assert all(e["ts"] < (last + 1) * 1000.0 for e in events
               if e.get("cat") in ("cpu_op", "user_annotation"))


def test_a_gzipped_trace_is_bounded_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(window, "GZIP_ABOVE", 100_000)
    trace = _trace(200)
    full, gz = window.encode_trace(trace)
    assert gz and len(json.dumps(trace)) > window.GZIP_ABOVE
    limit = len(full) // 3
    data, gz, cut = window.fit_trace(trace, limit)
    assert gz and len(data) <= limit and cut is not None and cut.steps is not None
    assert _steps_in(json.loads(gzip.decompress(data))["traceEvents"]) == list(
        range(*cut.steps))


def test_a_first_step_over_the_bound_is_cut_inside() -> None:
    data, _gz, cut = window.fit_trace(_trace(2, ops_per_step=400), 4096)
    assert len(data) <= 4096 and cut is not None and cut.steps is None
    note = window.trace_cut_note(cut, 3, 5, 0.004)
    assert note.startswith("the window's trace file holds part of its first step of [3, 5)")


def test_trace_limit_reads_the_option() -> None:
    assert window.trace_limit(100) == 100 << 20
    assert window.trace_limit(0.5) == 1 << 19
    assert window.trace_limit(0) == window.trace_limit(None) == 0
    assert window.trace_limit(float("inf")) == 0


@pytest.mark.slow
def test_a_real_windows_trace_is_bounded_and_its_size_printed(tmp_path: Path) -> None:
    log = tmp_path / "log"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "perfrun", "-q", "--log-dir", str(log), "--scheduler", "2", "18",
         "--max-trace-mb", "0.05", str(SCRIPTS / "win_train.py")],
        cwd=tmp_path, env=e2e_environment(), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=E2E_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    [trace] = list((log / "latest" / "trace").iterdir())
    size = trace.stat().st_size
    assert size <= 0.05 * (1 << 20)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("Trace of the window"))
    assert f"trace/{trace.name} ({size / 1024:.0f} KiB)" in line, line
    assert "the window's trace file holds steps [2, " in proc.stdout, proc.stdout
    assert "over --max-trace-mb 0.05" in flat(proc.stdout)
    assert time.monotonic() - start < E2E_TIMEOUT
