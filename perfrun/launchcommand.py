"""A launch command with perfrun in front: `perfrun torchrun ... train.py`,
`perfrun accelerate launch ... train.py`, `perfrun mpirun -n 2 python
train.py`, as one writes `nsys profile CMD` or `py-spy record -- CMD`.

Users start their ranks with a launcher they already have; perfrun rides
on it rather than asking them to rewrite the command. What is decided here,
from the command line alone (nothing is run or imported):

* whether the command perfrun was given is a launcher's, and which
  (`recognise`);
* for torch's own launcher (`torchrun`, `python -m torch.distributed.run`,
  `perfrun -m torch.distributed.run`), its options read into perfrun's own
  torchrun settings, so the run is exactly `perfrun --nproc-per-node N
  train.py` with every other torchrun option passed on as given
  (`read_torchrun`);
* for any other launcher, the user's script inside the command: the
  processes that run it are the ranks, and the launcher's own processes are
  not (`find_script`), with the rank count where the command says it.

Standard library only: the command line is split before any of perfrun's
heavier modules load.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from .errors import PerfrunError

#: torchrun's options that take no value (torch 2.x `torch.distributed.run`);
#: every other option takes one.
TORCHRUN_FLAGS = frozenset({
    "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path",
    "--run_path", "--virtual-local-rank", "--virtual_local_rank",
})
#: torchrun's options that perfrun's own settings hold, by their field.
TORCHRUN_SETTINGS = {
    "--nproc-per-node": "nproc_per_node", "--nproc_per_node": "nproc_per_node",
    "--nnodes": "nnodes",
    "--node-rank": "node_rank", "--node_rank": "node_rank",
    "--master-addr": "master_addr", "--master_addr": "master_addr",
    "--master-port": "master_port", "--master_port": "master_port",
    "--rdzv-backend": "rdzv_backend", "--rdzv_backend": "rdzv_backend",
    "--rdzv-endpoint": "rdzv_endpoint", "--rdzv_endpoint": "rdzv_endpoint",
    "--rdzv-id": "rdzv_id", "--rdzv_id": "rdzv_id",
}
#: The settings that hold a whole number.
INT_SETTINGS = frozenset({"nproc_per_node", "node_rank", "master_port"})

#: Launchers run as they are, the processes that run the script taken for
#: the ranks, each with the options that say how many ranks it starts where
#: they say it for sure (accelerate's and deepspeed's counts depend on their
#: config files and the machine: `--cpu --num_processes 2` starts one).
KNOWN = {
    "accelerate": (),
    "deepspeed": (),
    "mpirun": ("-n", "-np", "--n", "--np", "-c"),
    "mpiexec": ("-n", "-np", "--n", "--np", "-c"),
    "orterun": ("-n", "-np", "--n", "--np", "-c"),
    "srun": ("-n", "--ntasks"),
}
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")


class LaunchCommandError(PerfrunError):
    """A launch command perfrun cannot run: one line."""

    slug = "launch-command"


@dataclass(frozen=True)
class Launch:
    """A launcher's command, read."""

    #: "torchrun" for torch's launcher (run through perfrun's torchrun
    #: path), else the launcher's name, or "command" for one perfrun does
    #: not know.
    launcher: str
    #: The command up to the user's script (the launcher and its options;
    #: with a python executable before the script, that too).
    head: tuple[str, ...]
    #: The user's script, or None when it runs as a module.
    script: Optional[str]
    module: Optional[str]
    #: The script's own arguments.
    args: tuple[str, ...]
    #: torchrun: its options that perfrun's settings hold, by field, as
    #: strings; the rest of its options, as given.
    settings: tuple[tuple[str, str], ...] = ()
    passthrough: tuple[str, ...] = ()
    #: The ranks the command starts on this node, where it says.
    ranks: Optional[int] = None


def is_python(word: str) -> bool:
    """`python`, `python3`, `python3.11`, or a path to one."""
    return bool(_PYTHON.match(os.path.basename(word)))


def recognise(target: list[str], module: Optional[str] = None) -> Optional[str]:
    """Which launcher `target` (what perfrun runs: the script and its
    arguments, or after `perfrun -m MODULE` the module's) is, or None for a
    script of the user's. Known launchers go by name; a file of the current
    folder named otherwise is a script, as `python NAME` would run it; any
    other program on PATH whose command holds a Python script is a launcher
    perfrun does not know ("command")."""
    if module is not None:
        return "torchrun" if module == "torch.distributed.run" else None
    if not target:
        return None
    first = target[0]
    name = os.path.basename(first)
    if name.endswith(".py"):
        return None
    if name == "torchrun":
        return "torchrun"
    if is_python(first):
        return "torchrun" if target[1:3] == ["-m", "torch.distributed.run"] else "python"
    if name == "accelerate" and target[1:2] == ["launch"]:
        return "accelerate"
    if name in KNOWN:
        return name
    if os.path.isfile(first) and "/" not in first:
        return None
    if _executable(first) and find_script(target[1:]) is not None:
        return "command"
    return None


def _executable(name: str) -> bool:
    """A program: a path to an executable file, or a name on PATH (not a
    file of the current folder: `perfrun train` runs ./train as a script,
    as python would, even where PATH has `.`)."""
    if "/" in name:
        return os.path.isfile(name) and os.access(name, os.X_OK)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and folder != "." and os.access(os.path.join(folder, name), os.X_OK):
            return True
    return False


def read(target: list[str], module: Optional[str] = None) -> Optional[Launch]:
    """The launcher's command read (see `recognise`), or None for a script.
    Raises LaunchCommandError where the command runs no script perfrun can
    find."""
    kind = recognise(target, module)
    if kind is None:
        return None
    if kind == "torchrun":
        if module is not None:
            head, rest = ("-m", "torch.distributed.run"), target
        elif is_python(target[0]):
            head, rest = tuple(target[:3]), target[3:]
        else:
            head, rest = (target[0],), target[1:]
        return read_torchrun(head, rest)
    found = python_target(target[1:]) if kind == "python" else find_script(target[1:])
    if found is None:
        raise LaunchCommandError(
            f"found no Python script in the {os.path.basename(target[0])} command: perfrun "
            "profiles the processes that run one (SCRIPT.py, or python -m MODULE)")
    script, module_name, end = found
    head = tuple(target[: 1 + end - (0 if script is None else 1)])
    if module_name is not None:
        head = head[:-2]
    return Launch(kind, head, script, module_name, tuple(target[1 + end:]),
                  ranks=_rank_count(kind, list(head[1:])))


#: python's own options that take a value (python --help).
_PYTHON_VALUED = frozenset({"-X", "-W", "--check-hash-based-pycs"})


def python_target(args: list[str]) -> Optional[tuple[Optional[str], Optional[str], int]]:
    """What `python ARGS` runs, by python's own grammar: (script, module,
    index after it), or None (`-c`, or nothing to run)."""
    i = 0
    while i < len(args):
        word = args[i]
        if word == "-m":
            return (None, args[i + 1], i + 2) if i + 1 < len(args) else None
        if word == "-c" or word == "-" or (word.startswith("-") and "c" in word[1:]
                                            and not word.startswith("--")):
            return None
        if word.startswith("-"):
            i += 2 if word in _PYTHON_VALUED else 1
            continue
        return word, None, i + 1
    return None


def find_script(args: list[str]) -> Optional[tuple[Optional[str], Optional[str], int]]:
    """Where in a launcher's arguments the user's script is: (script,
    module, index after it), or None. It is what a python executable among
    them runs, else the first `*.py` argument that is a file."""
    for i, word in enumerate(args):
        if is_python(word):
            found = python_target(args[i + 1:])
            if found is not None:
                script, module, end = found
                return script, module, i + 1 + end
        if word.endswith(".py") and os.path.isfile(word):
            return word, None, i + 1
    return None


def read_torchrun(head: tuple[str, ...], rest: list[str]) -> Launch:
    """torchrun's options and the script after them (torchrun's own
    grammar: options first, then the script or, with -m, the module, then
    its arguments)."""
    settings: dict[str, str] = {}
    passthrough: list[str] = []
    as_module = False
    i = 0
    while i < len(rest):
        arg = rest[i]
        if not arg.startswith("-") or arg == "-":
            break
        if arg == "--":
            i += 1
            break
        name, eq, value = arg.partition("=")
        if name in ("-h", "--help"):
            raise LaunchCommandError("torchrun's help: run `torchrun --help` without perfrun")
        if name in ("--no-python", "--no_python"):
            raise LaunchCommandError(
                "torchrun --no-python runs a program that is not a Python script: perfrun "
                "profiles Python scripts (leave --no-python out, or put perfrun inside the "
                "command)")
        if name in TORCHRUN_FLAGS:
            if name in ("-m", "--module"):
                as_module = True
            else:
                passthrough.append(arg)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(rest):
                raise LaunchCommandError(f"torchrun's {name} needs a value")
            value = rest[i + 1]
        field = TORCHRUN_SETTINGS.get(name)
        if field is not None and (field not in INT_SETTINGS or value.strip().isdigit()):
            settings[field] = value
        else:
            passthrough += [name, value]
        i += 1 if eq else 2
    if i >= len(rest):
        raise LaunchCommandError("the torchrun command names no script to run")
    script = None if as_module else rest[i]
    module = rest[i] if as_module else None
    nproc = settings.get("nproc_per_node")
    return Launch("torchrun", head, script, module, tuple(rest[i + 1:]),
                  settings=tuple(settings.items()), passthrough=tuple(passthrough),
                  ranks=int(nproc) if nproc is not None else None)


def _rank_count(kind: str, options: list[str]) -> Optional[int]:
    """How many ranks a launcher's options start, where they say."""
    names = KNOWN.get(kind, ())
    for i, word in enumerate(options):
        name, eq, value = word.partition("=")
        if name in names:
            text = value if eq else (options[i + 1] if i + 1 < len(options) else "")
            if text.isdigit() and int(text) > 0:
                return int(text)
    return None
