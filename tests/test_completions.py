"""Shell completion: the committed scripts in completions/ are what the click
app generates today, and the completion they call back into answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPLETIONS = ROOT / "completions"
GENERATOR = ROOT / "scripts" / "gen_completions.py"
FILES = {"bash": "perfrun.bash", "zsh": "_perfrun", "fish": "perfrun.fish"}
TIMEOUT = 120


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)
    env.pop("_PERFRUN_COMPLETE", None)
    env.update(extra)
    return env


def _perfrun(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfrun"],
        env=_env(**env),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args],
        env=_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.mark.slow
@pytest.mark.parametrize("shell", sorted(FILES))
def test_committed_script_is_what_click_generates(shell: str) -> None:
    proc = _perfrun(_PERFRUN_COMPLETE=f"{shell}_source")
    assert proc.returncode == 0, proc.stderr
    committed = (COMPLETIONS / FILES[shell]).read_text(encoding="utf-8")
    assert committed == proc.stdout, (
        f"completions/{FILES[shell]} is out of date: run python scripts/gen_completions.py"
    )


@pytest.mark.slow
def test_generator_reproduces_the_committed_files(tmp_path: Path) -> None:
    proc = _generator("--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES.values())
    for name in FILES.values():
        assert (tmp_path / name).read_bytes() == (COMPLETIONS / name).read_bytes(), name
    assert _generator("--check").returncode == 0


@pytest.mark.slow
def test_generator_check_names_a_stale_file(tmp_path: Path) -> None:
    for name in FILES.values():
        shutil.copy(COMPLETIONS / name, tmp_path / name)
    (tmp_path / "_perfrun").write_text("#compdef perfrun\n", encoding="utf-8")
    proc = _generator("--check", "--output-dir", str(tmp_path))
    assert proc.returncode == 1
    assert "out of date" in proc.stderr and "_perfrun" in proc.stderr
    assert "perfrun.bash" not in proc.stderr
    assert (tmp_path / "_perfrun").read_text(encoding="utf-8") == "#compdef perfrun\n"


def test_scripts_register_for_perfrun() -> None:
    bash = (COMPLETIONS / "perfrun.bash").read_text(encoding="utf-8")
    zsh = (COMPLETIONS / "_perfrun").read_text(encoding="utf-8")
    fish = (COMPLETIONS / "perfrun.fish").read_text(encoding="utf-8")
    assert "complete -o nosort -F _perfrun_completion perfrun" in bash
    assert zsh.startswith("#compdef perfrun\n")
    assert "complete --no-files --command perfrun" in fish
    for text in (bash, zsh, fish):
        assert "_PERFRUN_COMPLETE=" in text


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_script_parses() -> None:
    proc = subprocess.run(["bash", "-n", str(COMPLETIONS / "perfrun.bash")],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [
        # A word that is no command may be the script: files complete too.
        ("perfrun r", 1, ["plain,report", "plain,run", "file,r"]),
        ("perfrun run --sch", 2, ["plain,--scheduler"]),
        ("perfrun report --format ", 3,
         ["plain,table", "plain,json", "plain,markdown", "plain,html"]),
        ("perfrun w", 1, ["plain,watch", "file,w"]),
        # The README's forms, without the word `run`: options before the
        # script and after it.
        ("perfrun --tim", 1, ["plain,--timer-only", "plain,--time-unit"]),
        ("perfrun scripts/example_train.py --tim", 2, ["plain,--timer-only", "plain,--time-unit"]),
    ],
)
def test_completion_answers(words: str, cword: int, expected: list[str]) -> None:
    proc = _perfrun(_PERFRUN_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(cword))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == expected


@pytest.mark.slow
@pytest.mark.parametrize("words", ["perfrun run --time", "perfrun --time",
                                   "perfrun scripts/example_train.py --epochs 1 --time"])
def test_installed_bash_completion_completes_options(words: str) -> None:
    """The committed bash script, sourced, completes through a real `perfrun`,
    with the word `run` and without it, before the script and after it."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("bash") is None or not (bin_dir / "perfrun").exists():
        pytest.skip("needs bash and the perfrun command next to this Python")
    script = (
        f"source {COMPLETIONS / 'perfrun.bash'}\n"
        f"COMP_WORDS=({words}); COMP_CWORD={len(words.split()) - 1}\n"
        "_perfrun_completion perfrun\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = _env(PATH=os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]))
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["--timer-only", "--time-unit"]


# -- what completes, in-process: click's own completion over the app ------------------

EXAMPLE = str(ROOT / "scripts" / "example_train.py")
LR_SCHEDULE = str(ROOT / "tests" / "scripts" / "lr_schedule_train.py")


def completions(words: str) -> list[str]:
    """What `perfrun WORDS<Tab>` offers: the last word is the one being
    completed (empty after a trailing space), as the shell hands it over."""
    from click.shell_completion import ShellComplete

    from perfrun.cli import cli

    args = words.split()[1:]
    incomplete = "" if words.endswith(" ") else args.pop()
    complete = ShellComplete(cli, {}, "perfrun", "_PERFRUN_COMPLETE")
    return [f"{item.type},{item.value}" for item in complete.get_completions(args, incomplete)]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        # Options before the script, with and without the word `run`.
        ("perfrun --tim", ["plain,--timer-only", "plain,--time-unit"]),
        ("perfrun run --tim", ["plain,--timer-only", "plain,--time-unit"]),
        ("perfrun --nproc", ["plain,--nproc-per-node"]),
        ("perfrun --ver", ["plain,--version"]),
        ("perfrun --timer-only --sch", ["plain,--scheduler"]),
        # An option's values, and the script itself, after options.
        ("perfrun --step-on f", ["plain,forward"]),
        ("perfrun --timer-only tr", ["file,tr"]),
        # After the script: perfrun's options, and the script's own (read
        # from its source), each once.
        (f"perfrun {EXAMPLE} --tim", ["plain,--timer-only", "plain,--time-unit"]),
        (f"perfrun {EXAMPLE} --scheduler 1 2 --stop-a",
         ["plain,--stop-after", "plain,--stop-after-window"]),
        (f"perfrun {EXAMPLE} --ep", ["plain,--epochs"]),
        (f"perfrun {EXAMPLE} --batch", ["plain,--batch-size"]),
        (f"perfrun {LR_SCHEDULE} --sch", ["plain,--scheduler"]),
        (f"perfrun run {EXAMPLE} --sam", ["plain,--samples"]),
        # After `--`, all is the script's: perfrun offers nothing.
        (f"perfrun {EXAMPLE} -- --tim", []),
        # The commands still complete.
        ("perfrun rep", ["plain,report", "file,rep"]),
        ("perfrun report --format j", ["plain,json"]),
        # Every file or folder the user names completes as a path: a folder
        # where only a folder will do, a file (or a folder) elsewhere.
        ("perfrun report repl", ["dir,repl"]),
        ("perfrun status perfrun_l", ["dir,perfrun_l"]),
        ("perfrun watch ", ["dir,"]),
        ("perfrun combine node0/job-1 n", ["dir,n"]),
        ("perfrun combine node0/job-1 -o o", ["dir,o"]),
        ("perfrun analyze rank0.pt", ["file,rank0.pt"]),
        ("perfrun compare base.json perfrun_l", ["file,perfrun_l"]),
        ("perfrun report perfrun_log --output r", ["file,r"]),
        ("perfrun --config tr", ["file,tr"]),
        ("perfrun --log-dir ru", ["dir,ru"]),
        ("perfrun --save-baseline b", ["file,b"]),
        ("perfrun --baseline b", ["file,b"]),
        (f"perfrun {EXAMPLE} --log-dir ru", ["dir,ru"]),
    ],
)
def test_both_forms_complete(words: str, expected: list[str]) -> None:
    assert completions(words) == expected
