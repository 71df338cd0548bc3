"""A launcher's command with perfrun in front, read without running it
(launchcommand.py), and what the command line and the settings make of it
(cli.py): which launcher, where the user's script is, torchrun's options as
perfrun's own, and everything after the launcher left to it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perfrun import cli
from perfrun.cli import UsageError, settings_from_options, split_run_argv
from perfrun.launchcommand import LaunchCommandError, read, recognise
from perfrun.launcher.launch import build_command, expected_ranks
from perfrun.scriptoptions import NOTHING


@pytest.fixture(autouse=True)
def in_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder with the user's train.py, as the commands name it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")


@pytest.mark.parametrize("target, kind", [
    (["train.py", "--lr", "1"], None),
    (["torchrun", "--nproc-per-node", "2", "train.py"], "torchrun"),
    (["/opt/venv/bin/torchrun", "train.py"], "torchrun"),
    (["python", "-m", "torch.distributed.run", "train.py"], "torchrun"),
    (["python3.11", "-m", "torch.distributed.run", "train.py"], "torchrun"),
    (["accelerate", "launch", "train.py"], "accelerate"),
    (["deepspeed", "--num_gpus", "2", "train.py"], "deepspeed"),
    (["mpirun", "-n", "2", "python", "train.py"], "mpirun"),
    (["srun", "-n", "2", "python", "train.py"], "srun"),
    (["python", "-u", "train.py"], "python"),
    (["env", "A=1", "python", "train.py"], "command"),
    (["env", "A=1"], None),
])
def test_which_launcher(target: list[str], kind: str) -> None:
    assert recognise(target) == kind


def test_a_file_of_the_folder_is_a_script_whatever_its_name(tmp_path: Path) -> None:
    (tmp_path / "env").write_text("print('mine')\n")
    assert recognise(["env", "python", "train.py"]) is None


def test_torchrun_options_become_perfruns_and_the_rest_pass_on() -> None:
    launch = read(["torchrun", "--nproc_per_node=2", "--max-restarts", "1", "--standalone",
                   "--rdzv-id", "exp", "train.py", "--lr", "1", "--nproc-per-node", "9"])
    assert launch is not None
    assert launch.script == "train.py" and launch.args == ("--lr", "1", "--nproc-per-node", "9")
    assert dict(launch.settings) == {"nproc_per_node": "2", "rdzv_id": "exp"}
    assert launch.passthrough == ("--max-restarts", "1", "--standalone")
    assert launch.ranks == 2


def test_torchrun_with_a_module_and_auto_processes() -> None:
    launch = read(["torchrun", "--nproc-per-node", "auto", "-m", "pkg.train", "x"])
    assert launch is not None and launch.module == "pkg.train" and launch.script is None
    assert launch.passthrough == ("--nproc-per-node", "auto") and launch.ranks is None


@pytest.mark.parametrize("target, message", [
    (["torchrun", "--nproc-per-node", "2"], "names no script"),
    (["torchrun", "--no-python", "train.sh"], "--no-python"),
    (["torchrun", "--nproc-per-node"], "needs a value"),
    (["accelerate", "launch", "--cpu"], "found no Python script"),
])
def test_a_command_perfrun_cannot_run_is_one_line(target: list[str], message: str) -> None:
    with pytest.raises(LaunchCommandError, match=message):
        read(target)


def test_other_launchers_run_as_given_and_say_their_ranks_where_sure() -> None:
    mpi = read(["mpirun", "-n", "2", "--oversubscribe", "python", "-u", "train.py", "a"])
    assert mpi is not None and mpi.head == ("mpirun", "-n", "2", "--oversubscribe", "python", "-u")
    assert (mpi.script, mpi.args, mpi.ranks) == ("train.py", ("a",), 2)
    srun = read(["srun", "--ntasks=4", "python", "-m", "pkg.train", "a"])
    assert srun is not None and srun.head == ("srun", "--ntasks=4", "python")
    assert (srun.module, srun.args, srun.ranks) == ("pkg.train", ("a",), 4)
    # accelerate's count depends on its config and the machine: not guessed.
    acc = read(["accelerate", "launch", "--num_processes", "2", "--cpu", "train.py"])
    assert acc is not None and acc.ranks is None and acc.script == "train.py"


# -- the command line -----------------------------------------------------------------


def test_after_a_launcher_nothing_is_perfruns() -> None:
    argv = ["--timer-only", "torchrun", "--nproc-per-node", "2", "train.py", "--batch-size",
            "4", "--stop-after", "3"]
    split = split_run_argv(argv, NOTHING)
    assert split.before == ["--timer-only"] and split.after == []
    assert split.target == argv[1:]
    module = split_run_argv(["-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "train.py", "--stop-after", "3"], NOTHING)
    assert module.after == [] and module.target == ["--nproc-per-node", "2", "train.py",
                                                    "--stop-after", "3"]


def _settings(script: str | None, args: list[str], module: str | None = None) -> object:
    return settings_from_options({"script": script, "script_args": tuple(args),
                                  "module": module})


@pytest.mark.parametrize("command", [
    ["torchrun", "--nproc-per-node", "2", "--max-restarts", "1", "train.py", "5", "--x"],
    ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
     "train.py", "5", "--x"],
])
def test_a_torchrun_command_is_perfruns_own_torchrun_run(command: list[str]) -> None:
    settings = _settings(command[0], command[1:])
    plain = _settings("train.py", ["5", "--x"]).replace(nproc_per_node=2)
    assert settings.script == "train.py" and settings.script_args == ("5", "--x")
    assert settings.nproc_per_node == 2 and settings.distributed and not settings.launch
    assert settings.torchrun_args == ("--max-restarts", "1")
    made = build_command(settings, "/tmp/run")
    assert made == [*build_command(plain, "/tmp/run")[:-3], "--max-restarts", "1",
                    "train.py", "5", "--x"]
    assert expected_ranks(settings) == 2


def test_perfruns_minus_m_torch_distributed_run() -> None:
    settings = _settings("--nproc-per-node", ["2", "train.py"], module="torch.distributed.run")
    assert settings.module is None and settings.script == "train.py"
    assert settings.nproc_per_node == 2


def test_torchrun_with_no_options_is_still_torchrun() -> None:
    settings = _settings("torchrun", ["train.py"])
    assert settings.distributed and settings.torchrun_args == ()
    assert "perfrun.launcher.torchrun" in build_command(settings, "/tmp/run")


def test_a_torchrun_option_given_twice_is_refused() -> None:
    with pytest.raises(UsageError, match="given to perfrun and to torchrun"):
        settings_from_options({"script": "torchrun", "nproc_per_node": 2,
                               "script_args": ("--nproc-per-node", "2", "train.py")})


def test_another_launcher_runs_as_given() -> None:
    settings = _settings("accelerate", ["launch", "--multi_gpu", "train.py", "--lr", "1"])
    assert settings.launch == ("accelerate", "launch", "--multi_gpu")
    assert settings.launch_kind == "accelerate" and not settings.distributed
    assert build_command(settings, "/tmp/run") == [
        "accelerate", "launch", "--multi_gpu", "train.py", "--lr", "1"]
    assert expected_ranks(settings) == 1


def test_a_launcher_and_perfruns_nsys_are_refused() -> None:
    with pytest.raises(Exception, match="--nsys with a accelerate command|--nsys with"):
        settings_from_options({"script": "accelerate", "nsys": True,
                               "script_args": ("launch", "train.py")})


def test_cli_main_refuses_a_bad_command_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["torchrun", "--nproc-per-node", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "names no script" in err
    assert os.listdir(".") == ["train.py"]


# -- the boot: which processes of a launcher's command are ranks --------------------


def _boot() -> object:
    """boot/sitecustomize.py as a module of its own (without
    PERFRUN_SETTINGS it starts nothing)."""
    import importlib.util

    from perfrun.launcher.launch import BOOT_DIR

    spec = importlib.util.spec_from_file_location(
        "perfrun_boot_under_test", os.path.join(BOOT_DIR, "sitecustomize.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ranks_are_the_processes_that_run_the_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERFRUN_SETTINGS", raising=False)
    boot = _boot()
    script = {"script": os.path.realpath(tmp_path / "train.py")}
    payload = {"launcher": "command", "rank_target": script}
    for argv, rank in ((["train.py", "--lr"], True),
                       ([str(tmp_path / "train.py")], True),
                       (["/opt/bin/accelerate", "launch", "train.py"], False),
                       (["-c"], False),
                       (["-m"], False)):
        monkeypatch.setattr("sys.argv", argv)
        assert boot._is_rank(payload) is rank, argv
    module = {"launcher": "command", "rank_target": {"module": "pkg.train"}}
    monkeypatch.setattr("sys.argv", ["-m", "x"])
    monkeypatch.setattr("sys.orig_argv", ["python", "-u", "-m", "pkg.train", "x"], raising=False)
    assert boot._is_rank(module)
    monkeypatch.setattr("sys.orig_argv", ["python", "-m", "pkg.other"], raising=False)
    assert not boot._is_rank(module)
