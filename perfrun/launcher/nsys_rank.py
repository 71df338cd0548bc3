"""Run a rank under nsys only when it is one of the chosen ranks.

`python -E -m perfrun.launcher.nsys_rank 0,3 -- nsys profile ... PYTHON SCRIPT ...`:
each torchrun worker starts this; ranks in the list exec the whole nsys
command, the others exec just the Python part, so a long job does not write
one huge report per rank. (-E keeps perfrun's bootstrap out of this short
process: it is not a rank, it only becomes one.) `all` chooses every rank:
perfrun then comes here only so that nsys, a program that does not know
perfrun, still ends with torchrun's agent (see `main`).
"""

from __future__ import annotations

import os
import sys

from perfrun.runtime.lifeline import AGENT_PID_VAR, die_with


def split(argv: list[str]) -> tuple[set[str], list[str]]:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit(
            "usage: python -m perfrun.launcher.nsys_rank RANKS -- nsys profile ... CMD")
    ranks = {r.strip() for r in argv[0].split(",") if r.strip()}
    return ranks, argv[2:]


def tie_to_agent() -> None:
    """Die with torchrun's agent, which started this process. The request
    outlives the exec below, so nsys (or the rank itself) is killed when the
    agent dies, and the rank with it (its bootstrap ties it to nsys)."""
    try:
        agent = int(os.environ.get(AGENT_PID_VAR, ""))
    except ValueError:
        return
    die_with(agent)


def python_part(command: list[str], python: str) -> list[str]:
    """The command nsys was asked to run: from the Python executable on."""
    for i, arg in enumerate(command):
        if i > 0 and arg == python:
            return command[i:]
    raise SystemExit(f"perfrun.launcher.nsys_rank: no {python} in {command}")


def main(argv: list[str]) -> None:
    ranks, command = split(argv)
    tie_to_agent()
    rank = os.environ.get("RANK", "0")
    if rank not in ranks and "all" not in ranks:
        command = python_part(command, sys.executable)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
