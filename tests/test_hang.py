"""Hang diagnosis (perfrun/launcher/hang.py) on hand-written rank files: positions, the
odd one out, the report's text, the watch's timing, and `perfrun status`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from conftest import E2E_TIMEOUT, e2e_environment

from perfrun import cli
from perfrun.exitcodes import ExitCode
from perfrun.launcher.hang import (
    HangWatch,
    Position,
    hang_report,
    lag_note,
    odd_one_out,
    position_of,
    read_positions,
)
from perfrun.settings import Settings, SettingsError
from perfrun.store.layout import HANG_FILE, stack_path
from perfrun.store.stepfile import COL, STEP_COLUMNS, StepWriter

NOW = 1_700_000_000.0


def rank_doc(rank: int, step: Optional[int], phase: Optional[str], since: float = NOW - 30,
             status: str = "running", count: int = 0, pid: int = 0, buffered: bool = False,
             timer_only: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "perfrun-results", "version": 2, "rank": rank, "status": status,
        "env": {"pid": pid or None, "hostname": "elsewhere"},
        "settings": {"timer_only": timer_only},
        "steps": {"count": count},
    }
    if step is not None:
        doc["position"] = {"step": step, "phase": phase, "since_unix": since,
                           "step_since_unix": since - 1, "written_unix": NOW - 1,
                           "buffered": buffered}
    return doc


def pos(rank: int, step: Optional[int], phase: Optional[str], since: float = NOW - 30) -> Position:
    return position_of(rank_doc(rank, step, phase, since))


def test_the_odd_rank_is_named_with_its_phase_and_time() -> None:
    positions = [pos(0, 1204, "backward"), pos(1, 1204, "dataloader", NOW - 312),
                 pos(2, 1204, "backward"), pos(3, 1204, "backward")]
    assert odd_one_out(positions, NOW) == (
        "ranks 0,2,3 are in Backward at step 1204 (waiting in the gradient all_reduce, if "
        "DDP); rank 1 is in Dataloader at step 1204 for 312 s")


def test_two_ranks_the_one_further_on_is_waiting() -> None:
    positions = [pos(0, 3, "backward"), pos(1, 3, "forward", NOW - 7)]
    line = odd_one_out(positions, NOW)
    assert line is not None and line.startswith("rank 0 is in Backward at step 3")
    assert line.endswith("rank 1 is in Forward at step 3 for 7 s")


def test_no_odd_one_when_all_agree_or_unknown() -> None:
    assert odd_one_out([pos(0, 5, "backward"), pos(1, 5, "backward")], NOW) is None
    assert odd_one_out([pos(0, None, None), pos(1, 5, "forward")], NOW) is None


def test_report_lists_every_rank_and_its_stack() -> None:
    positions = [pos(0, 3, "backward"), pos(1, 3, "forward", NOW - 7)]
    text = hang_report(positions, {1: 'File "train.py", line 41 in forward\n'}, NOW, 60.0)
    lines = text.splitlines()
    assert lines[0] == "perfrun: hang: no rank has finished a step for 60 s"
    assert "rank 0   running   Backward at step 3 for 30.0 s" in text
    assert "--- rank 0 Python stack: not available" in text
    assert '  File "train.py", line 41 in forward' in text
    assert lines[-1].startswith("perfrun: hang: rank 0 is in Backward at step 3")


def test_the_lag_note_names_the_mode_the_run_used() -> None:
    """Positions handed over in batches lag; the note says in which mode:
    the default mode on a CPU run buffers as --timer-only does, and was
    called timer-only mode."""
    def buffered(rank: int, timer_only: bool) -> Position:
        return position_of(rank_doc(rank, 3, "forward", buffered=True, timer_only=timer_only))

    assert lag_note([pos(0, 3, "forward")]) is None
    default = lag_note([buffered(0, False)])
    assert default == ("(default mode on CPU: phase edges are handed over in batches, so a "
                       "rank's phase may lag it by up to 0.5 s)")
    assert lag_note([buffered(0, True)], status=True) == (
        "(timer-only mode: phase edges are handed over in batches, so positions may lag the "
        "ranks by up to 0.5 s, plus the 2 s between saves)")
    text = hang_report([buffered(0, False), buffered(1, False)], {}, NOW, 60.0)
    assert "  " + default in text.splitlines() and "timer-only" not in text


def test_files_without_a_position_are_read() -> None:
    p = position_of({"rank": 2, "status": "running"})
    assert (p.rank, p.step, p.phase, p.pid) == (2, None, None, None)


def write(run_dir: Path, docs: list[dict[str, Any]]) -> None:
    run_dir.mkdir(exist_ok=True)
    for d in docs:
        (run_dir / f"rank{d['rank']}.json").write_text(json.dumps(d))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_watch_reports_once_after_the_timeout_without_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("perfrun.launcher.hang.STACK_WAIT", 0.0)
    run = tmp_path / "run"
    write(run, [rank_doc(0, 3, "backward"), rank_doc(1, 2, "forward")])
    clock = Clock()
    watch = HangWatch(str(run), timeout=10.0, action="report", clock=clock)
    assert not watch.poll()
    clock.t = 8.0
    write(run, [rank_doc(0, 3, "backward"), rank_doc(1, 3, "forward")])  # progress
    assert not watch.poll()
    clock.t = 17.0
    assert not watch.poll()
    clock.t = 18.5
    assert watch.poll()
    text = (run / HANG_FILE).read_text()
    assert "no rank has finished a step for 10 s" in text
    assert "rank 1 is in Forward at step 3" in text
    assert watch.poll()  # once
    assert (run / HANG_FILE).read_text() == text


def test_finished_ranks_are_no_hang(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write(run, [rank_doc(0, 3, "others", status="finished")])
    clock = Clock()
    watch = HangWatch(str(run), timeout=1.0, action="report", clock=clock)
    watch.poll()
    clock.t = 5.0
    assert not watch.poll()
    assert read_positions(str(run))[0].status == "finished"


def test_stack_files_sit_beside_the_rank_files() -> None:
    assert stack_path("/r", 3) == os.path.join("/r", "stack.rank3.txt")
    assert stack_path("/r", 3, 2) == os.path.join("/r", "stack.rank3.restart2.txt")


def test_status_prints_each_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    write(run, [rank_doc(0, 3, "backward"), rank_doc(1, 3, "forward")])
    assert cli.main(["status", str(run)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "rank 0   running   Backward at step 3 for" in out
    assert "rank 1 is in Forward at step 3" in out


def test_status_of_a_missing_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", str(tmp_path / "nope")]) == ExitCode.BAD_RESULTS
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("perfrun: error: no such folder")
    assert cli.main(["status", str(tmp_path)]) == ExitCode.BAD_RESULTS
    assert capsys.readouterr().err.startswith("perfrun: error: no run in")
    write(tmp_path / "run", [rank_doc(0, 3, "backward")])
    assert cli.main(["status", str(tmp_path / "run" / "rank0.json")]) == ExitCode.BAD_RESULTS
    err = capsys.readouterr().err
    assert err == (f"perfrun: error: {tmp_path / 'run' / 'rank0.json'} is a file of the run "
                   f"folder {tmp_path / 'run'}: give the folder (perfrun report "
                   f"{tmp_path / 'run'})\n")


@pytest.mark.slow
def test_a_default_mode_hang_is_reported_in_the_default_mode(tmp_path: Path) -> None:
    """A CPU run in the default mode that stops making steps: `perfrun
    status` while it waits, and the hang report, name the mode it used."""
    log = tmp_path / "log"
    script = Path(__file__).parent / "scripts" / "lifecycle_wait.py"
    proc = subprocess.Popen(
        # Forty seconds: the watch counts from the start, and on a loaded
        # 2-core machine (the suite's own workers beside it) importing torch
        # took over 20 s; a hang then is reported before the mode is known.
        [sys.executable, "-m", "perfrun", "--log-dir", str(log), "--hang-timeout", "40",
         "--hang-action", "terminate", str(script), "--pid-dir", str(tmp_path), "--steps", "5",
         "--wait", "120"],
        cwd=tmp_path, env=e2e_environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    status = ""
    deadline = time.monotonic() + E2E_TIMEOUT
    # Until the lag note shows ("mode" alone is in this test's own folder
    # name, which the status prints).
    while time.monotonic() < deadline and proc.poll() is None and "edges are" not in status:
        time.sleep(0.5)
        if (tmp_path / "0.pid").exists():
            status = subprocess.run([sys.executable, "-m", "perfrun", "status", str(log)],
                                    capture_output=True, text=True, env=e2e_environment(),
                                    timeout=E2E_TIMEOUT).stdout
    out, err = proc.communicate(timeout=E2E_TIMEOUT)
    assert proc.returncode == ExitCode.HANG, err
    assert "(default mode on CPU: phase edges are handed over in batches, so positions" \
        in status, status
    assert "(default mode on CPU: phase edges are handed over in batches, so a rank's " \
        "phase may lag it by up to 0.5 s)" in " ".join(err.split()), err
    assert "timer-only" not in status + err


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_hang_timeout_must_be_positive(value: float) -> None:
    with pytest.raises(SettingsError, match="--hang-timeout must be a number of seconds"):
        Settings(script="t.py", hang_timeout=value).validate()


def test_hang_action_is_checked() -> None:
    with pytest.raises(SettingsError, match="--hang-action takes report or terminate"):
        Settings(script="t.py", hang_action="explode").validate()


def test_hang_options_reach_the_settings() -> None:
    settings = cli.settings_from_options({"hang_timeout": 30.0, "hang_action": "terminate",
                                          "script": "t.py"})
    assert (settings.hang_timeout, settings.hang_action) == (30.0, "terminate")


def test_the_report_fits_80_columns_and_keeps_the_stacks_as_they_are() -> None:
    """On stderr and in hang.txt the sentences wrap at 80 columns (eight
    ranks, some in another place, in the default mode on CPU); a stack's
    own lines are never broken."""
    def buffered(rank: int, step: int, phase: str, since: float) -> Position:
        return position_of(rank_doc(rank, step, phase, since, buffered=True))

    positions = [buffered(r, 1203, "backward", NOW - 640.0) for r in range(6)]
    positions += [buffered(6, 1203, "forward", NOW - 655.0),
                  buffered(7, 1202, "optimization", NOW - 700.0)]
    frame = ('  File "/home/someone/projects/a-long-project-name/src/training/'
             'distributed_loop.py", line 4123 in all_reduce_gradients_in_buckets')
    text = hang_report(positions, {7: frame + "\n"}, NOW, 640.0, width=80)
    lines = text.splitlines()
    assert "  " + frame in lines
    assert all(len(line) <= 80 for line in lines if line != "  " + frame), text
    joined = " ".join(line.strip() for line in lines)
    assert "rank 7 is in Optimization at step 1202" in joined
    assert "phase edges are handed over in batches" in joined


# -- a rank of thousands of steps a second --------------------------------------------------


def _steps_file(path: Path, n: int, step: float, start: float = 1.0) -> None:
    """`n` steps of `step` seconds each, as a run writes them."""
    rows = np.full((n, len(STEP_COLUMNS)), np.nan)
    rows[:, COL["start"]] = start + step * np.arange(n)
    rows[:, COL["end"]] = rows[:, COL["start"]] + step
    writer = StepWriter(str(path), STEP_COLUMNS)
    writer.append_held(rows.reshape(-1), n)
    writer.close()


def test_a_fast_rank_is_placed_by_its_step_and_pace_not_a_phase(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank of 3,000 steps a second was in Backward for a millisecond when
    it saved: "Backward at step 60953 for 1.7 s" said how old the save was.
    Its step and pace say where it is; the phase is said of a rank held in
    it, fast or not."""
    run = tmp_path / "run"
    run.mkdir()
    fast = rank_doc(0, 60_953, "backward", since=NOW - 1.7, count=60_953)
    fast["position"]["written_unix"] = NOW - 1.699  # a millisecond into Backward
    fast["steps"]["file"] = "rank0.steps"
    _steps_file(run / "rank0.steps", 200, 1 / 3000)
    held = rank_doc(1, 60_950, "forward", since=NOW - 30, count=60_950)
    held["steps"]["file"] = "rank1.steps"  # fast steps, but 30 s in Forward now
    _steps_file(run / "rank1.steps", 200, 1 / 3000)
    write(run, [fast, held])
    p0, p1 = read_positions(str(run), pace=True)
    assert p0.rate == pytest.approx(3000) and p0.step_time == pytest.approx(1 / 3000)
    assert p0.moving() and not p1.moving()
    assert p0.place(NOW) == "at step 60953, 3,000 steps/s"
    assert p1.place(NOW) == "Forward at step 60950 for 30.0 s"
    # Without its pace (the hang watch reads none), where it was, as before.
    assert read_positions(str(run))[0].place(NOW) == "Backward at step 60953 for 1.7 s"

    monkeypatch.setattr(time, "time", lambda: NOW)
    assert cli.main(["status", str(run)]) == ExitCode.OK
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "rank 0   running   at step 60953, 3,000 steps/s  (saved 2 s ago)"
    assert out[2] == "rank 1   running   Forward at step 60950 for 30.0 s  (saved 1 s ago)"
    # The odd one out is looked for among the ranks held in a phase: one.
    assert len(out) == 3 and all(len(line) <= 80 for line in out[1:])  # [0]: the folder


def test_status_lays_its_note_out_in_80_columns_in_a_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    run = tmp_path / "run"
    write(run, [rank_doc(0, 3, "backward", buffered=True, timer_only=True)])
    assert cli.main(["status", str(run)]) == ExitCode.OK
    out = capsys.readouterr().out.splitlines()
    note = out[out.index(next(line for line in out if line.startswith("(timer-only"))):]
    assert len(note) == 2 and note[1].startswith(" the ranks") and note[1].endswith("saves)")
    assert all(len(line) <= 80 for line in out[1:])  # [0]: the folder, a path
