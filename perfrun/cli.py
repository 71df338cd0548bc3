"""The command line: parse argv and call the command that runs it
(commands.py, which calls the API and chooses the exit code).

`main(argv) -> int` is testable in-process; `console_main()` is the console
entry point (it also survives `perfrun ... | head` closing the pipe).

perfrun's options go before the script. Right after it perfrun reads only
the two its usage line shows there, `--scheduler START END` and
`--timer-only` (so `perfrun train.py --scheduler 100 110` works), and says
on stderr when it did; everything else after the script, `--help` and
`--batch-size` included, is the script's, exactly as `python train.py ...`
would get it. A `--` hands all that follows to the script.

Each command imports what it runs (commands.py, watch.py) when it is
called: `perfrun --help`, and the moment before a script starts, pay for
nothing else.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import click

from . import __version__
from .exitcodes import ExitCode
from .settings import (
    Settings,
    SettingsError,
    command_line_options,
    formats,
    load_config,
    parse_override,
    parse_threshold,
)

COMMANDS = ("run", "report", "compare", "analyze", "combine", "watch", "status")
#: The run option that --config and -o are shown before in `--help`.
CONFIG_BEFORE = "nproc_per_node"
#: Set to 1 to see the traceback of perfrun's own internal errors.
DEBUG_VARIABLE = "PERFRUN_DEBUG"
# The only options perfrun reads after the script (its usage line shows
# them there); any other argument after the script is the script's.
AFTER_SCRIPT = {"--scheduler": 2, "--timer-only": 0}
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


class UsageError(Exception):
    """A one-line command-line error, exit 2."""


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
                "type": click.Choice(spec.choices) if spec.choices else spec.type,
                "nargs": spec.nargs,
                "default": None,
                "metavar": spec.metavar,
            }
        options.append(
            click.option(*spec.flags, spec.dest, help=spec.help, hidden=spec.hidden, **takes)
        )
    return options


def _config_options() -> list[Any]:
    """Where settings come from rather than settings: not Settings fields."""
    return [
        click.option(
            "--config",
            "config_file",
            metavar="FILE",
            default=None,
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    the word `run`).
    """


@cli.command("run", context_settings={"ignore_unknown_options": True})
@_run_options
@click.argument("script", required=False, type=click.Path())
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(**kwargs: Any) -> int:
    """Run SCRIPT [ARGS...] (or -m MODULE [ARGS...]) and print where its time went."""
    from . import commands

    settings = settings_from_options(kwargs)
    obj = click.get_current_context().obj or {}
    # Said once the command line is known to be good, before the script runs.
    for note in obj.get("notes") or ():
        commands.say(note)
    return commands.run_and_report(settings, command_line=obj.get("command_line"))


@cli.command("report")
@click.argument("log_dir", default="perfrun_log")
@click.option("--format", "fmt", type=click.Choice(formats("report")), default="table")
@click.option("--output", metavar="FILE", default=None)
@click.option("--warmup", type=int, default=None, metavar="N")
@lambda f: _apply(_click_options("report"), f)
def report_command(
    log_dir: str, fmt: str, output: Optional[str], warmup: Optional[int], **view: Any
) -> int:
    """Re-print the tables of a finished run (a run folder, or a log folder's latest run)."""
    from . import commands

    return commands.report(log_dir, fmt=fmt, output=output, warmup=_warmup(warmup),
                           view=_view(view))


@cli.command("analyze")
@click.argument("traces", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(formats("analyze")), default="table")
@click.option("--output", metavar="FILE", default=None)
@lambda f: _apply(_click_options("analyze"), f)
def analyze_command(traces: tuple[str, ...], fmt: str, output: Optional[str], **view: Any) -> int:
    """Print the window tables (Overview, Operator, Kernel, Distributed,
    Memory Manipulation, Memory) of torch.profiler traces you already have:
    one trace file (.json or .json.gz) per rank."""
    from . import commands

    return commands.analyze(list(traces), fmt=fmt, output=output, view=_view(view))


@cli.command("combine")
@click.argument("run_dirs", nargs=-1, required=True, metavar="DIR...")
@click.option(
    "-o",
    "--output",
    "output",
    metavar="OUT",
    default=None,
    help="The folder to create (default ./perfrun_log/combined-JOB); never an existing one.",
)
def combine_command(run_dirs: tuple[str, ...], output: Optional[str]) -> int:
    """Merge the run folders of one multi-node job, copied from its nodes,
    into one folder that `perfrun report` reads as the whole job."""
    from . import commands

    return commands.combine(list(run_dirs), output)


@cli.command("watch")
@click.argument("log_dir", default="perfrun_log")
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
@click.argument("log_dir", default="perfrun_log")
def status_command(log_dir: str) -> int:
    """Say where each rank of a run is now: its step, its phase and for how
    long (a run folder, or a log folder's newest run)."""
    from . import commands

    return commands.status(log_dir)


@cli.command("compare")
@click.argument("baseline")
@click.argument("current")
@lambda f: _apply(_click_options("compare"), f)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(formats("compare")),
    default="table",
)
@click.option("--output", metavar="FILE", default=None)
@click.option("--warmup", type=int, default=None, metavar="N")
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
    return Settings().replace(**changes).validate()


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


def did_you_mean(name: str, known: Any) -> str:
    """" (did you mean --x?)" for the closest known option, or ""."""
    import difflib

    close = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], n=1,
                                      cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def split_run_argv(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Split `run` arguments into (options before, options after the script,
    [script-or-module, script args...]). Raises UsageError with a one-line
    message."""
    table = _option_table()
    before: list[str] = []
    i = 0
    target: list[str] = []
    dashes = False  # a `--` ends perfrun's options for good, after the script too
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            dashes = True
            break
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
                i += 1 if eq else 2
                break
            before.extend([arg, *argv[i + 1 : i + 1 + takes]])
            i += 1 + takes
            continue
        if arg.startswith("-") and arg != "-":
            raise UsageError(f"no such option: {arg}{did_you_mean(name, table)}")
        break
    module_given = any(a.startswith("--module=") for a in before)
    if not module_given:
        if i >= len(argv):
            return before, [], []
        target = [argv[i]]
        i += 1
    after: list[str] = []
    while i < len(argv) and not dashes:
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        name, eq, _ = arg.partition("=")
        if name in AFTER_SCRIPT:
            takes = 0 if eq else AFTER_SCRIPT[name]
            after.extend(argv[i : i + 1 + takes])
            i += 1 + takes
            continue
        break
    return before, after, target + argv[i:]


def after_script_notes(after: list[str], target: list[str]) -> list[str]:
    """What to tell the user about the script's side of the command line:
    options perfrun took from after the script (with the `--` form that
    would give them to the script), and arguments passed to the script that
    look like a misspelt perfrun option."""
    notes = []
    if after and target:
        script, rest = target[0], " ".join(target[1:])
        shown = " ".join(after)
        notes.append(
            f"read {shown} after {script} as perfrun's; if it is the script's own, put it "
            f"after --: perfrun {script} -- {shown}{' ' + rest if rest else ''}"
        )
    for arg in target[1:]:
        if arg == "--":
            break
        name = arg.partition("=")[0]
        if name.startswith("--") and name not in AFTER_SCRIPT:
            import difflib

            close = difflib.get_close_matches(name, list(AFTER_SCRIPT), n=1, cutoff=0.75)
            if close:
                notes.append(
                    f"passed {name} to the script as its own argument; perfrun's option is "
                    f"{close[0]}"
                )
    return notes


def main(argv: Optional[list[str]] = None) -> int:
    """Run perfrun; return the exit status (the script's own for `run`)."""
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
            before, after, target = split_run_argv(rest)
            if not target and not any(a.startswith("--module=") for a in before):
                raise UsageError("no script given: perfrun [OPTIONS] SCRIPT [ARGS...]")
            args = ["run", *before, *after, "--", *target]
            try:
                return _invoke(args, command_line, after_script_notes(after, target))
            except click.BadParameter as exc:
                raise _collision_hint(exc, after, target) from None
            except click.UsageError as exc:
                raise _collision_hint(exc, after, target) from None
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


def _collision_hint(exc: click.UsageError, after: list[str], target: list[str]) -> UsageError:
    message = exc.format_message()
    if after and target:
        script = target[0]
        table, names, j = _option_table(), [], 0
        while j < len(after):  # the option names only, not their values
            name, eq, _ = after[j].partition("=")
            names.append(name)
            j += 1 + (0 if eq else table.get(name, 0))
        opts = " ".join(names)
        rest = " ".join([*after, *target[1:]])
        return UsageError(
            f"{message.rstrip('.')}; {opts} after {script} was read as perfrun's option. If it "
            f"is the script's own, put it after --: perfrun {script} -- {rest}"
        )
    return UsageError(message)


def _invoke(args: list[str], command_line: list[str], notes: Optional[list[str]] = None) -> int:
    obj = {"command_line": command_line, "notes": list(notes or ())}
    result = cli.main(args=args, prog_name="perfrun", standalone_mode=False, obj=obj)
    return int(result) if isinstance(result, int) else 0


def console_main() -> None:
    """Console entry point: exit with main()'s status; a closed stdout
    (`perfrun ... | head`) ends quietly rather than with a traceback."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
