"""The public API under the command line: run a script and report, or
report a finished run. The live path and `perfrun report` share everything
from reading the rank files on."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import IO, Any, Optional

from .exitcodes import ExitCode
from .launch import LaunchError, exit_like
from .launch import run as launch_run
from .results import ResultsError, read_run, resolve_run_dir
from .settings import Settings


def _say(message: str) -> None:
    sys.stderr.write(f"perfrun: {message}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def _destination(output: Optional[str]) -> Iterator[IO[str]]:
    if output is None:
        yield sys.stdout
        return
    buffer = io.StringIO()
    yield buffer
    from .results import atomic_write_text

    atomic_write_text(output, buffer.getvalue())


def render_run(
    run_dir: str,
    fmt: str,
    output: Optional[str],
    warmup: Optional[int],
    view: Optional[dict[str, Any]] = None,
) -> Any:
    from .analysis.summary import build_report
    from .report import render

    run = read_run(run_dir)
    report = build_report(run, warmup=warmup)
    report.view = dict(view or {})
    with _destination(output) as stream:
        render(report, fmt, stream)
    if output is not None:
        _say(f"report written to {output}")
    return report


def run_and_report(settings: Settings, command_line: Optional[list[str]] = None) -> int:
    """Run the script under perfrun, print the report, and return the
    script's own exit status (a script killed by signal N kills perfrun
    with N after the report is printed)."""
    if not settings.enable:
        _say("profiling disabled (Profiler.enable is false): running the script as is")
        import subprocess

        target = [settings.script] if settings.script else ["-m", str(settings.module)]
        return subprocess.call([sys.executable, *target, *settings.script_args])
    try:
        outcome = launch_run(settings, command_line)
    except LaunchError as exc:
        _say(f"error: {exc}")
        return int(exc.code)
    returncode = outcome.returncode
    try:
        render_run(
            outcome.run_dir, settings.format, settings.output, settings.warmup, view_of(settings)
        )
    except ResultsError as exc:
        _say(f"error: {exc}")
    except BrokenPipeError:
        raise
    except Exception as exc:  # a report bug must not hide the script's status
        _say(
            f"internal error while reporting ({type(exc).__name__}: {exc}); "
            f"results are kept in {outcome.run_dir}"
        )
    _say(f"results saved in {outcome.run_dir}")
    if settings.distributed and returncode != 0:
        signum = _rank_signal(outcome.run_dir)
        if signum:
            returncode = -signum
    return exit_like(returncode)


def _rank_signal(run_dir: str) -> int:
    """torchrun exits 1 whatever a rank did: find a rank that was ended by a
    signal in the rank files themselves."""
    try:
        run = read_run(run_dir)
    except ResultsError:
        return 0
    for rank in run.ranks:
        signum = (rank.data.get("exit") or {}).get("signal")
        if signum:
            return int(signum)
    return 0


def view_of(settings: Settings) -> dict[str, Any]:
    return {
        "op_detail": settings.op_detail,
        "sort_by": settings.sort_by,
        "row_limit": settings.row_limit,
        "time_unit": settings.time_unit,
    }


def report(
    path: str,
    fmt: str = "table",
    output: Optional[str] = None,
    warmup: Optional[int] = None,
    view: Optional[dict[str, Any]] = None,
) -> int:
    """`perfrun report`: re-print a finished run's tables from its files.
    Exit 66 when the files cannot be read, 67 when they hold no measurement."""
    run_dir = resolve_run_dir(path)
    try:
        report = render_run(run_dir, fmt, output, warmup, view)
    except ResultsError as exc:
        _say(f"error: {exc}")
        return ExitCode.BAD_RESULTS
    if getattr(report, "problem", None):
        return ExitCode.NO_MEASUREMENT
    return ExitCode.OK
