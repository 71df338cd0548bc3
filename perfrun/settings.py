"""Resolved settings: one frozen dataclass built from the YAML file, `-o`
overrides and the command line (in that order of precedence, lowest first),
and carried to the profiled process in one environment variable.

The YAML format is the `Profiler:` section of Paddle's GPT configs, so the
training config itself can be passed with `--config`: every other section is
ignored. config.py reads the file and the overrides into field changes;
the fields, their converters and the rules across them are here.

To add a setting, add one field to Settings whose default is `option(...)`:
its flags, help and type make the `perfrun run` option (cli.py builds the
click option and reads its value back by them), `commands=VIEW` or `GATE` adds
it to report/analyze or compare, and `yaml=` a converter makes it a
`Profiler:` key too. A rule across fields goes in Settings.validate.

This module is imported inside every rank (the agent reads its settings
with it): yaml is imported by the functions that use it, and click never
(cli.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import PerfrunError
from .store.schema import shown

ENV_VAR = "PERFRUN_SETTINGS"

SUMMARY_KEYS = ("overview", "device", "model", "dist", "kernel", "op", "mem", "memcpy")
STEP_ON = ("auto", "optimizer", "forward", "backward", "dataloader")
#: Every output format, and the commands that print it. JUnit is the gate's
#: verdict, so `run` prints it only when gated (Settings.validate). The one
#: list of format names: the commands' `--format` choices come from it.
FORMATS: dict[str, tuple[str, ...]] = {
    "table": ("run", "report", "compare", "analyze"),
    "json": ("run", "report", "compare", "analyze"),
    "markdown": ("run", "report", "compare", "analyze"),
    "junit": ("run", "compare"),
    "html": ("report", "compare"),
}
#: Formats that report a gate's verdict, and so need one.
GATE_FORMATS = ("junit",)
SORT_KEYS = ("cpu-total", "cpu-avg", "cpu-max", "cpu-min", "gpu-total", "gpu-avg", "gpu-max",
             "gpu-min", "calls", "name")
TIME_UNITS = ("s", "ms", "us", "ns")
HANG_ACTIONS = ("report", "terminate")
#: The highest TCP port.
MAX_PORT = 65535
#: The port torchrun's static rendezvous listens on unless told another.
TORCHRUN_DEFAULT_PORT = 29500


def formats(command: str) -> tuple[str, ...]:
    """The output formats `command` can print, in FORMATS order (the order
    its `--format` choices are listed and completed in)."""
    return tuple(name for name, commands in FORMATS.items() if command in commands)


def default_warmup(n_steps: int) -> int:
    """Steps to leave out of the statistics when the user did not say
    (--warmup's default: the report's, and a rank's own summary for its
    tracker run, runtime/trackers.py).

    The first steps pay for lazy initialisation (CUDA context, cuDNN
    autotuning, allocator growth, DataLoader workers filling their queues).
    A tenth of the run, at least one and at most five, removes that without
    throwing away much of a short run; runs of fewer than three steps keep
    every step, since dropping one would leave almost nothing.
    """
    if n_steps < 3:
        return 0
    return min(5, max(1, n_steps // 10))


def port_span(ports: tuple[int, ...]) -> str:
    """`9700` or `9700-9707`: the ports of a node's ranks, for a message."""
    return str(ports[0]) if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"


class SettingsError(PerfrunError, ValueError):
    """A setting is invalid; the message is one line meant for the user."""

    slug = "settings"


# -- config values --------------------------------------------------------------
#
# The config is the user's file, and often a whole training config written for
# another tool: every value is checked by type before use, and a message shows
# the value as written, capped (schema.shown), never the whole of it.
#
# Each `_as_*` converter is a field's `yaml=`: called as (origin, key, value)
# with the file (or "override"), the key as the user wrote it and the loaded
# value, it returns the field's value or raises a one-line SettingsError
# naming all three. A converter returns None for YAML `null` only where null
# means something: "unset" for a field whose default is None, the default
# for any other (profiler_section_to_changes); elsewhere null is refused.


def capped(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def names_shown(names: list[Any], limit: int = 8) -> str:
    """Keys for a message: each capped, and only the first few of many."""
    out = ", ".join(shown(n) if not isinstance(n, str) else capped(n, 40) for n in names[:limit])
    return out + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


def as_written(value: Any) -> str:
    """A YAML value for a message, spelt as YAML spells it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return shown(value)


def _wrong(origin: str, key: str, expected: str, value: Any) -> SettingsError:
    return SettingsError(f"{origin}: Profiler.{key}: expected {expected}, got {as_written(value)}")


def _int_or_none(value: Any) -> int | None:
    """An integer, or a string of one; None for anything else (a bool too,
    though Python counts it an int). Not a converter itself: what _as_int
    and _as_window share, each with its own message."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:  # not a number, or past Python's digit limit
            return None
    return None


def _as_bool(origin: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
        return value.lower() in ("true", "yes", "on")
    raise _wrong(origin, key, "true or false", value)


def _as_int(origin: str, key: str, value: Any) -> int | None:
    if value is None:
        return None
    number = _int_or_none(value)
    if number is None:
        raise _wrong(origin, key, "an integer", value)
    return number


def _as_number(origin: str, key: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise _wrong(origin, key, "a number", value)


def _as_window(origin: str, key: str, value: Any) -> tuple[int, int] | None:
    """`[3, 14]`, or the same as a string (`'[3, 14]'`, `3 14`)."""
    if value is None:
        return None
    parts = value
    if isinstance(value, str):
        text = value.strip().strip("[]()")
        parts = [part for part in text.replace(",", " ").split() if part]
    if isinstance(parts, (list, tuple)) and len(parts) == 2:
        start, end = _int_or_none(parts[0]), _int_or_none(parts[1])
        if start is not None and end is not None:
            return (start, end)
    raise _wrong(origin, key, "two integers [START, END]", value)


def user_path(value: str) -> str:
    """A path option's value with `~` expanded: the shell leaves it as it
    is after `=` (`--log-dir=~/runs`) and in a config file, where a folder
    named `~` is never what was meant."""
    return os.path.expanduser(value)


def _as_path(origin: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _wrong(origin, key, "a path", value)
    return user_path(value)


def _as_word(origin: str, key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str):
        raise _wrong(origin, key, "a string", value)
    return value


def _as_summary(origin: str, key: str, value: Any) -> dict[str, bool] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _wrong(origin, key, f"a mapping of {', '.join(SUMMARY_KEYS)} to true or false",
                     value)
    bad = [k for k in value if k not in SUMMARY_KEYS]
    if bad:
        raise SettingsError(
            f"{origin}: unknown Profiler.summary key(s) {names_shown(bad)}; "
            f"valid keys: {', '.join(SUMMARY_KEYS)}"
        )
    summary = dict.fromkeys(SUMMARY_KEYS, True)
    summary.update({k: _as_bool(origin, f"summary.{k}", v) for k, v in value.items()})
    return summary


def parse_threshold(text: str) -> float:
    """The gate's threshold: `--max-regression 5%` (or 0.05, or 5) -> 0.05. A
    bad value is a SettingsError (exit 64, like any other bad setting), not
    a usage error."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            value = float(raw[:-1]) / 100.0
        else:
            value = float(raw)
            if value >= 1.0:
                value /= 100.0  # "5" means 5%
    except ValueError:
        raise SettingsError(
            f"--max-regression takes a percentage like 5% (not {text!r})") from None
    if not 0 <= value < 10:
        raise SettingsError(f"--max-regression must be a percentage >= 0 (not {text!r})")
    return value


# -- how each setting is set ----------------------------------------------------

#: The commands besides `run` that take an option, by what it is about.
VIEW = ("run", "report", "analyze")  # how the window tables are shown
GATE = ("run", "compare")  # the regression gate

#: The key of a Settings field's metadata that holds its Option.
OPTION = "perfrun.option"


class Option(NamedTuple):
    """How a Settings field is set from outside the program: its command-line
    option (`flags` empty: none) and its `Profiler:` key (`yaml` None: none).
    Plain data, no click: cli.py makes the click options from it, since
    this module is also imported inside the profiled process (for the same
    reason a NamedTuple, which costs less to define than a dataclass)."""

    #: The option's spellings, e.g. ("-m", "--module").
    flags: tuple[str, ...] = ()
    #: The parameter name click passes the value as: the long spelling's, or
    #: an explicit one where that would shadow a builtin (`fmt`).
    dest: str | None = None
    help: str | None = None
    metavar: str | None = None
    #: What click converts the text to: int or float (None: the text).
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    #: Values the option takes (2: `--scheduler START END`, as a tuple).
    nargs: int = 1
    hidden: bool = False
    #: Commands that take the option: always `run`, and VIEW or GATE ones.
    commands: tuple[str, ...] = ("run",)
    #: Turns click's value into the field's; may raise SettingsError.
    parse: Callable[[Any], Any] | None = None
    #: For an on/off flag: the value the field takes when it is given, the
    #: opposite of its default (`--no-nvtx` sets nvtx False). None: not a flag.
    flag_value: bool | None = None
    #: The converter of the field's `Profiler:` key (an `_as_*` above).
    yaml: Callable[[str, str, Any], Any] | None = None
    #: The key, where it is not the field's name (Paddle's `profiler_log`).
    yaml_key: str | None = None

    @property
    def is_flag(self) -> bool:
        return self.flag_value is not None


def option(
    *flags: str,
    default: Any = None,
    default_factory: Callable[[], Any] | None = None,
    dest: str | None = None,
    help: str | None = None,
    metavar: str | None = None,
    type: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] | None = None,
    nargs: int = 1,
    hidden: bool = False,
    commands: tuple[str, ...] = ("run",),
    parse: Callable[[Any], Any] | None = None,
    yaml: Callable[[str, str, Any], Any] | None = None,
    yaml_key: str | None = None,
) -> Any:
    """A Settings field with its default and its Option as metadata. A bool
    field with flags is an on/off flag that sets the opposite of its
    default; any other option takes a value, None until it is given."""
    if flags and dest is None:
        long = next((f for f in flags if f.startswith("--")), flags[0])
        dest = long.lstrip("-").replace("-", "_")
    flag_value = (not default) if flags and isinstance(default, bool) else None
    spec = Option(flags=flags, dest=dest, help=help, metavar=metavar, type=type, choices=choices,
                  nargs=nargs, hidden=hidden, commands=commands, parse=parse,
                  flag_value=flag_value, yaml=yaml, yaml_key=yaml_key)
    if default_factory is not None:
        return field(default_factory=default_factory, metadata={OPTION: spec})
    return field(default=default, metadata={OPTION: spec})


@dataclass(frozen=True)
class Settings:
    """Everything that decides how a run is launched, measured and reported.

    The fields' order is the order of `perfrun run --help` and of the valid
    `Profiler:` keys that an error lists (Paddle's own first, then perfrun's
    additions)."""

    script: str | None = None
    module: str | None = option(
        "-m", "--module", metavar="MODULE", help="Run a library module as a script, like python -m."
    )
    script_args: tuple[str, ...] = ()
    #: A launcher's command up to the script, where perfrun was put in front
    #: of one it runs as it is (`perfrun accelerate launch ... train.py`;
    #: launchcommand.py): the processes that run the script are the ranks,
    #: the launcher's own are not. Empty for a script perfrun starts itself.
    launch: tuple[str, ...] = ()
    #: Which launcher `launch` (or a torchrun command) is: its name, or
    #: "command" for one perfrun does not know.
    launch_kind: str | None = None
    #: How many ranks `launch` starts, where its options say.
    launch_ranks: int | None = None
    #: torchrun's options perfrun's settings do not hold, passed on as given,
    #: where perfrun was put in front of a torchrun command (`perfrun torchrun
    #: --max-restarts 1 ...`); None otherwise.
    torchrun_args: tuple[str, ...] | None = None

    # -- Paddle's Profiler keys --
    enable: bool = option(default=True, yaml=_as_bool)
    scheduler: tuple[int, int] | None = option(
        "--scheduler", type=int, nargs=2, metavar="START END", yaml=_as_window,
        help="Detailed window on steps [START, END).",
    )
    log_dir: str = option(
        "--log-dir", default="./perfrun_log", metavar="DIR", type=user_path, yaml=_as_path,
        yaml_key="profiler_log",
        help="Where runs are saved (default ./perfrun_log); one folder per run, "
        "and a `latest` link.",
    )
    detailed: bool = option(default=False, yaml=_as_bool)
    record_shapes: bool = option(default=False, yaml=_as_bool)
    profile_memory: bool = option(default=False, yaml=_as_bool)
    summary: dict[str, bool] = option(
        default_factory=lambda: dict.fromkeys(SUMMARY_KEYS, True), yaml=_as_summary
    )
    # -- perfrun's own; as Profiler keys, spelt as the options are --
    timer_only: bool = option(
        "--timer-only", default=False, yaml=_as_bool,
        help="Baseline mode: wall-clock phase timers only (reader_cost, batch_cost, ips).",
    )

    # -- the launch (cli.py shows --config and -o before these) --
    nproc_per_node: int | None = option(
        "--nproc-per-node", type=int, metavar="N",
        help="Launch N ranks per node through torch.distributed.run.",
    )
    nnodes: str | None = option("--nnodes", metavar="N|MIN:MAX", help="torchrun: number of nodes.")
    node_rank: int | None = option("--node-rank", type=int, help="torchrun: this node's rank.")
    master_addr: str | None = option("--master-addr", help="torchrun: master address.")
    master_port: int | None = option("--master-port", type=int, help="torchrun: master port.")
    rdzv_backend: str | None = option("--rdzv-backend", help="torchrun: rendezvous backend.")
    rdzv_endpoint: str | None = option("--rdzv-endpoint", help="torchrun: rendezvous endpoint.")
    rdzv_id: str | None = option("--rdzv-id", help="torchrun: rendezvous id.")
    nsys: bool = option(
        "--nsys", default=False, help="Run under Nsight Systems, one report per rank."
    )
    nsys_args: str = option(
        "--nsys-args", default="", metavar="ARGS", help="Extra arguments for `nsys profile`."
    )
    nsys_ranks: str | None = option(
        "--nsys-ranks", metavar="R,R", help="With --nsys: profile only these ranks (e.g. 0,3)."
    )

    # -- the measurement --
    module_depth: int | None = option(
        "--module-depth", type=int, metavar="N",
        help="Module Summary depth (default: the depth that shows the model's main blocks).",
    )
    warmup: int | None = option(
        "--warmup", type=int, metavar="N", yaml=_as_int,
        help="Steps left out of the statistics (default: 1 to 5, by run length; printed).",
    )
    step_on: str = option(
        "--step-on", default="auto", choices=STEP_ON, yaml=_as_word,
        help="What ends a step (default auto: the optimizer step, else each cycle "
        "of the phases the script has).",
    )
    batch_size: int | None = option(
        "--batch-size", type=int, metavar="N", yaml=_as_int,
        help="Samples per step (default: inferred from the DataLoader's batches).",
    )
    stop_after: int | None = option(
        "--stop-after", type=int, metavar="N", yaml=_as_int,
        help="End the script cleanly after N steps and report.",
    )
    nvtx: bool = option("--no-nvtx", default=True, yaml=_as_bool, help="Do not emit NVTX ranges.")
    #: Runs with steps kept in the log folder (the oldest beyond are
    #: removed once a run has started, runs without steps first;
    #: launcher/retention.py); 0 keeps all.
    keep: int = option(
        "--keep", default=20, type=int, metavar="N", yaml=_as_int,
        help="Runs with steps kept in the log folder: once a run has started, the oldest "
        "beyond N are removed, runs without steps first (default 20; 0 keeps all).",
    )
    #: The most MiB a rank's window trace file may take on disk; a larger
    #: trace keeps the window's first steps only (runtime/window.py). 0: no
    #: bound.
    max_trace_mb: float = option(
        "--max-trace-mb", default=100.0, type=float, metavar="MB", yaml=_as_number,
        help="Detailed window: the most MiB a rank's trace file may take; a larger trace "
        "keeps the window's first steps (default 100; 0: no bound).",
    )
    #: Seconds with no rank finishing a step (counted from the launch) after
    #: which the launcher reports a hang (launcher/hang.py); None: never.
    hang_timeout: float | None = option(
        "--hang-timeout", type=float, metavar="S",
        help="Report a hang (each rank's step, phase and Python stack) when no rank has "
        "finished a step for S seconds (default: off; 600 suits CI).",
    )
    #: What follows a hang report: "report" (the run goes on) or "terminate"
    #: (the run is ended as by Ctrl-C; perfrun exits with ExitCode.HANG).
    hang_action: str = option(
        "--hang-action", default="report", choices=HANG_ACTIONS,
        help="After a hang report: let the run go on (report, the default) or end it "
        "as Ctrl-C would and exit 72 (terminate).",
    )
    #: Count the FLOPs of one step (runtime/flops.py); --no-flops: off.
    count_flops: bool = option(
        "--no-flops", default=True,
        help="Do not count the FLOPs of one step (achieved FLOP/s and MFU are then unknown).",
    )
    #: Record the CUDA allocator's history and write a snapshot PyTorch's
    #: memory visualiser opens (runtime/allocator.py): at the first
    #: out-of-memory error, else at the end.
    memory_snapshot: bool = option(
        "--memory-snapshot", default=False,
        help="Record the CUDA allocator's history (its last 3 steps, each allocation "
        "tagged with its step and phase) and write rank<R>.memory.pickle for PyTorch's "
        "memory visualiser, at the first out-of-memory error or at the end. Costs a few "
        "microseconds an allocation.",
    )
    #: Peak dense TFLOP/s of one GPU for MFU (--peak-tflops), instead of
    #: the table in analysis/peaks.py.
    peak_tflops: float | None = option(
        "--peak-tflops", type=float, metavar="X",
        help="Peak dense TFLOP/s of one GPU for MFU (default: looked up by GPU model "
        "and dtype).",
    )

    # -- the script's experiment tracker (runtime/trackers.py) --
    #: Log perfrun's figures into the W&B run, MLflow run or TensorBoard
    #: writer the script opened itself; --no-tracker: never.
    tracker: bool = option(
        "--no-tracker", default=True, yaml=_as_bool,
        help="Do not log perfrun's figures into the script's own W&B, MLflow or "
        "TensorBoard run.",
    )
    #: Steps a point of the tracker's series covers; None: chosen from the
    #: step time, one point about every 10 s (runtime/trackerpoints.py).
    tracker_every: int | None = option(
        "--tracker-every", type=int, metavar="N", yaml=_as_int,
        help="Log perfrun's figures to the script's tracker every N steps, each point "
        "over those N (default: N for a point about every 10 s of training).",
    )
    #: Every rank logs to its own tracker run, not rank 0 alone.
    tracker_all_ranks: bool = option(
        "--tracker-all-ranks", default=False, yaml=_as_bool,
        help="Every rank logs to the tracker run its script opened (default: rank 0 only).",
    )
    #: The most seconds a tracker may take to take perfrun's last figures
    #: as its run closes, and, after the run, its summary; past it, a note.
    tracker_timeout: float = option(
        "--tracker-timeout", default=10.0, type=float, metavar="S", hidden=True,
    )

    # -- the output --
    #: No start notice on stderr (-q).
    quiet: bool = option(
        "-q", "--quiet", default=False, help="No start notice (the run folder) on stderr."
    )
    format: str = option(
        "--format", dest="fmt", default="table", choices=formats("run"),
        help="What is printed: table (default), json or markdown; junit with a gate "
        "(--baseline and --max-regression).",
    )
    output: str | None = option(
        "--output", metavar="FILE", type=user_path,
        help="Write the report to FILE instead of standard output."
    )
    #: Serve each rank's figures to Prometheus while the run lasts: the rank
    #: with local rank L on port PORT + L (runtime/metrics.py,
    #: docs/prometheus.md); None: no endpoint.
    metrics_port: int | None = option(
        "--metrics-port", type=int, metavar="PORT", yaml=_as_int,
        help="Serve Prometheus metrics while the run lasts: the rank with local rank L "
        "on port PORT+L (needs prometheus_client).",
    )
    flush_interval: float = option("--flush-interval", default=2.0, type=float, hidden=True)

    # -- the detailed window --
    with_stack: bool = option(
        "--with-stack", default=False, help="Detailed window: record Python stacks."
    )
    with_flops: bool = option(
        "--with-flops", default=False, help="Detailed window: estimate FLOPs per op."
    )
    stop_after_window: bool = option(
        "--stop-after-window", default=False,
        help="End the script cleanly once the detailed window is recorded.",
    )
    op_detail: bool = option(
        "--op-detail", default=False, commands=VIEW,
        help="Show each operator's kernels beneath it.",
    )
    sort_by: str = option(
        "--sort-by", default="cpu-total", choices=SORT_KEYS, commands=VIEW,
        help="Sort key of the window tables (default cpu-total).",
    )
    row_limit: int = option(
        "--row-limit", default=20, type=int, metavar="N", commands=VIEW, help="Rows per table."
    )
    time_unit: str | None = option(
        "--time-unit", choices=TIME_UNITS, commands=VIEW, help="Time unit of tables."
    )

    # -- the gate --
    save_baseline: str | None = option(
        "--save-baseline", metavar="FILE", type=user_path,
        help="Save this run as a baseline for the gate."
    )
    baseline: str | None = option(
        "--baseline", metavar="FILE|DIR", type=user_path,
        help="Gate: compare this run with a baseline file or results folder.",
    )
    max_regression: float | None = option(
        "--max-regression", metavar="PCT", parse=parse_threshold, commands=GATE,
        help="Gate threshold, e.g. 5%: fail when steps are slower beyond noise.",
    )
    fail_on_inconclusive: bool = option(
        "--fail-on-inconclusive", default=False, commands=GATE,
        help="Gate: an inconclusive verdict fails (exit 69; 73 when a run was disturbed).",
    )
    allow_env_mismatch: bool = option(
        "--allow-env-mismatch", default=False, commands=GATE,
        help="Gate: compare even when the environments' fingerprints differ.",
    )
    #: Gate even a run whose measurement was disturbed (a machine known to
    #: be shared); by default such a run gives no verdict.
    ignore_disturbed: bool = option(
        "--ignore-disturbed", default=False, commands=GATE,
        help="Gate: judge runs whose measurement was disturbed (a shared machine) "
        "rather than calling them inconclusive (exit 73 with --fail-on-inconclusive).",
    )

    @property
    def gated(self) -> bool:
        return self.baseline is not None

    @property
    def distributed(self) -> bool:
        """True when the script runs under torch.distributed.run."""
        return any(
            v is not None
            for v in (
                self.nproc_per_node,
                self.nnodes,
                self.node_rank,
                self.master_addr,
                self.master_port,
                self.rdzv_backend,
                self.rdzv_endpoint,
                self.rdzv_id,
                self.torchrun_args,
            )
        )

    @property
    def metrics_ports(self) -> tuple[int, ...]:
        """The ports this node's ranks serve metrics on (--metrics-port),
        by local rank: PORT + L. One port a rank rather than one a node: each
        rank serves what its own flush thread measured, and a rank that dies
        takes only its own target down (Prometheus' `up` says which)."""
        if self.metrics_port is None:
            return ()
        ranks = (self.nproc_per_node or 1) if self.distributed else 1
        return tuple(range(self.metrics_port, self.metrics_port + ranks))

    @property
    def torchrun_port(self) -> int | None:
        """The port torchrun's rendezvous listens on at this node, where it
        can be known: --master-port, the port of --rdzv-endpoint, or
        torchrun's default, 29500."""
        if not self.distributed:
            return None
        if self.master_port is not None:
            return self.master_port
        if self.rdzv_endpoint is not None:
            tail = self.rdzv_endpoint.rpartition(":")[2]
            return int(tail) if tail.isdigit() else None
        return TORCHRUN_DEFAULT_PORT

    @property
    def use_nvtx(self) -> bool:
        return self.nvtx and not self.timer_only

    def validate(self) -> Settings:
        """Check cross-field rules; return self so calls can be chained."""
        if self.scheduler is not None:
            start, end = self.scheduler
            if start < 0 or end < 0:
                raise SettingsError(f"scheduler [{start}, {end}): steps cannot be negative")
            if end <= start:
                raise SettingsError(
                    f"scheduler [{start}, {end}): END must be greater than START "
                    "(the window is half-open: [3, 14) records steps 3..13)"
                )
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise SettingsError(f"--nproc-per-node must be at least 1, not {self.nproc_per_node}")
        if self.launch and self.distributed:
            raise SettingsError(
                f"perfrun's torchrun options and a {self.launch_kind} command: the launcher "
                "starts the ranks; give it its options, and perfrun none of torchrun's")
        if self.launch and self.nsys:
            raise SettingsError(
                f"--nsys with a {self.launch_kind} command: perfrun runs nsys itself only "
                "around the ranks it starts; put nsys inside the launcher's command instead")
        for name in ("warmup", "stop_after"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SettingsError(f"--{name.replace('_', '-')} cannot be negative ({value})")
        if self.stop_after == 0:
            raise SettingsError("--stop-after must be at least 1: with 0 the script would be "
                                "ended before its first step, leaving nothing to report")
        if self.batch_size is not None and self.batch_size < 1:
            raise SettingsError(f"--batch-size must be at least 1, not {self.batch_size}")
        if self.step_on not in STEP_ON:
            raise SettingsError(
                f"--step-on must be one of {', '.join(STEP_ON)}, not {shown(self.step_on)}"
            )
        if self.format in GATE_FORMATS and not self.gated:
            raise SettingsError(
                f"--format {self.format} needs a gate (--baseline FILE --max-regression PCT): "
                "JUnit reports the gate's verdict"
            )
        if self.format not in formats("run"):
            ungated = [name for name in formats("run") if name not in GATE_FORMATS]
            raise SettingsError(
                f"--format must be one of {', '.join(ungated)}, not {shown(self.format)}"
            )
        unknown = set(self.summary) - set(SUMMARY_KEYS)
        if unknown:
            raise SettingsError(
                f"unknown Profiler.summary key(s) {names_shown(sorted(map(str, unknown)))}; "
                f"valid: {', '.join(SUMMARY_KEYS)}"
            )
        if self.sort_by not in SORT_KEYS:
            raise SettingsError(
                f"--sort-by must be one of {', '.join(SORT_KEYS)}, not {shown(self.sort_by)}"
            )
        if self.time_unit is not None and self.time_unit not in TIME_UNITS:
            raise SettingsError(
                f"--time-unit must be one of {', '.join(TIME_UNITS)}, not {shown(self.time_unit)}"
            )
        if self.row_limit < 1:
            raise SettingsError(f"--row-limit must be at least 1, not {self.row_limit}")
        if self.stop_after_window and self.scheduler is None:
            raise SettingsError("--stop-after-window needs a window: --scheduler START END")
        if self.module_depth is not None and self.module_depth < 0:
            raise SettingsError(f"--module-depth cannot be negative ({self.module_depth})")
        if self.nsys_ranks is not None:
            if not self.nsys:
                raise SettingsError("--nsys-ranks goes with --nsys")
            parts = [p.strip() for p in self.nsys_ranks.split(",") if p.strip()]
            if not parts or not all(p.isdigit() for p in parts):
                raise SettingsError(
                    f"--nsys-ranks takes rank numbers like 0,3 (not {shown(self.nsys_ranks)})"
                )
        if self.max_regression is not None and self.baseline is None:
            raise SettingsError("--max-regression needs --baseline FILE (what to compare with)")
        if self.keep < 0:
            raise SettingsError(f"--keep cannot be negative ({self.keep}); 0 keeps every run")
        if not self.max_trace_mb >= 0:  # NaN too
            raise SettingsError(
                f"--max-trace-mb cannot be negative ({self.max_trace_mb}); 0 means no bound"
            )
        if self.flush_interval <= 0:
            raise SettingsError("flush interval must be positive")
        if self.hang_timeout is not None and not self.hang_timeout > 0:  # NaN too
            raise SettingsError(
                f"--hang-timeout must be a number of seconds above 0, not {self.hang_timeout}"
            )
        if self.peak_tflops is not None and not self.peak_tflops > 0:  # NaN too
            raise SettingsError(
                f"--peak-tflops must be a number of TFLOP/s above 0, not {self.peak_tflops}"
            )
        if self.tracker_every is not None and self.tracker_every < 1:
            raise SettingsError(f"--tracker-every must be at least 1, not {self.tracker_every}")
        if not self.tracker_timeout > 0:  # NaN too
            raise SettingsError(
                f"--tracker-timeout must be a number of seconds above 0, not {self.tracker_timeout}"
            )
        if self.metrics_port is not None:
            self._validate_metrics_port()
        if self.hang_action not in HANG_ACTIONS:
            raise SettingsError(
                f"--hang-action takes {' or '.join(HANG_ACTIONS)}, not {shown(self.hang_action)}"
            )
        return self

    def _validate_metrics_port(self) -> None:
        """Every port a rank of this node would serve on is a port, and
        none is torchrun's own (its rendezvous binds it first, and the rank
        would serve nothing)."""
        port, ports = self.metrics_port, self.metrics_ports
        if port is None or not ports:
            return
        if not 1 <= port <= MAX_PORT:
            raise SettingsError(f"--metrics-port must be a port number from 1 to {MAX_PORT}, "
                                f"not {port}")
        if ports[-1] > MAX_PORT:
            raise SettingsError(
                f"--metrics-port {port}: {len(ports)} ranks a node serve on ports {port} to "
                f"{ports[-1]}, past {MAX_PORT}; take a port of {MAX_PORT + 1 - len(ports)} "
                "or below"
            )
        master = self.torchrun_port
        if master is not None and master in ports:
            raise SettingsError(
                f"--metrics-port {port}: the ranks' ports {port_span(ports)} include "
                f"torchrun's rendezvous port {master}; take ports apart from it"
            )

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    # -- transport to the child ------------------------------------------------

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Settings:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in names}
        if data.get("scheduler") is not None:
            data["scheduler"] = tuple(data["scheduler"])
        data["script_args"] = tuple(data.get("script_args", ()))
        data["launch"] = tuple(data.get("launch", ()))
        if data.get("torchrun_args") is not None:
            data["torchrun_args"] = tuple(data["torchrun_args"])
        return cls(**data)


def option_of(f: dataclasses.Field) -> Option | None:
    return f.metadata.get(OPTION)


#: `perfrun run --help` in sections, as the fields are grouped above: each
#: title with the first field of its section; a field is in the section of
#: the last first field before it (help_section). Paddle's keys and
#: perfrun's own share the first, since only their most used have options.
HELP_SECTIONS: tuple[tuple[str, str], ...] = (
    ("Run", "module"),
    ("Launch", "nproc_per_node"),
    ("Measurement", "module_depth"),
    ("The script's experiment tracker", "tracker"),
    ("Output", "quiet"),
    ("The detailed window (--scheduler)", "with_stack"),
    ("CI gate", "save_baseline"),
)


def help_section(name: str) -> str | None:
    """The `--help` section of Settings field `name` (HELP_SECTIONS), or
    None for a name that is no field, or one before the first section."""
    names = [f.name for f in dataclasses.fields(Settings)]
    if name not in names:
        return None
    at = names.index(name)
    starts = [(names.index(first), title) for title, first in HELP_SECTIONS]
    return max(((i, title) for i, title in starts if i <= at), default=(0, None))[1]


def command_line_options(command: str = "run") -> list[tuple[str, Option]]:
    """(field name, Option) of each setting `command` takes on its command
    line, in field order."""
    return [
        (f.name, spec)
        for f in dataclasses.fields(Settings)
        if (spec := option_of(f)) is not None and spec.flags and command in spec.commands
    ]


def child_settings(
    settings: Settings,
    run_dir: str,
    boot_dir: str,
    base: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What the bootstrap of the profiled process reads (boot/sitecustomize.py):
    the settings, where the run folder and the boot folder are, and the
    user's original PYTHONPATH, so the child can restore exactly what
    `python` would have seen. `extra`: what else the bootstrap needs
    (launcher kind, command line). It goes to the child as a file
    (store/layout.py names it), never in the environment: the script's
    arguments are in it twice, and a variable of the environment holds at
    most 128 KiB on Linux, where `python` takes an argument list of 2 MiB."""
    env = os.environ if base is None else base
    payload = dataclasses.asdict(settings)
    payload.update(extra or {})
    payload["run_dir"] = os.path.abspath(run_dir)
    payload["boot_dir"] = boot_dir
    payload["pythonpath"] = env.get("PYTHONPATH")
    return payload


def child_environment(
    settings_file: str,
    boot_dir: str,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of the profiled process: our boot folder first on
    PYTHONPATH, and in ENV_VAR the path of the file that holds
    `child_settings` (a few dozen bytes, whatever the argument list)."""
    env = dict(os.environ if base is None else base)
    original = env.get("PYTHONPATH")
    env[ENV_VAR] = os.path.abspath(settings_file)
    env["PYTHONPATH"] = boot_dir + (os.pathsep + original if original else "")
    return env
