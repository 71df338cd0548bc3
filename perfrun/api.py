"""perfrun from Python: the functions the command line is made of, which
return values and raise typed errors.

    from perfrun import api

    run = api.load_run("perfrun_log")             # the newest run of a log folder
    report = api.build_report(run)                # every number the tables print
    print(report.perf.batch_cost.avg, [a.kind for a in report.advice])
    api.render(report, "markdown", sys.stdout)    # or "table", "json", "html"

Errors are exceptions, never exit codes or messages on stderr: a run or a
baseline that cannot be read raises `ResultsError` (its `kind` says whether
it is MISSING or DAMAGED), a trace `TraceError`, a refused comparison
`EnvironmentMismatch`, a run that cannot start `LaunchError`, a bad
setting `SettingsError`: each a `PerfrunError` (perfrun/errors.py), so one
`except PerfrunError` catches what perfrun raises on purpose. The command
line (commands.py) turns them into one line and an exit code. The result
types (`Report`, `Comparison`, `TraceAnalysis`, `RunResults`, `Outcome`)
and `Settings` are importable from here.

`perfrun train.py` starts the script before anything here but the launcher
is needed, and a script that never imports torch is reported without the
analysis: so the analysis and the renderers are imported inside the
functions that use them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any, Callable, Optional

from .analysis.tracefile import TraceError
from .errors import PerfrunError
from .launcher.launch import LaunchError, Outcome
from .launcher.launch import run as launch_run
from .settings import Settings, SettingsError
from .store.files import DAMAGED, MISSING, ResultsError
from .store.results import RunResults, live_ranks, read_run, resolve_run_dir

if TYPE_CHECKING:
    from .analysis.compare import Comparison
    from .analysis.report import Report
    from .analysis.window import TraceAnalysis

__all__ = [
    "DAMAGED", "MISSING", "Comparison", "EnvironmentMismatch", "LaunchError", "Outcome",
    "PerfrunError", "Report", "ResultsError", "RunInputError", "RunResults", "Settings",
    "SettingsError", "TraceAnalysis", "TraceError", "analyze", "build_report", "compare",
    "load_baseline", "load_run", "render", "run", "save_baseline",
]

#: The result types the functions below return, importable from here
#: (`from perfrun.api import Report`) but imported only when asked for, as
#: the analysis is: where each lives.
_LAZY = {
    "Report": "perfrun.analysis.report",
    "Comparison": "perfrun.analysis.compare",
    "TraceAnalysis": "perfrun.analysis.window",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: Told one line when a log folder's `latest` link does not name its newest
#: run (the newest is read): the command line prints it, the API is silent.
Note = Optional[Callable[[str], None]]


class RunInputError(ResultsError):
    """One of a comparison's two runs cannot be read: `which` is
    "baseline" or "current run", `kind` as for ResultsError."""

    slug = "run-input"

    def __init__(self, which: str, error: ResultsError) -> None:
        super().__init__(f"{which}: {error}", error.kind)
        self.which = which


class EnvironmentMismatch(PerfrunError):
    """A gate refused to compare runs of different environments (hardware,
    software, world size, script): `differences` says which, one each."""

    slug = "environment-mismatch"

    def __init__(self, differences: list[str]) -> None:
        super().__init__("; ".join(differences))
        self.differences = differences


def load_run(path: str, note: Note = None) -> RunResults:
    """A run folder, or a log folder's newest run (`latest`), read and
    merged. Raises ResultsError."""
    return read_run(resolve_run_dir(path, note))


def load_baseline(path: str, note: Note = None) -> RunResults:
    """A baseline file, or a run folder or log folder as for load_run.
    Raises ResultsError."""
    from .store import baseline

    return baseline.load(path, note)


def build_report(
    run: RunResults,
    warmup: Optional[int] = None,
    view: Optional[dict[str, Any]] = None,
    alive: Optional[Iterable[int]] = None,
    series: bool = True,
) -> Report:
    """Every number the tables print, the advice and the page's series.

    `warmup`: steps left out of the statistics (None: as the run was
    started, else by its length). `view`: how the window's tables are shown
    (sort_by, row_limit, time_unit, op_detail). `alive`: the ranks still
    running (None: asked of this machine, so a report taken during the run
    does not call them dead). `series=False` leaves out what only the page
    draws. The report carries the merged results too, which its JSON ends
    with, as `perfrun report --format json` prints it."""
    from .analysis.build import build_report as build

    if alive is None:
        alive = live_ranks(run)
    report = build(run, warmup=warmup, alive=alive, series=series, results=True)
    report.view = dict(view or {})
    return report


def render(report: Report, fmt: str = "table", stream: Optional[IO[str]] = None,
           base_dir: Optional[str] = None) -> Optional[str]:
    """Write `report` as `fmt` ("table", "json", "markdown" or "html") to
    `stream`, or return it as a string when no stream is given. `base_dir`:
    where a page will be written, for relative links to its traces."""
    import io

    from .report import render as render_to

    out = io.StringIO() if stream is None else stream
    render_to(report, fmt, out, base_dir=base_dir)
    if stream is None:
        assert isinstance(out, io.StringIO)
        return out.getvalue()
    return None


def compare(
    baseline: str,
    current: str,
    threshold: Optional[float] = None,
    warmup: Optional[int] = None,
    allow_env_mismatch: bool = False,
    ignore_disturbed: bool = False,
    note: Note = None,
    series: bool = True,
) -> Comparison:
    """CURRENT against BASELINE (each a baseline file, a run folder or a log
    folder). With a `threshold` (0.05 for 5%), the gate's verdict is in
    `.gate`; a run whose measurement was disturbed gives no verdict unless
    `ignore_disturbed`. Raises RunInputError when either cannot be read,
    EnvironmentMismatch when a gate would compare different environments
    (unless `allow_env_mismatch`). `series=False` leaves out what only the
    comparison's page draws."""
    from .analysis.compare import compare_report, compare_runs
    from .store import baseline as baselines

    # Each run's step files are checked as its report reads them, once
    # (results.read_run's check_steps).
    try:
        base_run = baselines.load(baseline, note, check_steps=False)
    except ResultsError as exc:
        raise RunInputError("baseline", exc) from None
    try:
        current_run = baselines.load(current, note, check_steps=False)
    except ResultsError as exc:
        raise RunInputError("current run", exc) from None
    history = baselines.load_history(baseline)
    gated = threshold is not None or bool(history)
    try:
        base_report = compare_report(base_run, warmup, series, gated)
    except ResultsError as exc:
        raise RunInputError("baseline", exc) from None
    try:
        current_report = compare_report(current_run, warmup, series, gated)
    except ResultsError as exc:
        raise RunInputError("current run", exc) from None
    # The fingerprints from the reports, which took rank 0's batch size on
    # their pass over its steps (a baseline file's own, where it stored one).
    base_fp = baselines.stored_fingerprint(baseline, base_run, base_report.environment)
    current_fp = current_report.environment
    differences = baselines.mismatches(base_fp, current_fp)
    if differences and threshold is not None and not allow_env_mismatch:
        raise EnvironmentMismatch(differences)
    return compare_runs(
        base_run,
        current_run,
        threshold,
        baseline,
        current,
        warmup=warmup,
        mismatches=differences,
        base_history=history,
        ignore_disturbed=ignore_disturbed,
        series=series,
        reports=(base_report, current_report),
    )


def analyze(paths: list[str]) -> TraceAnalysis:
    """The window tables of torch.profiler traces (one file per rank, .json
    or .json.gz). Raises tracefile.TraceError."""
    from .analysis.tracefile import load_trace
    from .analysis.window import analyze_traces

    return analyze_traces([load_trace(path) for path in paths])


def save_baseline(run_dir: str, path: str) -> int:
    """Save the run in `run_dir` as the baseline in `path` (earlier runs of
    the same environment kept beside it, for the gate's run-to-run spread);
    returns how many runs the file holds. Raises ResultsError, OSError."""
    from .analysis.disturbed import flags_of
    from .store.baseline import write_baseline

    run = read_run(run_dir)
    try:
        disturbed = [f.to_dict() for f in flags_of(run)]
    except Exception:  # noqa: BLE001 - a damaged record is no reason to lose the baseline
        disturbed = []
    return write_baseline(run, path, disturbed)


def run(settings: Settings, command_line: Optional[list[str]] = None) -> Outcome:
    """Run the script `settings` names under perfrun and wait for it (its
    output is the script's own); the results are in `.run_dir`, for
    load_run. Raises LaunchError before the script starts."""
    return launch_run(settings, command_line)
