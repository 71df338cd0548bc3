"""perfrun's options written after the script, for real: the README's
headline command says nothing more than the same options written before
the script, `--timer-only --stop-after N` after the script work, and a
training script that defines `--scheduler` itself (its learning-rate
schedule) gets its own value while perfrun says so in one line.

The rule itself (which argument goes where, and each note) is unit-tested
in test_cli.py; reading a script's options in test_scriptoptions.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import PerfrunRun, RunPerfrun

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "scripts" / "example_train.py"
LR_SCHEDULE = Path(__file__).parent / "scripts" / "lr_schedule_train.py"


def perfrun_lines(run: PerfrunRun) -> list[str]:
    return [line for line in run.err.splitlines() if line.startswith("perfrun: ")]


def notes(run: PerfrunRun) -> list[str]:
    """perfrun's lines on stderr other than the ones every run prints (where
    the results go, where the report went)."""
    usual = ("perfrun: profiling ", "perfrun: results saved in ", "perfrun: report written to ")
    return [line for line in perfrun_lines(run) if not line.startswith(usual)]


@pytest.fixture
def train(tmp_path: Path) -> str:
    """The README's train.py: the bundled example, 16 batches an epoch."""
    shutil.copy(EXAMPLE, tmp_path / "train.py")
    return "train.py"


def test_the_headline_command_prints_no_notice(run_perfrun: RunPerfrun, train: str) -> None:
    script_args = ["--epochs", "1", "--samples", "1024"]
    after = run_perfrun(train, "--scheduler", "5", "8", *script_args)
    before = run_perfrun("--scheduler", "5", "8", train, *script_args)
    for run in (after, before):
        assert run.returncode == 0, run.describe()
        assert run.rank0().data["window"] == [5, 8], run.describe()
    assert notes(after) == [], after.describe()
    assert len(perfrun_lines(after)) == len(perfrun_lines(before)), after.describe()


def test_timer_only_and_stop_after_after_the_script(run_perfrun: RunPerfrun, train: str) -> None:
    run = run_perfrun(train, "--timer-only", "--stop-after", "50")
    assert run.returncode == 0, run.describe()
    rank = run.rank0()
    assert rank.data["settings"]["timer_only"] is True
    assert rank.status == "stopped"
    assert len(rank.rows) == 50
    assert notes(run) == [], run.describe()


def test_a_script_that_defines_scheduler_gets_its_own(run_perfrun: RunPerfrun,
                                                      tmp_path: Path) -> None:
    script = shutil.copy(LR_SCHEDULE, tmp_path / "lr_schedule_train.py")
    run = run_perfrun(Path(script).name, "--scheduler", "cosine", "--epochs", "2",
                      "--timer-only")
    assert run.returncode == 0, run.describe()
    # The script's own value reached it: two epochs on the cosine schedule.
    assert [line.endswith("(cosine)") for line in run.out.splitlines()] == [True, True]
    assert notes(run) == [
        "perfrun: --scheduler went to lr_schedule_train.py, which defines it; perfrun's goes "
        "before the script"
    ], run.describe()
    # ...and the options after it that it does not define were perfrun's.
    settings = run.rank0().data["settings"]
    assert settings["timer_only"] is True
    assert settings["scheduler"] is None
