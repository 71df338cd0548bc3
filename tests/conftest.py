"""Shared fixtures. Each section belongs to the tests named in its heading."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from perfrun.store.rankfile import RankResult
from perfrun.store.results import RunResults, read_run

# A test run started in the background of a non-interactive shell (`cmd &`)
# inherits SIGINT ignored, and so would every perfrun and script it starts:
# the Ctrl-C tests (test_lifecycle.py, test_e2e_process.py) would then see
# a script that, like `python script.py` started the same way, never gets
# its KeyboardInterrupt. Python's own handler here means the children start
# with SIGINT as a terminal gives it (a caught signal is reset on exec).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# ---------------------------------------------------------------------------
# The suite on a busy machine: `--busy N` (or PERFRUN_TEST_BUSY=N)
#
# A test that compares times, rates or shares between runs, or whose verdict
# could depend on free cores, is marked `timing`; it must give the same
# verdict whatever else shares the machine's cores. `python -m pytest -m
# timing --busy 2` runs those tests beside N processes that spin on a core
# each for the whole session, so that a test that holds only on an idle
# machine fails here, not on a user's busy one. The spinners are started once
# per session, by the process that runs it (xdist's controller, not each
# worker), and killed when it ends.
# ---------------------------------------------------------------------------

BUSY_ENV = "PERFRUN_TEST_BUSY"

#: A spinner: busy until the process that started it is gone (its parent
#: checked every million turns, a few tens of milliseconds), so that a
#: session killed before its teardown leaves none behind.
SPINNER = (
    "import os\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(1_000_000):\n"
    "        pass\n"
)

_BUSY_PROCS = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--busy", type=int, default=None, metavar="N",
        help=f"run the tests beside N processes that spin on a core each for the whole "
             f"session (default: ${BUSY_ENV}, else 0); with -m timing, the tests whose "
             f"verdicts must not depend on free cores")


def busy_processes(config: pytest.Config) -> int:
    """How many spinners the session asked for: --busy, else $PERFRUN_TEST_BUSY."""
    value = config.getoption("--busy")
    if value is None:
        text = os.environ.get(BUSY_ENV, "").strip() or "0"
        try:
            value = int(text)
        except ValueError:
            raise pytest.UsageError(f"{BUSY_ENV}={text!r}: expected a whole number") from None
    if value < 0:
        raise pytest.UsageError(f"--busy {value}: expected 0 or more processes")
    return int(value)


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    n = busy_processes(config)
    return f"busy: {n} spinning processes beside the tests" if n else None


def hang_limit(busy: int) -> float:
    """E2E_TIMEOUT for this session: 120 s where a run has a core of its
    own; on a busy machine, as many times that as runnable processes
    outnumber the cores (the 1-minute load average, or the spinners and one
    test), at most 5 times. A run that gets a fifth of a core takes five
    times as long: slow, not hung."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return HANG_LIMIT_IDLE * min(5.0, max(1.0, max(load, busy + 1) / cores))


def pytest_sessionstart(session: pytest.Session) -> None:
    global E2E_TIMEOUT
    config = session.config
    # Before the test modules import it (collection comes after this hook).
    E2E_TIMEOUT = hang_limit(busy_processes(config))
    if hasattr(config, "workerinput"):  # an xdist worker: the controller spins
        return
    config.stash[_BUSY_PROCS] = [
        subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.DEVNULL)
        for _ in range(busy_processes(config))
    ]


def pytest_unconfigure(config: pytest.Config) -> None:
    for proc in config.stash.get(_BUSY_PROCS, []):
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------
# Scripts of the project (scripts/, tests/gpu/scripts/) imported by the tests
# that check their pure parts, without running their main.
# ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def import_file(path: Path, name: str) -> Any:
    """The module at `path`, imported as `name` (its `__main__` block not
    run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# ---------------------------------------------------------------------------
# End-to-end runs of real scripts (test_e2e_training.py)
#
# `run_perfrun(*args)` runs `python -m perfrun --log-dir <tmp>/log ARGS...` in
# a real subprocess, from the test's own temporary folder, and returns a
# `PerfrunRun` with the exit status, the captured output and the run folder.
# ---------------------------------------------------------------------------

#: A run that takes longer than this is hung, not slow: 120 s on an idle
#: machine, more on a busy one (hang_limit, set as the session starts).
HANG_LIMIT_IDLE = 120.0
E2E_TIMEOUT = HANG_LIMIT_IDLE


#: The line perfrun writes on stderr before the script starts (-q: none).
START_NOTICE = "perfrun: profiling "


def script_stderr(stderr: str) -> list[str]:
    """The script's own stderr lines: perfrun's start notice taken off the
    front, and its closing lines (`perfrun: ...`, blank lines) off the end."""
    lines = stderr.splitlines()
    if lines and lines[0].startswith(START_NOTICE):
        lines.pop(0)
    while lines and (lines[-1].startswith("perfrun: ") or not lines[-1].strip()):
        lines.pop()
    return lines


def e2e_environment() -> dict[str, str]:
    """The environment both perfrun and a direct `python script.py` get: the
    test process's own, with no perfrun state leaking in and one OpenMP
    thread (the scripts are tiny; thread pools would only add noise)."""
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)
    env["OMP_NUM_THREADS"] = "1"
    return env


@dataclass
class PerfrunRun:
    """What one `perfrun` invocation left behind."""

    args: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes
    log_dir: Path
    report_path: Optional[Path]

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def describe(self) -> str:
        """For assertion messages: the command and what it printed."""
        return (
            f"perfrun {' '.join(self.args)} -> {self.returncode}\n"
            f"--- stdout ---\n{self.out}\n--- stderr ---\n{self.err}"
        )

    @property
    def run_dir(self) -> Path:
        """The one run folder in the log folder (`latest` is a link to it)."""
        runs = [p for p in self.log_dir.iterdir() if p.is_dir() and not p.is_symlink()]
        assert len(runs) == 1, f"expected one run folder, found {runs}\n{self.describe()}"
        return runs[0]

    def results(self) -> RunResults:
        return read_run(str(self.run_dir))

    def rank0(self) -> RankResult:
        ranks = self.results().ranks
        assert [r.rank for r in ranks] == [0], self.describe()
        return ranks[0]

    def report(self) -> dict[str, Any]:
        """The JSON report: the file written by `--format json --output`, or,
        for runs that printed tables, the same document built from the run
        folder."""
        if self.report_path is not None:
            return json.loads(self.report_path.read_text(encoding="utf-8"))
        from perfrun.analysis.build import build_report

        return build_report(self.results()).to_dict()


RunPerfrun = Callable[..., PerfrunRun]


@pytest.fixture
def run_perfrun(tmp_path: Path) -> RunPerfrun:
    """Run perfrun for real. `json_report=True` (the default) adds
    `--format json --output <tmp>/report.json`; pass False to get the tables
    on stdout."""
    counter = [0]

    def run(
        *args: str,
        json_report: bool = True,
        env: Optional[dict[str, str]] = None,
        timeout: float = E2E_TIMEOUT,
    ) -> PerfrunRun:
        counter[0] += 1
        n = counter[0]
        log_dir = tmp_path / ("log" if n == 1 else f"log{n}")
        report_path = tmp_path / ("report.json" if n == 1 else f"report{n}.json")
        options: list[str] = ["--log-dir", str(log_dir)]
        if json_report:
            options += ["--format", "json", "--output", str(report_path)]
        argv = [*options, *args]
        proc = subprocess.run(
            [sys.executable, "-m", "perfrun", *argv],
            cwd=tmp_path,
            env=e2e_environment() if env is None else env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
        return PerfrunRun(
            args=argv,
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
            log_dir=log_dir,
            report_path=report_path if json_report else None,
        )

    return run


@pytest.fixture
def run_python(tmp_path: Path) -> Callable[..., bytes]:
    """`python ARGS...` as a user would run it, from the same folder and with
    the same environment as `run_perfrun`; returns its stdout."""

    def run(*args: str, timeout: float = E2E_TIMEOUT) -> bytes:
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=e2e_environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
        return proc.stdout

    return run


# ---------------------------------------------------------------------------
# End of the end-to-end training section.
# ---------------------------------------------------------------------------



# ---------------------------------------------------------------------------
# A real terminal: tmux (test_watch.py, test_display.py)
#
# tmux comes from the system's packages (.ci/run installs it); where it is
# absent, or cannot start a server, the terminal tests skip and say why.
# ---------------------------------------------------------------------------

TMUX = shutil.which("tmux")


def tmux_problem() -> Optional[str]:
    """Why tmux cannot host the terminal tests here, or None. Having it on
    PATH is not enough: on some machines its server cannot start at all
    (`server exited unexpectedly`), which says nothing about perfrun."""
    if TMUX is None:
        return "no tmux on PATH (CI installs it: apt-get install tmux, see .ci/run)"
    socket = f"perfrun-probe-{os.getpid()}"
    try:
        probe = subprocess.run([TMUX, "-L", socket, "new-session", "-d", "sleep 1"],
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"tmux cannot start a session here ({exc})"
    subprocess.run([TMUX, "-L", socket, "kill-server"], capture_output=True, timeout=20)
    if probe.returncode != 0:
        return f"tmux cannot start a server here: {(probe.stderr or '').strip()}"
    return None


TMUX_PROBLEM = tmux_problem()
needs_tmux = pytest.mark.skipif(TMUX_PROBLEM is not None, reason=TMUX_PROBLEM or "")


class Terminal:
    """A tmux server of the test's own (its own socket), `width` x `height`."""

    def __init__(self, tmp: Path, width: int = 80, height: int = 40) -> None:
        self.socket = f"perfrun-test-{os.getpid()}-{tmp.name}-{width}"
        self.width, self.height = width, height

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        return subprocess.run([TMUX, "-L", self.socket, *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-x", str(self.width), "-y", str(self.height), "-s",
                  "term", command)

    def screen(self, history: str = "-200") -> str:
        """What the pane shows, `history` lines of scrollback included
        (`-`: all of it); a line the terminal wrapped comes back whole."""
        return self.tmux("capture-pane", "-p", "-J", "-S", history, "-t", "term")

    def wait_for(self, predicate: Any, timeout: float = 90.0, history: str = "-200") -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen(history)
            if predicate(screen):
                return screen
            time.sleep(0.5)
        raise AssertionError(f"timed out; the screen was:\n{screen}")

    def close(self) -> None:
        subprocess.run([TMUX or "tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


def flat(text: str) -> str:
    """Report text with its line wrapping undone (every run of whitespace one
    space): perfrun lays sentences out at most 100 columns wide, in a pipe
    too, so a phrase may sit across two lines."""
    return " ".join(text.split())
