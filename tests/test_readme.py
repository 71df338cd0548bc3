"""Every perfrun command the README and its documents (docs/) show, run as
written; and the README itself: a quick start of two commands, the second
the one CI runs, Usage near the top, and every document it links there.

The commands are read from the README and docs/ (their code blocks, and the
CI job's folded `run:` command), so a document that drifts from what
perfrun accepts fails here. They run in a temporary folder where `train.py` is the
bundled example (scripts/example_train.py: 192 steps on CPU) and
`rank0.pt.trace.json.gz` is a real GPU trace from tests/data/traces, in the
README's order (then the documents'), so `perfrun report perfrun_log` and the gate find what the
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
DOCS = ROOT / "docs"
TRACE = ROOT / "tests" / "data" / "traces" / "nccl_two_ranks" / "rank0.json.gz"


def documents() -> list[Path]:
    """The README, then the documents it links in docs/, in the order it
    links them: the commands run in that order."""
    text = README.read_text(encoding="utf-8")
    linked = dict.fromkeys(re.findall(r"\]\(docs/([\w-]+\.md)", text))
    return [README, *(DOCS / name for name in linked)]


def readme_commands() -> list[str]:
    """The perfrun commands of the README and its documents: each
    code-block line that starts with `perfrun ` (comments dropped; usage
    lines with [OPTIONS] left out), and the CI job's folded command."""
    text = "\n".join(doc.read_text(encoding="utf-8") for doc in documents())
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
        "perfrun --timer-only torchrun --nproc-per-node 2 train.py",
        "perfrun report perfrun_log --format html --output report.html",
        "perfrun watch perfrun_log",
        "perfrun --nproc-per-node 2 --metrics-port 9700 train.py",
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
        elif command.startswith("perfrun --timer-only torchrun"):
            assert "Ranks: 2" in done.stdout and "Perf Summary" in done.stdout, described(done)
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


# -- the README as a first-time reader meets it ---------------------------------------------


def _section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    """Two commands: one installs the CPU build of torch from PyTorch's own
    index (the default index would give the CUDA build), then perfrun, and
    runs the bundled example; the other installs the test extra and runs
    the suite, which is what .ci/run runs."""
    quick = _section(README.read_text(encoding="utf-8"), "Quick start")
    blocks = [b.strip() for b in re.findall(r"```\n(.*?)```", quick, re.S)]
    assert len(blocks) == 2 and all("\n" not in b for b in blocks), blocks
    first, second = blocks
    assert first.startswith("pip install torch") and first.endswith(
        "perfrun scripts/example_train.py")
    assert "--index-url https://download.pytorch.org/whl/cpu" in first
    assert "pip install . " in first
    # The torch it installs is the one the test extra pins, so the second
    # command keeps it rather than fetching the CUDA build.
    pinned = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned and f"torch=={pinned.group(1)} " in first
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # The first pytest line; the one after it is the loaded pass of the
    # `timing` tests (Contributing).
    ran, *_ = [line for line in ci.splitlines() if "pytest" in line and not line.startswith("#")]
    assert ran.replace("pip install -q ", "pip install ") == second
    for said in ("Lightning", "transformers", "accelerate", "26 minutes"):
        assert said in quick, said


def test_usage_is_near_the_top_and_the_long_reference_is_in_docs() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines.index("## Usage") < 150
    text = "\n".join(lines)
    linked = documents()[1:]
    assert linked and all(doc.exists() for doc in linked), linked
    # Every document in docs/ is linked from the README, and links back.
    assert {p.name for p in DOCS.glob("*.md")} - {"README.md"} == {p.name for p in linked}
    for doc in linked:
        assert "](../README.md)" in doc.read_text(encoding="utf-8"), doc
    # The fast loop and its time are said where contributors look.
    contributing = _section(text, "Contributing")
    assert 'python -m pytest -q -m "not slow"' in contributing and "45 s" in contributing
    # So are the load-sensitive tests' loaded pass and its time, the command
    # CI runs after the suite.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    _, *loaded = [line for line in ci.splitlines() if "pytest" in line and not line.startswith("#")]
    assert loaded == ["python -m pytest -q -m timing --busy 2"], loaded
    assert f"\n{loaded[0]}\n" in contributing and "PERFRUN_TEST_BUSY" in contributing


def _anchors(doc: Path) -> set[str]:
    """The anchors GitHub makes of a document's headings: lower case,
    punctuation dropped, spaces made hyphens."""
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_every_relative_link_in_the_readme_and_docs_reaches_its_place() -> None:
    for doc in [README, *DOCS.glob("*.md")]:
        text = doc.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)]*))?\)", text):
            path = doc.parent / target if target else doc
            assert path.exists(), (doc.name, target)
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), (doc.name, target, anchor)


def test_the_ci_job_installs_perfrun_the_way_it_can_be_installed() -> None:
    """perfrun is not on the public package index: the CI example installs
    it from its repository or a wheel, never `pip install perfrun`."""
    gate = _section(README.read_text(encoding="utf-8"), "CI performance gate")
    job = re.search(r"```yaml\n(.*?)```", gate, re.S)
    assert job is not None
    [install] = [line.strip() for line in job.group(1).splitlines() if "pip install" in line]
    assert install != "- run: pip install perfrun"
    assert install.endswith(".whl") or "git+" in install, install
