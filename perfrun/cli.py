"""The command line: parse argv and call the command that runs it
(commands.py, which calls the API and chooses the exit code).

`main(argv) -> int` is testable in-process; `console_main()` is the console
entry point (it also survives `perfrun ... | head` closing the pipe).

perfrun's options go before the script, and may be written after it too:
there perfrun takes every one of them, except a name the script defines
itself (its argparse `--scheduler`, say), which stays the script's, as
`python train.py ...` would give it. What the script defines is read from
its source, never run (scriptoptions.py); where perfrun took or left an
option that the script might also have meant, it says so in one line.
`-m` and `-h/--help` after the script are the script's, and a `--` hands
all that follows to the script. split_run_argv is that rule, pure.

Each command imports what it runs (commands.py, watch.py) when it is
called: `perfrun --help`, and the moment before a script starts, pay for
nothing else.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, NamedTuple, Optional

import click

from . import __version__, launchcommand, scriptoptions
from .config import load_config, parse_override
from .errors import PerfrunError
from .exitcodes import ExitCode
from .scriptoptions import ScriptOptions
from .settings import (
    Settings,
    SettingsError,
    command_line_options,
    formats,
    help_section,
    parse_threshold,
    user_path,
)

COMMANDS = ("run", "report", "compare", "analyze", "combine", "watch", "status")
#: The run option that --config and -o are shown before in `--help`.
CONFIG_BEFORE = "nproc_per_node"
#: Set to 1 to see the traceback of perfrun's own internal errors.
DEBUG_VARIABLE = "PERFRUN_DEBUG"
#: Options that say what runs, or ask about perfrun itself: written before
#: the script. After it they are the script's, as with `python train.py
#: --help`; every other option of perfrun's is read after the script too.
BEFORE_SCRIPT_ONLY = frozenset({"-m", "--module", "-h", "--help"})
# torchrun's own spellings of its options, accepted before the script as
# torchrun accepts them.
TORCHRUN_SPELLINGS = {
    "--nproc_per_node": "--nproc-per-node",
    "--node_rank": "--node-rank",
    "--master_addr": "--master-addr",
    "--master_port": "--master-port",
    "--rdzv_backend": "--rdzv-backend",
    "--rdzv_endpoint": "--rdzv-endpoint",
    "--rdzv_id": "--rdzv-id",
}


class UsageError(PerfrunError):
    """A one-line command-line error, exit 2."""

    slug = "usage"


class UserPath(click.ParamType):
    """A file or folder the user names: `~` expanded where the shell left it
    (settings.user_path), and completed by the shell as a path, which a
    plain function type would not be (`perfrun report perfrun_l<Tab>`,
    `--config tr<Tab>`)."""

    name = "path"

    def __init__(self, kind: str = "file") -> None:
        #: "file" completes files and folders; "dir" folders only.
        self.kind = kind

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Any:
        return user_path(value) if isinstance(value, str) else value

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        return [CompletionItem(incomplete, type=self.kind)]


#: A path that may be a file (or a folder: a report, a baseline, a trace).
FILE = UserPath("file")
#: A folder: a log folder, a run folder.
DIR = UserPath("dir")


def _click_options(command: str) -> list[Any]:
    """The click options of `command`'s settings, made from the Settings
    fields' metadata (settings.option), in field order. Every value option
    defaults to None and every flag to off, so that settings_from_options
    can tell an option not given from one given: only a given one overrides
    the config file."""
    options = []
    for _name, spec in command_line_options(command):
        if spec.is_flag:
            takes: dict[str, Any] = {"is_flag": True}
        else:
            takes = {
                "type": click.Choice(spec.choices) if spec.choices else _click_type(spec),
                "nargs": spec.nargs,
                "default": None,
                "metavar": spec.metavar,
            }
        options.append(
            click.option(*spec.flags, spec.dest, help=spec.help, hidden=spec.hidden, **takes)
        )
    return options


#: The `perfrun run --help` sections of its options that are not settings.
_OTHER_SECTIONS = {"config_file": "Settings from a file", "overrides": "Settings from a file"}


def _click_type(spec: Any) -> Any:
    """A setting's click type: a path setting (settings.user_path) completes
    as a path, a folder where its value is one (metavar DIR)."""
    if spec.type is user_path:
        return DIR if spec.metavar == "DIR" else FILE
    return spec.type


def _config_options() -> list[Any]:
    """Where settings come from rather than settings: not Settings fields."""
    return [
        click.option(
            "--config",
            "config_file",
            metavar="FILE",
            default=None,
            type=FILE,
            help="YAML file with a Profiler: section (the training config itself will do).",
        ),
        click.option(
            "-o",
            "--override",
            "overrides",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override a config key, e.g. -o Profiler.scheduler=[100,110].",
        ),
    ]


def _run_options(f: Any) -> Any:
    """Every setting's option, and --config and -o (not settings themselves)
    before the launch's options, where they have always been shown."""
    options = _click_options("run")
    at = [name for name, _spec in command_line_options("run")].index(CONFIG_BEFORE)
    options[at:at] = _config_options()
    return _apply(options, f)


def _apply(options: list[Any], f: Any) -> Any:
    for option in reversed(options):
        f = option(f)
    return f


class _Perfrun(click.Group):
    """perfrun's commands, where a first word that is none of them starts a
    run (`perfrun train.py` is `perfrun run train.py`). main() sorts that
    out before click sees a run; this does it for shell completion, so that
    `perfrun --tim<Tab>` and `perfrun train.py --tim<Tab>` complete as
    `perfrun run ...` does."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in (
            *ctx.help_option_names, "--version"
        ):
            args = ["run", *args]
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        """The commands and the group's options, then what `perfrun run`
        offers with nothing written yet: its options, or the script."""
        results = super().shell_complete(ctx, incomplete)
        run = self.commands["run"]
        with run.make_context("run", [], parent=ctx, resilient_parsing=True) as sub:
            more = run.shell_complete(sub, incomplete)
            if not incomplete.startswith("-"):
                script = next(p for p in run.params if p.name == "script")
                more += script.shell_complete(sub, incomplete)
        seen = {item.value for item in results}
        return results + [item for item in more if item.value not in seen]


class _Run(click.Command):
    """`perfrun run`: its `--help` in the settings' sections
    (settings.HELP_SECTIONS), and after the script, completion offers the
    script's own options too, read from its source (scriptoptions.py)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        field_of = {spec.dest: name for name, spec in command_line_options("run")}
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or isinstance(param, click.Argument):
                continue
            name = param.name or ""
            title = (help_section(field_of.get(name, name))
                     or _OTHER_SECTIONS.get(name, "Other"))
            sections.setdefault(title, []).append(record)
        for title, records in sections.items():
            with formatter.section(title):
                formatter.write_dl(records)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        results = super().shell_complete(ctx, incomplete)
        script = ctx.params.get("script")
        if script and incomplete.startswith("-") and not ctx.params.get("module"):
            seen = {item.value for item in results}
            results += [
                CompletionItem(name, help=f"{script}'s own option")
                for name in sorted(scriptoptions.read_script(script).names)
                if name.startswith(incomplete) and name not in seen
            ]
        return results


@click.group(cls=_Perfrun, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="perfrun")
def cli() -> None:
    """Profile an unmodified PyTorch training script.

    \b
    perfrun train.py --scheduler 100 110      detailed window on steps [100, 110)
    perfrun --timer-only train.py             cheap baseline: reader_cost, batch_cost, ips
    perfrun --nproc-per-node 8 train.py       under torch.distributed, per-rank results
    perfrun report perfrun_log                re-print the tables of the latest run
    perfrun watch perfrun_log                 follow the latest run live, from another terminal
    perfrun status perfrun_log                where each rank of the latest run is now
    perfrun compare base.json perfrun_log     the CI gate: is this run slower?
    perfrun analyze rank0.json.gz rank1.json.gz   window tables of torch.profiler traces
    perfrun combine node0/job-x node1/job-x   one folder from the nodes' run folders

    `perfrun run --help` lists the options of a run (they also work without
    the word `run`), and how they are told from the script's own when
    written after the script.
    """


@cli.command("run", cls=_Run, context_settings={"ignore_unknown_options": True})
@_run_options
@click.argument("script", required=False, type=click.Path())
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(**kwargs: Any) -> int:
    """Run SCRIPT [ARGS...] (or -m MODULE [ARGS...]) and print where its time went.

    perfrun's options go before SCRIPT or after it: `perfrun train.py
    --scheduler 100 110` is `perfrun --scheduler 100 110 train.py`. After
    SCRIPT, an option that the script defines itself (its own argparse or
    click option of that name, read from its source, which is not run) is
    the script's; -m, -h/--help, and everything after `--`, are the
    script's too. Where the script might also have meant an option, a note
    on stderr says which way it went.
    """
    from . import commands

    settings = settings_from_options(kwargs)
    obj = click.get_current_context().obj or {}
    # Said once the command line is known to be good, before the script runs.
    for note in obj.get("notes") or ():
        commands.say(note)
    return commands.run_and_report(settings, command_line=obj.get("command_line"))


@cli.command("report")
@click.argument("log_dir", default="perfrun_log", type=DIR)
@click.option("--format", "fmt", type=click.Choice(formats("report")), default="table",
              help="What is printed: table (default), json, markdown or html.")
@click.option("--output", metavar="FILE", default=None, type=FILE,
              help="Write the report to FILE instead of standard output.")
@click.option("--warmup", type=int, default=None, metavar="N",
              help="Steps left out of the statistics (default: as the run had it).")
@lambda f: _apply(_click_options("report"), f)
def report_command(
    log_dir: str, fmt: str, output: Optional[str], warmup: Optional[int], **view: Any
) -> int:
    """Re-print the tables of a finished run (a run folder, or a log folder's latest run)."""
    from . import commands

    return commands.report(log_dir, fmt=fmt, output=output, warmup=_warmup(warmup),
                           view=_view(view))


@cli.command("analyze")
@click.argument("traces", nargs=-1, required=True, type=FILE)
@click.option("--format", "fmt", type=click.Choice(formats("analyze")), default="table",
              help="What is printed: table (default), json or markdown.")
@click.option("--output", metavar="FILE", default=None, type=FILE,
              help="Write the tables to FILE instead of standard output.")
@lambda f: _apply(_click_options("analyze"), f)
def analyze_command(traces: tuple[str, ...], fmt: str, output: Optional[str], **view: Any) -> int:
    """Print the window tables (Overview, Operator, Kernel, Distributed,
    Memory Manipulation, Memory) of torch.profiler traces you already have:
    one trace file (.json or .json.gz) per rank."""
    from . import commands

    return commands.analyze(list(traces), fmt=fmt, output=output, view=_view(view))


@cli.command("combine")
@click.argument("run_dirs", nargs=-1, required=True, metavar="DIR...", type=DIR)
@click.option(
    "-o",
    "--output",
    "output",
    metavar="OUT",
    default=None,
    type=DIR,
    help="The folder to create (default ./perfrun_log/combined-JOB); never an existing one.",
)
def combine_command(run_dirs: tuple[str, ...], output: Optional[str]) -> int:
    """Merge the run folders of one multi-node job, copied from its nodes,
    into one folder that `perfrun report` reads as the whole job."""
    from . import commands

    return commands.combine(list(run_dirs), output)


@cli.command("watch")
@click.argument("log_dir", default="perfrun_log", type=DIR)
@click.option(
    "--interval",
    type=float,
    default=1.0,
    metavar="S",
    help="Seconds between reads of the ranks' files (default 1; they flush every 2).",
)
@click.option(
    "--last",
    type=int,
    default=None,
    metavar="N",
    help="Steps of each rank the rate and phase split are taken over (default 50).",
)
def watch_command(log_dir: str, interval: float, last: Optional[int]) -> int:
    """Follow a run in progress live (a run folder, or a log folder's newest
    run) until it ends, then leave its final tables on the screen."""
    from . import watch

    if interval <= 0:
        raise SettingsError(f"--interval must be above 0, not {interval}")
    if last is not None and last < 1:
        raise SettingsError(f"--last must be at least 1, not {last}")
    return watch.watch(log_dir, interval=interval, last=last or watch.LAST_STEPS)


@cli.command("status")
@click.argument("log_dir", default="perfrun_log", type=DIR)
def status_command(log_dir: str) -> int:
    """Say where each rank of a run is now: its step, its phase and for how
    long (a run folder, or a log folder's newest run)."""
    from . import commands

    return commands.status(log_dir)


@cli.command("compare")
@click.argument("baseline", type=FILE)
@click.argument("current", type=FILE)
@lambda f: _apply(_click_options("compare"), f)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(formats("compare")),
    default="table",
    help="What is printed: table (default), json, markdown, junit or html.",
)
@click.option("--output", metavar="FILE", default=None, type=FILE,
              help="Write the comparison to FILE instead of standard output.")
@click.option("--warmup", type=int, default=None, metavar="N",
              help="Steps left out of both runs' statistics (default: as each run had it).")
def compare_command(
    baseline: str,
    current: str,
    max_regression: Optional[str],
    fail_on_inconclusive: bool,
    allow_env_mismatch: bool,
    ignore_disturbed: bool,
    fmt: str,
    output: Optional[str],
    warmup: Optional[int],
) -> int:
    """Compare CURRENT with BASELINE (each a baseline file or a results folder);
    with --max-regression, gate on it (exit 68 on a regression)."""
    from . import commands

    return commands.compare(
        baseline,
        current,
        threshold=None if max_regression is None else parse_threshold(max_regression),
        fail_on_inconclusive=fail_on_inconclusive,
        allow_env_mismatch=allow_env_mismatch,
        ignore_disturbed=ignore_disturbed,
        fmt=fmt,
        output=output,
        warmup=_warmup(warmup),
    )


def _view(opts: dict[str, Any]) -> dict[str, Any]:
    """The view options of `report` and `analyze`, checked as `run` checks
    them (Settings.validate)."""
    limit = opts.get("row_limit")
    view = {
        "op_detail": bool(opts.get("op_detail")),
        "sort_by": opts.get("sort_by") or "cpu-total",
        "row_limit": 20 if limit is None else limit,
        "time_unit": opts.get("time_unit"),
    }
    if view["row_limit"] < 1:
        raise SettingsError(f"--row-limit must be at least 1, not {view['row_limit']}")
    return view


def _warmup(value: Optional[int]) -> Optional[int]:
    """--warmup of `report` and `compare`, checked as `run` checks it."""
    if value is not None and value < 0:
        raise SettingsError(f"--warmup cannot be negative ({value})")
    return value


def settings_from_options(opts: dict[str, Any]) -> Settings:
    """Config file, then -o overrides, then command-line options, each later
    one winning. `opts` is click's values by parameter name; an option not
    given (None, or a flag left off) changes nothing, so it never undoes
    what the config file set."""
    changes: dict[str, Any] = {}
    if opts.get("config_file"):
        changes.update(load_config(opts["config_file"]))
    for text in opts.get("overrides") or ():
        changes.update(parse_override(text))
    for name, spec in command_line_options("run"):
        value = opts.get(spec.dest)
        if spec.is_flag:
            if value:  # a flag left off says nothing
                changes[name] = spec.flag_value
        elif value is not None:
            if spec.nargs > 1:
                value = tuple(value)
            changes[name] = value if spec.parse is None else spec.parse(value)
    if opts.get("script") is not None:
        if opts.get("module"):
            # With -m, what click took for the script is the first argument.
            changes["script_args"] = (opts["script"], *opts.get("script_args", ()))
        else:
            changes["script"] = opts["script"]
            changes["script_args"] = tuple(opts.get("script_args", ()))
    else:
        changes["script_args"] = tuple(opts.get("script_args", ()))
    if "script" not in changes and not changes.get("module"):
        raise UsageError("no script given: perfrun [OPTIONS] SCRIPT [ARGS...] or -m MODULE")
    changes.update(launch_changes(changes))
    return Settings().replace(**changes).validate()


def launch_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """Where perfrun was put in front of a launcher's command (`perfrun
    torchrun ... train.py`, `perfrun accelerate launch ... train.py`;
    launchcommand.py), what the settings become: the script is the one
    inside the command; torchrun's options are perfrun's own torchrun
    settings, the rest of them passed on; any other launcher is run as it
    is. Nothing for a script."""
    target = [changes["script"]] if changes.get("script") else []
    try:
        launch = launchcommand.read([*target, *changes.get("script_args", ())],
                                    changes.get("module"))
    except launchcommand.LaunchCommandError as exc:
        raise UsageError(str(exc)) from None
    if launch is None:
        return {}
    out: dict[str, Any] = {"script": launch.script, "module": launch.module,
                           "script_args": launch.args, "launch_kind": launch.launcher,
                           "launch_ranks": launch.ranks}
    if launch.launcher != "torchrun":
        out["launch"] = launch.head
        return out
    for field, value in launch.settings:
        if changes.get(field) is not None:
            raise UsageError(f"--{field.replace('_', '-')} is given to perfrun and to torchrun: "
                             "give it once, in the torchrun command")
        out[field] = int(value) if field in launchcommand.INT_SETTINGS else value
    out["torchrun_args"] = launch.passthrough
    return out


# -- argv splitting ------------------------------------------------------------


def _option_table() -> dict[str, int]:
    """Each run option spelling -> number of values it takes."""
    table: dict[str, int] = {}
    for param in run_command.params:
        if isinstance(param, click.Option):
            takes = 0 if param.is_flag else param.nargs
            for name in param.opts + param.secondary_opts:
                table[name] = takes
    table["--help"] = table["-h"] = 0
    return table


def did_you_mean(name: str, known: Any, bare: bool = False) -> str:
    """" (did you mean --x?)" for the closest known option, or "";
    `bare`: the option alone."""
    import difflib

    close = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], n=1,
                                      cutoff=0.75)
    if bare:
        return close[0] if close else ""
    return f" (did you mean {close[0]}?)" if close else ""


#: python's own command-line flags, which perfrun cannot pass to the
#: interpreter it starts the script with (the script runs as `python
#: SCRIPT`), and what does the same from the environment, which the script's
#: process inherits.
INTERPRETER_FLAGS = {
    "-W": "set PYTHONWARNINGS=ARG",
    "-O": "set PYTHONOPTIMIZE=1",
    "-OO": "set PYTHONOPTIMIZE=2",
    "-X": "set the option's variable (PYTHONDEVMODE=1 for -X dev; "
          "python --help-xoptions lists the others)",
    "-u": "set PYTHONUNBUFFERED=1",
    "-B": "set PYTHONDONTWRITEBYTECODE=1",
    "-s": "set PYTHONNOUSERSITE=1",
    "-d": "set PYTHONDEBUG=1",
    "-v": "set PYTHONVERBOSE=1",
    "-i": "set PYTHONINSPECT=1",
    "-P": "set PYTHONSAFEPATH=1",
}


def interpreter_flag(arg: str) -> Optional[str]:
    """The one line for python's own flag `arg` written before the script
    (`-Werror`, `-X dev`, `-c CODE`), or None when it is none of python's."""
    if arg.startswith("-c"):
        return ("-c is python's, not perfrun's: perfrun runs a script file or -m MODULE; "
                "save the code to a file and give its name")
    flag = arg if arg in INTERPRETER_FLAGS else arg[:2]
    if flag not in INTERPRETER_FLAGS or (flag != arg and flag not in ("-W", "-X")):
        return None
    return (f"{flag} is python's, not perfrun's: perfrun starts the script as "
            f"`python SCRIPT`; {INTERPRETER_FLAGS[flag]} in its environment instead")


class RunArgv(NamedTuple):
    """`perfrun run`'s arguments sorted out (split_run_argv)."""

    #: perfrun's options written before the script (-m as `--module=NAME`).
    before: list[str]
    #: perfrun's options written after it.
    after: list[str]
    #: [script, its arguments...]; with -m, the module's arguments.
    target: list[str]
    #: What to tell the user, one line each, before the script starts.
    notes: list[str]


def _before_script(argv: list[str], table: dict[str, int]) -> tuple[list[str], int, bool]:
    """perfrun's options before the script, where the script (or, after -m,
    the module's first argument) is, and whether a `--` ended perfrun's
    options there."""
    before: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return before, i + 1, True
        name, eq, value = arg.partition("=")
        if name in TORCHRUN_SPELLINGS:
            name = TORCHRUN_SPELLINGS[name]
            arg = f"{name}={value}" if eq else name
        if arg.startswith("-") and name in table:
            takes = 0 if eq else table[name]
            if name in ("-m", "--module"):
                if i + 1 >= len(argv) and not eq:
                    raise UsageError("-m needs a module name")
                before.append(arg if eq else f"--module={argv[i + 1]}")
                return before, i + (1 if eq else 2), False
            before.extend([arg, *argv[i + 1 : i + 1 + takes]])
            i += 1 + takes
            continue
        if arg == "-":
            raise UsageError("perfrun cannot run a script from standard input: "
                             "save it to a file and give its name")
        if arg.startswith("-"):
            said = None if arg.startswith("--") else interpreter_flag(arg)
            raise UsageError(said or f"no such option: {arg}{did_you_mean(name, table)}")
        break
    return before, i, False


class Target(NamedTuple):
    """What `perfrun run ARGV` runs (run_target)."""

    kind: str  # "script" or "module"
    name: str
    #: Where in ARGV its own arguments start.
    start: int
    #: What is written after it, up to a `--`: what perfrun may take from.
    after: list[str]


def _locate(argv: list[str], table: dict[str, int]) -> tuple[list[str], Optional[Target], bool]:
    """perfrun's options before the script, what runs (None: nothing), and
    whether a `--` before the script made all after it the script's."""
    before, at, dashes = _before_script(argv, table)
    module = next((a.partition("=")[2] for a in before if a.startswith("--module=")), None)
    if module is None:
        if at >= len(argv):
            return before, None, dashes
        kind, name, at = "script", argv[at], at + 1
    else:
        kind, name = "module", module
    rest = argv[at:]
    return before, Target(kind, name, at, rest[: rest.index("--")] if "--" in rest else rest), \
        dashes


def run_target(argv: list[str]) -> Optional[Target]:
    """What `perfrun run ARGV` runs; None when nothing does, or when a `--`
    before the script makes everything after it the script's."""
    _before, target, dashes = _locate(argv, _option_table())
    return None if dashes else target


def split_run_argv(argv: list[str], defines: ScriptOptions) -> RunArgv:
    """Split `run` arguments between perfrun and the script, given what the
    script defines (scriptoptions.py reads it from the script's source).
    Raises UsageError with a one-line message.

    The rule, the same for every option: perfrun's options go before the
    script, and may also be written after it, where perfrun takes them,
    except a name the script defines itself, which is the script's. A `--`
    gives everything after it to the script. -m and -h/--help say what runs
    and ask about perfrun itself: after the script they are the script's
    (`perfrun train.py --help` is the script's help, as with python).
    Nothing is taken or left silently where the script might have meant
    otherwise: a name both define, an option perfrun takes from a script
    whose source does not say all it reads, or one that argparse would
    also take as an abbreviation of the script's own, each gets a note."""
    table = _option_table()
    before, target, dashes = _locate(argv, table)
    if target is None:
        return RunArgv(before, [], [], [])
    script = [target.name] if target.kind == "script" else []
    if _is_launch(target, argv):
        # A launcher's command, as after `nsys profile`: all of it is the
        # launcher's, perfrun's options go before it.
        return RunArgv(before, [], script + argv[target.start :], [])
    if dashes:
        return RunArgv(before, [], script + argv[target.start :], [])
    try:
        after, script_args, notes = split_after_script(
            argv[target.start :], target.name, table, defines
        )
    except _Short as short:
        raise UsageError(read_as_perfruns(
            f"Option '{short.name}' requires {short.needs}", [short.name], target.name, argv,
            target.start,
        )) from None
    return RunArgv(before, after, script + script_args, notes)


class _Short(Exception):
    """An option perfrun takes after the script, without all its values."""

    def __init__(self, name: str, needs: str) -> None:
        super().__init__(name)
        self.name, self.needs = name, needs


def read_as_perfruns(message: str, names: list[str], label: str, argv: list[str],
                     start: int) -> str:
    """`message` about options perfrun took after the script, and the
    command that gives them to the script instead: the one written, with a
    `--` after the script (`start`: where its arguments begin in argv)."""
    rest = argv[start:]
    if "--" in rest:
        rest.remove("--")
    fixed = " ".join(["perfrun", *argv[:start], "--", *rest])
    subject = "it is" if len(names) == 1 else "they are"
    return (f"{message.rstrip('.')}; {' '.join(names)} after {label} was read as perfrun's. "
            f"If {subject} the script's own, put {subject.split()[0]} after --: {fixed}")


def split_after_script(
    args: list[str], label: str, table: dict[str, int], defines: ScriptOptions
) -> tuple[list[str], list[str], list[str]]:
    """(perfrun's options, the script's arguments, notes) of what is written
    after the script `label`: the rule of split_run_argv."""
    ours = {name: takes for name, takes in table.items() if name not in BEFORE_SCRIPT_ONLY}
    after: list[str] = []
    script: list[str] = []
    left: list[str] = []  # perfrun's names the script defines, given to it
    taken: list[str] = []  # what perfrun took where the script's source is unsure
    taken_names: list[str] = []
    shortened: list[str] = []  # perfrun's names argparse would take as the script's
    misspelt: dict[str, str] = {}  # the script's argument -> perfrun's option it looks like
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            script.extend(args[i + 1 :])
            break
        name, eq, value = arg.partition("=")
        if name in TORCHRUN_SPELLINGS:
            name = TORCHRUN_SPELLINGS[name]
            arg = f"{name}={value}" if eq else name
        if not arg.startswith("-") or name not in ours:
            script.append(args[i])
            if name.startswith("--") and not defines.defines(name) and name not in misspelt:
                close = did_you_mean(name, ours, bare=True)
                if close:
                    misspelt[name] = close
            i += 1
            continue
        if defines.defines(name):
            script.append(args[i])
            if name not in left:
                left.append(name)
            i += 1
            continue
        takes = 0 if eq else ours[name]
        values = args[i + 1 : i + 1 + takes]
        if "--" in values:
            values = values[: values.index("--")]
        if len(values) < takes:
            # Said here: click would read the `--` before the script's
            # arguments as the missing value.
            raise _Short(name, "an argument" if takes == 1 else f"{takes} arguments")
        after.extend([arg, *values])
        if defines.unsure:
            taken.extend([arg, *values])
            taken_names.append(name)
        elif defines.expansions(name):
            longer = ", ".join(defines.expansions(name))
            shortened.append(f"took {name} as perfrun's, though argparse would give it to "
                             f"{label}'s {longer}; for the script, write that in full")
        i += 1 + len(values)
    notes = []
    if left:
        notes.append(
            f"{', '.join(left)} went to {label}, which defines "
            + ("it; perfrun's goes" if len(left) == 1 else "them; perfrun's go")
            + " before the script"
        )
    if taken:
        them = "it" if len(taken_names) == 1 else "them"
        notes.append(f"took {' '.join(taken)} as perfrun's, though {label} {defines.unsure}; "
                     f"for the script, put {them} after --")
    return after, script, notes + shortened + [
        f"passed {name} to the script as its own argument; perfrun's option is {close}"
        for name, close in misspelt.items()
    ]


def main(argv: Optional[list[str]] = None) -> int:
    """Run perfrun; return the exit status (the script's own for `run`)."""
    with warnings.catch_warnings():
        # numpy's arithmetic warnings from perfrun's own modules (a mean of
        # no steps, a value not recorded) say nothing the report does not:
        # what a figure lacks is said in its own words, and a step file
        # holding values no rank writes is refused before any arithmetic.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"perfrun\.")
        return _main(argv)


def _main(argv: Optional[list[str]]) -> int:
    if argv is None:
        argv = sys.argv[1:]
    command_line = ["perfrun", *argv]
    if not argv and "_PERFRUN_COMPLETE" not in os.environ:
        # Bare `perfrun`: what it does and how to start, not an error message
        # wrapped around the whole help.
        ctx = click.Context(cli, info_name="perfrun", help_option_names=["-h", "--help"])
        click.echo(cli.get_help(ctx), err=True)
        return ExitCode.USAGE
    if argv and argv[0] in COMMANDS:
        command, rest = argv[0], argv[1:]
    elif not argv or argv[0] in ("-h", "--help", "--version"):
        command, rest = "", argv
    else:
        command, rest = "run", argv
    try:
        if command == "run" and not any(a in ("-h", "--help") for a in _leading_options(rest)):
            split = split_run_argv(rest, _script_defines(rest))
            if not split.target and not any(a.startswith("--module=") for a in split.before):
                raise UsageError("no script given: perfrun [OPTIONS] SCRIPT [ARGS...]")
            args = ["run", *split.before, *split.after, "--", *split.target]
            try:
                return _invoke(args, command_line, split.notes)
            except click.UsageError as exc:
                raise _collision_hint(exc, split.after, rest) from None
        return _invoke(([command] if command else []) + rest, command_line)
    except UsageError as exc:
        click.echo(f"perfrun: error: {exc}", err=True)
        return ExitCode.USAGE
    except click.UsageError as exc:
        click.echo(f"perfrun: error: {exc.format_message()}", err=True)
        return ExitCode.USAGE
    except SettingsError as exc:
        click.echo(f"perfrun: error: {exc}", err=True)
        return ExitCode.CONFIG
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.Abort:
        return 130
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as exc:
        # perfrun's own bug: one line and the documented code; the
        # traceback on request.
        if os.environ.get(DEBUG_VARIABLE):
            raise
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        click.echo(
            f"perfrun: internal error: {message} (set {DEBUG_VARIABLE}=1 to see the "
            "traceback, and please report it)",
            err=True,
        )
        return ExitCode.INTERNAL


def _leading_options(argv: list[str]) -> list[str]:
    out = []
    for arg in argv:
        if not arg.startswith("-") or arg == "--":
            break
        out.append(arg)
    return out


def _is_launch(target: Target, argv: list[str]) -> bool:
    """Whether what perfrun runs is a launcher's command (launchcommand.py)."""
    if target.kind == "module":
        return launchcommand.recognise([], target.name) is not None
    return launchcommand.recognise([target.name, *argv[target.start :]]) is not None


def _script_defines(argv: list[str]) -> ScriptOptions:
    """What the script of `perfrun run ARGV` defines, read from its source
    only when an option is written after it (`perfrun train.py` reads
    nothing)."""
    target = run_target(argv)
    if target is None or not any(a.startswith("-") for a in target.after):
        return scriptoptions.NOTHING
    if _is_launch(target, argv):
        return scriptoptions.NOTHING
    if target.kind == "module":
        # python -m looks in the current folder first, then on its path.
        return scriptoptions.read_module(target.name, [os.getcwd(), *sys.path[1:]])
    return scriptoptions.read_script(target.name)


def _collision_hint(exc: click.UsageError, after: list[str], argv: list[str]) -> UsageError:
    """click's one line, and where what it refuses is an option perfrun
    took from after the script, the command that gives it to the script."""
    message = exc.format_message()
    table, names, j = _option_table(), [], 0
    while j < len(after):  # the option names only, not their values
        name, eq, _ = after[j].partition("=")
        names.append(name)
        j += 1 + (0 if eq else table.get(name, 0))
    named = [n for n in dict.fromkeys(names) if f"'{n}'" in message]
    target = run_target(argv)
    if not named or target is None:
        return UsageError(message)
    return UsageError(read_as_perfruns(message, named, target.name, argv, target.start))


def _invoke(args: list[str], command_line: list[str], notes: Optional[list[str]] = None) -> int:
    obj = {"command_line": command_line, "notes": list(notes or ())}
    result = cli.main(args=args, prog_name="perfrun", standalone_mode=False, obj=obj)
    return int(result) if isinstance(result, int) else 0


def console_main() -> None:
    """Console entry point: exit with main()'s status; a closed stdout
    (`perfrun ... | head`) ends quietly rather than with a traceback, exit
    1. A standard stream closed from the start (`perfrun train.py >&-`)
    is as it is for python: what perfrun would print there is dropped
    (Python's own print writes nothing when sys.stdout is None), and the
    script inherits the closed descriptor as it would from the shell."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - for the process's life
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = ExitCode.CLOSED_OUTPUT
    except KeyboardInterrupt:
        code = 130
    leave(code)


def leave(code: int) -> None:
    """Exit with `code`, without the interpreter's teardown where it has
    nothing left to do. Once the report is out, tearing down the modules a
    run loads (numpy, rich, the report's) took about 40 ms of every run's
    wall time, after the user had read everything (measured between the
    end of main() and the process's exit, on a script that imports torch).
    It is skipped only when nothing asked to run at exit: no exit handler
    was registered (a tracker's client, logging, coverage measurement all
    register one) and no thread that Python would wait for is alive; our
    files are closed by then, and the standard streams are flushed here.
    Otherwise Python exits as usual."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a stream that cannot flush: the usual exit
        sys.exit(code)
    import atexit
    import threading

    count = getattr(atexit, "_ncallbacks", None)
    main_thread = threading.main_thread()
    waited = any(t.is_alive() and not t.daemon for t in threading.enumerate()
                 if t is not main_thread)
    if count is None or count() or waited or not isinstance(code, int) or not 0 <= code <= 255:
        sys.exit(code)
    os._exit(code)
