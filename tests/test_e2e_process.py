"""perfrun as a process: real runs of tiny scripts with real torch on CPU.

What users see of the launcher itself: the script behaves exactly as under
`python script.py` (exit status, output, traceback, argv, sys.path, cwd,
environment), signals end perfrun the way they end the script, ranks and
DataLoader workers are told apart, the user's own sitecustomize still runs,
expected errors are one line with a documented exit code, `--nsys` builds
the right command, and the YAML config is honoured.

perfrun is always started as `python -m perfrun` in a subprocess, with the
test's tmp_path as working directory and log folder.
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
from typing import Optional

import pytest
from conftest import START_NOTICE, script_stderr

from perfrun.exitcodes import ExitCode
from perfrun.store.rankfile import VERSION, read_rank_file

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
TRAIN = SCRIPTS / "proc_train.py"
DDP = SCRIPTS / "proc_ddp.py"
ENV_SCRIPT = SCRIPTS / "proc_env.py"
EXIT_SCRIPT = SCRIPTS / "proc_exit.py"
BOOT_DIR = Path(__file__).parent.parent / "perfrun" / "boot"

TIMEOUT = 90


# -- helpers -----------------------------------------------------------------------


def base_env(pythonpath: Optional[str] = None, **extra: str) -> dict[str, str]:
    """The environment both `python` and `perfrun` get: the test's own, with
    no perfrun state leaking in and PYTHONPATH exactly as the test wants."""
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


class Finished(subprocess.CompletedProcess):
    """A finished run, with the pid the perfrun process had."""

    pid: int


def perfrun(
    *args: str, cwd: Path, env: Optional[dict[str, str]] = None, timeout: float = TIMEOUT
) -> Finished:
    with subprocess.Popen(
        [sys.executable, "-m", "perfrun", *args],
        cwd=cwd,
        env=env if env is not None else base_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"perfrun ran past {timeout} s:\n{out}\n{err}")
    result = Finished(proc.args, proc.returncode, out, err)
    result.pid = proc.pid
    return result


def python(
    *args: str, cwd: Path, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env if env is not None else base_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def run_dir_of(log_dir: Path) -> Path:
    """The one run folder a test's log folder holds."""
    runs = [p for p in log_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1, runs
    return runs[0]


def rank_data(run_dir: Path, rank: int = 0) -> dict:
    """The rank's document as the reader sees it, its steps inline."""
    return read_rank_file(str(run_dir / f"rank{rank}.json")).inline()


def rows(run_dir: Path, rank: int = 0) -> list:
    return rank_data(run_dir, rank)["steps"]["rows"]


def steps_printed(stdout: str) -> int:
    return len(re.findall(r"^step \d+ done$", stdout, flags=re.M))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"perfrun ended before {path.name} appeared:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path.name} did not appear in {timeout} s")
        time.sleep(0.05)


def seen_by_script(stdout: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("PROC_ENV "):
            return json.loads(line[len("PROC_ENV ") :])
    raise AssertionError(f"the script printed nothing:\n{stdout}")


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """An expected error: the documented status, one `perfrun: error:` line
    on stderr, no traceback, nothing on stdout. Returns the line."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("perfrun: error: "), lines[0]
    assert result.stdout == ""
    return lines[0]


# -- the script runs as under `python script.py` ----------------------------------------


def test_exception_traceback_and_status_match_python(tmp_path: Path) -> None:
    args = [str(TRAIN), "--steps", "6", "--raise-at", "3"]
    plain = python(*args, cwd=tmp_path)
    under = perfrun("--log-dir", str(tmp_path / "log"), *args, cwd=tmp_path)

    assert plain.returncode == 1
    assert under.returncode == plain.returncode
    assert "ValueError: bad batch at step 3" in plain.stderr
    assert script_stderr(under.stderr) == plain.stderr.splitlines()
    assert under.stdout.startswith(plain.stdout)
    run_dir = run_dir_of(tmp_path / "log")
    data = rank_data(run_dir)
    assert data["exit"]["exception"] == "ValueError"
    assert len(rows(run_dir)) == 3
    assert "rank 0: raised ValueError after 3 steps" in under.stdout


def test_sys_exit_status_passes_through(tmp_path: Path) -> None:
    plain = python(str(EXIT_SCRIPT), "3", cwd=tmp_path)
    under = perfrun("--log-dir", str(tmp_path / "log"), str(EXIT_SCRIPT), "3", cwd=tmp_path)
    assert plain.returncode == 3
    assert under.returncode == 3
    assert under.stdout.startswith(plain.stdout)
    assert script_stderr(under.stderr) == plain.stderr.splitlines()


@pytest.mark.parametrize("with_pythonpath", [False, True], ids=["no-PYTHONPATH", "PYTHONPATH"])
def test_script_sees_what_python_gives_it(tmp_path: Path, with_pythonpath: bool) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    pythonpath = f"{extra}{os.pathsep}{tmp_path / 'missing'}" if with_pythonpath else None
    env = base_env(pythonpath)
    cwd = tmp_path / "work"
    cwd.mkdir()
    script = os.path.relpath(ENV_SCRIPT, cwd)  # relative, as users type it
    args = [script, "--lr", "0.1", "-c", "x"]
    plain = seen_by_script(python(*args, cwd=cwd, env=env).stdout)
    result = perfrun("--log-dir", str(tmp_path / "log"), *args, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    under = seen_by_script(result.stdout)

    assert under == plain
    assert under["argv"] == args
    assert under["name"] == "__main__"
    assert under["path"][0] == str(SCRIPTS.resolve())
    assert under["cwd"] == str(cwd)
    assert under["pythonpath"] == pythonpath
    assert not under["settings_var"]
    assert all(os.path.abspath(p or ".") != str(BOOT_DIR.resolve()) for p in under["path"])
    assert (run_dir_of(tmp_path / "log") / "rank0.json").exists()


def test_module_form_matches_python_m(tmp_path: Path) -> None:
    env = base_env(str(SCRIPTS))
    args = ["-m", "proc_env", "--lr", "0.1"]
    plain = seen_by_script(python(*args, cwd=tmp_path, env=env).stdout)
    result = perfrun("--log-dir", str(tmp_path / "log"), *args, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    under = seen_by_script(result.stdout)

    assert under == plain
    assert under["argv"] == [str(SCRIPTS / "proc_env.py"), "--lr", "0.1"]
    assert under["name"] == "__main__"
    assert under["path"][0] == str(tmp_path)
    assert under["pythonpath"] == str(SCRIPTS)
    assert (run_dir_of(tmp_path / "log") / "rank0.json").exists()


# -- signals ----------------------------------------------------------------------------


def test_script_killed_by_sigkill(tmp_path: Path) -> None:
    log = tmp_path / "log"
    options = ["--log-dir", str(log), "--flush-interval", "0.2"]
    result = perfrun(*options, str(TRAIN), "--steps", "8", "--kill-at", "4", cwd=tmp_path)
    # perfrun dies by the script's signal, after printing the report.
    assert result.returncode == -signal.SIGKILL
    run_dir = run_dir_of(log)
    data = rank_data(run_dir)
    assert data["status"] == "running"  # no final write: only periodic flushes
    assert len(rows(run_dir)) == 4 == steps_printed(result.stdout)
    assert f"Results: {run_dir}" in result.stdout
    # The signal is named, and what the kill may have cost: the steps after
    # the last save, up to the launcher's end (a bound, so "at most").
    text = " ".join(result.stdout.split())
    said = re.search(
        r"rank 0: killed by SIGKILL after 4 steps; at most its last (\d+\.\d) s of steps "
        r"\(about (\d+) steps at its median step\) are not in its results: a rank saves "
        r"every 0\.2 s, and SIGKILL leaves it no time to save the rest", text)
    assert said, result.stdout
    meta = json.loads((run_dir / "run.json").read_text())
    assert float(said.group(1)) <= meta["elapsed"]


def test_the_rank_file_counts_the_flush_threads_cpu(tmp_path: Path) -> None:
    """perfrun's flush thread (saves, samplers) reports its own CPU time, the
    most it can have taken from the script's thread: more than nothing, and
    less than the run's time."""
    log = tmp_path / "log"
    result = perfrun("--log-dir", str(log), "--flush-interval", "0.2", str(TRAIN),
                     "--steps", "8", "--sleep", "0.1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = rank_data(run_dir_of(log))
    flush = data["extra"]["flush"]
    assert flush["calls"] >= 2, flush
    assert 0.0 < flush["thread_cpu"] < data["elapsed"], (flush, data["elapsed"])
    # The final save holds every step: they reach the save itself.
    assert flush["replayed"] == pytest.approx(data["elapsed"], abs=0.05), flush


def test_a_script_killed_before_its_first_save_still_imported_torch(tmp_path: Path) -> None:
    """Killed outright 0.6 s into its first step, before any periodic save
    (every 2 s): the rank saved when torch was imported, so the report says
    it was killed before its first step, not that torch was never imported."""
    log = tmp_path / "log"
    result = perfrun("--log-dir", str(log), str(TRAIN), "--steps", "8", "--kill-at", "0",
                     cwd=tmp_path)
    assert result.returncode == -signal.SIGKILL
    data = rank_data(run_dir_of(log))
    assert data["torch_imported"] is True and data["status"] == "running"
    text = " ".join(result.stdout.split())
    assert "never imported torch" not in text, result.stdout
    assert "rank 0: killed by SIGKILL before its first step" in text, result.stdout


def _signal_perfrun(tmp_path: Path, signum: int) -> tuple[subprocess.CompletedProcess, Path]:
    """Start a long training run under perfrun, send `signum` to perfrun
    (not to the script) once the script is training, and wait for the end."""
    log = tmp_path / "log"
    ready = tmp_path / "ready"
    script = [str(TRAIN), "--steps", "400", "--sleep", "0.05"]
    script += ["--ready-at", "3", "--ready-file", str(ready)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfrun", "--log-dir", str(log), *script],
        cwd=tmp_path,
        env=base_env(),
        stdin=subprocess.DEVNULL,  # not a terminal: perfrun forwards SIGINT itself
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(ready, proc)
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=TIMEOUT)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return result, run_dir_of(log)


def test_sigint_to_perfrun_interrupts_script_and_reports(tmp_path: Path) -> None:
    result, run_dir = _signal_perfrun(tmp_path, signal.SIGINT)
    # The script dies of its KeyboardInterrupt, which Python turns into death
    # by SIGINT (as `python script.py` does); perfrun then dies the same way.
    assert result.returncode == -signal.SIGINT
    assert "KeyboardInterrupt" in script_stderr(result.stderr)[-1]
    n = steps_printed(result.stdout)
    assert n >= 3
    assert "training finished" not in result.stdout
    assert len(rows(run_dir)) == n
    data = rank_data(run_dir)
    # Python ends an uncaught KeyboardInterrupt by SIGINT: not "finished".
    assert data["status"] == "signalled"
    assert data["exit"] == {"exception": "KeyboardInterrupt", "signal": signal.SIGINT}
    assert f"Results: {run_dir}" in result.stdout
    assert f"rank 0: killed by SIGINT after {n} steps" in result.stdout


def test_sigterm_to_perfrun_is_forwarded_and_reports(tmp_path: Path) -> None:
    result, run_dir = _signal_perfrun(tmp_path, signal.SIGTERM)
    assert result.returncode == -signal.SIGTERM
    n = steps_printed(result.stdout)
    assert n >= 3
    assert "training finished" not in result.stdout
    assert len(rows(run_dir)) == n
    data = rank_data(run_dir)
    assert data["status"] == "signalled"
    assert data["exit"]["signal"] == signal.SIGTERM
    assert f"Results: {run_dir}" in result.stdout
    assert f"rank 0: killed by SIGTERM after {n} steps" in result.stdout


# -- distributed -------------------------------------------------------------------------


def test_two_ranks_under_torchrun(tmp_path: Path) -> None:
    log = tmp_path / "log"
    options = ["--log-dir", str(log), "--nproc-per-node", "2", "--master-port", str(free_port())]
    result = perfrun(*options, str(DDP), "--steps", "5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = run_dir_of(log)
    assert sorted(p.name for p in run_dir.glob("rank*.json")) == ["rank0.json", "rank1.json"]
    for rank in (0, 1):
        data = rank_data(run_dir, rank)
        assert (data["rank"], data["world_size"], data["status"]) == (rank, 2, "finished")
        assert len(data["steps"]["rows"]) == 5
        assert f"rank {rank} of 2 done, sum 1" in result.stdout
        assert re.search(rf"^{rank}\s+finished\s+5\s", result.stdout, flags=re.M), result.stdout
    assert "Ranks: 2" in result.stdout


def test_one_rank_raising_fails_the_run(tmp_path: Path) -> None:
    log = tmp_path / "log"
    # Rank 1 raises; rank 0 is busy elsewhere until torchrun stops it with
    # SIGTERM, so the outcome does not depend on how gloo notices the loss.
    options = ["--log-dir", str(log), "--nproc-per-node", "2", "--master-port", str(free_port())]
    script = [str(DDP), "--steps", "5", "--raise-rank", "1", "--raise-at", "2", "--others-wait"]
    result = perfrun(*options, *script, cwd=tmp_path)
    run_dir = run_dir_of(log)
    assert "RuntimeError: rank 1 failed at step 2" in result.stderr
    text = " ".join(result.stdout.split())
    problems = text[text.index("Ranks with problems"):]
    # The root cause first, then what torchrun did about it.
    assert problems.startswith(
        "Ranks with problems - rank 1: the first rank to fail: raised RuntimeError after 2 "
        "steps - rank 0: terminated by torchrun (SIGTERM) after 2 steps, once rank 1 had "
        "failed"), problems
    assert re.search(r"^0\s+terminated\s+2\s", result.stdout, flags=re.M), result.stdout
    assert re.search(r"^1\s+raised, first\s+2\s", result.stdout, flags=re.M), result.stdout
    assert rank_data(run_dir, 1)["exit"]["exception"] == "RuntimeError"
    # The status `python -m torch.distributed.run` exits with: the SIGTERM
    # rank 0 got was torchrun's own clean-up, not how the run ended.
    assert result.returncode == 1


def test_the_rank_that_failed_first_is_named(tmp_path: Path) -> None:
    """Rank 1 raises at step 30 of a DDP loop; rank 0, in its gradient
    all-reduce, loses its peer and raises too (or torchrun stops it
    first). Both said "finished" in the Ranks table and "raised
    RuntimeError" in the list: rank 1, the root cause, was not named."""
    log = tmp_path / "log"
    options = ["--log-dir", str(log), "--nproc-per-node", "2", "--master-port", str(free_port())]
    script = [str(DDP), "--steps", "60", "--raise-rank", "1", "--raise-at", "30"]
    result = perfrun(*options, *script, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    run_dir = run_dir_of(log)
    status = json.loads((run_dir / "torchrun-status.json").read_text())
    assert status["failures"]["1"]["exitcode"] == 1
    text = " ".join(result.stdout.split())
    problems = text[text.index("Ranks with problems"):]
    assert problems.startswith("Ranks with problems - rank 1: the first rank to fail: "
                               "raised RuntimeError after 30 steps - rank 0: "), problems
    assert re.match(
        r"(raised RuntimeError after \d+ steps|terminated by torchrun \(SIGTERM\) after "
        r"\d+ steps), once rank 1 had failed",
        problems.split(" - rank 0: ", 1)[1]), problems
    assert re.search(r"^1\s+raised, first\s+30\s", result.stdout, flags=re.M), result.stdout
    assert re.search(r"^0\s+(raised|terminated)\s", result.stdout, flags=re.M), result.stdout
    assert not re.search(r"^\d\s+finished\s", result.stdout, flags=re.M), result.stdout
    report = json.loads(perfrun("report", str(run_dir), "--format", "json",
                                cwd=tmp_path).stdout)
    assert report["ranks"]["first_failed"] == 1
    assert [r["outcome"] for r in report["ranks"]["rows"]][1] == "raised, first"


# -- the user's own sitecustomize ------------------------------------------------------------
#
# perfrun's launcher is itself a Python program started with the user's
# PYTHONPATH, so Python runs the user's sitecustomize in the launcher too,
# before any perfrun code (nothing perfrun can change). What matters is the
# script's process: there it must run exactly once, after perfrun's own.


def user_site(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """A folder holding a sitecustomize that records its pid, then `body`."""
    site = tmp_path / "usersite"
    site.mkdir()
    pids = tmp_path / "sitecustomize-pids"
    (site / "sitecustomize.py").write_text(
        "import os\n"
        f"with open({str(pids)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n" + body
    )
    return site, pids


def test_user_sitecustomize_still_runs(tmp_path: Path) -> None:
    site, pids = user_site(tmp_path, 'print(f"USER-SITE-RAN {os.getpid()}", flush=True)\n')
    env = base_env(str(site))
    result = perfrun(
        "--log-dir", str(tmp_path / "log"), str(TRAIN), "--steps", "5", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    run_dir = run_dir_of(tmp_path / "log")
    script_pid = rank_data(run_dir)["env"]["pid"]
    ran_in = [int(p) for p in pids.read_text().split()]
    assert ran_in.count(script_pid) == 1
    assert set(ran_in) <= {script_pid, result.pid}
    assert result.stdout.count(f"USER-SITE-RAN {script_pid}\n") == 1
    assert len(rows(run_dir)) == 5


def test_pythons_flags_reach_the_script_from_the_environment(tmp_path: Path) -> None:
    """`perfrun -W error train.py` is refused in one line naming the
    variable; set it, and the script sees what `python -W error` gives."""
    script = tmp_path / "flags.py"
    script.write_text(
        "import sys, warnings\n"
        "print('optimize', sys.flags.optimize, 'debug', __debug__, 'dev', sys.flags.dev_mode)\n"
        "try:\n"
        "    warnings.warn('deprecated', DeprecationWarning)\n"
        "except DeprecationWarning:\n"
        "    print('warning raised')\n"
    )
    refused = perfrun("-W", "error", str(script), cwd=tmp_path)
    assert refused.returncode == ExitCode.USAGE
    assert refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "PYTHONWARNINGS" in refused.stderr
    assert not (tmp_path / "perfrun_log").exists()

    env = base_env(PYTHONWARNINGS="error", PYTHONOPTIMIZE="1", PYTHONDEVMODE="1")
    plain = python("-W", "error", "-O", "-X", "dev", str(script), cwd=tmp_path)
    profiled = perfrun("--log-dir", str(tmp_path / "log"), str(script), cwd=tmp_path, env=env)
    assert profiled.returncode == plain.returncode == 0, profiled.stderr
    assert plain.stdout == "optimize 1 debug False dev True\nwarning raised\n"
    assert profiled.stdout.startswith(plain.stdout)


def test_failing_user_sitecustomize_is_reported_like_python(tmp_path: Path) -> None:
    site, pids = user_site(tmp_path, 'raise RuntimeError("user site is broken")\n')
    env = base_env(str(site))
    plain = python(str(EXIT_SCRIPT), cwd=tmp_path, env=env)
    expected = [
        "Error in sitecustomize; set PYTHONVERBOSE for traceback:",
        "RuntimeError: user site is broken",
    ]
    assert plain.stderr.splitlines()[:2] == expected  # what Python itself prints

    pids.unlink()
    result = perfrun(
        "--log-dir", str(tmp_path / "log"), str(TRAIN), "--steps", "5", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    run_dir = run_dir_of(tmp_path / "log")
    script_pid = rank_data(run_dir)["env"]["pid"]
    ran_in = [int(p) for p in pids.read_text().split()]
    assert ran_in.count(script_pid) == 1
    assert set(ran_in) <= {script_pid, result.pid}
    # Each process it ran in printed Python's two lines, the script's included.
    lines = result.stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line == expected[0]]
    assert len(starts) == len(ran_in)
    assert all(lines[i : i + 2] == expected for i in starts)
    assert "training finished" in result.stdout
    assert len(rows(run_dir)) == 5


# -- DataLoader workers are not ranks ------------------------------------------------------------


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_write_no_rank_files(tmp_path: Path, context: str) -> None:
    log = tmp_path / "log"
    script = [str(TRAIN), "--steps", "6", "--workers", "2", "--context", context]
    result = perfrun("--log-dir", str(log), *script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "profiling disabled" not in result.stderr
    run_dir = run_dir_of(log)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "pipeline", "rank0.json", "rank0.steps", "report.html", "run.json",
        "settings.json"]
    # The workers write their batches' table (the Data Pipeline's), no more.
    tables = sorted(p.name for p in (run_dir / "pipeline").iterdir())
    assert tables[0] == "rank0.loader0.fetches", tables
    assert len(tables) == 3 and all(re.fullmatch(r"rank0\.loader0\.pid\d+\.batches", t)
                                    for t in tables[1:]), tables
    data = rank_data(run_dir)
    assert len(data["steps"]["rows"]) == 6
    assert [d["num_workers"] for d in data["dataloaders"]] == [2]


def test_training_in_processes_the_script_spawns_is_named_not_silent(tmp_path: Path) -> None:
    """`mp.spawn(train, nprocs=2)`: the children are not ranks (their
    environment loses perfrun's variables, as DataLoader workers' does), so
    nothing of theirs is recorded; the report says they were started, and
    how to profile them, instead of only "no training loop was seen"."""
    log = tmp_path / "log"
    result = perfrun("--log-dir", str(log), str(SCRIPTS / "proc_mp_spawn.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "worker 0 trained 5 steps" in result.stdout
    assert "worker 1 trained 5 steps" in result.stdout
    run_dir = run_dir_of(log)
    assert sorted(p.name for p in run_dir.glob("rank*.json")) == ["rank0.json"]
    data = rank_data(run_dir)
    assert data["faults"] == []
    [note] = [n for n in data["notes"] if "torch.multiprocessing" in n]
    assert note.startswith("the script started 2 process(es) with torch.multiprocessing (train)")
    assert "perfrun --nproc-per-node 2 " in note
    assert "no PyTorch training loop was seen" in result.stdout
    assert "the script started 2 process(es) with torch.multiprocessing" in result.stdout


def test_training_on_a_thread_of_the_scripts_is_profiled(tmp_path: Path) -> None:
    """Issue 44: a script whose loop runs in a threading.Thread, the main
    thread only waiting for it. perfrun times that thread's steps (from its
    second: the first shows which thread trains) and its DataLoader's
    stages, and says where they ran, rather than "no PyTorch training loop
    was seen"."""
    log = tmp_path / "log"
    result = perfrun("--log-dir", str(log), str(SCRIPTS / "proc_thread_train.py"),
                     "--steps", "40", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "trained on a thread: 40 steps" in result.stdout
    data = rank_data(run_dir_of(log))
    assert data["faults"] == []
    assert len(data["steps"]["rows"]) == 39
    assert any(n.startswith("the training loop ran on a thread of the script's (trainer), not "
                            "its main thread") for n in data["notes"]), data["notes"]
    [loader] = data["dataloaders"]
    assert loader["batch_size"] == 8
    text = " ".join(result.stdout.split())
    assert "no PyTorch training loop was seen" not in text
    assert re.search(r"Steps: \d+ counted of 39 recorded", text), result.stdout
    assert "Data Pipeline" in text and "(trainer)" in text


# -- expected errors: one line, a documented status --------------------------------------------


def _error_case(tmp_path: Path, *args: str, code: int, env: Optional[dict] = None) -> str:
    marker = tmp_path / "marker"
    env = dict(env or base_env(), PROC_EXIT_MARKER=str(marker))
    result = perfrun(*args, str(EXIT_SCRIPT), cwd=tmp_path, env=env)
    line = assert_one_line_error(result, code)
    assert not marker.exists(), "the script ran"
    return line


def test_script_not_found(tmp_path: Path) -> None:
    result = perfrun("--log-dir", str(tmp_path / "log"), "no_such_script.py", cwd=tmp_path)
    line = assert_one_line_error(result, ExitCode.NO_SCRIPT)
    assert ExitCode.NO_SCRIPT == 65
    assert "no_such_script.py" in line
    assert not (tmp_path / "log").exists()


def test_unknown_module(tmp_path: Path) -> None:
    result = perfrun("--log-dir", str(tmp_path / "log"), "-m", "no_such_module_xyz", cwd=tmp_path)
    line = assert_one_line_error(result, ExitCode.NO_SCRIPT)
    assert "no_such_module_xyz" in line


@pytest.mark.parametrize(
    "options, fragment",
    [
        (["--scheduler", "5", "5"], "END must be greater than START"),
        (["--scheduler", "7", "3"], "END must be greater than START"),
        (["--scheduler", "-1", "3"], "cannot be negative"),
        (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
    ],
    ids=["end-equals-start", "end-before-start", "negative", "nproc-0"],
)
def test_bad_settings_are_config_errors(tmp_path: Path, options: list, fragment: str) -> None:
    assert ExitCode.CONFIG == 64
    line = _error_case(tmp_path, "--log-dir", str(tmp_path / "log"), *options, code=ExitCode.CONFIG)
    assert fragment in line
    assert not (tmp_path / "log").exists()


def test_malformed_yaml_config(tmp_path: Path) -> None:
    config = tmp_path / "gpt.yaml"
    config.write_text("Global:\n  seed: [1, 2\nProfiler:\n  enable: true\n")
    line = _error_case(tmp_path, "--config", str(config), code=ExitCode.CONFIG)
    assert "malformed YAML" in line
    assert "line 3" in line


def test_unknown_profiler_key_lists_valid_keys(tmp_path: Path) -> None:
    config = tmp_path / "gpt.yaml"
    config.write_text("Profiler:\n  enable: true\n  schedular: [2, 4]\n")
    line = _error_case(tmp_path, "--config", str(config), code=ExitCode.CONFIG)
    assert "schedular" in line
    assert "valid keys: enable, scheduler, profiler_log" in line


def test_script_option_after_script_shows_the_dash_dash_fix(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    env = base_env(PROC_EXIT_MARKER=str(marker))
    result = perfrun(str(EXIT_SCRIPT), "--scheduler", "cosine", cwd=tmp_path, env=env)
    line = assert_one_line_error(result, ExitCode.USAGE)
    assert f"perfrun {EXIT_SCRIPT} -- --scheduler cosine" in line
    assert not marker.exists()


def test_unwritable_log_dir_fails_before_the_script_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # A folder under a regular file cannot be created, even by root.
    line = _error_case(tmp_path, "--log-dir", str(blocker / "log"), code=ExitCode.CONFIG)
    assert "cannot write to the log folder" in line


def test_nsys_missing_fails_before_anything_runs(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = base_env(PATH=str(empty_bin))
    line = _error_case(
        tmp_path, "--log-dir", str(tmp_path / "log"), "--nsys", code=ExitCode.CONFIG, env=env
    )
    assert "nsys" in line
    assert not (tmp_path / "log").exists()


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    """A real (torch-free, so quick) run folder to damage."""
    log = tmp_path / "log"
    result = perfrun("--log-dir", str(log), str(EXIT_SCRIPT), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = run_dir_of(log)
    ok = perfrun("report", str(run_dir), cwd=tmp_path)
    assert ok.returncode in (ExitCode.OK, ExitCode.NO_MEASUREMENT), ok.stderr
    return run_dir


def test_report_on_truncated_rank_file(tmp_path: Path, finished_run: Path) -> None:
    path = finished_run / "rank0.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    result = perfrun("report", str(finished_run), cwd=tmp_path)
    line = assert_one_line_error(result, ExitCode.BAD_RESULTS)
    assert ExitCode.BAD_RESULTS == 66
    assert "rank0.json" in line and "truncated" in line


def test_report_on_future_version_file(tmp_path: Path, finished_run: Path) -> None:
    path = finished_run / "rank0.json"
    data = json.loads(path.read_text())
    data["version"] = VERSION + 1
    path.write_text(json.dumps(data))
    result = perfrun("report", str(tmp_path / "log"), cwd=tmp_path)
    line = assert_one_line_error(result, ExitCode.BAD_RESULTS)
    assert f"version {VERSION + 1}" in line


# -- --nsys ----------------------------------------------------------------------------------


def fake_nsys(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A stand-in `nsys` first on PATH (Nsight Systems cannot be installed
    here): it records its arguments and RANK, then runs the command after
    `profile`'s options. It runs with -S so that, like the real (native)
    nsys, it does not itself load perfrun's bootstrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "nsys-calls.jsonl"
    script = bin_dir / "nsys"
    script.write_text(
        f"#!{sys.executable} -S\n"
        "import json, os, sys\n"
        "argv = sys.argv[1:]\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': argv, 'rank': os.environ.get('RANK')}) + '\\n')\n"
        "i = next(i for i, a in enumerate(argv)\n"
        f"         if a == {sys.executable!r} or a.endswith('python'))\n"
        "os.execv(argv[i], argv[i:])\n"
    )
    script.chmod(0o755)
    env = base_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return env, calls


def nsys_option(argv: list[str], name: str) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name:
            return argv[i + 1]
    raise AssertionError(f"{name} not given to nsys: {argv}")


def check_nsys_call(argv: list[str], run_dir: Path) -> str:
    assert argv[0] == "profile"
    traced = nsys_option(argv, "--trace").split(",")
    assert "nvtx" in traced and "cuda" in traced
    output = nsys_option(argv, "--output")
    assert Path(output).resolve().parent.parent == run_dir.resolve()
    return output


def test_nsys_wraps_the_script(tmp_path: Path) -> None:
    env, calls = fake_nsys(tmp_path)
    log = tmp_path / "log"
    result = perfrun(
        "--log-dir", str(log), "--nsys", str(TRAIN), "--steps", "5", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    run_dir = run_dir_of(log)
    entries = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(entries) == 1
    check_nsys_call(entries[0]["argv"], run_dir)
    assert entries[0]["argv"][-3:] == [str(TRAIN), "--steps", "5"]
    assert "training finished" in result.stdout
    assert len(rows(run_dir)) == 5


def test_nsys_once_per_rank_under_torchrun(tmp_path: Path) -> None:
    env, calls = fake_nsys(tmp_path)
    log = tmp_path / "log"
    options = ["--log-dir", str(log), "--nproc-per-node", "2", "--master-port", str(free_port())]
    result = perfrun(*options, "--nsys", str(DDP), "--steps", "3", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    run_dir = run_dir_of(log)
    entries = [json.loads(line) for line in calls.read_text().splitlines()]
    assert sorted(e["rank"] for e in entries) == ["0", "1"]
    for entry in entries:
        output = check_nsys_call(entry["argv"], run_dir)
        assert "%q{RANK}" in output
    for rank in (0, 1):
        assert len(rows(run_dir, rank)) == 3


# -- YAML config -----------------------------------------------------------------------------


GPT_CONFIG = """\
Global:
  device: gpu
  seed: 1024
  global_batch_size: 8
  micro_batch_size: 4

Engine:
  max_steps: 500
  logging_freq: 1
  eval_freq: 500
  mix_precision:
    enable: False
  save_load:
    save_steps: 1000
    output_dir: ./output

Model:
  module: "GPTModuleAuto"
  name: "GPT"
  vocab_size: 50304
  hidden_size: 1024
  num_layers: 4
  use_recompute: False

Optimizer:
  name: FusedAdamW
  weight_decay: 0.01
  lr:
    name: CosineAnnealingWithWarmupDecay
    decay_steps: 360000
    max_lr: 5.0e-5

Profiler:
  enable: True
  scheduler: [2, 4]
  profiler_log: {log}
"""


def _config_run(
    tmp_path: Path,
    before: tuple[str, ...] = (),
    after: tuple[str, ...] = (),
    script: tuple[str, ...] = (str(TRAIN), "--steps", "6"),
) -> tuple[subprocess.CompletedProcess, Path]:
    """A run with the GPT config: `perfrun --config FILE BEFORE SCRIPT AFTER
    SCRIPT-ARGS` (right after the script perfrun still reads its long options)."""
    log = tmp_path / "profiler_log"
    config = tmp_path / "pretrain_gpt.yaml"
    config.write_text(GPT_CONFIG.format(log=log))
    result = perfrun("--config", str(config), *before, script[0], *after, *script[1:], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "perfrun_log").exists()
    return result, run_dir_of(log)


def test_paddle_gpt_config_is_honoured(tmp_path: Path) -> None:
    result, run_dir = _config_run(tmp_path)
    assert rank_data(run_dir)["window"] == [2, 4]
    assert "Window: steps [2, 4)" in result.stdout
    assert len(rows(run_dir)) == 6


# The precedence itself is unit-tested in test_cli.py; these two only show
# that the winner reaches the script's process, so a torch-free script will do.


def test_command_line_scheduler_wins_over_config(tmp_path: Path) -> None:
    _, run_dir = _config_run(tmp_path, after=("--scheduler", "1", "3"), script=(str(EXIT_SCRIPT),))
    assert rank_data(run_dir)["window"] == [1, 3]


def test_override_sets_the_scheduler(tmp_path: Path) -> None:
    _, run_dir = _config_run(
        tmp_path, before=("-o", "Profiler.scheduler=[1,3]"), script=(str(EXIT_SCRIPT),)
    )
    assert rank_data(run_dir)["window"] == [1, 3]


def test_the_start_notice_names_the_run_folder_and_q_drops_it(tmp_path: Path) -> None:
    """Before the script's first line, one line on stderr says where the
    results will be; `-q` leaves it out."""
    script = tmp_path / "hello.py"
    script.write_text("import sys\nprint('out')\nprint('err', file=sys.stderr)\n")
    log = tmp_path / "log"
    for quiet in (False, True):
        args = [sys.executable, "-m", "perfrun", "--log-dir", str(log)]
        args += ["-q"] if quiet else []
        done = subprocess.run([*args, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        first = done.stderr.splitlines()[0]
        if quiet:
            assert first == "err", done.stderr
            assert START_NOTICE not in done.stderr
        else:
            assert first.startswith(f"{START_NOTICE}{script}; results in {log}{os.sep}"), first
            run_dir = first.rsplit(" ", 1)[1]
            assert os.path.isdir(run_dir)
            assert done.stderr.splitlines()[1] == "err"


SAVE_FAILS = """
import os, sys
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
for path in sys.argv[1:]:
    os.makedirs(path)  # where perfrun will want to write a file
"""


NO_DATA = """
import argparse, glob, os, sys
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
args = parser.parse_args()
files = sorted(glob.glob(os.path.join(args.data, "*.pt")))
if not files:
    print(f"no shards in {args.data}: nothing to train on")
    sys.exit(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for path in files:
    x, y = torch.load(path)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


def test_save_baseline_of_a_run_with_no_steps_fails(tmp_path: Path) -> None:
    """A CI job on main that records its baseline from a run that trained
    nothing (an empty data folder, exit 0) fails, in one line, and leaves
    the baseline it had: saved, every later gate would exit 67."""
    script = tmp_path / "train.py"
    script.write_text(NO_DATA)
    (tmp_path / "shards").mkdir()
    base = tmp_path / "base.json"
    base.write_text("{}")  # stands for the previous baseline: kept as it is
    done = subprocess.run(
        [sys.executable, "-m", "perfrun", "--log-dir", str(tmp_path / "log"),
         "--save-baseline", str(base), str(script), "--data", str(tmp_path / "shards")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == ExitCode.NO_MEASUREMENT, done.stderr
    assert done.stdout.startswith("no shards in "), done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("perfrun: error")]
    assert errors == ["perfrun: error: could not save the baseline: the run recorded no steps "
                      "(no training loop was seen): a baseline needs steps to compare "
                      "against"], done.stderr
    assert "baseline saved" not in done.stderr and "Traceback" not in done.stderr
    assert base.read_text() == "{}"


@pytest.mark.parametrize(
    "option, name, code, message",
    [
        ("--save-baseline", "base.json", ExitCode.CONFIG, "could not save the baseline: "),
        ("--output", "report.txt", ExitCode.CONFIG, "could not write the report: "),
    ],
)
def test_a_file_that_cannot_be_saved_after_the_run_is_no_success(
    tmp_path: Path, option: str, name: str, code: int, message: str
) -> None:
    """The script succeeded, but perfrun could not save what it was asked
    to: never exit 0 (a CI job on main would go green with no baseline)."""
    script = tmp_path / "train.py"
    script.write_text(SAVE_FAILS)
    target = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-m", "perfrun", "-q", "--log-dir", str(tmp_path / "log"),
         option, str(target), str(script), str(target)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == code, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("perfrun: error")]
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert "Traceback" not in done.stderr


NVTX_SEEN = """
import sys
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
print("nvtx imported:", "nvtx" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.skipif(any(os.path.exists(p) for p in ("/proc/driver/nvidia", "/dev/dxg")),
                    reason="an NVIDIA driver is here: nvtx is imported, as it should be")
def test_nvtx_stays_unimported_where_no_tool_could_listen(tmp_path: Path) -> None:
    # The default mode imports nvtx only where a tool could listen (an
    # NVIDIA driver, or a tool named in NVTX_INJECTION64_PATH); a tool
    # named there gets it.
    script = tmp_path / "nvtx_seen.py"
    script.write_text(NVTX_SEEN)
    env = base_env()
    env.pop("NVTX_INJECTION64_PATH", None)
    env.pop("NVTX_INJECTION32_PATH", None)
    done = perfrun("--log-dir", str(tmp_path / "log"), str(script), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "nvtx imported: False" in done.stdout
    # A tool named in the environment (a library that is not there: nvtx
    # falls back to its no-op ranges, as without a tool).
    named = dict(env, NVTX_INJECTION64_PATH=str(tmp_path / "libTool.so"))
    done = perfrun("--log-dir", str(tmp_path / "log2"), str(script), cwd=tmp_path, env=named)
    assert done.returncode == 0, done.stderr
    assert "nvtx imported: True" in done.stdout
