"""Every perfrun command the README shows, run as written.

The commands are read from the README itself (its code blocks, and the CI
job's folded `run:` command), so a README that drifts from what perfrun
accepts fails here. They run in a temporary folder where `train.py` is the
bundled example (scripts/example_train.py: 192 steps on CPU) and
`rank0.pt.trace.json.gz` is a real GPU trace from tests/data/traces, in the
README's order, so `perfrun report perfrun_log` and the gate find what the
commands before them left.

Two commands cannot run as written here, and are held to what the README
says happens instead: `--nsys` needs Nsight Systems, absent on these
machines (perfrun refuses it before the script runs: exit 64, one line);
`pip install ...` changes the environment and is checked by CI itself (the
test command) and by hand from a fresh clone (the quick start). The
folders `perfrun combine` merges are made first, from the 8-rank run the
README ran before, split as two nodes would have left it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import E2E_TIMEOUT, e2e_environment

from perfrun.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TRACE = ROOT / "tests" / "data" / "traces" / "nccl_two_ranks" / "rank0.json.gz"


def readme_commands() -> list[str]:
    """The README's perfrun commands: each code-block line that starts with
    `perfrun ` (comments dropped; usage lines with [OPTIONS] left out), and
    the CI job's folded command."""
    text = README.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines = block.splitlines()
        skip = 0
        for i, line in enumerate(lines):
            stripped = line.strip()
            if skip:
                skip -= 1
            elif stripped.startswith("- run: >"):
                # A YAML folded scalar: the indented lines after it, joined.
                folded = []
                for nxt in lines[i + 1 :]:
                    if not nxt.startswith(" " * (len(line) - len(line.lstrip()) + 2)):
                        break
                    folded.append(nxt.strip())
                out.append(" ".join(folded))
                skip = len(folded)
            elif stripped.startswith("perfrun ") and "[" not in stripped.split("#")[0]:
                out.append(stripped.split("  #")[0].strip())
    return out


COMMANDS = readme_commands()


def test_the_readme_has_the_commands_this_test_knows() -> None:
    # A command added to the README is added here, and run.
    assert COMMANDS == [
        "perfrun train.py --scheduler 100 110",
        "perfrun --timer-only train.py",
        "perfrun --nproc-per-node 8 train.py",
        "perfrun --nsys train.py",
        "perfrun report perfrun_log",
        "perfrun analyze rank0.pt.trace.json.gz",
        "perfrun report perfrun_log --format html --output report.html",
        "perfrun watch perfrun_log",
        "perfrun --timer-only --hang-timeout 600 --hang-action terminate train.py",
        "perfrun status perfrun_log",
        "perfrun --timer-only --save-baseline baseline.json train.py",
        "perfrun --timer-only --baseline baseline.json --max-regression 5% train.py",
        "perfrun compare baseline.json perfrun_log/latest --max-regression 5%",
        "perfrun --timer-only --stop-after 300 --baseline baseline.json "
        "--max-regression 5% --format junit --output perf-gate.xml train.py",
        "perfrun combine node0/perfrun_log/job-exp42 node1/perfrun_log/job-exp42 -o job-exp42",
    ]


def run(work: Path, command: str) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command)
    assert argv[0] == "perfrun"
    return subprocess.run(
        [sys.executable, "-m", "perfrun", *argv[1:]],
        cwd=work,
        env=e2e_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=E2E_TIMEOUT * 2,
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    shutil.copy(ROOT / "scripts" / "example_train.py", work / "train.py")
    shutil.copy(TRACE, work / "rank0.pt.trace.json.gz")
    return work


def described(done: subprocess.CompletedProcess[str]) -> str:
    return f"{done.args} -> {done.returncode}\n--- stdout ---\n{done.stdout}\n--- stderr ---\n" \
        f"{done.stderr}"


# Gates at 5% between two runs of one script on a shared machine may
# rightly say FAIL (68) or, with noise, pass: either is the command working.
GATE_CODES = (ExitCode.OK, ExitCode.REGRESSION)


@pytest.mark.slow
def test_every_readme_command_runs_as_written(work: Path) -> None:
    expect = {
        "perfrun --nsys train.py": (ExitCode.CONFIG,),
        "perfrun --timer-only --baseline baseline.json --max-regression 5% train.py": GATE_CODES,
        "perfrun compare baseline.json perfrun_log/latest --max-regression 5%": GATE_CODES,
    }
    [ci_command] = [c for c in COMMANDS if "--format junit" in c]
    expect[ci_command] = GATE_CODES
    for command in COMMANDS:
        if command.startswith("perfrun combine"):
            split_as_two_nodes(work)
        done = run(work, command)
        assert done.returncode in expect.get(command, (ExitCode.OK,)), described(done)
        assert "Traceback" not in done.stderr, described(done)
        if command == "perfrun train.py --scheduler 100 110":
            # The headline: perfrun's window written after the script, taken
            # without a note (train.py defines no --scheduler of its own).
            said = [line.split(" ", 2)[1] for line in done.stderr.splitlines()
                    if line.startswith("perfrun: ")]
            assert said == ["profiling", "results"], described(done)
            assert "Window: steps [100, 110)" in done.stdout, described(done)
        if command == "perfrun --nsys train.py":
            [line] = done.stderr.splitlines()
            assert "nsys" in line and line.startswith("perfrun: error: "), line
        elif "--format html" in command:
            page = (work / "report.html").read_text(encoding="utf-8")
            assert page.startswith("<!DOCTYPE html>") and "Perf Summary" in page
        elif command.startswith("perfrun watch"):
            assert "the run ended (exit status 0)" in done.stdout, described(done)
            assert "Perf Summary" in done.stdout, described(done)
        elif command.startswith("perfrun status"):
            assert re.search(r"^rank 0 +finished", done.stdout, re.M), described(done)
        elif command.startswith("perfrun analyze"):
            assert "606.519" in done.stdout, described(done)
        elif command.startswith("perfrun report"):
            assert "Perf Summary" in done.stdout, described(done)
        elif command == ci_command:
            xml = (work / "perf-gate.xml").read_text(encoding="utf-8")
            assert xml.startswith("<?xml") and "<testsuite" in xml, xml
            assert "Perf Summary" in done.stdout, described(done)
        elif command.startswith("perfrun combine"):
            assert "combined ranks 0-7 from 2 folders into job-exp42" in done.stderr, \
                described(done)
            assert sorted(p.name for p in (work / "job-exp42").glob("rank*.json")) == [
                f"rank{r}.json" for r in range(8)]
        elif "--nproc-per-node 8" in command:
            assert "8 ranks" in done.stdout or "rank 7" in done.stdout, described(done)
        else:
            assert "Perf Summary" in done.stdout or "Verdict" in done.stdout, described(done)
    assert (work / "baseline.json").exists()


def split_as_two_nodes(work: Path) -> None:
    """node0/ and node1/ as two nodes with log folders of their own would
    have left the README's 8-rank run: ranks 0-3 in one, 4-7 in the other,
    each with the run's run.json."""
    [run] = [p for p in (work / "perfrun_log").iterdir()
             if not p.is_symlink() and (p / "rank7.json").exists()]
    for node, ranks in ((0, range(4)), (1, range(4, 8))):
        folder = work / f"node{node}" / "perfrun_log" / "job-exp42"
        folder.mkdir(parents=True)
        shutil.copy(run / "run.json", folder)
        for r in ranks:
            for path in run.glob(f"rank{r}.*"):
                shutil.copy(path, folder)


def test_every_exit_code_is_in_the_readmes_exit_code_table() -> None:
    """The `## Exit codes` table lists every code perfrun/exitcodes.py
    defines, and no other."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    listed = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    assert listed == {int(code) for code in ExitCode}
