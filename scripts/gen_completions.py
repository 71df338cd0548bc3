"""Regenerate the shell completion scripts in completions/ from the click app.

    python scripts/gen_completions.py            # rewrite completions/*
    python scripts/gen_completions.py --check    # exit 1 if any is out of date
    python scripts/gen_completions.py --output-dir DIR

Each script is what click itself prints for `_PERFRUN_COMPLETE=<shell>_source
perfrun`; it calls perfrun back at every <Tab>, so the options it offers are
always the installed perfrun's. Only click's template (a click upgrade, or a
renamed program) changes the files; tests/test_completions.py checks that
the committed ones are current.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPLETIONS = ROOT / "completions"
COMPLETE_VAR = "_PERFRUN_COMPLETE"

#: Shell -> file name, each the name that shell's loader looks for.
FILES = {
    "bash": "perfrun.bash",
    "zsh": "_perfrun",
    "fish": "perfrun.fish",
}


def generate(shell: str) -> str:
    """The completion script for `shell`, as `python -m perfrun` prints it."""
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)
    env[COMPLETE_VAR] = f"{shell}_source"
    # Make the checkout's perfrun importable even where it is not installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "perfrun"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(
            f"perfrun printed no {shell} completion script (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-500:]}"
        )
    text = proc.stdout
    return text if text.endswith("\n") else text + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 if a file is out of date.")
    parser.add_argument("--output-dir", type=Path, default=COMPLETIONS)
    args = parser.parse_args(argv)
    stale = []
    for shell, name in FILES.items():
        path = args.output_dir / name
        text = generate(shell)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if stale:
        print(
            "out of date: " + ", ".join(stale) + " (run python scripts/gen_completions.py)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
