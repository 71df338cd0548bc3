"""The command line without processes: how argv is split between perfrun and
the script, how the YAML config and `-o` overrides become settings, and the
checks settings get before anything runs. All in-process; `main()` is only
called for errors that are found before a script would start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfrun import cli
from perfrun.cli import UsageError, split_run_argv
from perfrun.config import PROFILER_KEYS, load_config, parse_override
from perfrun.exitcodes import ExitCode
from perfrun.scriptoptions import NOTHING, ScriptOptions
from perfrun.settings import SUMMARY_KEYS, Settings, SettingsError

# -- split_run_argv -------------------------------------------------------------------

#: What scripts define, as scriptoptions.py reads it (tests/test_scriptoptions.py).
#: An argparse training script: its options, -h/--help, and abbreviations.
TRAIN = ScriptOptions(frozenset({"-h", "--help", "--epochs", "--lr", "--batch-size"}), True)
#: One that chooses its learning-rate schedule with its own --scheduler.
LR = ScriptOptions(frozenset({"-h", "--help", "--scheduler", "--epochs", "--warmup-epochs"}),
                   True)
#: One that reads sys.argv itself: what it takes is not known.
ARGV = ScriptOptions(unsure="reads sys.argv itself")


def split(argv: list[str], defines: ScriptOptions = NOTHING) -> tuple:
    before, after, target, _notes = split_run_argv(argv, defines)
    return before, after, target


@pytest.mark.parametrize(
    "argv, defines, expected",
    [
        ([], NOTHING, ([], [], [])),
        (["train.py"], TRAIN, ([], [], ["train.py"])),
        (
            ["--scheduler", "100", "110", "train.py", "--lr", "0.1"],
            TRAIN,
            (["--scheduler", "100", "110"], [], ["train.py", "--lr", "0.1"]),
        ),
        # The headline command: perfrun's window, written after the script.
        (
            ["train.py", "--scheduler", "100", "110"],
            TRAIN,
            ([], ["--scheduler", "100", "110"], ["train.py"]),
        ),
        # Every perfrun option after the script is perfrun's, wherever it
        # stands among the script's own, in any spelling it takes.
        (
            ["train.py", "--timer-only", "--stop-after", "50"],
            TRAIN,
            ([], ["--timer-only", "--stop-after", "50"], ["train.py"]),
        ),
        (
            ["train.py", "--epochs", "2", "--warmup=3", "--lr", "0.1", "--log-dir", "d", "-q"],
            TRAIN,
            ([], ["--warmup=3", "--log-dir", "d", "-q"], ["train.py", "--epochs", "2", "--lr",
                                                           "0.1"]),
        ),
        (
            ["train.py", "--nproc_per_node", "2", "--master_port=29999"],
            NOTHING,
            ([], ["--nproc-per-node", "2", "--master-port=29999"], ["train.py"]),
        ),
        # ...except a name the script defines itself: the script's.
        (
            ["train.py", "--batch-size", "64", "--timer-only"],
            TRAIN,
            ([], ["--timer-only"], ["train.py", "--batch-size", "64"]),
        ),
        (
            ["lr.py", "--scheduler", "cosine", "--epochs", "2", "--timer-only"],
            LR,
            ([], ["--timer-only"], ["lr.py", "--scheduler", "cosine", "--epochs", "2"]),
        ),
        (["argp.py", "--output", "foo"], ScriptOptions(frozenset({"--output"})),
         ([], [], ["argp.py", "--output", "foo"])),
        (["argp.py", "--output", "foo"], NOTHING, ([], ["--output", "foo"], ["argp.py"])),
        # -m and --help say what runs and ask about perfrun: after the
        # script they are the script's, as with python.
        (["train.py", "--help"], TRAIN, ([], [], ["train.py", "--help"])),
        (["train.py", "-h"], NOTHING, ([], [], ["train.py", "-h"])),
        (["train.py", "--module", "m"], NOTHING, ([], [], ["train.py", "--module", "m"])),
        (["train.py", "-m", "m"], NOTHING, ([], [], ["train.py", "-m", "m"])),
        # Short options follow the same rule.
        (
            ["train.py", "-o", "x=1", "-c", "cfg"],
            ScriptOptions(frozenset({"-o", "-c"})),
            ([], [], ["train.py", "-o", "x=1", "-c", "cfg"]),
        ),
        (
            ["train.py", "-o", "Profiler.warmup=1", "-c", "cfg"],
            NOTHING,
            ([], ["-o", "Profiler.warmup=1"], ["train.py", "-c", "cfg"]),
        ),
        # torchrun's own spellings, before the script.
        (
            ["--nproc_per_node", "2", "--master_port=29999", "train.py"],
            NOTHING,
            (["--nproc-per-node", "2", "--master-port=29999"], [], ["train.py"]),
        ),
        # `--` hands everything after it to the script, even perfrun's names,
        # before the script or after it; a second `--` is the script's.
        (
            ["train.py", "--", "--scheduler", "1", "2"],
            NOTHING,
            ([], [], ["train.py", "--scheduler", "1", "2"]),
        ),
        (
            ["train.py", "--lr", "1", "--timer-only", "--", "--warmup", "2", "--", "x"],
            TRAIN,
            ([], ["--timer-only"], ["train.py", "--lr", "1", "--warmup", "2", "--", "x"]),
        ),
        (
            ["--timer-only", "--", "train.py", "--timer-only"],
            NOTHING,
            (["--timer-only"], [], ["train.py", "--timer-only"]),
        ),
        (
            ["-o", "Profiler.scheduler=[1,3]", "train.py"],
            NOTHING,
            (["-o", "Profiler.scheduler=[1,3]"], [], ["train.py"]),
        ),
        (["--log-dir=/tmp/x", "train.py"], NOTHING, (["--log-dir=/tmp/x"], [], ["train.py"])),
        (["-h"], NOTHING, (["-h"], [], [])),
        # -m: the module name ends perfrun's options before it; after it the
        # rule is the same as after a script.
        (["-m", "pkg.train", "--lr", "1"], TRAIN, (["--module=pkg.train"], [], ["--lr", "1"])),
        (
            ["--timer-only", "-m", "pkg.train", "-c", "x"],
            NOTHING,
            (["--timer-only", "--module=pkg.train"], [], ["-c", "x"]),
        ),
        (["--module=pkg.train", "a"], NOTHING, (["--module=pkg.train"], [], ["a"])),
        (
            ["-m", "pkg.train", "--scheduler", "1", "2", "a"],
            NOTHING,
            (["--module=pkg.train"], ["--scheduler", "1", "2"], ["a"]),
        ),
        (
            ["-m", "pkg.train", "--scheduler", "step"],
            LR,
            (["--module=pkg.train"], [], ["--scheduler", "step"]),
        ),
        # A script whose name looks like a value is still the script (`-`
        # is standard input to python, and refused: test_split_run_argv_errors).
        (["100", "110"], NOTHING, ([], [], ["100", "110"])),
    ],
)
def test_split_run_argv(argv: list[str], defines: ScriptOptions, expected: tuple) -> None:
    assert split(argv, defines) == expected


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--no-such-option", "train.py"], "no such option: --no-such-option$"),
        (["--timer-onyl", "x.py"], r"no such option: --timer-onyl \(did you mean --timer-only\?\)"),
        (["--nproc-per-nod", "2", "t.py"], r"did you mean --nproc-per-node\?"),
        (["-x", "train.py"], "no such option: -x"),
        # python's own flags are named as python's, with what does the same
        # from the environment; -c and a script on stdin cannot run.
        (["-Werror", "train.py"], r"^-W is python's, not perfrun's: .* set PYTHONWARNINGS=ARG"),
        (["-W", "error", "train.py"], r"^-W is python's, not perfrun's"),
        (["-X", "dev", "train.py"], r"^-X is python's, .*PYTHONDEVMODE=1 for -X dev"),
        (["-Xdev", "train.py"], r"^-X is python's"),
        (["-O", "train.py"], r"set PYTHONOPTIMIZE=1 in its environment instead$"),
        (["-OO", "train.py"], r"set PYTHONOPTIMIZE=2 in its environment instead$"),
        (["-u", "train.py"], r"set PYTHONUNBUFFERED=1"),
        (["--timer-only", "-B", "train.py"], r"set PYTHONDONTWRITEBYTECODE=1"),
        (["-c", "print(1)"], r"^-c is python's, not perfrun's: .*save the code to a file"),
        (["-"], r"^perfrun cannot run a script from standard input"),
        (["-Ox", "train.py"], r"^no such option: -Ox$"),
        (["-m"], "-m needs a module name"),
        (["--timer-only", "--module"], "-m needs a module name"),
        # An option perfrun takes after the script needs its values there:
        # a `--` (or the end) is not one.
        (
            ["train.py", "--epochs", "1", "--stop-after"],
            r"^Option '--stop-after' requires an argument; --stop-after after train.py was read "
            r"as perfrun's. If it is the script's own, put it after --: "
            r"perfrun train.py -- --epochs 1 --stop-after$",
        ),
        (
            ["train.py", "--scheduler", "3", "--", "x"],
            r"requires 2 arguments; .* perfrun train.py -- --scheduler 3 x$",
        ),
    ],
)
def test_split_run_argv_errors(argv: list[str], fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        split_run_argv(argv, TRAIN)


def notes(argv: list[str], defines: ScriptOptions) -> list[str]:
    return split_run_argv(argv, defines).notes


def test_the_headline_command_and_options_the_script_lacks_are_taken_quietly() -> None:
    for defines in (TRAIN, NOTHING):
        assert notes(["train.py", "--scheduler", "100", "110"], defines) == []
        assert notes(["train.py", "--timer-only", "--stop-after", "50", "--lr", "1"], defines) \
            == []
    # Nothing written after the script, nothing to say, whatever the script.
    assert notes(["train.py", "--lr", "1"], ARGV) == []
    assert notes(["--timer-only", "train.py", "--help"], TRAIN) == []


def test_a_name_the_script_defines_is_its_own_and_perfrun_says_so() -> None:
    assert notes(["lr.py", "--scheduler", "cosine", "--timer-only"], LR) == [
        "--scheduler went to lr.py, which defines it; perfrun's goes before the script"
    ]
    both = ScriptOptions(frozenset({"--scheduler", "--output"}))
    assert notes(["t.py", "--scheduler", "a", "--output", "o", "--scheduler", "b"], both) == [
        "--scheduler, --output went to t.py, which defines them; perfrun's go before the script"
    ]


def test_what_perfrun_takes_from_a_script_it_cannot_read_fully_is_said() -> None:
    assert notes(["argv.py", "30", "--timer-only", "--stop-after", "5"], ARGV) == [
        "took --timer-only --stop-after 5 as perfrun's, though argv.py reads sys.argv itself; "
        "for the script, put them after --"
    ]
    assert notes(["-m", "pkg.train", "--warmup=2"], ScriptOptions(unsure="has a source perfrun "
                                                                          "did not find")) == [
        "took --warmup=2 as perfrun's, though pkg.train has a source perfrun did not find; "
        "for the script, put it after --"
    ]


def test_an_option_argparse_would_take_as_an_abbreviation_is_said() -> None:
    # argparse takes --warmup for the script's --warmup-epochs (allow_abbrev).
    assert notes(["lr.py", "--warmup", "2"], LR) == [
        "took --warmup as perfrun's, though argparse would give it to lr.py's --warmup-epochs; "
        "for the script, write that in full"
    ]
    strict = ScriptOptions(LR.names, abbreviates=False)
    assert notes(["lr.py", "--warmup", "2"], strict) == []


def test_a_misspelt_perfrun_option_passed_to_the_script_is_said() -> None:
    assert notes(["train.py", "--timer-onyl"], TRAIN) == [
        "passed --timer-onyl to the script as its own argument; perfrun's option is --timer-only"
    ]
    # Not where the script defines that spelling itself.
    own = ScriptOptions(frozenset({"--batch_size"}))
    assert notes(["train.py", "--batch_size", "3"], own) == []
    assert notes(["train.py", "--batch_size", "3"], NOTHING) == [
        "passed --batch_size to the script as its own argument; perfrun's option is --batch-size"
    ]


def test_every_run_option_is_known_to_the_splitter() -> None:
    # The splitter reads click's own option table, so a new option can never
    # be taken for the script's by mistake.
    table = cli._option_table()
    for name, takes in {
        "--scheduler": 2,
        "--timer-only": 0,
        "--nsys": 0,
        "--log-dir": 1,
        "--config": 1,
        "-o": 1,
        "--nproc-per-node": 1,
        "--flush-interval": 1,
        "-h": 0,
    }.items():
        assert table[name] == takes, name


def test_run_target_names_what_runs_and_what_follows_it() -> None:
    assert cli.run_target(["--timer-only", "t.py", "--lr", "1", "--", "x"]) == cli.Target(
        "script", "t.py", 2, ["--lr", "1"]
    )
    assert cli.run_target(["-m", "pkg.train", "a"]) == cli.Target("module", "pkg.train", 2, ["a"])
    assert cli.run_target(["--timer-only"]) is None
    assert cli.run_target(["--", "t.py", "--timer-only"]) is None


def test_the_script_is_read_only_when_an_option_follows_it(tmp_path: Path) -> None:
    # A script python could not compile: reading it says so, not reading it
    # leaves NOTHING.
    script = tmp_path / "broken.py"
    script.write_text("import argparse\ndef main(:\n")
    assert cli._script_defines([str(script), "100"]) is NOTHING
    assert cli._script_defines([str(script), "--", "--scheduler"]) is NOTHING
    assert cli._script_defines([str(script), "--lr", "1"]).unsure == (
        "could not be read (SyntaxError)"
    )


# -- main(): errors found before anything runs ------------------------------------------


def test_main_hint_for_script_option_read_as_perfrun_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["train.py", "--scheduler", "cosine"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("perfrun: error: ")
    assert "perfrun train.py -- --scheduler cosine" in err
    assert ".;" not in err


@pytest.mark.parametrize(
    "argv, named, fix",
    [
        # --scheduler takes two values, so it swallowed the script's --lr too.
        (["--scheduler", "cosine", "--lr", "0.1"], "--scheduler", "--scheduler cosine --lr 0.1"),
    ],
)
def test_main_hint_keeps_the_script_arguments(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str, fix: str
) -> None:
    assert cli.main(["train.py", *argv]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"; {named} after train.py was read as perfrun's." in err
    assert err.rstrip().endswith(f"perfrun train.py -- {fix}")


@pytest.mark.parametrize(
    "argv, code, fragment",
    [
        (["--scheduler", "5", "3", "train.py"], ExitCode.CONFIG, "END must be greater"),
        (["--scheduler", "-2", "3", "train.py"], ExitCode.CONFIG, "cannot be negative"),
        (["--nproc-per-node", "0", "train.py"], ExitCode.CONFIG, "at least 1"),
        (["-o", "Profiler.nope=1", "train.py"], ExitCode.CONFIG, "unknown Profiler key"),
        (["--no-such-option", "train.py"], ExitCode.USAGE, "no such option"),
        (["-W", "error", "train.py"], ExitCode.USAGE, "PYTHONWARNINGS"),
        (["-"], ExitCode.USAGE, "standard input"),
        (["--timer-only"], ExitCode.USAGE, "no script given"),
        (["--step-on", "epoch", "train.py"], ExitCode.USAGE, "--step-on"),
    ],
)
def test_main_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], code: int, fragment: str
) -> None:
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("perfrun: error: ")
    assert fragment in err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["report", "--warmup", "-1", "nowhere"], "--warmup cannot be negative (-1)"),
        (["report", "--row-limit", "0", "nowhere"], "--row-limit must be at least 1, not 0"),
        (["compare", "a", "b", "--warmup", "-2"], "--warmup cannot be negative (-2)"),
        (["analyze", "t.json", "--row-limit", "0"], "--row-limit must be at least 1, not 0"),
    ],
)
def test_report_and_compare_check_as_run_checks(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    assert cli.main(argv) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_outputs_that_cannot_be_written_are_refused_before_the_script_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("open('ran.marker', 'w').close()\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (["--output", str(tmp_path), str(script)], "is a folder; give a file name"),
        (["--output", str(tmp_path / "no" / "r.txt"), str(script)], "no such folder"),
        (["--save-baseline", str(a_file / "b.json"), str(script)], "no such folder"),
        (["report", str(tmp_path), "--output", str(tmp_path)], "is a folder"),
        (["compare", "a", "b", "--output", str(tmp_path)], "is a folder"),
    ]
    for argv, fragment in cases:
        assert cli.main(argv) == ExitCode.CONFIG, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and fragment in err, (argv, err)
    assert not (tmp_path / "ran.marker").exists()


def test_an_internal_error_is_one_line_and_exit_70(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfrun import commands

    def broken(*args: object, **kwargs: object) -> int:
        raise KeyError("a perfrun bug")

    monkeypatch.setattr(commands, "report", broken)
    monkeypatch.delenv(cli.DEBUG_VARIABLE, raising=False)
    assert cli.main(["report", "somewhere"]) == ExitCode.INTERNAL == 70
    err = capsys.readouterr().err
    assert err == (
        "perfrun: internal error: KeyError: 'a perfrun bug' (set PERFRUN_DEBUG=1 to see the "
        "traceback, and please report it)\n"
    )
    monkeypatch.setenv(cli.DEBUG_VARIABLE, "1")
    with pytest.raises(KeyError):
        cli.main(["report", "somewhere"])


# -- settings from options ---------------------------------------------------------------


def _options(**given: object) -> dict[str, object]:
    return {"script": "train.py", "script_args": (), **given}


def test_command_line_beats_override_beats_config(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("Profiler:\n  scheduler: [2, 4]\n  warmup: 1\n  profiler_log: from_file\n")
    from_file = cli.settings_from_options(_options(config_file=str(config)))
    assert (from_file.scheduler, from_file.warmup, from_file.log_dir) == ((2, 4), 1, "from_file")

    overridden = cli.settings_from_options(
        _options(config_file=str(config), overrides=("Profiler.scheduler=[5,9]",))
    )
    assert overridden.scheduler == (5, 9)
    assert overridden.warmup == 1

    direct = cli.settings_from_options(
        _options(config_file=str(config), overrides=("Profiler.scheduler=[5,9]",), scheduler=(1, 3))
    )
    assert direct.scheduler == (1, 3)
    assert direct.log_dir == "from_file"


def test_module_takes_the_first_argument_as_its_own() -> None:
    settings = cli.settings_from_options(
        {"module": "pkg.train", "script": "--lr", "script_args": ("0.1",)}
    )
    assert settings.module == "pkg.train"
    assert settings.script is None
    assert settings.script_args == ("--lr", "0.1")


# -- load_config ------------------------------------------------------------------------


PADDLE_GPT = """\
Global:
  device: gpu
  seed: 1024
  global_batch_size:
  local_batch_size: 8
  micro_batch_size: 8

Engine:
  max_steps: 500000
  num_train_epochs: 1
  accumulate_steps: 1
  logging_freq: 1
  mix_precision:
    enable: True
    dtype: "float16"
    level: "O2"
    scale_loss: 32768.0
  save_load:
    save_steps: 1000
    output_dir: ./output

Model:
  module: "GPTModule"
  name: "GPT"
  fuse_attn_qkv: True
  vocab_size: 50304
  hidden_size: 1024
  num_layers: 24

Data:
  Train:
    dataset:
      name: GPTDataset
      input_dir: ./data/
      split: [949, 50, 1]
    sampler:
      name: GPTBatchSampler
      shuffle: False
      drop_last: True
    loader:
      num_workers: 1
      return_list: False

Optimizer:
  name: FusedAdamW
  weight_decay: 0.01
  beta1: 0.9
  lr:
    name: CosineAnnealingWithWarmupDecay
    decay_steps: 360000
    warmup_rate: 0.01
    max_lr: 5.0e-5
  grad_clip:
    name: "ClipGradByGlobalNorm"
    clip_norm: 1.0

Profiler:
  enable: True
  scheduler: [1, 5]
  profiler_log: profiler_log
  detailed: True
"""


def test_load_paddle_gpt_config(tmp_path: Path) -> None:
    config = tmp_path / "pretrain_gpt_345M_single_card.yaml"
    config.write_text(PADDLE_GPT)
    assert load_config(str(config)) == {
        "enable": True,
        "scheduler": (1, 5),
        "log_dir": "profiler_log",
        "detailed": True,
    }


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", {}),
        ("Global:\n  seed: 1\n", {}),
        ("Profiler:\n", {}),
        ("Profiler:\n  enable: false\n", {"enable": False}),
        ("Profiler:\n  enable: 'yes'\n", {"enable": True}),
        ("Profiler:\n  scheduler: '[3, 14]'\n", {"scheduler": (3, 14)}),
        ("Profiler:\n  scheduler: 3 14\n", {"scheduler": (3, 14)}),
        ("Profiler:\n  scheduler:\n", {"scheduler": None}),
        ("Profiler:\n  warmup: '4'\n  batch_size: 32\n", {"warmup": 4, "batch_size": 32}),
        ("Profiler:\n  step_on: forward\n", {"step_on": "forward"}),
        (
            "Profiler:\n  summary:\n    kernel: false\n    op: false\n",
            {"summary": {**dict.fromkeys(SUMMARY_KEYS, True), "kernel": False, "op": False}},
        ),
    ],
)
def test_load_config_values(tmp_path: Path, text: str, expected: dict) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    assert load_config(str(config)) == expected


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("Global:\n  a: [1, 2\nProfiler:\n  enable: true\n", ["malformed YAML", "line 3"]),
        ("Profiler:\n  schedular: [1, 2]\n", ["unknown Profiler key(s) schedular", "valid keys"]),
        ("- a\n- b\n", ["expected a mapping"]),
        ("Profiler: [1, 2]\n", ["Profiler: expected a mapping"]),
        ("Profiler:\n  enable: maybe\n", ["Profiler.enable: expected true or false"]),
        (
            "Profiler:\n  scheduler: [1, 2, 3]\n",
            ["Profiler.scheduler: expected two integers [START, END]"],
        ),
        (
            "Profiler:\n  scheduler: [a, 2]\n",
            ["Profiler.scheduler: expected two integers [START, END], got ['a', 2]"],
        ),
        ("Profiler:\n  warmup: true\n", ["Profiler.warmup: expected an integer, got true"]),
        ("Profiler:\n  profiler_log: ''\n", ["Profiler.profiler_log: expected a path"]),
        ("Profiler:\n  summary:\n    kernels: false\n", ["unknown Profiler.summary key(s)"]),
        ("Profiler:\n  summary: [kernel]\n", ["Profiler.summary: expected a mapping"]),
    ],
)
def test_load_config_errors(tmp_path: Path, text: str, fragments: list[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(SettingsError) as info:
        load_config(str(config))
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_unknown_key_message_lists_every_valid_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("Profiler:\n  sheduler: [1, 2]\n")
    with pytest.raises(SettingsError) as info:
        load_config(str(config))
    assert str(info.value).endswith("valid keys: " + ", ".join(PROFILER_KEYS))


def test_load_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="config file not found"):
        load_config(str(tmp_path / "nope.yaml"))


# -- parse_override ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Profiler.scheduler=[1,3]", {"scheduler": (1, 3)}),
        ("Profiler.scheduler=[100, 110]", {"scheduler": (100, 110)}),
        ("Profiler.enable=false", {"enable": False}),
        ("Profiler.profiler_log=/tmp/logs", {"log_dir": "/tmp/logs"}),
        ("Profiler.warmup=3", {"warmup": 3}),
        ("Profiler.stop_after=", {"stop_after": None}),
        (
            "Profiler.summary.kernel=false",
            {"summary": {**dict.fromkeys(SUMMARY_KEYS, True), "kernel": False}},
        ),
        (" Profiler.timer_only =true", {"timer_only": True}),
    ],
)
def test_parse_override(text: str, expected: dict) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("Profiler.scheduler", "must look like Profiler.KEY=VALUE"),
        ("scheduler=[1,3]", "only Profiler.* keys"),
        ("Global.seed=1", "only Profiler.* keys"),
        ("Profiler=1", "only Profiler.* keys"),
        ("Profiler.scheduler=[1,", "cannot parse the value"),
        ("Profiler.nope=1", "unknown Profiler key(s) nope"),
        ("Profiler.profiler_log=", "expected a path"),
        ("Profiler.scheduler=[1]", "expected two integers [START, END]"),
    ],
)
def test_parse_override_errors(text: str, fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_override(text)
    assert fragment in str(info.value)


# -- Settings.validate ------------------------------------------------------------------


def test_defaults_are_valid() -> None:
    settings = Settings(script="train.py")
    assert settings.validate() is settings
    assert not settings.distributed


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"scheduler": (5, 5)}, "END must be greater than START"),
        ({"scheduler": (7, 3)}, "END must be greater than START"),
        ({"scheduler": (-1, 3)}, "steps cannot be negative"),
        ({"scheduler": (1, -3)}, "steps cannot be negative"),
        ({"nproc_per_node": 0}, "--nproc-per-node must be at least 1"),
        ({"warmup": -1}, "--warmup cannot be negative"),
        ({"stop_after": -5}, "--stop-after cannot be negative"),
        ({"stop_after": 0}, "--stop-after must be at least 1"),
        ({"batch_size": 0}, "--batch-size must be at least 1"),
        ({"step_on": "epoch"}, "--step-on must be one of"),
        ({"format": "html"}, "--format must be one of"),
        ({"summary": {"kernels": True}}, "unknown Profiler.summary key"),
        ({"flush_interval": 0.0}, "flush interval must be positive"),
    ],
)
def test_validate_rejects(changes: dict, fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings(script="train.py").replace(**changes).validate()
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"scheduler": (0, 1)},
        {"scheduler": (100, 110)},
        {"nproc_per_node": 1},
        {"warmup": 0, "stop_after": 1, "batch_size": 1},
        {"flush_interval": 0.2},
    ],
)
def test_validate_accepts(changes: dict) -> None:
    Settings(script="train.py").replace(**changes).validate()


@pytest.mark.parametrize(
    "field",
    [
        "nproc_per_node",
        "nnodes",
        "node_rank",
        "master_addr",
        "master_port",
        "rdzv_backend",
        "rdzv_endpoint",
        "rdzv_id",
    ],
)
def test_any_torchrun_option_means_distributed(field: str) -> None:
    value = (
        "x" if field in ("nnodes", "master_addr", "rdzv_backend", "rdzv_endpoint", "rdzv_id") else 1
    )
    assert Settings().replace(**{field: value}).distributed


def test_settings_survive_the_trip_to_the_child() -> None:
    settings = Settings(
        script="train.py",
        script_args=("--lr", "0.1"),
        scheduler=(3, 14),
        summary={**dict.fromkeys(SUMMARY_KEYS, True), "op": False},
        nproc_per_node=2,
        flush_interval=0.2,
    )
    assert Settings.from_json(settings.to_json()) == settings


def test_bare_perfrun_prints_the_help_and_exits_2(capsys, monkeypatch) -> None:
    from perfrun.cli import main

    monkeypatch.delenv("_PERFRUN_COMPLETE", raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Usage: perfrun")
    assert "perfrun run --help" in err and "compare" in err and "error" not in err


def test_a_home_in_a_path_option_is_expanded(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """`--log-dir=~/runs`: the shell leaves `~` as it is after `=`; a folder
    named `~` is never what was meant. The config file's path too."""
    monkeypatch.setenv("HOME", str(tmp_path))
    ctx = cli.run_command.make_context(
        "run", ["--log-dir=~/runs", "--output=~/r.json", "--save-baseline=~/b.json",
                "--baseline=~/base.json", "train.py"])
    assert ctx.params["log_dir"] == str(tmp_path / "runs")
    assert ctx.params["output"] == str(tmp_path / "r.json")
    assert ctx.params["save_baseline"] == str(tmp_path / "b.json")
    assert ctx.params["baseline"] == str(tmp_path / "base.json")
    report = cli.cli.commands["report"].make_context("report", ["--output=~/x.md", "runs"])
    assert report.params["output"] == str(tmp_path / "x.md")
    config = tmp_path / "train.yaml"
    config.write_text("Profiler:\n  profiler_log: ~/logs\n")
    from perfrun.config import load_config

    assert load_config(str(config))["log_dir"] == str(tmp_path / "logs")


def test_a_closed_stdout_is_as_for_python(tmp_path: Path) -> None:
    """`perfrun report RUN >&-`: nothing to print to, no error, exit 0 (as
    python exits with its stdout closed); `perfrun report RUN | head -1`:
    the rest dropped without a message, exit 1 (the exit code table's;
    here the reader is gone before the first line, as a pipe buffer would
    otherwise hold a short report whole)."""
    import os
    import subprocess
    import sys

    from test_stepfile import ROWS, write_v2

    run = tmp_path / "run"
    run.mkdir()
    write_v2(run, ROWS)
    argv = [sys.executable, "-m", "perfrun", "report", str(run)]
    closed = subprocess.run(argv, capture_output=False, stderr=subprocess.PIPE,
                            preexec_fn=lambda: os.close(1), timeout=120)
    assert closed.returncode == 0 and closed.stderr == b"", closed.stderr
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # a reader gone before the report is written: `| head -0`
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == ExitCode.CLOSED_OUTPUT == 1 and err == b"", err


def test_run_help_is_grouped_by_the_settings_sections(capsys, monkeypatch) -> None:
    """`perfrun run --help` shows its options in the settings' sections, in
    their order, each option once, none left in "Other" but --help."""
    from perfrun.settings import HELP_SECTIONS, command_line_options, help_section

    for name, _spec in command_line_options("run"):
        assert help_section(name) is not None, name
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    titles = [line[:-1] for line in out.splitlines() if line.endswith(":")
              and not line.startswith(" ")]
    settings_titles = [title for title, _first in HELP_SECTIONS]
    assert [t for t in titles if t in settings_titles] == settings_titles
    assert titles[-1] == "Other" and "Settings from a file" in titles
    other = out.split("\nOther:\n", 1)[1]
    words = other.split()  # `-h, --help`, or `--help` where a test took -h
    assert words[-5:] == ["Show", "this", "message", "and", "exit."]
    assert set(words[:-5]) <= {"-h,", "--help"} and "--help" in words
    options = out.split("\nRun:\n", 1)[1]
    for _name, spec in command_line_options("run"):
        if not spec.hidden:
            flag = spec.flags[-1]
            assert len(re.findall(rf"^  (?:-\w, )?{flag}(?= )", options, re.M)) == 1, flag
    measurement = out.split("\nMeasurement:\n", 1)[1].split("\n\n", 1)[0]
    assert "--no-flops" in measurement and "--stop-after" in measurement
    gate = out.split("\nCI gate:\n", 1)[1].split("\n\n", 1)[0]
    assert "--max-regression" in gate and "--baseline" in gate


def test_every_option_of_every_command_says_what_it_does() -> None:
    """No option in any command's --help without its line of help."""
    import click

    for name, command in cli.cli.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, (name, param.opts)
