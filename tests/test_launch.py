"""Starting the script (perfrun/launcher/launch.py, settings.child_settings):
an argument list of any length `python` accepts reaches the script as
written, the settings reach the rank in a file rather than the environment,
a script that cannot be started is one line, and only a run that started
prunes old ones. The deciders on plain data first, then real runs."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT, e2e_environment

from perfrun import cli
from perfrun.exitcodes import ExitCode
from perfrun.launcher.launch import MAX_ARG_STRLEN, argument_space, start_failure
from perfrun.settings import ENV_VAR, Settings, child_environment, child_settings
from perfrun.store import layout
from perfrun.store.results import read_run
from perfrun.store.stepfile import STEP_COLUMNS

SCRIPT = Path(__file__).parent / "scripts" / "train_shards.py"
#: What Linux allows one environment variable, NAME=VALUE (MAX_ARG_STRLEN):
#: the settings once held the argument list twice in one.
ONE_VARIABLE = 128 * 1024


# -- on plain data ------------------------------------------------------------------------


def test_the_settings_go_in_a_file_and_the_environment_names_it(tmp_path: Path) -> None:
    args = tuple(f"data/shard-{i:05d}.csv" for i in range(5000))
    settings = Settings(script="train.py", script_args=args)
    payload = child_settings(settings, str(tmp_path), "/boot", base={"PYTHONPATH": "/mine"},
                             extra={"command": ["perfrun", "train.py", *args]})
    assert payload["script_args"] == args and payload["pythonpath"] == "/mine"
    assert payload["run_dir"] == str(tmp_path) and payload["boot_dir"] == "/boot"
    assert len(json.dumps(payload)) > ONE_VARIABLE
    path = layout.settings_path(str(tmp_path))
    env = child_environment(path, "/boot", base={"PYTHONPATH": "/mine", "HOME": "/h"})
    assert env[ENV_VAR] == path and env["PYTHONPATH"] == f"/boot{os.pathsep}/mine"
    assert env["HOME"] == "/h"
    assert max(len(k) + len(v) + 2 for k, v in env.items()) < 1024
    assert layout.settings_path("/r", "3") == os.path.join("/r", "nodes", "settings.node3.json")


def test_a_list_the_system_refuses_is_said_with_its_figures() -> None:
    one = argument_space(["python", "x" * 200_000], {}, 2_097_152)
    assert one == (f"the argument list is too long: one argument is 200000 bytes, and the "
                   f"system takes at most {MAX_ARG_STRLEN - 1} in one")
    cmd = ["python", *["a" * 99] * 30_000]
    total = 7 + 100 * 30_000 + 4 + 8 * 30_004
    assert argument_space(cmd, {"A": "b"}, 2_097_152) == (
        f"the argument list is too long: the arguments and the environment take {total} "
        "bytes, and the system takes at most 2097152")
    refused = start_failure(cmd, {"A": "b"}, OSError(errno.E2BIG, "Argument list too long"))
    assert refused.startswith("cannot start the script: the argument list is too long: the "
                              f"arguments and the environment take {total} bytes")
    assert start_failure(["/opt/py"], {}, OSError(errno.EACCES, "Permission denied")) == (
        "cannot start the script (/opt/py): Permission denied")


# -- real runs ----------------------------------------------------------------------------


def write_shards(folder: Path, names: list[str], rows: int = 4) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        lines = [",".join(f"{(i + r + c) % 7 * 0.1:.1f}" for c in range(9)) for r in range(rows)]
        (folder / name).write_text("\n".join(lines) + "\n")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=e2e_environment(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=E2E_TIMEOUT)


@pytest.mark.slow
def test_1500_arguments_run_as_python_runs_them(tmp_path: Path) -> None:
    """`perfrun train.py data/*.csv` with 1,500 shards (about 180 KB of
    arguments, past what one variable of the environment holds): the
    script gets every argument, as under python, and trains."""
    data = tmp_path / "data"
    shards = [str(data / f"shard-{i:05d}-of-01500.csv") for i in range(1500)]
    write_shards(data, [Path(s).name for s in shards[:40]])
    assert sum(len(s) + 1 for s in shards) > ONE_VARIABLE
    args = [str(SCRIPT), *shards, "--max-shards", "40"]
    plain = run(*args, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    under = run("-m", "perfrun", "--log-dir", str(tmp_path / "log"), *args, cwd=tmp_path)
    assert under.returncode == 0, under.stderr
    assert under.stdout.startswith(plain.stdout), under.stdout[:2000]
    assert "internal error" not in under.stderr and "too long" not in under.stderr
    [rank] = read_run(str(tmp_path / "log" / "latest")).ranks
    assert rank.n_steps == 40
    assert list(rank.data["settings"]["script_args"]) == args[1:]


def largest_list(size: int) -> int:
    """How many arguments of `size` bytes `python -S -c ""` accepts here,
    in this environment: the system's limit, found by trying."""
    def fits(n: int) -> bool:
        try:
            subprocess.run([sys.executable, "-S", "-c", "", *["a" * (size - 1)] * n],
                           env=e2e_environment(), check=True, timeout=E2E_TIMEOUT)
        except OSError:
            return False
        return True

    lo, hi = 1, 4 * 1024 * 1024 // size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


@pytest.mark.slow
def test_an_argument_list_near_pythons_limit_runs(tmp_path: Path) -> None:
    """Shard names of 100 bytes, as many as leave python 1 to 2 KiB of the
    system's limit (about 2 MiB): python runs the script with them, and so
    does perfrun."""
    size = 100
    fit = largest_list(size)
    # The script's own arguments take the place of `-S -c ""`, and 1 KiB
    # is left over.
    extra = sum(len(a) + 1 + 8 for a in (str(SCRIPT), "--max-shards", "20"))
    extra -= sum(len(a) + 1 + 8 for a in ("-S", "-c", ""))
    n = fit - -(-(extra + 1024) // (size + 8))
    data = tmp_path / "d"
    shards = [str(data / f"{i:07d}".ljust(size - 1 - len(str(data)) - 1, "x")) for i in range(n)]
    assert {len(s) + 1 for s in shards} == {size}
    write_shards(data, [Path(s).name for s in shards[:20]])
    args = [str(SCRIPT), *shards, "--max-shards", "20"]
    plain = run(*args, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    under = run("-m", "perfrun", "-q", "--log-dir", "log", *args, cwd=tmp_path)
    assert under.returncode == 0, under.stderr[-2000:]
    assert under.stdout.startswith(plain.stdout), under.stdout[:2000]
    assert read_run(str(tmp_path / "log" / "latest")).ranks[0].n_steps == 20


def made_run(log: Path, name: str, started: float) -> None:
    """A finished run of ten steps, as an earlier perfrun left it."""
    folder = log / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"started": started, "returncode": 0}))
    row = [0.0, 1.0] + [0.0] * (len(STEP_COLUMNS) - 2)
    (folder / "rank0.json").write_text(json.dumps({
        "format": "perfrun-results", "version": 1, "rank": 0, "status": "finished",
        "steps": {"columns": list(STEP_COLUMNS), "rows": [row] * 10}}))


@pytest.mark.slow
def test_a_script_that_cannot_be_started_is_one_line_and_prunes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3 MB of arguments, past what the system takes: the exec is refused,
    perfrun says so in one line and exits 64, and the old runs --keep 1
    would have pruned are all still there."""
    log = tmp_path / "log"
    made_run(log, "20260101-000000-1", 1.0)
    made_run(log, "20260102-000000-2", 2.0)
    code = cli.main(["--log-dir", str(log), "--keep", "1", str(SCRIPT),
                     *[f"shard-{i:06d}".ljust(99, "x") for i in range(30_000)]])
    assert code == ExitCode.CONFIG
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("perfrun: profiling "), err
    assert err[1].startswith("perfrun: error: cannot start the script: the argument list is "
                             "too long: the arguments and the environment take "), err
    assert err[1].endswith(f"bytes, and the system takes at most {os.sysconf('SC_ARG_MAX')}")
    assert {"20260101-000000-1", "20260102-000000-2"} <= set(os.listdir(log))


def test_a_latest_that_is_a_folder_is_kept_and_no_link_left_beside_it(tmp_path: Path) -> None:
    """A log folder copied with cp -rL or scp -r: `latest` is a folder,
    which perfrun never removes, and each run once left a `latest.tmp<PID>`
    link beside it."""
    from perfrun.launcher.launch import _point_latest

    copied = tmp_path / "latest"
    copied.mkdir()
    (copied / "rank0.json").write_text("{}")
    run = tmp_path / "20261128-101010-1"
    run.mkdir()
    _point_latest(str(tmp_path), str(run))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20261128-101010-1", "latest"]
    assert copied.is_dir() and not copied.is_symlink() and (copied / "rank0.json").exists()
