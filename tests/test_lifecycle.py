"""perfrun and its run live and die together.

Real runs of `python -m perfrun` on tiny scripts: whatever ends perfrun
ends the script, torchrun's agent and every worker (SIGKILL included);
every catchable signal that would end perfrun reaches the script and
perfrun ends as the script did; a rank interrupted by Ctrl-C is not
"finished"; a script that replaces itself (os.execv) at its end keeps its
steps; torchrun's node arguments are refused before anything runs.

Waits poll with a deadline: the machine may be loaded, so no fixed sleep
decides a test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from perfrun.exitcodes import ExitCode
from perfrun.launcher.torchrun import argument_problem
from perfrun.runtime.lifeline import ended_status, raised_by_script
from perfrun.store.rankfile import read_rank_file

SCRIPTS = Path(__file__).parent / "scripts"
WAIT = SCRIPTS / "lifecycle_wait.py"
EXEC = SCRIPTS / "lifecycle_exec.py"

#: Long enough for torch's import and a gloo rendezvous on a loaded machine.
READY_TIMEOUT = 90.0
#: How long the kernel and torchrun may take to end what perfrun leaves.
GONE_TIMEOUT = 15.0
TIMEOUT = 120.0


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Run:
    """perfrun in the background, its log folder in tmp_path/log. Its output
    goes to files, not pipes: a process perfrun leaves behind would hold a
    pipe open, and reading to its end would wait for that process, hiding
    the very thing the tests look for. stdin is not a terminal: perfrun
    forwards SIGINT itself."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.out_path = tmp_path / "perfrun.out"
        self.err_path = tmp_path / "perfrun.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "perfrun", "--log-dir", str(tmp_path / "log"), *args],
                cwd=tmp_path,
                env=environment(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        self.pid = self.proc.pid

    def output(self) -> tuple[str, str]:
        return self.out_path.read_text(), self.err_path.read_text()

    def finish(self) -> tuple[str, str]:
        """Wait for perfrun to end; its stdout and stderr."""
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("perfrun did not end\n{}\n{}".format(*self.output())) from None
        return self.output()

    def send_signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL perfrun, and reap it."""
        self.proc.kill()
        self.proc.wait()

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode


def wait_for_pids(pid_dir: Path, ranks: int, run: Run) -> list[tuple[int, int]]:
    """The (pid, parent pid) each rank leaves once it is ready."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        files = sorted(pid_dir.glob("*.pid"))
        if len(files) == ranks:
            return [tuple(map(int, f.read_text().split())) for f in files]  # type: ignore[misc]
        if run.proc.poll() is not None:
            raise AssertionError(
                "perfrun ended before the script was ready\n{}\n{}".format(*run.output())
            )
        if time.monotonic() > deadline:
            run.proc.kill()
            run.proc.wait()
            raise AssertionError("the script never got ready\n{}\n{}".format(*run.output()))
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet (an
    orphan's new parent may be slow to reap, or never do it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def survivors(pids: list[int]) -> list[int]:
    """The processes still running once GONE_TIMEOUT has passed, or none as
    soon as all are gone. Whatever is left is killed, so that a failing test
    leaves nothing behind."""
    deadline = time.monotonic() + GONE_TIMEOUT
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def run_dir(tmp_path: Path) -> Path:
    runs = [p for p in (tmp_path / "log").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1, runs
    return runs[0]


def rank_data(folder: Path, rank: int = 0) -> dict:
    """The rank's document as the reader sees it, its steps inline."""
    return read_rank_file(str(folder / f"rank{rank}.json")).inline()


def flat(text: str) -> str:
    """Report text with its line wrapping undone."""
    return " ".join(text.split())


# -- perfrun dies: the run dies with it ------------------------------------------------------


@pytest.mark.slow
def test_sigkill_of_perfrun_ends_the_script(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run = Run(tmp_path, str(WAIT), "--pid-dir", str(pid_dir))
    [(script, parent)] = wait_for_pids(pid_dir, 1, run)
    assert parent == run.pid
    run.kill()
    assert survivors([script]) == []


@pytest.mark.slow
def test_sigkill_of_perfrun_ends_torchrun_and_every_worker(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run = Run(
        tmp_path, "--nproc-per-node", "2", "--master-port", str(free_port()),
        str(WAIT), "--pid-dir", str(pid_dir), "--dist", "--steps", "2",
    )
    pids = wait_for_pids(pid_dir, 2, run)
    workers = [pid for pid, _ in pids]
    agents = {parent for _, parent in pids}
    assert len(agents) == 1 and run.pid not in agents  # workers of torchrun's agent
    run.kill()
    assert survivors([*workers, *agents]) == []


# -- signals perfrun is sent reach the script ------------------------------------------------


@pytest.mark.slow
def test_sigusr1_reaches_the_script_and_perfrun_exits_as_it_did(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run = Run(tmp_path, str(WAIT), "--pid-dir", str(pid_dir), "--exit-on", "USR1", "3")
    wait_for_pids(pid_dir, 1, run)
    run.send_signal(signal.SIGUSR1)
    out, err = run.finish()
    assert run.returncode == 3, err
    assert "got SIGUSR1, exiting 3" in out
    meta = json.loads((run_dir(tmp_path) / "run.json").read_text())
    assert meta["returncode"] == 3
    assert meta["signals"] == ["SIGUSR1"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGUSR2", "SIGALRM"])
def test_a_signal_the_script_does_not_handle_ends_both(tmp_path: Path, name: str) -> None:
    signum = getattr(signal, name)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run = Run(tmp_path, str(WAIT), "--pid-dir", str(pid_dir))
    [(script, _)] = wait_for_pids(pid_dir, 1, run)
    run.send_signal(signum)
    out, err = run.finish()
    # The script died of it, and perfrun, after its report, the same way.
    assert run.returncode == -signum, err
    assert "waited to the end" not in out
    assert not alive(script)
    meta = json.loads((run_dir(tmp_path) / "run.json").read_text())
    assert meta["returncode"] == -signum
    assert meta["signals"] == [name]


# -- Ctrl-C is not "finished" ----------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_under_torchrun_marks_the_ranks_signalled(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run = Run(
        tmp_path, "--nproc-per-node", "2", "--master-port", str(free_port()),
        str(WAIT), "--pid-dir", str(pid_dir), "--dist", "--steps", "3",
    )
    wait_for_pids(pid_dir, 2, run)
    run.send_signal(signal.SIGINT)
    out, err = run.finish()
    assert "KeyboardInterrupt" in err
    folder = run_dir(tmp_path)
    for rank in (0, 1):
        data = rank_data(folder, rank)
        assert data["status"] == "signalled", data["status"]
        assert data["exit"] == {"exception": "KeyboardInterrupt", "signal": signal.SIGINT}
        assert len(data["steps"]["rows"]) == 3
        assert re.search(rf"^{rank}\s+killed\s+3\s", out, flags=re.M), out
        assert f"rank {rank}: killed by SIGINT after 3 steps" in flat(out)
    assert not re.search(r"^\d\s+finished\s", out, flags=re.M), out


@pytest.mark.slow
def test_ctrl_c_of_a_script_marks_it_signalled(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run = Run(tmp_path, str(WAIT), "--pid-dir", str(pid_dir), "--steps", "3")
    wait_for_pids(pid_dir, 1, run)
    run.send_signal(signal.SIGINT)
    out, err = run.finish()
    assert run.returncode == -signal.SIGINT, err
    data = rank_data(run_dir(tmp_path))
    assert data["status"] == "signalled"
    assert data["exit"] == {"exception": "KeyboardInterrupt", "signal": signal.SIGINT}
    assert "rank 0: killed by SIGINT after 3 steps" in flat(out)


RAISE_INTERRUPT = SCRIPTS / "lifecycle_raise_interrupt.py"


@pytest.mark.slow
def test_a_keyboardinterrupt_the_script_raises_is_no_signal(tmp_path: Path) -> None:
    """Issue 44: the script's own `raise KeyboardInterrupt` after 21 steps.
    Python ends it by SIGINT all the same (a shell shows 130), and perfrun
    ends the same way, with the script's output and traceback; the report
    says it raised, not that a signal killed it."""
    args = [str(RAISE_INTERRUPT), "--steps", "30", "--raise-at", "20"]
    plain = subprocess.run([sys.executable, *args], env=environment(), capture_output=True,
                           text=True, timeout=TIMEOUT)
    assert plain.returncode == -signal.SIGINT, plain.stderr
    run = Run(tmp_path, *args)
    out, err = run.finish()
    assert run.returncode == plain.returncode, err
    assert out.startswith(plain.stdout)
    assert plain.stderr.rstrip("\n") in err
    data = rank_data(run_dir(tmp_path))
    assert data["status"] == "finished"
    assert data["exit"] == {"exception": "KeyboardInterrupt", "signal": None}
    text = flat(out)
    assert "rank 0: raised KeyboardInterrupt after 21 steps" in text, out
    assert "killed" not in text and "SIGINT" not in text, out


CATCH_STOP = SCRIPTS / "lifecycle_catch_stop.py"


@pytest.mark.slow
def test_a_stop_the_script_catches_is_said_with_what_ran_after(tmp_path: Path) -> None:
    """Issue 44: --stop-after 10 on a loop that catches BaseException: the
    script swallows perfrun's SystemExit and trains on to its end. Its
    output and status are its own; the report holds the 10 steps before
    the stop and says the script caught it and made 29 more steps."""
    run = Run(tmp_path, "--stop-after", "10", str(CATCH_STOP), "--steps", "40")
    out, err = run.finish()
    assert run.returncode == 0, err
    assert "step 10: SystemExit caught, carrying on" in out
    assert "trained 39 steps" in out
    data = rank_data(run_dir(tmp_path))
    assert data["status"] == "stopped"
    assert len(data["steps"]["rows"]) == 10
    text = flat(out)
    assert re.search(r"Steps: \d+ counted of 10 recorded", text), out
    assert ("--stop-after 10: perfrun ended the script after 10 steps (SystemExit(0)), but the "
            "script caught it and trained on: 29 more optimizer steps ran after the stop, "
            "which perfrun did not record; the results hold the 10 steps before it") in text


def _raised(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test's own
        return exc
    raise AssertionError("nothing raised")


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "last, status, exit_signal",
    [
        (None, "finished", None),
        (ValueError("bad"), "finished", None),
        (KeyboardInterrupt(), "signalled", signal.SIGINT),
        # The script's own `raise KeyboardInterrupt`: no signal killed it.
        (_raised(_raise_keyboard_interrupt), "finished", None),
    ],
)
def test_ended_status(last: Optional[BaseException], status: str, exit_signal: object) -> None:
    exit_info: dict = {"exception": None, "signal": None}
    assert ended_status(last, exit_info) == status
    assert exit_info["signal"] == exit_signal


def test_a_keyboardinterrupt_is_told_from_a_signal_by_where_it_was_raised() -> None:
    """Python's SIGINT handler raises where the interpreter checks for
    signals (here, the call that sent it), never at a `raise` statement,
    unless the script's own handler raises it; a KeyboardInterrupt raised
    while handling the signal's is the signal's too."""
    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:
        pytest.skip("signal handlers can only be set from the main thread")
    try:
        assert raised_by_script(_raised(_raise_keyboard_interrupt))
        assert raised_by_script(_raised(lambda: _raised_in_call()))
        by_signal = _raised(lambda: signal.raise_signal(signal.SIGINT))
        assert isinstance(by_signal, KeyboardInterrupt) and not raised_by_script(by_signal)

        def convert() -> None:
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt as exc:
                raise KeyboardInterrupt("stop") from exc

        assert not raised_by_script(_raised(convert))

        def handler(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)
        assert not raised_by_script(_raised(lambda: signal.raise_signal(signal.SIGINT)))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not raised_by_script(KeyboardInterrupt())


def _raised_in_call() -> None:
    def inner() -> None:
        raise KeyboardInterrupt("from a function")

    inner()


# -- a script that replaces itself at its end ------------------------------------------------


@pytest.mark.slow
def test_exec_at_the_end_keeps_the_steps(tmp_path: Path) -> None:
    run = Run(tmp_path, str(EXEC))
    out, err = run.finish()
    assert run.returncode == 0, err
    assert "step 4 done\nafter exec\n" in out
    data = rank_data(run_dir(tmp_path))
    assert data["status"] == "finished"
    assert data["torch_imported"] is True
    assert len(data["steps"]["rows"]) == 5
    assert data["exit"]["exec"] == sys.executable
    text = flat(out)
    assert "never imported torch" not in text
    assert "Ranks with problems" not in text
    # Warm-up (step 0) and the step the FLOPs were counted on (step 1) out.
    assert "Steps: 3 counted of 5 recorded" in text
    assert "rank 0 replaced itself with" in text


# -- a script that leaves by os._exit ---------------------------------------------------------


OS_EXIT = SCRIPTS / "lifecycle_os_exit.py"


@pytest.mark.slow
def test_os_exit_keeps_the_steps_and_the_status(tmp_path: Path) -> None:
    """os._exit runs no exit handler: the steps since the last periodic
    save (here all 30, the run being shorter than one save interval) were
    lost, and the report said the script never imported torch."""
    plain = subprocess.run([sys.executable, str(OS_EXIT), "--steps", "30", "--status", "3"],
                           env=environment(), capture_output=True, text=True, timeout=TIMEOUT)
    assert plain.returncode == 3, plain.stderr
    run = Run(tmp_path, str(OS_EXIT), "--steps", "30", "--status", "3")
    out, err = run.finish()
    assert run.returncode == 3, err
    assert out.startswith(plain.stdout)
    data = rank_data(run_dir(tmp_path))
    assert data["status"] == "finished"
    assert data["exit"]["os_exit"] == 3
    assert data["torch_imported"] is True
    assert len(data["steps"]["rows"]) == 30
    text = flat(out)
    assert "never imported torch" not in text
    assert "rank 0: left by os._exit(3) after 30 steps" in text
    assert re.search(r"Steps: \d+ counted of 30 recorded", text), text


@pytest.mark.slow
def test_os_exit_before_torch_keeps_the_status(tmp_path: Path) -> None:
    run = Run(tmp_path, str(OS_EXIT), "--before-torch", "--status", "5")
    out, err = run.finish()
    assert run.returncode == 5, err
    data = rank_data(run_dir(tmp_path))
    assert (data["status"], data["exit"]["os_exit"]) == ("finished", 5)
    # True here: the script left before its `import torch`.
    assert "the script never imported torch" in flat(out)


@pytest.mark.slow
@pytest.mark.parametrize("status", [0, 3, 255])
def test_os_exit_status_is_the_scripts_whatever_the_save_does(status: int) -> None:
    """The save before os._exit raising, even a KeyboardInterrupt, changes
    nothing the process does: os._exit ends it with the script's status."""
    code = (
        "import os\n"
        "from perfrun.runtime.lite import watch_os_exit\n"
        "seen = []\n"
        "def before(status):\n"
        "    seen.append(status)\n"
        "    raise KeyboardInterrupt\n"
        "watch_os_exit(before)\n"
        "watch_os_exit(before)  # once only\n"
        "try:\n"
        "    os._exit('not a status')\n"
        "except TypeError:\n"
        "    print('TypeError', seen, flush=True)\n"
        f"os._exit({status})\n"
    )
    env = dict(environment(), PYTHONPATH=str(Path(__file__).parent.parent))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert result.returncode == status, result.stderr
    assert result.stdout == "TypeError ['not a status']\n"
    assert result.stderr == ""


@pytest.mark.slow
def test_a_syntax_error_is_reported_as_the_script_not_starting(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\n\n\ndef train(:\n    pass\n")
    plain = subprocess.run([sys.executable, str(script)], env=environment(),
                           capture_output=True, text=True, timeout=TIMEOUT)
    run = Run(tmp_path, str(script))
    out, err = run.finish()
    assert run.returncode == plain.returncode == 1
    assert plain.stderr in err
    text = flat(out)
    assert ("perfrun: the script did not start: SyntaxError: invalid syntax (train.py, "
            "line 4)") in text
    assert "never imported torch" not in text and "Ranks with problems" not in text


def test_not_started_is_a_syntax_error_in_the_scripts_own_file() -> None:
    from perfrun.runtime.lite import not_started

    try:
        compile("def f(:\n", "/work/train.py", "exec")
    except SyntaxError as exc:
        exc.__traceback__ = None  # as Python leaves it for `python train.py`
        assert not_started(exc) == "invalid syntax (train.py, line 1)"
    try:
        exec(compile("def f(:\n", "/work/model.py", "exec"))
    except SyntaxError as exc:  # raised while the script ran (an import, exec)
        assert not_started(exc) is None
    assert not_started(ValueError("x")) is None and not_started(None) is None


# -- torchrun's arguments, before anything runs ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--master-port", "99999"], "--master-port must be a port number from 1 to 65535"),
        (["--master-port", "0"], "--master-port must be a port number from 1 to 65535"),
        (["--nnodes", "abc"], "--nnodes takes N or MIN:MAX"),
        (["--nnodes", "3:2"], "MIN must not be greater than MAX"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2 is not a node of --nnodes 2"),
        (["--nnodes", "1", "--node-rank", "-1"], "--node-rank cannot be negative"),
    ],
)
def test_bad_torchrun_arguments_are_refused_first(
    tmp_path: Path, args: list[str], message: str
) -> None:
    run = Run(tmp_path, *args, str(WAIT), "--pid-dir", str(tmp_path))
    out, err = run.finish()
    assert run.returncode == ExitCode.CONFIG, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("perfrun: error: ") and message in lines[0]
    assert not (tmp_path / "log").exists()  # nothing ran, not even a run folder


@pytest.mark.parametrize(
    "kwargs",
    [
        {"nproc_per_node": 2, "nnodes": "2", "node_rank": 1, "master_port": 29500},
        {"nnodes": "1:4", "node_rank": 7},
        {"nnodes": 3},
        {"master_port": 1},
        {"master_port": 65535},
        {},
    ],
)
def test_good_torchrun_arguments_pass(kwargs: dict) -> None:
    assert argument_problem(**kwargs) is None
