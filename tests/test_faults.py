"""Fault injection: when something breaks, the script behaves as it would
without perfrun, and the report says what happened.

* perfrun's own hooks failing (broken from inside the script) never reach
  the script and are listed after the run;
* the script's own exceptions, raised inside a call perfrun wraps, keep
  their traceback and exit status;
* a torchrun rank SIGKILLed mid-run keeps its flushed steps and is marked;
* the disk filling up mid-run leaves the script alone;
* training in a process perfrun never entered (python -I, os.exec*) is
  reported as such, not as an empty run.

Already covered in test_e2e_process.py, so not repeated here: a SIGKILLed
single-process run, truncated and future-version results files, a log folder
that cannot be created, and a failing user sitecustomize.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT, START_NOTICE, e2e_environment, script_stderr

from perfrun.exitcodes import ExitCode
from perfrun.store.rankfile import read_rank_file
from perfrun.store.results import BOOTSTRAP_HINT

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
PERFRUN_DIR = Path(__file__).parent.parent / "perfrun"
FAULTS_TITLE = "perfrun's own hooks failed (the script was not affected)"


# -- helpers --------------------------------------------------------------------------


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python ARGS...` in `cwd` with the shared end-to-end environment."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=e2e_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=E2E_TIMEOUT,
    )


def perfrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run("-m", "perfrun", *args, cwd=cwd)


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout}\n"
        f"--- stderr ---\n{result.stderr}"
    )


def run_dir_of(log_dir: Path) -> Path:
    runs = [p for p in log_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1, runs
    return runs[0]


def rank_data(run_dir: Path, rank: int = 0) -> dict:
    """The rank's document as the reader sees it, its steps inline."""
    return read_rank_file(str(run_dir / f"rank{rank}.json")).inline()


def flat(text: str) -> str:
    """Text with every run of whitespace made one space: the tables wrap
    long lines at the terminal width."""
    return " ".join(text.split())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- perfrun's own faults ----------------------------------------------------------------

INJECT = SCRIPTS / "fault_inject.py"
INJECT_ARGS = ["--steps", "10", "--inject-at", "3", "--inject-steps", "3"]


@pytest.fixture(scope="module")
def plain_inject(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """The injection script under plain python (nothing to inject into)."""
    tmp = tmp_path_factory.mktemp("plain_inject")
    count = tmp / "count"
    result = run(str(INJECT), "--target", "tracker.begin", *INJECT_ARGS,
                 "--count-file", str(count), cwd=tmp)
    assert result.returncode == 0, describe(result)
    assert count.read_text() == "0"
    return result


@pytest.mark.parametrize(
    "target",
    [
        # Fails as each phase starts, before the script's own call.
        "tracker.begin",
        # Fails as each phase ends, after the script's call returned: its
        # result must still reach the script (the printed losses show it).
        "tracker.end",
    ],
)
def test_fault_in_perfrun_hook_never_reaches_the_script(
    tmp_path: Path, plain_inject: subprocess.CompletedProcess[str], target: str
) -> None:
    count = tmp_path / "count"
    log = tmp_path / "log"
    # --stop-after (past the end) keeps the clock live: each edge reaches the
    # tracker inside the hook, during the steps the script injects into,
    # rather than in a later replay of buffered edges (whose faults are
    # recorded as "replay", at moments the script cannot pin down).
    result = perfrun("--log-dir", str(log), "--stop-after", "1000", str(INJECT),
                     "--target", target, *INJECT_ARGS,
                     "--count-file", str(count), cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    # The script ran to its end with the same output, and saw no error.
    assert result.stdout.startswith(plain_inject.stdout), describe(result)
    assert script_stderr(result.stderr) == plain_inject.stderr.splitlines()
    assert "Traceback" not in result.stderr
    assert "injected" not in result.stderr
    injected = int(count.read_text())
    # Steps 3, 4 and 5 lose their phases (zero_grad, forward, backward and
    # step in 3; those and the fetch in 4 and 5), and step 6 its fetch.
    assert injected == 4 + 5 + 5 + 1

    # The rank file keeps every fault, with its count.
    data = rank_data(run_dir_of(log))
    assert data["status"] == "finished"
    faults = data["faults"]
    assert {f["error"] for f in faults} == {"RuntimeError: injected"}
    assert {f["where"] for f in faults} == {
        "dataloader", "forward", "backward", "optimizer.step", "optimizer.zero_grad"
    }
    assert sum(f["count"] for f in faults) == injected
    # The steps before the fault are intact.
    assert len(data["steps"]["rows"]) >= 3

    # And the report lists them after the tables.
    report = result.stdout[len(plain_inject.stdout) :]
    assert FAULTS_TITLE in report, describe(result)
    section = report[report.index(FAULTS_TITLE) :]
    for f in faults:
        assert f"{f['where']}: RuntimeError: injected (x{f['count']})" in section, section


# -- the script's own failures ---------------------------------------------------------------

USER_ERROR = SCRIPTS / "fault_user_error.py"


def traceback_frames(stderr: str) -> tuple[list[list[str]], list[str]]:
    """The last traceback in `stderr`: its frames (each the `File` line and
    the lines under it) and what follows them (the exception line)."""
    lines = stderr.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Traceback "))
    frames: list[list[str]] = []
    rest: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("  File "):
            frames.append([line])
        elif line.startswith("    ") and frames and not rest:
            frames[-1].append(line)
        else:
            rest.append(line)
    return frames, rest


def is_perfrun_frame(frame: list[str]) -> bool:
    return frame[0].startswith(f'  File "{PERFRUN_DIR}{os.sep}')


@pytest.mark.parametrize("where", ["dataloader", "forward", "backward", "optimizer"])
def test_script_exception_inside_wrapped_call_keeps_its_traceback(
    tmp_path: Path, where: str
) -> None:
    """At step 2 the Dataset, the forward, an autograd backward or the
    optimizer step raises ValueError, inside perfrun's wrapper.

    What perfrun shows: the exit status, the exception line and the whole
    traceback are Python's. The exception passes through the wrapper perfrun
    put around the call (`perfrun/runtime/hooks.py`), which adds a frame;
    perfrun's excepthook leaves that frame out of what is printed, so the
    printed traceback is frame for frame the plain run's.
    """
    args = [str(USER_ERROR), "--where", where]
    plain = run(*args, cwd=tmp_path)
    log = tmp_path / "log"
    under = perfrun("--log-dir", str(log), *args, cwd=tmp_path)

    assert plain.returncode == 1, describe(plain)
    assert under.returncode == plain.returncode, describe(under)
    assert under.stdout.startswith(plain.stdout)
    assert plain.stdout.splitlines()[-1] == "step 1 done"

    plain_frames, plain_rest = traceback_frames(plain.stderr)
    frames, rest = traceback_frames("\n".join(script_stderr(under.stderr)))
    assert rest == plain_rest == [f"ValueError: user failure in {where} at step 2"]
    assert not [f for f in frames if is_perfrun_frame(f)], frames
    assert frames == plain_frames
    # Everything the script printed before the traceback is unchanged too.
    start = plain.stderr.index("Traceback ")
    assert under.stderr[:start] == plain.stderr[:start]

    # Two steps were done; the one that raised is not counted as a third,
    # even when it raised inside the optimizer step that would close it.
    data = rank_data(run_dir_of(log))
    assert data["exit"]["exception"] == "ValueError"
    assert data["faults"] == []
    assert len(data["steps"]["rows"]) == 2
    assert "rank 0: raised ValueError after 2 steps" in under.stdout


@pytest.mark.parametrize("where", ["dataloader", "collate"])
def test_an_exception_in_a_dataloader_worker_keeps_its_traceback(
    tmp_path: Path, where: str
) -> None:
    """The Dataset or the collate_fn raises in a worker process: torch
    formats the traceback there and raises it again in the loop. perfrun
    times the collate in the worker and the fetch in the loop (the Data
    Pipeline), and neither wrapper shows: the whole stderr is the plain
    run's, the worker's traceback inside it included."""
    args = [str(USER_ERROR), "--where", where, "--workers", "1"]
    plain = run(*args, cwd=tmp_path)
    under = perfrun("--log-dir", str(tmp_path / "log"), *args, cwd=tmp_path)
    assert plain.returncode == under.returncode == 1, describe(under)
    assert under.stdout.startswith(plain.stdout)
    assert f"ValueError: user failure in {where} at step 2" in plain.stderr
    assert "DataLoader worker process 0" in plain.stderr
    # (script_stderr takes perfrun's closing lines off the end, and the
    # blank lines before them: the plain run's last line is blank too.)
    assert script_stderr(under.stderr) == plain.stderr.rstrip("\n").splitlines()


def test_sys_exit_inside_forward_passes_its_status(tmp_path: Path) -> None:
    args = [str(USER_ERROR), "--where", "forward", "--exit", "5"]
    plain = run(*args, cwd=tmp_path)
    log = tmp_path / "log"
    under = perfrun("--log-dir", str(log), *args, cwd=tmp_path)
    assert plain.returncode == 5
    assert under.returncode == 5, describe(under)
    assert under.stdout.startswith(plain.stdout)
    # (script_stderr takes perfrun's closing lines off the end, and the
    # blank lines before them: the plain run's last line is blank too.)
    assert script_stderr(under.stderr) == plain.stderr.rstrip("\n").splitlines()
    data = rank_data(run_dir_of(log))
    assert data["status"] == "finished"
    assert data["exit"] == {"exception": None, "signal": None}
    assert len(data["steps"]["rows"]) == 2


# -- a rank killed under torchrun ------------------------------------------------------------


def test_rank_sigkilled_under_torchrun_keeps_its_steps(tmp_path: Path) -> None:
    log = tmp_path / "log"
    done = tmp_path / "rank0-done"
    result = perfrun(
        "--log-dir", str(log), "--flush-interval", "0.2",
        "--nproc-per-node", "2", "--master-port", str(free_port()),
        str(SCRIPTS / "fault_rank_kill.py"), "--steps", "8", "--kill-at", "4",
        "--done-file", str(done),
        cwd=tmp_path,
    )
    # torchrun itself exits 1 whatever a rank did; perfrun reads how its
    # first failed worker ended (torchrun's own record) and dies the same way.
    assert result.returncode == -signal.SIGKILL, describe(result)
    run_dir = run_dir_of(log)
    status = json.loads((run_dir / "torchrun-status.json").read_text())
    assert status["first"] == "1"
    assert status["failures"]["1"]["exitcode"] == -signal.SIGKILL
    killed = rank_data(run_dir, 1)
    assert killed["status"] == "running"  # no final write, only flushes
    assert len(killed["steps"]["rows"]) == 4
    # Both ranks print to one stdout: a line may hold the other's too.
    assert len(re.findall(r"rank 1 step \d done", result.stdout)) == 4
    fine = rank_data(run_dir, 0)
    assert fine["status"] == "finished"
    assert fine["exit"] == {"exception": None, "signal": None}
    assert len(fine["steps"]["rows"]) == 8

    assert "Ranks: 2" in result.stdout
    assert re.search(r"^0\s+finished\s+8\s", result.stdout, flags=re.M), describe(result)
    # torchrun's record names the signal the rank file could not.
    assert re.search(r"^1\s+killed\s+4\s", result.stdout, flags=re.M), describe(result)
    problems = flat(result.stdout[result.stdout.index("Ranks with problems") :])
    assert re.search(r"rank 1: killed by SIGKILL after 4 steps; at most its last \d+\.\d s "
                     r"of steps .*are not in its results: a rank saves every 0\.2 s, and "
                     r"SIGKILL leaves it no time to save the rest", problems), problems
    assert "rank 0:" not in problems and "first rank to fail" not in problems


# -- the disk fills up mid-run -------------------------------------------------------------------


def test_full_disk_mid_run_leaves_the_script_alone(tmp_path: Path) -> None:
    args = [str(SCRIPTS / "fault_disk_full.py"), "--steps", "8", "--full-at", "4"]
    plain = run(*args, cwd=tmp_path)
    assert plain.returncode == 0, describe(plain)
    log = tmp_path / "log"
    under = perfrun("--log-dir", str(log), "--flush-interval", "0.2", *args, cwd=tmp_path)
    # The script succeeded; its results are incomplete: perfrun's own 74.
    assert under.returncode == ExitCode.INCOMPLETE == 74, describe(under)
    assert under.stdout.startswith(plain.stdout)
    # (script_stderr takes perfrun's closing lines off the end, and the
    # blank lines before them: the plain run's last line is blank too.)
    assert script_stderr(under.stderr) == plain.stderr.rstrip("\n").splitlines()
    # One line from perfrun in the script's process, with the steps it
    # could not save, then the launcher's: incomplete, not "saved".
    lines = [x for x in under.stderr.splitlines() if not x.startswith(START_NOTICE)]
    said = lines[len(plain.stderr.splitlines()) :]
    assert said[0] == ("perfrun: could not save results: [Errno 27] File too large (4 of the "
                       "8 steps that ran are not saved)"), said
    assert said[1:] == [f"perfrun: results saved in {run_dir_of(log)} are incomplete: rank 0 "
                        "ended without saving its final results: the steps after its last "
                        "save are not in them"], said
    assert "Traceback" not in under.stderr

    # What was flushed before the disk filled up is kept and reported.
    data = rank_data(run_dir_of(log))
    assert data["status"] == "running"
    assert len(data["steps"]["rows"]) == 4
    assert ("rank 0: exited with status 0 after 4 steps but never saved its final results"
            in flat(under.stdout)), describe(under)
    assert "writing them failed (a full disk?)" in flat(under.stdout)


def test_a_disk_full_before_the_first_step_is_no_run_without_a_loop(tmp_path: Path) -> None:
    """Issue 44: no file can grow from before the first step on (the
    script trains all 8 steps): no step is saved and the rank cannot save
    its end. perfrun does not say "no PyTorch training loop was seen": the
    rank says on stderr how many steps it ran and could not save, the
    headline that no step was saved, and perfrun exits 74, the script
    having succeeded."""
    args = [str(SCRIPTS / "fault_disk_full.py"), "--steps", "8", "--full-at", "0"]
    log = tmp_path / "log"
    under = perfrun("--log-dir", str(log), "--flush-interval", "0.2", *args, cwd=tmp_path)
    assert under.returncode == ExitCode.INCOMPLETE, describe(under)
    assert "training finished" in under.stdout
    assert ("perfrun: could not save results: [Errno 27] File too large (8 of the 8 steps "
            "that ran are not saved)") in under.stderr.splitlines(), describe(under)
    text = flat(under.stdout)
    assert "no PyTorch training loop was seen" not in text
    assert ("perfrun: no step was saved: rank 0 ended without saving its final results, and "
            "its last save held no step") in text, describe(under)
    assert under.stderr.splitlines()[-1] == (
        f"perfrun: results saved in {run_dir_of(log)} are incomplete: rank 0 ended without "
        "saving its final results: the steps after its last save are not in them")


# -- step files damaged after the run ----------------------------------------------------------


@pytest.fixture(scope="module")
def sixty_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 60 real training steps, to damage copies of."""
    tmp = tmp_path_factory.mktemp("sixty")
    log = tmp / "log"
    result = perfrun("--log-dir", str(log), "--timer-only",
                     str(SCRIPTS / "proc_train.py"), "--steps", "60", cwd=tmp)
    assert result.returncode == 0, describe(result)
    return run_dir_of(log)


def damaged_copy(run_dir: Path, tmp_path: Path, damage: Callable[[bytearray, int], None]) -> Path:
    """A copy of `run_dir` whose rank0.steps `damage` changed (given the
    file's bytes and where its rows start)."""
    import shutil

    from perfrun.store.stepfile import read_header

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    steps = copy / "rank0.steps"
    _, offset = read_header(str(steps))
    data = bytearray(steps.read_bytes())
    damage(data, offset)
    steps.write_bytes(bytes(data))
    return copy


def test_a_step_file_cut_short_is_reported_with_the_steps_it_kept(
    sixty_steps: Path, tmp_path: Path
) -> None:
    """A copy that kept one step and part of the next: the report uses
    that step and says so, where it used to report it as the whole run."""
    row = 8 * 17

    def cut(data: bytearray, offset: int) -> None:
        del data[offset + row + 50:]

    copy = damaged_copy(sixty_steps, tmp_path, cut)
    result = perfrun("report", str(copy), cwd=tmp_path)
    assert result.returncode == ExitCode.OK, describe(result)
    assert "Steps: 1 counted of 1 recorded" in result.stdout
    assert ("rank 0: its step file rank0.steps is cut short: it holds 1 step of the 60 "
            "rank0.json counts, so this report uses step 0 and steps 1 to 59 are lost"
            in flat(result.stdout)), describe(result)
    assert result.stderr == ""


def test_garbage_in_a_step_file_is_one_line_and_66(sixty_steps: Path, tmp_path: Path) -> None:
    """Random bytes over steps 10 to 19 are refused, naming the step,
    where they were averaged into a 1e115 ms batch_cost with numpy's
    warnings on stderr."""
    import random

    row = 8 * 17

    def scramble(data: bytearray, offset: int) -> None:
        rng = random.Random(1)
        for i in range(offset + 10 * row, offset + 20 * row):
            data[i] = rng.randrange(256)

    copy = damaged_copy(sixty_steps, tmp_path, scramble)
    result = perfrun("report", str(copy), cwd=tmp_path)
    assert result.returncode == ExitCode.BAD_RESULTS, describe(result)
    assert result.stdout == ""
    assert re.fullmatch(
        rf"perfrun: error: cannot read {re.escape(str(copy / 'rank0.steps'))}: step 10 has "
        r"[a-z_]+ = \S+( s)?: the file is damaged\n", result.stderr), result.stderr


# -- training where perfrun cannot be ------------------------------------------------------------


@pytest.mark.parametrize("how", ["exec", "spawn"])
def test_training_in_an_isolated_interpreter_is_reported(tmp_path: Path, how: str) -> None:
    """The script starts Python again with -I (no PYTHONPATH, so no
    bootstrap) and trains there: by os.execv, or in a subprocess."""
    log = tmp_path / "log"
    result = perfrun("--log-dir", str(log), str(SCRIPTS / "fault_reexec.py"), "--how", how,
                     cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert "step 4 done\ntraining finished\n" in result.stdout
    out = flat(result.stdout)
    assert "perfrun: no PyTorch training loop was seen" in out
    assert flat(BOOTSTRAP_HINT) in out
    run_dir = run_dir_of(log)
    data = rank_data(run_dir)
    assert data["steps"]["rows"] == []
    assert data["torch_imported"] is False
    exec_problem = ("rank 0: exited with status 0 before its first step but never saved "
                    "its final results: it re-executed itself (os.exec*)")
    if how == "exec":
        # The pid's first program never reached its exit handler: it is not
        # reported as dead.
        assert data["status"] == "running"
        assert exec_problem in out
        assert "died" not in out
    else:
        assert data["status"] == "finished"
        assert "Ranks with problems" not in out

    # `perfrun report` says the same, and that there is no measurement.
    again = perfrun("report", str(run_dir), cwd=tmp_path)
    assert again.returncode == ExitCode.NO_MEASUREMENT, describe(again)
    assert flat(BOOTSTRAP_HINT) in flat(again.stdout)
    assert (exec_problem in flat(again.stdout)) == (how == "exec")
