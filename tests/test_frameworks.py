"""perfrun on real training frameworks: the Hugging Face Trainer, Lightning
(automatic and manual optimization), Accelerate, and a plain loop whose
optimizer step takes a closure, on the CPU, in real subprocesses.

Each script in tests/frameworks trains a tiny model built from a config or
from Linear layers, on synthetic data (nothing is downloaded), for 80 to 160
optimizer steps, the way that framework's own docs write the loop, with
evaluation passes along the way, and prints last one line
`FRAMEWORK_COUNTS {json}`: the framework's own counts of optimizer steps,
evaluation passes and batches, samples per micro-batch and micro-batches
per step. Every batch costs the same fixed CPU work in its collate function,
so the Reader Ratio is a property of the script, not of the run (its spread
over 5 runs of each script is under 1.1 points).

`test_framework[stack]` runs its stack three times: `python script.py`,
`perfrun script.py`, and `perfrun --scheduler A B script.py` with the
window ten steps before the end, one after the other (runs side by side
would load the machine more, and unevenly once their start-up drifts
apart). Then each check is a subtest, so that one failing check does not
hide the others:

a. the script prints the same under perfrun as under python (timings aside)
   and exits 0;
b. perfrun records exactly the framework's optimizer steps;
c. every step is its phases plus a non-negative Others (check_rank);
d. evaluation is neither steps nor samples, and the Eval extra counts the
   framework's evaluation passes and batches;
e. a detailed window changes neither the Reader Ratio nor the advice: the
   window run's Reader Ratio is its own timer's, over its step rows with
   the profiled steps left out; perfrun's own work at the window's edges
   is out of every step; and the window run has no advice the run without
   it lacks;
f. in the window, the Overview and the Model Summary agree on each phase's
   calls and time.

e holds the window run's Reader Ratio to its own rows, not to the other
run's: the Reader Ratios of two whole runs differed by 3 to 5 points on a
busy machine (19.8% against 16.9%, 27.3% against 21.9%), each run's share
set by where the time slices it loses land; for the same reason a verdict
on a share within a few points of its threshold may differ between the two
runs. e's advice and f (two clocks of one run) may still meet the load:
when the first pair fails either, a second pair (perfrun, perfrun with a
window) is run and the check fails only if it fails there too, with both
pairs' figures: a fault of perfrun's shows in every pair.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from conftest import PerfrunRun, RunPerfrun, e2e_environment
from oracle import step_time
from test_e2e_training import check_rank

from perfrun.store.stepfile import COL

pytestmark = pytest.mark.slow

FRAMEWORKS = Path(__file__).parent / "frameworks"

#: What the scripts' environment adds to e2e_environment(): nothing is
#: downloaded, nothing draws progress bars, one OpenMP thread.
FRAMEWORK_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_DISABLE": "1",
    "OMP_NUM_THREADS": "1",
}

#: Float noise in a ratio of sums over a hundred-odd steps, and in a sum
#: of times stored to 0.1 us.
RATIO_SLACK = 1e-9
FLOAT_SLACK = 1e-6
#: Window Overview against window Model Summary, per phase.
TIME_REL_TOLERANCE = 0.05
TIME_ABS_TOLERANCE = 50e-6
#: The two read their clocks a few Python statements apart at each edge
#: (perfrun's reading, then the profiler's range), so a time slice the
#: process loses between them shows in one and not the other: on this
#: 2-core machine, with pytest -n auto running other tests beside, 0.6 to
#: 2.1 ms over the 10 forward calls of a Lightning window. Allowed per call.
TIME_PER_CALL_TOLERANCE = 300e-6

PHASE_ROWS = ("Dataloader", "Forward", "Backward", "Optimization")


@dataclass(frozen=True)
class Stack:
    id: str
    script: str
    #: Modules the script imports; the stack is skipped without them.
    needs: tuple[str, ...]
    #: The detailed window, [start, end): ten steps before the end.
    window: tuple[int, int]

    @property
    def path(self) -> str:
        return str(FRAMEWORKS / self.script)


STACKS = [
    Stack("hf-trainer", "hf_trainer.py", ("transformers", "accelerate"), (65, 70)),
    Stack("lightning-auto", "lightning_auto.py", ("lightning",), (145, 150)),
    Stack("lightning-manual", "lightning_manual.py", ("lightning",), (85, 90)),
    Stack("accelerate", "accelerate_loop.py", ("accelerate",), (145, 150)),
    Stack("plain-closure", "plain_closure.py", (), (145, 150)),
]


# -- the runs -------------------------------------------------------------------


COUNTS_PREFIX = "FRAMEWORK_COUNTS "

#: Values in the Trainer's log lines that are timings ('train_runtime': '1.178',
#: 'eval_samples_per_second': '1335'): replaced before comparing outputs.
TIMING_VALUE = re.compile(
    r"""(['"]\w*(?:runtime|per_second)['"]:\s*)"""  # the key
    r"""('[^']*'|"[^"]*"|[-+.\deE]+)"""  # its value, quoted or not
)


def framework_counts(stdout: bytes) -> dict[str, int]:
    lines = [
        line[len(COUNTS_PREFIX) :]
        for line in stdout.decode("utf-8", "replace").splitlines()
        if line.startswith(COUNTS_PREFIX)
    ]
    assert len(lines) == 1, stdout.decode("utf-8", "replace")
    counts: dict[str, int] = json.loads(lines[0])
    return counts


def comparable_lines(stdout: bytes) -> list[str]:
    """The script's output without its FRAMEWORK_COUNTS line and with
    timings masked: what must not change under perfrun."""
    return [
        TIMING_VALUE.sub(r"\1<time>", line)
        for line in stdout.decode("utf-8", "replace").splitlines()
        if not line.startswith(COUNTS_PREFIX)
    ]


@dataclass
class StackRuns:
    direct: bytes
    plain: PerfrunRun
    window: PerfrunRun

    @property
    def counts(self) -> dict[str, int]:
        return framework_counts(self.direct)

    def perfrun_runs(self) -> list[tuple[str, PerfrunRun]]:
        return [("plain", self.plain), ("window", self.window)]


@pytest.fixture
def framework_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """FRAMEWORK_ENV set in this process too, so that `run_python` (which
    copies os.environ) and `run_perfrun` give the scripts the same
    environment."""
    for key, value in FRAMEWORK_ENV.items():
        monkeypatch.setenv(key, value)
    return e2e_environment()


def finished(run: PerfrunRun) -> PerfrunRun:
    assert run.returncode == 0, run.describe()
    return run


# -- a. the script runs as under python -----------------------------------------------


def check_output_same_as_python(stack: Stack, runs: StackRuns) -> None:
    expected = comparable_lines(runs.direct)
    assert expected, runs.direct
    for name, run in runs.perfrun_runs():
        assert run.returncode == 0, run.describe()
        # With --format json --output, everything on stdout is the script's.
        assert comparable_lines(run.stdout) == expected, (name, run.describe())


# -- b. one step per optimizer step --------------------------------------------------


def check_steps_are_optimizer_steps(stack: Stack, runs: StackRuns) -> None:
    expected = runs.counts["optimizer_steps"]
    for name, run in runs.perfrun_runs():
        finished(run)
        recorded = len(run.rank0().rows)
        title = run.report()["title"]
        assert (recorded, title["steps_recorded"]) == (expected, expected), (
            f"{name} run: perfrun recorded {recorded} steps (report: "
            f"{title['steps_recorded']}), the framework counted {expected} optimizer steps"
        )


# -- c. phases plus Others make the step -----------------------------------------------


def check_phases_add_up(stack: Stack, runs: StackRuns) -> None:
    for _name, run in runs.perfrun_runs():
        check_rank(finished(run).rank0())


# -- d. evaluation is not steps, not samples -----------------------------------------------


def check_evaluation_outside_steps(stack: Stack, runs: StackRuns) -> None:
    counts = runs.counts
    samples = counts["optimizer_steps"] * counts["train_batch_size"] * counts["accumulation"]
    for name, run in runs.perfrun_runs():
        rank = finished(run).rank0()
        recorded = sum(row[COL["samples"]] for row in rank.rows)
        evaluation = rank.data["extra"]["eval"]
        seen = {
            "samples": recorded,
            "passes": evaluation.get("passes"),
            "batches": evaluation.get("batches"),
            "calls": evaluation["calls"],
        }
        assert seen == {
            "samples": samples,
            "passes": counts["eval_passes"],
            "batches": counts["eval_batches"],
            "calls": counts["eval_passes"],
        }, (name, evaluation)
        # Each step counts the batches it trained on, also where the loader
        # fetches one batch ahead (accelerate, HF Trainer).
        per_step = {row[COL["samples"]] for row in rank.rows}
        assert per_step == {counts["train_batch_size"] * counts["accumulation"]}, (name, per_step)


# -- e. a window changes neither the Reader Ratio nor the advice ------------------------


def check_window_keeps_reader_ratio_and_advice(stack: Stack, runs: StackRuns) -> None:
    plain = finished(runs.plain).report()
    window = finished(runs.window).report()
    assert window["title"]["window"] == list(stack.window)
    # The window run's Reader Ratio is its timer's, over its own step rows
    # less the warm-up, the profiled steps (the profiler's warm-up step and
    # the window) and the FLOP-counted step: the window adds none of its
    # steps to it. Held to the run's own rows, not to the run without a
    # window: two whole runs on a busy machine differ by where the time
    # slices each loses land (3 to 5 points, one run against another).
    rank = runs.window.rank0()
    profiled = rank.data["profiled"]
    assert profiled == [stack.window[0] - 1, stack.window[1]], profiled
    warmup = window["title"]["warmup"]
    flops_step = (rank.data.get("flops") or {}).get("step")
    rows = [row for i, row in enumerate(rank.rows)
            if i >= warmup and not profiled[0] <= i < profiled[1] and i != flops_step]
    assert len(rows) == window["title"]["steps_counted"] == window["perf"]["steps"]
    fetching = math.fsum(row[COL["dataloader"]] for row in rows)
    ratio = fetching / math.fsum(step_time(row) for row in rows)
    assert window["perf"]["reader_ratio"] == pytest.approx(ratio, rel=RATIO_SLACK), (
        f"Reader Ratio {100 * window['perf']['reader_ratio']:.3f}% in the report, "
        f"{100 * ratio:.3f}% from the window run's rows outside {profiled}"
    )
    # perfrun's own work at the window's edges (the profiler's start, its
    # stop and the trace's export, 0.1 s and more) is set aside in the
    # steps it fell in, not left in their phases or their time.
    own = rank.data["extra"]["profiler"]
    set_aside = math.fsum(row[COL["excluded"]] or 0.0 for row in rank.rows)
    assert own["calls"] >= 2 and own["time"] > 0, own
    assert set_aside >= own["time"] - FLOAT_SLACK, (set_aside, own)
    kinds = {a["kind"] for a in plain["advice"]}
    # "unstable-timing" reads the spread of the run's own steps, which on a
    # shared 2-core machine is the load's (a 27 ms step among 5 ms ones
    # while other tests run): a verdict on the host, not on the window. A
    # share of the steps near its threshold lands either side of it from
    # one run to the next.
    added = [a for a in window["advice"] if a["kind"] not in kinds
             and a["kind"] != "unstable-timing" and not near_its_threshold(a)]
    assert added == [], (sorted(kinds), added)


#: How far apart two whole runs' shares of their steps (the Reader Ratio,
#: Others) land on a busy machine, in points: lightning-auto's Others was
#: 16.0% to 21.0% over four runs beside two busy processes (its threshold
#: 20%), its Reader Ratio 19.8% to 23.0%.
SHARE_SPREAD_POINTS = 5.0


def near_its_threshold(advice: dict) -> bool:
    """Advice on a share of the steps against a threshold (I/O-bound: the
    Reader Ratio; CPU-bound on a CPU-only run: Others), the share within
    SHARE_SPREAD_POINTS of it: a verdict another run could turn."""
    evidence = advice["evidence"]
    if advice["kind"] == "io-bound":
        share, limit = 100 * evidence["reader_ratio"], 100 * evidence["threshold"]
    elif advice["kind"] == "cpu-bound" and "others_ratio" in evidence and "gpus" not in evidence:
        share, limit = evidence["others_ratio"], evidence["threshold"]
    else:
        return False
    return abs(share - limit) <= SHARE_SPREAD_POINTS


# -- f. the window's Overview agrees with its Model Summary ------------------------------


def check_window_overview_matches_model(stack: Stack, runs: StackRuns) -> None:
    report = finished(runs.window).report()
    assert report["window"] is not None, runs.window.describe()
    overview = {o["type"]: o for o in report["window"]["ranks"]["0"]["overview"]}
    model = {r["name"]: r for r in report["window"]["model"]["rows"]}
    differ = []
    for phase in PHASE_ROWS:
        o, m = overview[phase], model[phase]
        total = m["cpu"]["total"]
        tolerance = max(TIME_REL_TOLERANCE * total, TIME_ABS_TOLERANCE,
                        TIME_PER_CALL_TOLERANCE * m["calls"])
        if o["calls"] != m["calls"] or abs(o["time"] - total) > tolerance:
            differ.append(
                f"{phase}: Overview {o['calls']} calls {1e3 * o['time']:.3f} ms, "
                f"Model Summary {m['calls']} calls {1e3 * total:.3f} ms"
            )
    assert differ == [], "\n".join(differ)


# -- the matrix ---------------------------------------------------------------------

CHECKS: list[tuple[str, Callable[[Stack, StackRuns], None]]] = [
    ("a. output same as python", check_output_same_as_python),
    ("b. steps are optimizer steps", check_steps_are_optimizer_steps),
    ("c. phases add up", check_phases_add_up),
    ("d. evaluation outside steps", check_evaluation_outside_steps),
    ("e. window keeps reader ratio and advice", check_window_keeps_reader_ratio_and_advice),
    ("f. window overview matches model", check_window_overview_matches_model),
]


#: Checks that compare times between whole runs: given a second pair of runs
#: when the first pair fails them (see test_framework).
TIMED_CHECKS = (check_window_keeps_reader_ratio_and_advice, check_window_overview_matches_model)


#: The stack that also runs under load (pytest -m timing --busy 2): the
#: checks' physics is the same in every stack, and this one is the
#: quickest (no framework to import).
TIMING_STACK = "plain-closure"


@pytest.mark.parametrize("stack", [
    pytest.param(s, id=s.id, marks=[pytest.mark.timing] if s.id == TIMING_STACK else [])
    for s in STACKS
])
def test_framework(
    stack: Stack,
    run_perfrun: RunPerfrun,
    run_python: Callable[..., bytes],
    framework_env: dict[str, str],
    subtests: pytest.Subtests,
) -> None:
    """One stack: three runs (python, perfrun, perfrun with a window), then
    each check a-f as a subtest of its own, so that one failing check does
    not hide the others."""
    for module in stack.needs:
        pytest.importorskip(module)
    direct = run_python(stack.path)
    plain = run_perfrun(stack.path, env=framework_env)
    start, end = stack.window
    window = run_perfrun("--scheduler", str(start), str(end), stack.path, env=framework_env)
    runs = StackRuns(direct, plain, window)
    # What every script promises, checked once, before perfrun is judged.
    assert runs.counts["optimizer_steps"] > stack.window[1] + 5, runs.counts
    assert runs.counts["eval_passes"] >= 2, runs.counts
    again: list[StackRuns] = []

    def second_pair() -> StackRuns:
        if not again:
            again.append(StackRuns(
                direct,
                run_perfrun(stack.path, env=framework_env),
                run_perfrun("--scheduler", str(start), str(end), stack.path, env=framework_env),
            ))
        return again[0]

    for name, check in CHECKS:
        with subtests.test(name):
            if check not in TIMED_CHECKS:
                check(stack, runs)
                continue
            try:
                check(stack, runs)
            except AssertionError as first:
                # Two whole runs on a shared 2-core machine (pytest -n auto
                # runs other tests beside them) can differ in their advice,
                # and one run's two clocks by a lost time slice, from load
                # alone; perfrun's own fault shows in every pair. One more
                # pair, then the verdict, with both.
                try:
                    check(stack, second_pair())
                except AssertionError as second:
                    raise AssertionError(
                        f"{first}\n--- and on a second pair of runs ---\n{second}"
                    ) from None
