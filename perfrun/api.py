"""The public API under the command line: run a script and report, or
report a finished run. The live path and `perfrun report` share everything
from reading the rank files on."""

from __future__ import annotations

import contextlib
import io
import os
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
    sink: Optional[dict[str, Any]] = None,
) -> Any:
    """Print (or write to `output`) the report of `run_dir` as `fmt`, and
    return the Report. `sink`, when given, receives the run it read
    (`sink["run"]`), so a caller can write report.html without reading the
    run again."""
    run = read_run(run_dir)
    if sink is not None:
        sink["run"] = run
    if fmt == "table" and output is None and _never_imported_torch(run):
        return _print_no_torch(run)
    from .analysis.summary import build_report
    from .report import render

    report = build_report(run, warmup=warmup, alive=live_ranks(run))
    report.view = dict(view or {})
    with _destination(output) as stream:
        if fmt == "json":
            # The merged results, not just the summaries: every rank's
            # document, and where its per-step records are (its step file:
            # a long run's millions of steps do not belong in a report).
            import json

            from .report.jsonout import render_json

            doc = json.loads(render_json(report))
            doc["results"] = {
                "run_dir": run.run_dir,
                "meta": run.meta,
                "missing_ranks": run.missing,
                "ranks": [_with_step_path(r) for r in run.ranks],
            }
            stream.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
            stream.flush()
        elif fmt == "html":
            from .report.html import write_html

            # Links to the trace files are relative to where the page goes.
            base = os.path.dirname(os.path.abspath(output)) if output is not None else None
            write_html(report, run, stream, base)
        else:
            render(report, fmt, stream)
    if output is not None:
        _say(f"report written to {output}")
    return report


def _with_step_path(rank: Any) -> dict[str, Any]:
    """A rank's document for the JSON report: format 2's steps with the
    step file's full path added (format 1's rows are inline already)."""
    if rank.steps_file is None:
        return rank.data  # type: ignore[no-any-return]
    steps = dict(rank.data.get("steps") or {}, path=os.path.abspath(rank.steps_file))
    return dict(rank.data, steps=steps)


def live_ranks(run: Any, now: Optional[float] = None) -> set[int]:
    """Ranks of a run still in progress: a `running` rank whose process is
    alive on this machine (a report taken during the run). A rank on
    another host cannot be asked: in a multi-node job folder it counts as
    running while its node's launcher has recorded no end and its file was
    written in the last RANK_FRESH seconds (a live rank rewrites it every
    few). A run whose launchers all recorded their end has none."""
    import time

    from .results import rank_alive

    if run.meta.get("returncode") is not None:
        return set()
    nodes = run.meta.get("nodes") if isinstance(run.meta.get("nodes"), dict) else {}
    now = time.time() if now is None else now
    live = set()
    for rank in run.ranks:
        if rank.status != "running" or (rank.data.get("env") or {}).get("pid") == os.getpid():
            continue
        alive = rank_alive(rank)
        if alive is None and nodes:
            alive = _node_running(rank, nodes) and _written_since(rank.path, now - RANK_FRESH)
        if alive:
            live.add(rank.rank)
    return live


#: How recently a rank on another host must have written its file to count
#: as running (it flushes every 2 seconds).
RANK_FRESH = 60.0


def _node_running(rank: Any, nodes: dict[str, Any]) -> bool:
    """Whether the launcher of the node `rank` ran on has recorded no end:
    the node found by the --node-rank in the rank's settings, else by host."""
    node_rank = (rank.data.get("settings") or {}).get("node_rank")
    host = (rank.data.get("env") or {}).get("hostname")
    for key, node in nodes.items():
        if not isinstance(node, dict):
            continue
        mine = str(node_rank) == key if node_rank is not None else node.get("host") == host
        if mine:
            return not isinstance(node.get("returncode"), int)
    return False


def _written_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except OSError:
        return False


def _never_imported_torch(run: Any) -> bool:
    """A run whose every rank finished without importing torch: there is
    nothing to analyse, so the report needs none of the analysis or table
    machinery (and a script that never imports torch is not slowed by it)."""
    return bool(run.ranks) and not run.missing and all(
        not r.n_steps and not r.data.get("torch_imported") and r.status == "finished"
        and not (r.data.get("exit") or {}).get("exception")
        for r in run.ranks
    )


def _print_no_torch(run: Any) -> Any:
    """Print the short report; return what stands for it (its `problem`)."""
    import types

    from .schema import BOOTSTRAP_HINT, NO_TORCH

    command = run.meta.get("command")
    lines = []
    if command:
        lines.append("Command: " + " ".join(command))
    lines += [f"Results: {run.run_dir}", "", f"perfrun: {NO_TORCH}", "", "Notes",
              f"  - {BOOTSTRAP_HINT}", ""]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    return types.SimpleNamespace(problem=NO_TORCH)


def run_and_report(settings: Settings, command_line: Optional[list[str]] = None) -> int:
    """Run the script under perfrun, print the report, and return the
    script's own exit status (a script killed by signal N kills perfrun
    with N after the report is printed)."""
    if not settings.enable:
        _say("profiling disabled (Profiler.enable is false): running the script as is")
        import subprocess

        target = [settings.script] if settings.script else ["-m", str(settings.module)]
        return subprocess.call([sys.executable, *target, *settings.script_args])
    problem = _unwritable_outputs(settings)
    if problem:
        _say(f"error: {problem}")
        return ExitCode.CONFIG
    if settings.gated:
        code = _check_baseline_first(settings)
        if code is not None:
            return code
    try:
        outcome = launch_run(settings, command_line)
    except LaunchError as exc:
        _say(f"error: {exc}")
        return int(exc.code)
    returncode = outcome.returncode
    # perfrun's own failure after the script ran: never an exit status of 0
    # (the script's own non-zero status still wins).
    failed: Optional[int] = None
    if settings.save_baseline:
        try:
            from .baseline import save_baseline

            runs = save_baseline(outcome.run_dir, settings.save_baseline)
            _say(
                f"baseline saved to {settings.save_baseline} ({runs} run"
                f"{'' if runs == 1 else 's'} of this environment)"
            )
            _warn_disturbed_baseline(settings.save_baseline)
        except ResultsError as exc:
            _say(f"error: could not save the baseline: {exc}")
            failed = ExitCode.NO_MEASUREMENT
        except OSError as exc:
            _say(f"error: could not save the baseline: {_os_reason(settings.save_baseline, exc)}")
            failed = ExitCode.CONFIG
    if settings.gated:
        gate_code = _gated(settings, outcome)
        return gate_code if gate_code != ExitCode.OK or failed is None else failed
    sink: dict[str, Any] = {}
    try:
        report = render_run(
            outcome.run_dir, settings.format, settings.output, settings.warmup, view_of(settings),
            sink=sink,
        )
        write_report_html(outcome.run_dir, report, sink.get("run"))
    except ResultsError as exc:
        _say(f"error: {exc}")
        failed = failed or ExitCode.BAD_RESULTS
    except OSError as exc:
        _say(f"error: could not write the report: {_os_reason(settings.output, exc)}")
        failed = failed or ExitCode.CONFIG
    except Exception as exc:  # a report bug must not hide the script's status
        _say(
            f"internal error while reporting ({type(exc).__name__}: {exc}); "
            f"results are kept in {outcome.run_dir}"
        )
        failed = failed or ExitCode.INTERNAL
    _say(f"results saved in {outcome.run_dir}")
    if outcome.hung and settings.hang_action == "terminate":
        _say("the run hung and was ended (--hang-action terminate): see hang.txt in the "
             "results folder")
        return ExitCode.HANG
    if settings.distributed and returncode != 0:
        signum = _rank_signal(outcome.run_dir, outcome.status_path)
        if signum:
            returncode = -signum
    if returncode == 0 and failed is not None:
        return int(failed)
    return exit_like(returncode)


def _warn_disturbed_baseline(path: str) -> None:
    """A baseline recorded while the machine was disturbed: said when it is
    saved, since every gate against it will be inconclusive."""
    from .baseline import stored_disturbed

    flags = stored_disturbed(path)
    if flags:
        _say("warning: the baseline run's measurement was disturbed (gates against it give "
             "no verdict unless --ignore-disturbed):")
        for message in flags:
            _say(f"  - {message}")


def write_report_html(
    run_dir: str,
    report: Any = None,
    run: Any = None,
    comparison: Any = None,
    base_run: Any = None,
) -> Optional[str]:
    """Write `report.html` into the run folder at the end of a run: the page
    to `scp` to a laptop. It must never cost the run its result: any
    failure (a missing plotly, a full disk, a bug in the page) is one note
    on stderr, and the exit status is the one the run would have had."""
    if report is not None and not hasattr(report, "title"):
        return None  # the short no-torch report: nothing to draw
    try:
        from .report.html import write_run_html

        return write_run_html(run_dir, report, run, comparison, base_run)
    except Exception as exc:  # noqa: BLE001 - a note, never the run's failure
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        _say(f"note: report.html not written ({reason})")
        return None


def _check_baseline_first(settings: Settings) -> Optional[int]:
    """Before the script runs: a missing or unreadable baseline, or one
    recorded for another script, Python or world size (what is known
    before running), is refused now rather than after the whole run."""
    import platform

    from . import baseline as baseline_mod

    assert settings.baseline is not None
    try:
        base_run = baseline_mod.load(settings.baseline)
    except ResultsError as exc:
        _say(f"error: baseline: {exc}")
        return ExitCode.NO_MEASUREMENT if "no such" in str(exc) else ExitCode.BAD_RESULTS
    if settings.allow_env_mismatch:
        return None
    stored = baseline_mod.stored_fingerprint(settings.baseline, base_run)
    known: dict[str, Any] = {
        "script": settings.script or (f"-m {settings.module}" if settings.module else None),
        "python": platform.python_version(),
    }
    if settings.nproc_per_node is not None and str(settings.nnodes or "1").isdigit():
        known["world_size"] = settings.nproc_per_node * int(settings.nnodes or 1)
    elif not settings.distributed:
        known["world_size"] = 1
    differ = baseline_mod.mismatches({k: stored.get(k) for k in known}, known)
    if differ:
        _refuse_mismatch(differ, " (checked before running the script)")
        return ExitCode.CONFIG
    return None


def _refuse_mismatch(differ: list[str], when: str = "") -> None:
    _say(
        "error: the baseline was recorded in a different environment ("
        + "; ".join(differ)
        + f"); compare like with like, or pass --allow-env-mismatch{when}"
    )


def _os_reason(path: Optional[str], exc: OSError) -> str:
    return f"{path}: {exc.strerror or exc}" if path else str(exc.strerror or exc)


def writable_file_problem(path: str, what: str) -> Optional[str]:
    """Why `path` cannot be written as a file, or None: checked before the
    script runs, so a run is not spent on a report or baseline that could
    never be saved."""
    if os.path.isdir(path):
        return f"{what} {path} is a folder; give a file name"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{what} {path}: no such folder {folder}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{what} {path}: the folder {folder} is not writable"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{what} {path}: the file is not writable"
    return None


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
    perfrun.torchrun: a negative status is a signal, SIGKILL included), then
    the rank files (a rank that caught SIGTERM says so). When a rank raised,
    the others' SIGTERM is torchrun's own clean-up, not how the run ended."""
    import json

    from .launch import TORCHRUN_STATUS

    try:
        with open(status_path or os.path.join(run_dir, TORCHRUN_STATUS), encoding="utf-8") as f:
            status = json.load(f)
        first = status["failures"][status["first"]]["exitcode"]
        return -int(first) if int(first) < 0 else 0
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        run = read_run(run_dir)
    except ResultsError:
        return 0
    if any((rank.data.get("exit") or {}).get("exception") for rank in run.ranks):
        return 0
    for rank in run.ranks:
        signum = (rank.data.get("exit") or {}).get("signal")
        if signum:
            return int(signum)
    return 0


def _gated(settings: Settings, outcome: Any) -> int:
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
    report: Any = None
    sink: dict[str, Any] = {}
    if report_fmt is not None:
        try:
            report = render_run(outcome.run_dir, report_fmt, report_out, settings.warmup,
                                view_of(settings), sink=sink)
        except ResultsError as exc:
            _say(f"error: {exc}")
            failed = ExitCode.BAD_RESULTS
        except OSError as exc:
            _say(f"error: could not write the report: {_os_reason(report_out, exc)}")
            failed = ExitCode.CONFIG
    _say(f"results saved in {outcome.run_dir}")
    if outcome.returncode != 0:
        _say(f"gate: the script exited with status {outcome.returncode}: no measurement to compare")
        return ExitCode.NO_MEASUREMENT
    threshold = settings.max_regression
    if threshold is None:
        # As `perfrun compare`: a gate needs a threshold.
        _say("not gated: no --max-regression given (e.g. --max-regression 5%); comparison only")
    assert settings.baseline is not None
    code = compare(
        settings.baseline,
        outcome.run_dir,
        threshold=threshold,
        fail_on_inconclusive=settings.fail_on_inconclusive,
        allow_env_mismatch=settings.allow_env_mismatch,
        fmt=fmt if fmt in ("table", "markdown", "json", "junit") else "table",
        output=output if fmt == "junit" else None,
        warmup=settings.warmup,
        sink=sink,
        ignore_disturbed=settings.ignore_disturbed,
    )
    # The page of a gated run holds the comparison too, when there was one.
    if "comparison" in sink:
        write_report_html(outcome.run_dir, sink["comparison"].current_report,
                          sink["current_run"], sink["comparison"], sink["base_run"])
    else:
        write_report_html(outcome.run_dir, report, sink.get("run"))
    return code if code != ExitCode.OK or failed is None else failed


def compare(
    baseline: str,
    current: str,
    threshold: Optional[float] = None,
    fail_on_inconclusive: bool = False,
    allow_env_mismatch: bool = False,
    fmt: str = "table",
    output: Optional[str] = None,
    warmup: Optional[int] = None,
    sink: Optional[dict[str, Any]] = None,
    ignore_disturbed: bool = False,
) -> int:
    """`perfrun compare`, and the gate of a gated run. `sink`, when given,
    receives the comparison and both runs (for the gated run's page).
    A run whose measurement was disturbed gives no verdict: exit 0 with a
    warning, or 73 (DISTURBED) with `fail_on_inconclusive`, never 68;
    `ignore_disturbed` gates it all the same."""
    if output is not None:
        problem = writable_file_problem(output, "--output")
        if problem:
            _say(f"error: {problem}")
            return ExitCode.CONFIG
    from . import baseline as baseline_mod
    from .compare import compare_runs
    from .gate import Verdict
    from .report.compare_out import render_comparison, verdict_line

    try:
        base_run = baseline_mod.load(baseline)
    except ResultsError as exc:
        _say(f"error: baseline: {exc}")
        return ExitCode.NO_MEASUREMENT if "no such" in str(exc) else ExitCode.BAD_RESULTS
    try:
        current_run = baseline_mod.load(current)
    except ResultsError as exc:
        _say(f"error: current run: {exc}")
        return ExitCode.BAD_RESULTS
    base_fp = baseline_mod.stored_fingerprint(baseline, base_run)
    current_fp = baseline_mod.fingerprint(current_run)
    mismatches = baseline_mod.mismatches(base_fp, current_fp)
    if mismatches and threshold is not None and not allow_env_mismatch:
        _refuse_mismatch(mismatches)
        return ExitCode.CONFIG
    comparison = compare_runs(
        base_run,
        current_run,
        threshold,
        baseline,
        current,
        warmup=warmup,
        mismatches=mismatches,
        base_history=baseline_mod.load_history(baseline),
        ignore_disturbed=ignore_disturbed,
    )
    if sink is not None:
        sink.update(comparison=comparison, base_run=base_run, current_run=current_run)
    with _destination(output) as stream:
        if fmt == "html":
            from .report.html import render_comparison_html

            stream.write(render_comparison_html(comparison, base_run, current_run))
            stream.flush()
        else:
            render_comparison(comparison, fmt, stream)
    # Workflow commands go to stdout, unless stdout carries a document a
    # machine will parse; the runner reads them from stderr too.
    machine = fmt in ("json", "junit", "html") and output is None
    _github_actions(comparison, verdict_line(comparison), sys.stderr if machine else sys.stdout)
    if comparison.problem:
        return ExitCode.NO_MEASUREMENT
    if comparison.gate is None:
        return ExitCode.OK
    verdict = comparison.gate.verdict
    if verdict == Verdict.FAIL:
        return ExitCode.REGRESSION
    if verdict == Verdict.INCONCLUSIVE and comparison.gate.ratio is None:
        # Not noise: nothing to decide on (too few steady steps). A gate
        # that can never decide must not pass forever.
        _say(f"error: gate: {comparison.gate.reason}")
        return ExitCode.NO_MEASUREMENT
    if verdict == Verdict.INCONCLUSIVE and comparison.gate.disturbed:
        return _disturbed_exit(comparison.gate, fail_on_inconclusive)
    if verdict == Verdict.INCONCLUSIVE:
        _say(f"warning: gate inconclusive: {comparison.gate.reason}")
        return ExitCode.INCONCLUSIVE if fail_on_inconclusive else ExitCode.OK
    return ExitCode.OK


def _disturbed_exit(gate: Any, fail_on_inconclusive: bool) -> int:
    """A disturbed run's gate: loud, one flag a line, and never a
    regression. 73 only when inconclusive verdicts are to fail CI."""
    undisturbed = gate.undisturbed.value.upper() if gate.undisturbed else "?"
    _say(f"warning: gate inconclusive: the measurement was disturbed (the step times alone "
         f"gave {undisturbed}); not judged:")
    for flag in gate.disturbed:
        _say(f"  - {flag}")
    _say("rerun on a quiet machine, or pass --ignore-disturbed where the machine is always "
         "shared")
    return ExitCode.DISTURBED if fail_on_inconclusive else ExitCode.OK


def _github_actions(comparison: Any, line: str, stream: IO[str]) -> None:
    """On GitHub Actions: the comparison in the job summary, a regression as
    an error annotation."""
    if os.environ.get("GITHUB_ACTIONS") != "true":
        return
    from .gate import Verdict
    from .report.compare_out import comparison_blocks
    from .report.markdown import render_markdown_blocks

    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(render_markdown_blocks(comparison_blocks(comparison)) + "\n")
        except OSError as exc:
            _say(f"could not write the job summary: {exc}")
    gate = comparison.gate
    text = line.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if comparison.problem or (gate is not None and gate.verdict == Verdict.FAIL):
        stream.write(f"::error title=perfrun performance gate::{text}\n")
    elif gate is not None and gate.verdict == Verdict.INCONCLUSIVE:
        stream.write(f"::warning title=perfrun performance gate::{text}\n")
    stream.flush()


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
    if output is not None:
        problem = writable_file_problem(output, "--output")
        if problem:
            _say(f"error: {problem}")
            return ExitCode.CONFIG
    run_dir = resolve_run_dir(path)
    try:
        report = render_run(run_dir, fmt, output, warmup, view)
    except ResultsError as exc:
        _say(f"error: {exc}")
        return ExitCode.BAD_RESULTS
    except OSError as exc:
        _say(f"error: could not write the report: {_os_reason(output, exc)}")
        return ExitCode.CONFIG
    if getattr(report, "problem", None):
        return ExitCode.NO_MEASUREMENT
    return ExitCode.OK


def analyze(
    paths: list[str],
    fmt: str = "table",
    output: Optional[str] = None,
    view: Optional[dict[str, Any]] = None,
) -> int:
    """`perfrun analyze`: the window tables of torch.profiler traces a user
    already has, one file per rank, computed as the window computes its own.
    Exit 66 when a trace cannot be read."""
    from .analysis.trace import summarize
    from .analysis.tracefile import TraceError, load_trace
    from .analysis.window import trace_window_report
    from .report.common import LinesBlock, TitleBlock
    from .report.window_blocks import window_blocks

    if output is not None:
        problem = writable_file_problem(output, "--output")
        if problem:
            _say(f"error: {problem}")
            return ExitCode.CONFIG
    loaded = []
    for path in paths:
        try:
            loaded.append(load_trace(path))
        except TraceError as exc:
            _say(f"error: {exc}")
            return ExitCode.BAD_RESULTS
    ranks = [t.rank for t in loaded]
    if None in ranks or len(set(ranks)) != len(ranks):
        ranks = list(range(len(loaded)))  # the files' order
    traces = []
    notes = []
    for rank, trace in zip(ranks, loaded):
        summary = summarize(trace.events)
        traces.append((int(rank), os.path.basename(trace.path), summary))
        if trace.skipped:
            notes.append(f"{trace.path}: {trace.skipped} malformed events skipped")
        if not trace.events:
            notes.append(f"{trace.path}: no events")
    window = trace_window_report(traces)
    view = dict(view or {})
    with _destination(output) as stream:
        if fmt == "json":
            import json

            from .report.jsonout import finite

            doc = {
                "format": "perfrun-analyze",
                "version": 1,
                "traces": [
                    {"path": t.path, "rank": r, "summary": s}
                    for t, (r, _n, s) in zip(loaded, traces)
                ],
                "notes": notes,
            }
            stream.write(json.dumps(finite(doc), indent=2, sort_keys=True, allow_nan=False) + "\n")
        else:
            items = [
                TitleBlock(
                    "perfrun analyze",
                    [("Traces", ", ".join(f"rank {r}: {t.path}" for t, (r, _n, _s)
                                          in zip(loaded, traces)))],
                    code_labels=("Traces",),
                ),
                *window_blocks(window, view, lambda _key: True),
            ]
            if notes:
                items.append(LinesBlock("notes", "Notes", notes))
            if fmt == "markdown":
                from .report.markdown import render_markdown_blocks

                stream.write(render_markdown_blocks(items))
            else:
                from .report.table import make_console, render_blocks

                render_blocks(items, make_console(stream))
        stream.flush()
    if output is not None:
        _say(f"report written to {output}")
    return ExitCode.OK


def combine(paths: list[str], output: Optional[str] = None) -> int:
    """`perfrun combine`: merge the run folders of one job, copied from its
    nodes, into a new folder (perfrun/combine.py decides what goes in).
    Exit 66 when a folder cannot be read, 71 when they are different jobs'
    runs, 64 when the output folder exists or cannot be written."""
    from . import combine as combining

    if output is not None and os.path.exists(output) and not (
        os.path.isdir(output) and not os.listdir(output)
    ):
        _say(f"error: {output} already exists; combine writes a new folder: give another -o "
             "or remove it first")
        return ExitCode.CONFIG
    sources = []
    seen = set()
    try:
        for path in paths:
            run_dir = resolve_run_dir(path)
            real = os.path.realpath(run_dir)
            if real in seen:
                continue  # the same folder given twice is one folder
            seen.add(real)
            sources.append(combining.read_source(run_dir))
    except combining.CombineError as exc:
        _say(f"error: {exc}")
        return exc.code
    problem = combining.mixed_jobs([combining.facts_of(s) for s in sources])
    if problem:
        _say(f"error: cannot combine: {problem}")
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
        _say(f"error: cannot write {output}: {exc.strerror or exc}")
        return ExitCode.CONFIG
    for line in combining.outcome_lines(plan, len(sources), output):
        _say(line)
    _say(f"see it with: perfrun report {output}")
    return ExitCode.OK
