"""perfrun on real training loops: real torch on CPU, real subprocesses.

Each test profiles one of the small scripts in tests/scripts and checks the
rank file it leaves: exact step counts and per-step call counts for the loop
shapes the step rules name (DataLoader or not, optimizer or hand-written
update, gradient accumulation, LBFGS closures, inference, validation
passes), phases landing where the time was really spent, and the options
that change a run (`--batch-size`, `--stop-after`, `--scheduler`,
`--timer-only`). Every run also goes through `check_run`, which holds every
rank file and report to the invariants any run must satisfy.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import PerfrunRun, RunPerfrun

from perfrun.analysis.stats import default_warmup
from perfrun.exitcodes import ExitCode
from perfrun.store.rankfile import RankResult
from perfrun.store.stepfile import COL, PHASES

SCRIPTS = Path(__file__).parent / "scripts"
LOADER = str(SCRIPTS / "train_loader.py")
TENSORS = str(SCRIPTS / "train_tensors.py")
LBFGS = str(SCRIPTS / "train_lbfgs.py")
INFER = str(SCRIPTS / "infer_loader.py")
WITH_EVAL = str(SCRIPTS / "train_with_eval.py")
TIMED = str(SCRIPTS / "timed_phases.py")
NO_TORCH = str(SCRIPTS / "no_torch.py")

#: Start and end are stored rounded to 0.1 us; sums of phases carry float noise.
TOLERANCE = 1e-6

CALL_COLUMNS = ("dataloader_calls", "forward_calls", "backward_calls", "optimization_calls")

pytestmark = pytest.mark.slow


# -- invariants every run satisfies ------------------------------------------------


def step_time(row: list[Any]) -> float:
    return row[COL["end"]] - row[COL["start"]] - row[COL["excluded"]]


def others(row: list[Any]) -> float:
    return step_time(row) - sum(row[COL[p]] for p in PHASES)


def calls(row: list[Any]) -> tuple[int, ...]:
    return tuple(row[COL[c]] for c in CALL_COLUMNS)


def check_rank(rank: RankResult) -> None:
    """Each step is made of its four phases plus a non-negative Others
    (end - start - excluded == dataloader + forward + backward +
    optimization + others, others >= 0); steps follow one another without
    overlapping; perfrun's hooks never failed."""
    assert rank.data["faults"] == []
    previous_end = None
    for i, row in enumerate(rank.rows):
        assert row[COL["start"]] <= row[COL["end"]], (i, row)
        assert row[COL["excluded"]] >= 0.0, (i, row)
        for phase in PHASES:
            assert row[COL[phase]] >= 0.0, (i, phase, row)
        assert others(row) >= -TOLERANCE, (i, others(row), row)
        if previous_end is not None:
            assert row[COL["start"]] >= previous_end - TOLERANCE, (i, row)
        previous_end = row[COL["end"]]


def check_spread(stats: dict[str, Any], name: str) -> None:
    assert stats["min"] is not None, name
    assert stats["min"] <= stats["avg"] <= stats["max"], (name, stats)
    if "median" in stats:
        assert stats["min"] <= stats["median"] <= stats["max"], (name, stats)


def counted_rows(rank: RankResult, title: dict[str, Any]) -> list[list[Any]]:
    """The steps the report summarises: after warm-up, outside an excluded
    detailed window, and not the step that ran under the FLOP counter."""
    profiled = title.get("profiled") or title["window"]
    start, end = profiled if profiled and title["window_excluded"] else (0, 0)
    flops = (rank.data.get("flops") or {}).get("step")
    return [row for i, row in enumerate(rank.rows)
            if i >= title["warmup"] and not start <= i < end and i != flops]


def check_report(report: dict[str, Any], rank: RankResult) -> None:
    """The JSON report agrees with itself and with the rank file: phases plus
    Others add up to ProfileStep, and every spread is ordered."""
    assert report["format"] == "perfrun-report"
    assert report["problem"] is None
    assert report["problems"] == []
    rows = counted_rows(rank, report["title"])
    perf = report["perf"]
    assert perf["steps"] == report["title"]["steps_counted"] == len(rows) > 0
    for key in ("reader_cost", "batch_cost", "ips"):
        check_spread(perf[key], key)
    if perf["samples_ips"] is not None:
        check_spread(perf["samples_ips"], "samples_ips")
    model = report["model"]
    assert model["overshoot_steps"] == 0
    totals = {row["name"]: row["cpu"]["total"] for row in model["rows"]}
    parts = ("Dataloader", "Forward", "Backward", "Optimization", "Others")
    assert sum(totals[p] for p in parts) == pytest.approx(totals["ProfileStep"], abs=TOLERANCE)
    assert totals["ProfileStep"] == pytest.approx(perf["batch_cost"]["total"], abs=TOLERANCE)
    assert totals["ProfileStep"] == pytest.approx(sum(map(step_time, rows)), abs=TOLERANCE)
    assert totals["Others"] == pytest.approx(sum(map(others, rows)), abs=TOLERANCE)
    for phase in PHASES:
        expected = sum(row[COL[phase]] for row in rows)
        assert totals[phase.capitalize()] == pytest.approx(expected, abs=TOLERANCE), phase


def check_run(run: PerfrunRun, steps: int) -> RankResult:
    """A run that exited 0, wrote exactly `steps` steps and passes every
    invariant, in its rank file and in its JSON report. Returns the rank
    file."""
    assert run.returncode == 0, run.describe()
    rank = run.rank0()
    assert len(rank.rows) == steps, run.describe()
    check_rank(rank)
    report = run.report()
    assert report["title"]["steps_recorded"] == steps
    check_report(report, rank)
    return rank


# -- loop shapes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "args", "steps", "per_step_calls", "samples"),
    [
        # 22 samples in batches of 5, two epochs: each step's samples are
        # read from its own batch, the short last one included.
        pytest.param(
            LOADER,
            ["--samples", "22", "--batch", "5"],
            10,
            (1, 1, 1, 2),
            [5, 5, 5, 5, 2] * 2,
            id="dataloader-optimizer",
        ),
        pytest.param(
            LOADER, ["--update", "manual"], 12, (1, 1, 1, 0), [4] * 12, id="dataloader-manual"
        ),
        pytest.param(TENSORS, [], 8, (0, 1, 1, 2), None, id="tensors-optimizer"),
        # The loss module is a second top-level forward; it must not start a
        # step of its own.
        pytest.param(
            TENSORS,
            ["--update", "manual", "--loss-module"],
            8,
            (0, 2, 1, 0),
            None,
            id="tensors-manual-loss-module",
        ),
    ],
)
def test_loop_shapes_exact_steps(
    run_perfrun: RunPerfrun,
    script: str,
    args: list[str],
    steps: int,
    per_step_calls: tuple[int, ...],
    samples: list[int] | None,
) -> None:
    """With and without a DataLoader, with torch.optim or a hand-written SGD
    update: one step per optimizer update (per batch without an optimizer)."""
    run = run_perfrun(script, *args)
    rank = check_run(run, steps)
    assert [calls(r) for r in rank.rows] == [per_step_calls] * steps
    samples_ips = run.report()["perf"]["samples_ips"]
    if samples is not None:
        assert rank.column("samples") == samples
        assert samples_ips is not None
    else:
        # No DataLoader: nothing to infer the batch size from.
        assert not any(rank.column("samples"))
        assert samples_ips is None
    assert rank.status == "finished"
    assert rank.data["extra"]["eval"]["calls"] == 0


@pytest.mark.parametrize(("mode", "loader"), [
    (["--timer-only"], []),
    ([], ["--workers", "2", "--persistent"]),
], ids=["timer-only", "persistent-workers"])
def test_every_epochs_steps_count_their_samples(
    run_perfrun: RunPerfrun, mode: list[str], loader: list[str]
) -> None:
    """Two epochs of a DataLoader whose iterators share one id: in
    --timer-only each epoch's iterator is made at the address the last one
    was freed from; with persistent workers the loader gives every epoch
    the same iterator object. Its first fetch is no second fetch of the
    exhausted run. Before, that epoch's first step counted no samples and
    its batches each the step after theirs, so the run had no samples/s."""
    run = run_perfrun(*mode, LOADER, "--samples", "22", "--batch", "5", *loader)
    rank = check_run(run, 10)
    assert rank.column("samples") == [5, 5, 5, 5, 2] * 2
    assert run.report()["perf"]["samples_ips"] is not None


def test_gradient_accumulation_with_dataloader(run_perfrun: RunPerfrun) -> None:
    # 24 samples in batches of 4: 6 micro-batches per epoch, 2 optimizer
    # steps of 3 micro-batches each, over 2 epochs.
    rank = check_run(run_perfrun(LOADER, "--accum", "3"), 4)
    assert [calls(r) for r in rank.rows] == [(3, 3, 3, 2)] * 4
    assert rank.column("samples") == [12] * 4


def test_gradient_accumulation_without_dataloader(run_perfrun: RunPerfrun) -> None:
    rank = check_run(run_perfrun(TENSORS, "--accum", "3", "--steps", "5"), 5)
    assert [calls(r) for r in rank.rows] == [(0, 3, 3, 2)] * 5


def test_lbfgs_closure_steps(run_perfrun: RunPerfrun) -> None:
    """optimizer.step(closure) is one step however many times the closure
    runs; the forward and backward inside it are counted as such and taken
    out of Optimization (counted twice, they would overrun the step and fail
    check_run)."""
    run = run_perfrun(LBFGS, "--steps", "6")
    rank = check_run(run, 6)
    closure_calls = [int(n) for n in re.findall(r"closure calls (\d+)", run.out)]
    assert len(closure_calls) == 6, run.out
    assert rank.column("forward_calls") == closure_calls
    assert rank.column("backward_calls") == closure_calls
    # The step itself plus the zero_grad each closure makes.
    assert rank.column("optimization_calls") == [1 + n for n in closure_calls]
    assert rank.column("dataloader_calls") == [0] * 6
    for row in rank.rows:
        assert row[COL["forward"]] > 0.0
        assert row[COL["backward"]] > 0.0
        assert row[COL["optimization"]] > 0.0


def test_inference_loop(run_perfrun: RunPerfrun) -> None:
    """An inference script has no training to tell evaluation apart from:
    its no_grad loop is the measured loop, one step per batch."""
    run = run_perfrun(INFER, "--samples", "40", "--batch", "8")
    rank = check_run(run, 5)
    assert [calls(r) for r in rank.rows] == [(1, 1, 0, 0)] * 5
    assert rank.column("samples") == [8] * 5
    assert rank.data["extra"]["eval"]["calls"] == 0
    # Said for what it is: no training was seen.
    assert run.report()["title"]["forward_only"] is True


def test_validation_pass_is_not_a_step(run_perfrun: RunPerfrun) -> None:
    # 48 samples in batches of 4: 12 steps; a validation pass of 3 batches
    # after every 4th step.
    run = run_perfrun(
        WITH_EVAL, "--samples", "48", "--batch", "4", "--eval-every", "4", "--val-batches", "3"
    )
    rank = check_run(run, 12)
    assert run.out.count("val loss") == 3
    assert [calls(r) for r in rank.rows] == [(1, 1, 1, 2)] * 12
    # Validation batches are not training samples.
    assert rank.column("samples") == [4] * 12
    evaluation = rank.data["extra"]["eval"]
    assert evaluation["calls"] == 3
    assert evaluation["forward_calls"] == 9
    assert evaluation["time"] > 0.0
    # The passes are cut out of the steps they fell in, and only those.
    excluded = rank.column("excluded")
    assert [i for i, e in enumerate(excluded) if e > 0.0] == [3, 7, 11]
    assert sum(excluded) >= evaluation["time"] - TOLERANCE
    extras = {e["name"]: e for e in run.report()["extras"]}
    assert extras["Eval"]["calls"] == 3


# -- time lands where it was spent -------------------------------------------------------


def test_phase_times_match_known_costs(run_perfrun: RunPerfrun) -> None:
    """The Dataset sleeps 20 ms per batch and the forward busy-waits 30 ms:
    per-step medians land in Dataloader and Forward, within generous bounds."""
    sleep, busy = 0.020, 0.030
    rank = check_run(run_perfrun(TIMED, "--steps", "8", "--sleep-ms", "20", "--busy-ms", "30"), 8)

    def median(name: str) -> float:
        return statistics.median(rank.column(name))

    assert 0.8 * sleep <= median("dataloader") <= 3 * sleep
    assert 0.8 * busy <= median("forward") <= 3 * busy
    # Neither cost leaks into the other phases or into Others.
    assert median("backward") < 0.8 * sleep
    assert median("optimization") < 0.8 * sleep
    assert statistics.median(others(r) for r in rank.rows) < 0.8 * sleep
    assert rank.column("samples") == [6] * 8


# -- samples per step ----------------------------------------------------------------------
# (Inferred from each batch: see test_loop_shapes_exact_steps.)


def test_batch_size_option_overrides_inference(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun("--batch-size", "7", LOADER, "--update", "manual")
    rank = check_run(run, 12)
    assert rank.column("samples") == [7] * 12
    perf = run.report()["perf"]
    assert perf["samples_ips"]["avg"] == pytest.approx(7 * perf["ips"]["avg"], rel=1e-9)


# -- options that change the run -------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "args", "last_line", "not_printed"),
    [
        pytest.param(TENSORS, ["--steps", "1000"], "step 4:", "step 5:", id="tensors"),
        # 6 batches per epoch: the stop comes inside the first epoch.
        pytest.param(LOADER, ["--update", "manual"], None, "epoch 0", id="dataloader-manual"),
    ],
)
def test_stop_after(
    run_perfrun: RunPerfrun,
    script: str,
    args: list[str],
    last_line: str | None,
    not_printed: str,
) -> None:
    run = run_perfrun("--stop-after", "5", script, *args)
    rank = check_run(run, 5)
    assert rank.status == "stopped"
    assert rank.data["exit"]["exception"] is None
    if last_line is not None:
        assert last_line in run.out
    assert not_printed not in run.out
    assert "done" not in run.out


def test_scheduler_window_is_recorded(run_perfrun: RunPerfrun) -> None:
    # Given after the script: perfrun's long options may follow it, and the
    # script's own `--steps` still reaches the script.
    run = run_perfrun(TENSORS, "--scheduler", "3", "6", "--steps", "10", "--update", "manual")
    rank = check_run(run, 10)
    assert rank.data["window"] == [3, 6]
    assert rank.data["settings"]["scheduler"] == [3, 6]
    title = run.report()["title"]
    assert title["window"] == [3, 6]
    # Warm-up (1 step of 10), the profiler's own warm-up step (2, profiled
    # with its events discarded), the 3 window steps and the step the FLOPs
    # were counted on (1) are left out.
    assert rank.data["profiled"] == [2, 6]
    assert rank.data["flops"]["step"] == 1
    assert title["steps_counted"] == 10 - default_warmup(10) - 1 - 3 - 1


@pytest.mark.parametrize(
    "window",
    [("6", "3"), ("3", "3"), ("-1", "5"), ("2", "-4")],
    ids=["end-before-start", "empty", "negative-start", "negative-end"],
)
def test_bad_scheduler_window_is_a_config_error(
    run_perfrun: RunPerfrun, window: tuple[str, str]
) -> None:
    run = run_perfrun("--scheduler", *window, TENSORS, json_report=False)
    assert run.returncode == ExitCode.CONFIG == 64, run.describe()
    lines = run.err.splitlines()
    assert len(lines) == 1, run.describe()
    assert lines[0].startswith("perfrun: error: scheduler"), run.describe()
    assert "Traceback" not in run.err
    # Refused before the script ran: it printed nothing, no run was saved.
    assert run.out == ""
    assert not run.log_dir.exists()


def test_timer_only_prints_perf_summary(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun("--timer-only", LOADER, "--update", "manual", json_report=False)
    rank = check_run(run, 12)
    assert rank.data["settings"]["timer_only"] is True
    tables = run.out[run.out.index("Perf Summary") :]
    for name in ("reader_cost", "batch_cost", "ips"):
        assert re.search(rf"^\s*{name}\s+\d", tables, re.MULTILINE), tables
    assert f"warm-up steps excluded: {default_warmup(12)}" in tables


def test_dataloader_workers_write_one_rank_file(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun(LOADER, "--workers", "2")
    rank = check_run(run, 12)
    assert [calls(r) for r in rank.rows] == [(1, 1, 1, 2)] * 12
    assert rank.column("samples") == [4] * 12
    files = sorted(p.name for p in run.run_dir.iterdir())
    # The workers' batch tables (the Data Pipeline) are the only files of theirs.
    assert files == ["pipeline", "rank0.json", "rank0.steps", "report.html", "run.json",
                     "settings.json"]
    assert sorted(p.name for p in run.log_dir.iterdir()) == sorted(["latest", run.run_dir.name])
    # Workers are not ranks: perfrun says nothing from inside them.
    said = [line.split(" ")[:3] for line in run.err.splitlines() if line.startswith("perfrun")]
    assert said == [
        ["perfrun:", "profiling", str(SCRIPTS / "train_loader.py") + ";"],
        ["perfrun:", "report", "written"],
        ["perfrun:", "results", "saved"],
    ], (
        run.describe()
    )


# -- what is printed -------------------------------------------------------------------------


def test_script_stdout_comes_first_and_unchanged(
    run_perfrun: RunPerfrun, run_python: Callable[..., bytes]
) -> None:
    direct = run_python(LOADER, "--update", "manual")
    assert direct.startswith(b"epoch 0: loss ")
    run = run_perfrun(LOADER, "--update", "manual", json_report=False)
    check_run(run, 12)
    assert run.stdout[: len(direct)] == direct
    assert b"Perf Summary" in run.stdout[len(direct) :]


def test_script_without_torch(run_perfrun: RunPerfrun, run_python: Callable[..., bytes]) -> None:
    direct = run_python(NO_TORCH)
    run = run_perfrun(NO_TORCH, json_report=False)
    assert run.returncode == 0, run.describe()
    assert run.stdout.startswith(direct)
    assert "no PyTorch training loop was seen" in run.out[len(direct) :]
    rank = run.rank0()
    assert rank.rows == []
    assert rank.data["torch_imported"] is False
    assert rank.status == "finished"

    as_json = run_perfrun(NO_TORCH)
    assert as_json.returncode == 0, as_json.describe()
    report = as_json.report()
    assert "no PyTorch training loop was seen" in report["problem"]
    assert report["perf"] is None
