"""The command layer: each perfrun command as the API's calls (api.py), the
lines it prints, and the exit code it returns (exitcodes.py).

Here, and only here, an error becomes a message and a number: the API
returns values and raises typed errors; cli.py parses the command line and
calls these. What a user sees on stderr is one line, `perfrun: ...`.

`perfrun train.py` spends its time in the script, and a script that never
imports torch is reported without the analysis or the tables: so the
analysis, the renderers and the gate are imported inside the functions
that use them, never before the script has run.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, Optional

from . import api
from .exitcodes import ExitCode
from .launcher.launch import LaunchError, Outcome, exit_like
from .prose import for_stream, note_for_stream, stream_width, terminal_width, wrap
from .settings import Settings
from .store import layout
from .store.files import MISSING, ResultsError, write_named_file
from .store.results import (
    BOOTSTRAP_HINT,
    NO_TORCH,
    RunResults,
    never_imported_torch,
    not_a_run_folder,
    read_run,
    resolve_run_dir,
)
from .store.runmeta import first_failure_signal

if TYPE_CHECKING:
    from .analysis.compare import Comparison
    from .analysis.gate import GateResult
    from .analysis.report import Report


def say(message: str) -> None:
    """One message on stderr: one line in a pipe or a log; on a terminal,
    laid out in its width (prose.py), a path or command never broken. A
    note (`note: ...`) is laid out in a pipe too (prose.note_for_stream)."""
    layout = note_for_stream if message.startswith("note: ") else for_stream
    sys.stderr.write(layout(f"perfrun: {message}", sys.stderr) + "\n")
    sys.stderr.flush()


def note(message: str) -> None:
    """A note on stderr: told by readers when the run they read is not the
    one `latest` names."""
    sys.stderr.write(note_for_stream(f"perfrun: note: {message}", sys.stderr) + "\n")


@contextlib.contextmanager
def _destination(output: Optional[str]) -> Iterator[IO[str]]:
    """Standard output, or a file written whole once the report is done
    (a failed report leaves no half-written file)."""
    if output is None:
        yield sys.stdout
        return
    buffer = io.StringIO()
    yield buffer
    write_named_file(output, buffer.getvalue())


def view_of(settings: Settings) -> dict[str, Any]:
    return {
        "op_detail": settings.op_detail,
        "sort_by": settings.sort_by,
        "row_limit": settings.row_limit,
        "time_unit": settings.time_unit,
    }


def _os_reason(path: Optional[str], exc: OSError) -> str:
    return f"{path}: {exc.strerror or exc}" if path else str(exc.strerror or exc)


def writable_file_problem(path: str, what: str) -> Optional[str]:
    """Why `path` cannot be written as a file, or None: checked before the
    script runs, so a run is not spent on a report or baseline that could
    never be saved."""
    if os.path.isdir(path):
        return f"{what} {path} is a folder; give a file name"
    # A symlink is written through (store/files.write_named_file): the
    # folder that matters is its target's.
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        return f"{what} {path}: no such folder {folder}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{what} {path}: the folder {folder} is not writable"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{what} {path}: the file is not writable"
    return None


def _output_problem(output: Optional[str]) -> Optional[int]:
    """--output that can never be written: said, and exit 64."""
    if output is not None:
        problem = writable_file_problem(output, "--output")
        if problem:
            say(f"error: {problem}")
            return ExitCode.CONFIG
    return None


# -- a run's report ---------------------------------------------------------------------


def _print_no_torch(run: RunResults) -> None:
    """The short report of a run that never imported torch, laid out as the
    report's title and notes are (report/table.py), without loading it: the
    Command and Results lines whole in a pipe, the sentences in the
    stream's width with hanging indents."""
    command = run.meta.get("command")
    width, title = stream_width(sys.stdout), terminal_width(sys.stdout)
    lines = []
    if command:
        lines += wrap("Command: " + " ".join(command), title, "", "  ")
    lines += wrap(f"Results: {run.run_dir}", title, "", "  ")
    lines += ["", *wrap(f"perfrun: {NO_TORCH}", width, "", "  "), "", "Notes",
              *wrap(BOOTSTRAP_HINT, width, "  - ", "    "), ""]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def show_report(
    run_dir: str,
    fmt: str,
    output: Optional[str],
    warmup: Optional[int],
    view: Optional[dict[str, Any]] = None,
    page: bool = False,
    meta: Optional[dict[str, Any]] = None,
) -> Optional[Report]:
    """Print (or write to `output`) the report of `run_dir` as `fmt`, and
    return the Report; None when the run never imported torch and its
    short report was printed instead. `page`: the Report will be drawn as
    report.html too (what only the page draws is computed for html alone).
    `meta`: the launcher's record of the run, when run.json could not be
    brought up to date (a full disk). Raises ResultsError, OSError."""
    # Each step file is checked as the report reads it, once (check_steps).
    run = read_run(run_dir, check_steps=False)
    if meta is not None:
        run.meta.update(meta)
    if fmt == "table" and output is None and never_imported_torch(run):
        _print_no_torch(run)
        return None
    report = api.build_report(run, warmup, view, series=page or fmt == "html")
    # Links to the trace files are relative to where the page goes.
    base = os.path.dirname(os.path.abspath(output)) if output is not None else None
    with _destination(output) as stream:
        api.render(report, fmt, stream, base_dir=base)
    if output is not None:
        say(f"report written to {output}")
    return report


def write_report_html(report: Optional[Report], comparison: Optional[Comparison] = None
                      ) -> Optional[str]:
    """Write `report.html` into the run folder at the end of a run: the page
    to `scp` to a laptop. It must never cost the run its result: any
    failure (a missing plotly, a full disk, a bug in the page) is one note
    on stderr, and the exit status is the one the run would have had. A
    run without steps (a script that failed before its loop, never imported
    torch, or was asked for --help) gets no page: it would be megabytes of
    charts of nothing, in every such folder."""
    if report is None or report.problem is not None:
        return None  # no step to draw
    try:
        from .report import html as page

        return page.write_run_html(report, comparison)
    except Exception as exc:  # noqa: BLE001 - a note, never the run's failure
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        say(f"note: report.html not written ({reason})")
        return None


def send_to_trackers(settings: Settings, report: Optional[Report], page: Optional[str]) -> None:
    """Give the tracker runs the script opened the report's summary, and
    report.html where the tracker keeps files (launcher/trackers.py). Like
    the page, it never costs the run its result: a tracker that fails or
    does not answer is one note on stderr."""
    if report is None or report.problem is not None or not settings.tracker:
        return
    try:
        from .launcher.trackers import deliver
        from .report.tracker import summary_figures, summary_markdown, summary_words

        problems = deliver(report.title.run_dir, summary_figures(report), summary_words(report),
                           summary_markdown(report, page), page, settings.tracker_timeout)
    except Exception as exc:  # noqa: BLE001 - a note, never the run's failure
        problems = [f"the report's summary did not reach the tracker ({type(exc).__name__}: "
                    f"{exc})".splitlines()[0][:240]]
    for problem in problems:
        say(f"note: {problem}")


def report(
    path: str,
    fmt: str = "table",
    output: Optional[str] = None,
    warmup: Optional[int] = None,
    view: Optional[dict[str, Any]] = None,
) -> int:
    """`perfrun report`: re-print a finished run's tables from its files.
    Exit 66 when the files cannot be read, 67 when they hold no measurement."""
    code = _output_problem(output)
    if code is not None:
        return code
    run_dir = resolve_run_dir(path, note)
    try:
        shown = show_report(run_dir, fmt, output, warmup, view)
    except ResultsError as exc:
        say(f"error: {exc}")
        return ExitCode.BAD_RESULTS
    except OSError as exc:
        say(f"error: could not write the report: {_os_reason(output, exc)}")
        return ExitCode.CONFIG
    if shown is None or shown.problem:
        return ExitCode.NO_MEASUREMENT
    return ExitCode.OK


# -- perfrun run --------------------------------------------------------------------------

#: What the report needs once the script has ended: imported (and plotly's
#: bundle packed, where it is not in the cache) by a thread of the lowest
#: priority while the script runs, rather than after it (numpy alone is
#: about 0.1 s), so the tables follow the script's last line at once.
WARM_MODULES = ("numpy", "perfrun.analysis.build", "perfrun.report.table",
                "perfrun.report.jsonout", "perfrun.report.html")


def warm_report() -> Any:
    """Start the warming thread; returns it (a daemon: it never holds the
    launcher's exit, and a failure only means the import happens later)."""
    import importlib
    import threading

    def warm() -> None:
        try:
            if hasattr(os, "setpriority"):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            for name in WARM_MODULES:
                importlib.import_module(name)
            from .report import html as page

            page.plotly_bundle()
        except Exception:  # noqa: BLE001 - only ever sooner, never different
            pass

    thread = threading.Thread(target=warm, name="perfrun-warm", daemon=True)
    thread.start()
    return thread



def run_and_report(settings: Settings, command_line: Optional[list[str]] = None) -> int:
    """Run the script under perfrun, print the report, and return the
    script's own exit status (a script killed by signal N kills perfrun
    with N after the report is printed)."""
    if not settings.enable:
        say("profiling disabled (Profiler.enable is false): running the script as is")
        import subprocess

        target = [settings.script] if settings.script else ["-m", str(settings.module)]
        return subprocess.call([sys.executable, *target, *settings.script_args])
    problem = _unwritable_outputs(settings)
    if problem:
        say(f"error: {problem}")
        return ExitCode.CONFIG
    if settings.gated:
        code = _check_baseline_first(settings)
        if code is not None:
            return code
    # The warming thread imports (CPU, holding the GIL) while the launcher's
    # other threads make many short system calls (reading /proc for the host
    # load, the run's files): each call gives up the GIL, and getting it
    # back waited out the whole switch interval, 5 ms, every time. When the
    # script ended before the imports did, the last host-load reading after
    # it took 15-30 ms instead of 1. A short interval hands the GIL back
    # within 0.1 ms; with one thread wanting it, it changes nothing.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    try:
        return _run_and_report(settings, command_line)
    finally:
        sys.setswitchinterval(interval)


#: The longest the report waits for the warming thread, seconds (it only
#: imports; past this the report imports what is left itself).
WARM_WAIT = 120.0
#: The launcher's GIL switch interval while a run goes (run_and_report).
SWITCH_INTERVAL = 1e-4


def _run_and_report(settings: Settings, command_line: Optional[list[str]]) -> int:
    warming = warm_report()
    try:
        outcome = api.run(settings, command_line)
    except LaunchError as exc:
        say(f"error: {exc}")
        return int(exc.code)
    # The report imports what the warming thread may still be importing:
    # two threads importing a package and its modules in opposite orders
    # can each wait for the other's module lock, and Python then raises
    # _DeadlockError in one of them (seen once, on a short run, in
    # perfrun.report.table). Waiting for the thread costs nothing the
    # report would not pay itself.
    if warming is not None:
        warming.join(WARM_WAIT)
    returncode = outcome.returncode
    task = outcome.task
    if task is not None and task.rank != 0:
        # One task of a job srun or mpirun started: the task of rank 0
        # reports the whole job, once, and this one says where.
        from .launcher.external import other_task_line

        say(other_task_line(task, outcome.run_dir))
        if outcome.hung and settings.hang_action == "terminate":
            return ExitCode.HANG
        return exit_like(returncode)
    if outcome.waited is not None and outcome.waited.note:
        say(f"note: {outcome.waited.note}")
    if outcome.meta_unsaved:
        say(f"note: {outcome.meta_unsaved}; the report below has the run's end")
    # perfrun's own failure after the script ran: never an exit status of 0
    # (the script's own non-zero status still wins).
    failed: Optional[int] = None
    if settings.save_baseline:
        failed = _save_baseline(outcome.run_dir, settings.save_baseline)
    if settings.gated:
        gate_code = _gated(settings, outcome)
        return gate_code if gate_code != ExitCode.OK or failed is None else failed
    shown: Optional[Report] = None
    try:
        shown = show_report(outcome.run_dir, settings.format, settings.output, settings.warmup,
                            view_of(settings), page=True, meta=_unsaved_meta(outcome))
        send_to_trackers(settings, shown, write_report_html(shown))
    except ResultsError as exc:
        say(f"error: {exc}")
        failed = failed or ExitCode.BAD_RESULTS
    except OSError as exc:
        say(f"error: could not write the report: {_os_reason(settings.output, exc)}")
        failed = failed or ExitCode.CONFIG
    except Exception as exc:  # a report bug must not hide the script's status
        say(
            f"internal error while reporting ({type(exc).__name__}: {exc}); "
            f"results are kept in {outcome.run_dir}"
        )
        failed = failed or ExitCode.INTERNAL
    say(saved_line(outcome.run_dir, shown))
    if shown is not None and shown.unsaved is not None:
        failed = failed or ExitCode.INCOMPLETE
    if outcome.hung and settings.hang_action == "terminate":
        say("the run hung and was ended (--hang-action terminate): see hang.txt in the "
            "results folder")
        return ExitCode.HANG
    if settings.distributed and returncode != 0:
        signum = _rank_signal(outcome.run_dir, outcome.status_path)
        if signum:
            returncode = -signum
    if returncode == 0 and failed is not None:
        return int(failed)
    return exit_like(returncode)


def saved_line(run_dir: str, report: Optional[Report]) -> str:
    """The run's closing line: where its results are, and, when saves failed
    (a full disk), that they are incomplete and by how much, rather than
    "saved" as if whole."""
    unsaved = report.unsaved if report is not None else None
    if unsaved is None:
        return f"results saved in {run_dir}"
    return f"results saved in {run_dir} are incomplete: {unsaved.sentence()}"


def _unsaved_meta(outcome: Outcome) -> Optional[dict[str, Any]]:
    """The launcher's record of the run, where run.json lacks it."""
    return outcome.meta if outcome.meta_unsaved else None


def _save_baseline(run_dir: str, path: str) -> Optional[int]:
    """--save-baseline: the exit code of a failure to save, or None."""
    try:
        runs = api.save_baseline(run_dir, path)
    except ResultsError as exc:
        say(f"error: could not save the baseline: {exc}")
        return ExitCode.NO_MEASUREMENT
    except OSError as exc:
        say(f"error: could not save the baseline: {_os_reason(path, exc)}")
        return ExitCode.CONFIG
    say(f"baseline saved to {path} ({runs} run{'' if runs == 1 else 's'} of this environment)")
    _warn_disturbed_baseline(path)
    return None


def _warn_disturbed_baseline(path: str) -> None:
    """A baseline recorded while the machine was disturbed: said when it is
    saved, since every gate against it will be inconclusive."""
    from .store.baseline import stored_disturbed

    flags = stored_disturbed(path)
    if flags:
        say("warning: the baseline run's measurement was disturbed (gates against it give "
            "no verdict unless --ignore-disturbed):")
        for message in flags:
            say(f"  - {message}")


def _check_baseline_first(settings: Settings) -> Optional[int]:
    """Before the script runs: a missing or unreadable baseline, or one
    recorded for another script, Python or world size (what is known
    before running), is refused now rather than after the whole run."""
    import platform

    from .store import baseline as baselines

    assert settings.baseline is not None
    try:
        base_run = api.load_baseline(settings.baseline, note)
    except ResultsError as exc:
        say(f"error: baseline: {exc}")
        return ExitCode.NO_MEASUREMENT if exc.kind == MISSING else ExitCode.BAD_RESULTS
    if settings.allow_env_mismatch:
        return None
    stored = baselines.stored_fingerprint(settings.baseline, base_run)
    known: dict[str, Any] = {
        "script": settings.script or (f"-m {settings.module}" if settings.module else None),
        "python": platform.python_version(),
    }
    if settings.nproc_per_node is not None and str(settings.nnodes or "1").isdigit():
        known["world_size"] = settings.nproc_per_node * int(settings.nnodes or 1)
    elif not settings.distributed:
        known["world_size"] = 1
    differ = baselines.mismatches({k: stored.get(k) for k in known}, known)
    if differ:
        _refuse_mismatch(differ, " (checked before running the script)")
        return ExitCode.CONFIG
    return None


def _refuse_mismatch(differ: list[str], when: str = "") -> None:
    say(
        "error: the baseline was recorded in a different environment ("
        + "; ".join(differ)
        + f"); compare like with like, or pass --allow-env-mismatch{when}"
    )


def _unwritable_outputs(settings: Settings) -> Optional[str]:
    for path, what in ((settings.output, "--output"), (settings.save_baseline, "--save-baseline")):
        if path:
            problem = writable_file_problem(path, what)
            if problem:
                return problem
    return None


def _rank_signal(run_dir: str, status_path: Optional[str] = None) -> int:
    """torchrun exits 1 whatever a rank did: find the signal that ended the
    run. First torchrun's own record of its first failed worker (written by
    launcher/torchrun.py: a negative status is a signal, SIGKILL included),
    then the rank files (a rank that caught SIGTERM says so). When a rank
    raised, the others' SIGTERM is torchrun's own clean-up, not how the run
    ended."""
    signum = first_failure_signal(status_path or os.path.join(run_dir, layout.TORCHRUN_STATUS))
    if signum is not None:
        return signum
    try:
        run = read_run(run_dir)
    except ResultsError:
        return 0
    if any((rank.data.get("exit") or {}).get("exception") for rank in run.ranks):
        return 0
    for rank in run.ranks:
        exit_signal = (rank.data.get("exit") or {}).get("signal")
        if exit_signal:
            return int(exit_signal)
    return 0


def _gated(settings: Settings, outcome: Outcome) -> int:
    """`perfrun run --baseline`: the exit status is the gate's, never the
    script's (a crashed script is a measurement failure).

    What goes where: with --format table or markdown, the run's report and
    then the comparison, both on stdout (or the report in --output). With
    --format json, one document for machines: the comparison on stdout, and
    the run's JSON report in --output if given. With --format junit (a gate
    only: JUnit has no run report), the JUnit comparison in --output, and
    the run's table on stdout; without --output, only the JUnit document on
    stdout."""
    fmt = settings.format
    output = settings.output
    if fmt in ("table", "markdown") or (output is not None and fmt == "json"):
        report_fmt, report_out = fmt, output
    elif fmt == "junit" and output is not None:
        report_fmt, report_out = "table", None
    else:
        report_fmt = report_out = None
    failed: Optional[int] = None
    shown: Optional[Report] = None
    if report_fmt is not None:
        try:
            shown = show_report(outcome.run_dir, report_fmt, report_out, settings.warmup,
                                view_of(settings), page=True, meta=_unsaved_meta(outcome))
        except ResultsError as exc:
            say(f"error: {exc}")
            failed = ExitCode.BAD_RESULTS
        except OSError as exc:
            say(f"error: could not write the report: {_os_reason(report_out, exc)}")
            failed = ExitCode.CONFIG
    say(saved_line(outcome.run_dir, shown))
    if outcome.returncode != 0:
        say(f"gate: the script exited with status {outcome.returncode}: no measurement to compare")
        return ExitCode.NO_MEASUREMENT
    threshold = settings.max_regression
    if threshold is None:
        # As `perfrun compare`: a gate needs a threshold.
        say("not gated: no --max-regression given (e.g. --max-regression 5%); comparison only")
    assert settings.baseline is not None
    code, comparison = _compare(
        settings.baseline,
        outcome.run_dir,
        threshold=threshold,
        fail_on_inconclusive=settings.fail_on_inconclusive,
        allow_env_mismatch=settings.allow_env_mismatch,
        fmt=fmt if fmt in ("table", "markdown", "json", "junit") else "table",
        output=output if fmt == "junit" else None,
        warmup=settings.warmup,
        ignore_disturbed=settings.ignore_disturbed,
        page=True,
    )
    # The page of a gated run holds the comparison too, when there was one.
    if comparison is not None:
        current = comparison.current_report
        if shown is None and current is not None and current.unsaved is not None:
            say(f"the results are incomplete: {current.unsaved.sentence()}")
        shown = current
        page = write_report_html(shown, comparison)
    else:
        page = write_report_html(shown)
    send_to_trackers(settings, shown, page)
    if shown is not None and shown.unsaved is not None:
        failed = failed or ExitCode.INCOMPLETE
    return code if code != ExitCode.OK or failed is None else failed


# -- perfrun compare ----------------------------------------------------------------------


def compare(
    baseline: str,
    current: str,
    threshold: Optional[float] = None,
    fail_on_inconclusive: bool = False,
    allow_env_mismatch: bool = False,
    fmt: str = "table",
    output: Optional[str] = None,
    warmup: Optional[int] = None,
    ignore_disturbed: bool = False,
) -> int:
    """`perfrun compare`. A run whose measurement was disturbed gives no
    verdict: exit 0 with a warning, or 73 (DISTURBED) with
    `fail_on_inconclusive`, never 68; `ignore_disturbed` gates it all the
    same."""
    code, _comparison = _compare(baseline, current, threshold, fail_on_inconclusive,
                                 allow_env_mismatch, fmt, output, warmup, ignore_disturbed)
    return code


def _compare(
    baseline: str,
    current: str,
    threshold: Optional[float],
    fail_on_inconclusive: bool,
    allow_env_mismatch: bool,
    fmt: str,
    output: Optional[str],
    warmup: Optional[int],
    ignore_disturbed: bool,
    page: bool = False,
) -> tuple[int, Optional[Comparison]]:
    """The comparison, printed, and the exit code it earns; the comparison
    is None when none could be made. `page`: a page will be drawn of it."""
    code = _output_problem(output)
    if code is not None:
        return code, None
    from .report import render_comparison
    from .report.comparison import verdict_line

    try:
        comparison = api.compare(baseline, current, threshold, warmup=warmup,
                                 allow_env_mismatch=allow_env_mismatch,
                                 ignore_disturbed=ignore_disturbed, note=note,
                                 series=page or fmt == "html")
    except api.RunInputError as exc:
        say(f"error: {exc}")
        missing_baseline = exc.which == "baseline" and exc.kind == MISSING
        return (ExitCode.NO_MEASUREMENT if missing_baseline else ExitCode.BAD_RESULTS), None
    except api.EnvironmentMismatch as exc:
        _refuse_mismatch(exc.differences)
        return ExitCode.CONFIG, None
    with _destination(output) as stream:
        render_comparison(comparison, fmt, stream)
    # Workflow commands go to stdout, unless stdout carries a document a
    # machine will parse; the runner reads them from stderr too.
    machine = fmt in ("json", "junit", "html") and output is None
    _github_actions(comparison, verdict_line(comparison), sys.stderr if machine else sys.stdout)
    return gate_exit(comparison, fail_on_inconclusive), comparison


def gate_exit(comparison: Comparison, fail_on_inconclusive: bool) -> int:
    """The exit code a comparison earns, its warnings said: 68 for a
    regression; 67 for no measurement, or a gate that had nothing to
    decide on (too few steady steps: a gate that can never decide must not
    pass forever); 69 (73 when disturbed) for an inconclusive verdict when
    those are to fail CI; else 0."""
    from .analysis.gate import Verdict

    if comparison.problem:
        return ExitCode.NO_MEASUREMENT
    gate = comparison.gate
    if gate is None:
        return ExitCode.OK
    if gate.verdict == Verdict.FAIL:
        return ExitCode.REGRESSION
    if gate.verdict == Verdict.INCONCLUSIVE and gate.ratio is None:
        say(f"error: gate: {gate.reason}")
        return ExitCode.NO_MEASUREMENT
    if gate.verdict == Verdict.INCONCLUSIVE and gate.disturbed:
        return _disturbed_exit(gate, fail_on_inconclusive)
    if gate.verdict == Verdict.INCONCLUSIVE:
        say(f"warning: gate inconclusive: {gate.reason}")
        return ExitCode.INCONCLUSIVE if fail_on_inconclusive else ExitCode.OK
    return ExitCode.OK


def _disturbed_exit(gate: GateResult, fail_on_inconclusive: bool) -> int:
    """A disturbed run's gate: loud, one flag a line, and never a
    regression. 73 only when inconclusive verdicts are to fail CI."""
    undisturbed = gate.undisturbed.value.upper() if gate.undisturbed else "?"
    say(f"warning: gate inconclusive: the measurement was disturbed (the step times alone "
        f"gave {undisturbed}); not judged:")
    for flag in gate.disturbed:
        say(f"  - {flag}")
    say("rerun on a quiet machine, or pass --ignore-disturbed where the machine is always "
        "shared")
    return ExitCode.DISTURBED if fail_on_inconclusive else ExitCode.OK


def _github_actions(comparison: Comparison, line: str, stream: IO[str]) -> None:
    """On GitHub Actions: the comparison in the job summary, a regression as
    an error annotation."""
    if os.environ.get("GITHUB_ACTIONS") != "true":
        return
    from .analysis.gate import Verdict
    from .report.comparison import comparison_blocks
    from .report.markdown import render_markdown_blocks

    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(render_markdown_blocks(comparison_blocks(comparison)) + "\n")
        except OSError as exc:
            say(f"could not write the job summary: {exc}")
    gate = comparison.gate
    text = line.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if comparison.problem or (gate is not None and gate.verdict == Verdict.FAIL):
        stream.write(f"::error title=perfrun performance gate::{text}\n")
    elif gate is not None and gate.verdict == Verdict.INCONCLUSIVE:
        stream.write(f"::warning title=perfrun performance gate::{text}\n")
    stream.flush()


# -- perfrun analyze, combine, status -------------------------------------------------------


def analyze(
    paths: list[str],
    fmt: str = "table",
    output: Optional[str] = None,
    view: Optional[dict[str, Any]] = None,
) -> int:
    """`perfrun analyze`: the window tables of torch.profiler traces a user
    already has. Exit 66 when a trace cannot be read."""
    from .analysis.tracefile import TraceError
    from .report import render_analysis

    code = _output_problem(output)
    if code is not None:
        return code
    try:
        analysis = api.analyze(paths)
    except TraceError as exc:
        say(f"error: {exc}")
        return ExitCode.BAD_RESULTS
    with _destination(output) as stream:
        render_analysis(analysis, fmt, stream, view)
    if output is not None:
        say(f"report written to {output}")
    return ExitCode.OK


def combine(paths: list[str], output: Optional[str] = None) -> int:
    """`perfrun combine`: merge the run folders of one job, copied from its
    nodes, into a new folder (combine.py decides what goes in). Exit 66
    when a folder cannot be read, 71 when they are different jobs' runs,
    64 when the output folder exists or cannot be written."""
    from . import combine as combining

    if output is not None and os.path.exists(output) and not (
        os.path.isdir(output) and not os.listdir(output)
    ):
        say(f"error: {output} already exists; combine writes a new folder: give another -o "
            "or remove it first")
        return ExitCode.CONFIG
    sources = []
    seen = set()
    try:
        for path in paths:
            run_dir = resolve_run_dir(path, note)
            real = os.path.realpath(run_dir)
            if real in seen:
                continue  # the same folder given twice is one folder
            seen.add(real)
            sources.append(combining.read_source(run_dir))
    except combining.CombineError as exc:
        say(f"error: {exc}")
        return exc.code
    problem = combining.mixed_jobs([combining.facts_of(s) for s in sources])
    if problem:
        say(f"error: cannot combine: {problem}")
        return ExitCode.MIXED_RUNS
    plan = combining.plan(sources)
    if output is None:
        name = plan.meta.get("job", {}).get("name") or os.path.basename(
            os.path.normpath(sources[0].path))
        output = combining.default_output(
            os.path.join("perfrun_log", f"combined-{name}"), os.path.exists
        )
    try:
        combining.write(plan, output)
    except OSError as exc:
        say(f"error: cannot write {output}: {exc.strerror or exc}")
        return ExitCode.CONFIG
    for line in combining.outcome_lines(plan, len(sources), output):
        say(line)
    say(f"see it with: perfrun report {output}")
    return ExitCode.OK


def status(path: str) -> int:
    """`perfrun status`: where each rank of a run is now. Exit 66 when the
    folder holds no run."""
    import time

    from .launcher.hang import lag_note, odd_one_out, read_positions, status_lines
    from .store.results import is_run_dir

    if not os.path.isdir(path):
        why = not_a_run_folder(path) if os.path.exists(path) else f"no such folder: {path}"
        sys.stderr.write(f"perfrun: error: {why}\n")
        return ExitCode.BAD_RESULTS
    run_dir = path if is_run_dir(path) else resolve_run_dir(path)
    if not is_run_dir(run_dir):
        sys.stderr.write(f"perfrun: error: no run in {path}\n")
        return ExitCode.BAD_RESULTS
    positions = read_positions(run_dir, pace=True)
    now = time.time()
    print(f"Run: {run_dir}")
    if not positions:
        print("no rank has written results yet")
        return ExitCode.OK
    # In the stream's width, a pipe's too (80): a status is read, not grepped.
    width = stream_width(sys.stdout)
    for line in status_lines(positions, now):
        print("\n".join(wrap(line, width, "", "      ")))
    # A moving rank's phase is one instant of thousands (Position.moving):
    # where the ranks are held, and how late that may be seen, is said of
    # the others.
    held = [p for p in positions if p.status == "running" and not p.moving()]
    odd = odd_one_out(held, now)
    if odd:
        print("\n".join(wrap(odd, width, "", "  ")))
    lag = lag_note([p for p in positions if not p.moving()], status=True)
    if lag is not None:
        print("\n".join(wrap(lag, width, "", " ")))
    return ExitCode.OK
