"""The command line: parse, call the API, map errors to an ExitCode.

`main(argv) -> int` is testable in-process; `console_main()` is the console
entry point (it also survives `perfrun ... | head` closing the pipe).

perfrun's options go before the script. Right after it perfrun reads only
the two its usage line shows there, `--scheduler START END` and
`--timer-only` (so `perfrun train.py --scheduler 100 110` works), and says
on stderr when it did; everything else after the script, `--help` and
`--batch-size` included, is the script's, exactly as `python train.py ...`
would get it. A `--` hands all that follows to the script.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import click

from . import __version__
from .exitcodes import ExitCode
from .settings import (
    SORT_KEYS,
    STEP_ON,
    TIME_UNITS,
    Settings,
    SettingsError,
    formats,
    load_config,
    parse_override,
)

COMMANDS = ("run", "report", "compare", "analyze", "combine", "watch", "status")
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


def _run_options(f: Any) -> Any:
    options = [
        click.option(
            "-m",
            "--module",
            metavar="MODULE",
            help="Run a library module as a script, like python -m.",
        ),
        click.option(
            "--timer-only",
            is_flag=True,
            help="Baseline mode: wall-clock phase timers only (reader_cost, batch_cost, ips).",
        ),
        click.option(
            "--scheduler",
            nargs=2,
            type=int,
            metavar="START END",
            default=None,
            help="Detailed window on steps [START, END).",
        ),
        click.option(
            "--log-dir",
            metavar="DIR",
            default=None,
            help="Where runs are saved (default ./perfrun_log); one folder per run, "
            "and a `latest` link.",
        ),
        click.option(
            "--keep",
            type=int,
            default=None,
            metavar="N",
            help="Runs kept in the log folder: the oldest beyond N are removed when a run "
            "starts (default 20; 0 keeps all).",
        ),
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
        click.option(
            "--nproc-per-node",
            type=int,
            default=None,
            metavar="N",
            help="Launch N ranks per node through torch.distributed.run.",
        ),
        click.option(
            "--nnodes", default=None, metavar="N|MIN:MAX", help="torchrun: number of nodes."
        ),
        click.option("--node-rank", type=int, default=None, help="torchrun: this node's rank."),
        click.option("--master-addr", default=None, help="torchrun: master address."),
        click.option("--master-port", type=int, default=None, help="torchrun: master port."),
        click.option("--rdzv-backend", default=None, help="torchrun: rendezvous backend."),
        click.option("--rdzv-endpoint", default=None, help="torchrun: rendezvous endpoint."),
        click.option("--rdzv-id", default=None, help="torchrun: rendezvous id."),
        click.option("--nsys", is_flag=True, help="Run under Nsight Systems, one report per rank."),
        click.option(
            "--nsys-args", default=None, metavar="ARGS", help="Extra arguments for `nsys profile`."
        ),
        click.option(
            "--nsys-ranks",
            default=None,
            metavar="R,R",
            help="With --nsys: profile only these ranks (e.g. 0,3).",
        ),
        click.option(
            "--module-depth",
            type=int,
            default=None,
            metavar="N",
            help="Module Summary depth (default: the depth that shows the model's main blocks).",
        ),
        click.option(
            "--step-on",
            type=click.Choice(STEP_ON),
            default=None,
            help="What ends a step (default auto: the optimizer step, else each cycle "
            "of the phases the script has).",
        ),
        click.option(
            "--warmup",
            type=int,
            default=None,
            metavar="N",
            help="Steps left out of the statistics (default: 1 to 5, by run length; printed).",
        ),
        click.option(
            "--batch-size",
            type=int,
            default=None,
            metavar="N",
            help="Samples per step (default: inferred from the DataLoader's batches).",
        ),
        click.option(
            "--stop-after",
            type=int,
            default=None,
            metavar="N",
            help="End the script cleanly after N steps and report.",
        ),
        click.option("--no-nvtx", is_flag=True, help="Do not emit NVTX ranges."),
        click.option(
            "-q", "--quiet", is_flag=True, help="No start notice (the run folder) on stderr."
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(formats("run")),
            default=None,
            help="What is printed: table (default), json or markdown; junit with a gate "
            "(--baseline and --max-regression).",
        ),
        click.option(
            "--output",
            metavar="FILE",
            default=None,
            help="Write the report to FILE instead of standard output.",
        ),
        click.option("--flush-interval", type=float, default=None, hidden=True),
        click.option(
            "--max-trace-mb",
            type=float,
            default=None,
            metavar="MB",
            help="Detailed window: the most MiB a rank's trace file may take; a larger trace "
            "keeps the window's first steps (default 100; 0: no bound).",
        ),
        click.option(
            "--hang-timeout",
            type=float,
            default=None,
            metavar="S",
            help="Report a hang (each rank's step, phase and Python stack) when no rank has "
            "finished a step for S seconds (default: off; 600 suits CI).",
        ),
        click.option(
            "--hang-action",
            type=click.Choice(("report", "terminate")),
            default=None,
            help="After a hang report: let the run go on (report, the default) or end it "
            "as Ctrl-C would and exit 72 (terminate).",
        ),
        click.option(
            "--no-flops",
            is_flag=True,
            help="Do not count the FLOPs of one step (achieved FLOP/s and MFU are then unknown).",
        ),
        click.option(
            "--peak-tflops",
            type=float,
            default=None,
            metavar="X",
            help="Peak dense TFLOP/s of one GPU for MFU (default: looked up by GPU model "
            "and dtype).",
        ),
        click.option("--with-stack", is_flag=True, help="Detailed window: record Python stacks."),
        click.option("--with-flops", is_flag=True, help="Detailed window: estimate FLOPs per op."),
        click.option(
            "--stop-after-window",
            is_flag=True,
            help="End the script cleanly once the detailed window is recorded.",
        ),
        *_view_options(),
        click.option(
            "--save-baseline",
            metavar="FILE",
            default=None,
            help="Save this run as a baseline for the gate.",
        ),
        click.option(
            "--baseline",
            metavar="FILE|DIR",
            default=None,
            help="Gate: compare this run with a baseline file or results folder.",
        ),
        *_gate_options(),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _view_options() -> list[Any]:
    """How the window tables are shown; `run` and `report` share them."""
    return [
        click.option("--op-detail", is_flag=True, help="Show each operator's kernels beneath it."),
        click.option(
            "--sort-by",
            type=click.Choice(SORT_KEYS),
            default=None,
            help="Sort key of the window tables (default cpu-total).",
        ),
        click.option("--row-limit", type=int, default=None, metavar="N", help="Rows per table."),
        click.option(
            "--time-unit", type=click.Choice(TIME_UNITS), default=None, help="Time unit of tables."
        ),
    ]


def _gate_options() -> list[Any]:
    return [
        click.option(
            "--max-regression",
            metavar="PCT",
            default=None,
            help="Gate threshold, e.g. 5%: fail when steps are slower beyond noise.",
        ),
        click.option(
            "--fail-on-inconclusive",
            is_flag=True,
            help="Gate: an inconclusive verdict fails (exit 69; 73 when a run was disturbed).",
        ),
        click.option(
            "--allow-env-mismatch",
            is_flag=True,
            help="Gate: compare even when the environments' fingerprints differ.",
        ),
        click.option(
            "--ignore-disturbed",
            is_flag=True,
            help="Gate: judge runs whose measurement was disturbed (a shared machine) "
            "rather than calling them inconclusive (exit 73 with --fail-on-inconclusive).",
        ),
    ]


def _parse_threshold(text: Optional[str]) -> Optional[float]:
    if text is None:
        return None
    from .gate import parse_threshold

    try:
        return parse_threshold(text)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


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
    from . import api

    settings = settings_from_options(kwargs)
    obj = click.get_current_context().obj or {}
    # Said once the command line is known to be good, before the script runs.
    for note in obj.get("notes") or ():
        click.echo(f"perfrun: {note}", err=True)
    return api.run_and_report(settings, command_line=obj.get("command_line"))


@cli.command("report")
@click.argument("log_dir", default="perfrun_log")
@click.option("--format", "fmt", type=click.Choice(formats("report")), default="table")
@click.option("--output", metavar="FILE", default=None)
@click.option("--warmup", type=int, default=None, metavar="N")
@lambda f: _apply(_view_options(), f)
def report_command(
    log_dir: str, fmt: str, output: Optional[str], warmup: Optional[int], **view: Any
) -> int:
    """Re-print the tables of a finished run (a run folder, or a log folder's latest run)."""
    from . import api

    return api.report(log_dir, fmt=fmt, output=output, warmup=_warmup(warmup), view=_view(view))


@cli.command("analyze")
@click.argument("traces", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(formats("analyze")), default="table")
@click.option("--output", metavar="FILE", default=None)
@lambda f: _apply(_view_options(), f)
def analyze_command(traces: tuple[str, ...], fmt: str, output: Optional[str], **view: Any) -> int:
    """Print the window tables (Overview, Operator, Kernel, Distributed,
    Memory Manipulation, Memory) of torch.profiler traces you already have:
    one trace file (.json or .json.gz) per rank."""
    from . import api

    return api.analyze(list(traces), fmt=fmt, output=output, view=_view(view))


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
    from . import api

    return api.combine(list(run_dirs), output)


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
    from . import hang

    return hang.status(log_dir)


@cli.command("compare")
@click.argument("baseline")
@click.argument("current")
@lambda f: _apply(_gate_options(), f)
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
    from . import api

    return api.compare(
        baseline,
        current,
        threshold=_parse_threshold(max_regression),
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
    """Config file, then -o overrides, then command-line options."""
    changes: dict[str, Any] = {}
    if opts.get("config_file"):
        changes.update(load_config(opts["config_file"]))
    for text in opts.get("overrides") or ():
        changes.update(parse_override(text))
    direct = {
        "module": opts.get("module"),
        "scheduler": tuple(opts["scheduler"]) if opts.get("scheduler") else None,
        "log_dir": opts.get("log_dir"),
        "nproc_per_node": opts.get("nproc_per_node"),
        "nnodes": opts.get("nnodes"),
        "node_rank": opts.get("node_rank"),
        "master_addr": opts.get("master_addr"),
        "master_port": opts.get("master_port"),
        "rdzv_backend": opts.get("rdzv_backend"),
        "rdzv_endpoint": opts.get("rdzv_endpoint"),
        "rdzv_id": opts.get("rdzv_id"),
        "nsys_args": opts.get("nsys_args"),
        "step_on": opts.get("step_on"),
        "warmup": opts.get("warmup"),
        "batch_size": opts.get("batch_size"),
        "stop_after": opts.get("stop_after"),
        "format": opts.get("fmt"),
        "output": opts.get("output"),
        "flush_interval": opts.get("flush_interval"),
        "sort_by": opts.get("sort_by"),
        "row_limit": opts.get("row_limit"),
        "time_unit": opts.get("time_unit"),
        "save_baseline": opts.get("save_baseline"),
        "nsys_ranks": opts.get("nsys_ranks"),
        "module_depth": opts.get("module_depth"),
        "baseline": opts.get("baseline"),
        "max_regression": _parse_threshold(opts.get("max_regression")),
        "keep": opts.get("keep"),
        "max_trace_mb": opts.get("max_trace_mb"),
        "hang_timeout": opts.get("hang_timeout"),
        "hang_action": opts.get("hang_action"),
        "peak_tflops": opts.get("peak_tflops"),
    }
    changes.update({k: v for k, v in direct.items() if v is not None})
    if opts.get("timer_only"):
        changes["timer_only"] = True
    if opts.get("nsys"):
        changes["nsys"] = True
    if opts.get("no_nvtx"):
        changes["nvtx"] = False
    if opts.get("no_flops"):
        changes["count_flops"] = False
    for flag in (
        "quiet",
        "with_stack",
        "with_flops",
        "stop_after_window",
        "op_detail",
        "fail_on_inconclusive",
        "allow_env_mismatch",
        "ignore_disturbed",
    ):
        if opts.get(flag):
            changes[flag] = True
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
