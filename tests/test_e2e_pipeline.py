"""The Data Pipeline on real loops: real DataLoaders, real worker processes
(forked and spawned), real torch on the CPU.

Each loop's numbers are held to the script's own stopwatch (its dataset's
`__getitem__` and its collate, timed inside the script), to perfrun's step
clock (the fetches add up to the Dataloader phase), and to the workers the
script names; and the advice is followed: the change it recommends is made
and both versions run under plain python, where the change must pay and its
prediction must hold. Those timed comparisons are ratios, not wall-clock
limits, and use loops whose outcome the machine's load cannot turn: a
dataset that waits on reads, in-memory indexing against workers that must
pickle every batch. The versions take turns, an epoch each, in one process:
separate processes of one loop differed by a factor of 2 in their model's
part of the step beside busy processes, more than the change being timed.

The arithmetic of the stages and the advice's rules on hand-built tables
are in test_pipeline.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import PerfrunRun, RunPerfrun

from perfrun.report.summary_blocks import NO_DATALOADER
from perfrun.store.stepfile import COL

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
DECODE = str(SCRIPTS / "data_decode.py")
IN_MEMORY = str(SCRIPTS / "data_in_memory.py")
GET_BATCH = str(SCRIPTS / "data_get_batch.py")

#: Timed comparisons: the versions take turns in one process, this many
#: epochs each.
TURNS = 3


def printed(out: str | bytes, key: str) -> list[float]:
    """The numbers after `key` on the line that starts with it."""
    text = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
    for line in text.splitlines():
        if line.startswith(key + " "):
            return [float(v) for v in re.findall(r"[-\d.]+", line[len(key):])]
    raise AssertionError(f"no {key} line in:\n{text}")


def decode_turns(run_python: Callable[..., bytes], loop: list[str],
                 *workers: int) -> list[dict[str, float]]:
    """data_decode.py's loop with each number of workers in one process, an
    epoch each in turn, TURNS epochs each: each version's median step and
    fetch, under the same load as the others."""
    text = run_python(*loop, "--take-turns", ",".join(map(str, workers)),
                      "--turns", str(TURNS)).decode("utf-8", "replace")
    line = re.compile(r"^TURN (\d+) STEP ([\d.]+) FETCH ([\d.]+)$", re.M)
    found = {int(m.group(1)): {"step": float(m.group(2)) / 1e3, "fetch": float(m.group(3)) / 1e3}
             for m in line.finditer(text)}
    assert list(found) == list(workers), text
    return [found[w] for w in workers]


def taking_turns(run_python: Callable[..., bytes], *versions: str) -> list[dict[str, float]]:
    """The in-memory loop's versions (`plain`, `batched`, `workers=K`) timed
    in one process, an epoch each in turn, TURNS epochs each: each version's
    median step and fetch, under the same load as the others, and the CPU
    time a step of the process and its workers."""
    text = run_python(IN_MEMORY, "--take-turns", ",".join(versions),
                      "--epochs", str(TURNS)).decode("utf-8", "replace")
    line = re.compile(r"^TURN (\S+) STEP ([\d.]+) FETCH ([\d.]+) CPU ([\d.]+)$", re.M)
    found = {m.group(1): {"step": float(m.group(2)) / 1e3, "fetch": float(m.group(3)) / 1e3,
                          "cpu": float(m.group(4)) / 1e3}
             for m in line.finditer(text)}
    assert list(found) == list(versions), text
    return [found[v] for v in versions]


def finished(run: PerfrunRun) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    return run.report()


def main_loader(report: dict[str, Any]) -> dict[str, Any]:
    assert report["pipeline"] is not None, report
    training = [lp for lp in report["pipeline"]["loaders"]
                if lp["settings"].get("training", True)]
    return training[0]


def stages(lp: dict[str, Any]) -> dict[str, float]:
    return {s["name"]: s["per_batch"] for s in lp["stages"]}


def io_advice(report: dict[str, Any]) -> dict[str, Any]:
    [advice] = [a for a in report["advice"] if a["kind"] == "io-bound"]
    return advice


def fetch_phase_total(run: PerfrunRun) -> float:
    """The Dataloader phase of every step but the first (whose fetch is the
    iterator's first, kept apart by the Data Pipeline)."""
    rows = run.rank0().rows
    return sum(row[COL["dataloader"]] for row in rows[1:])


def check_fetches_add_up(run: PerfrunRun, lp: dict[str, Any]) -> None:
    """The Data Pipeline's fetches are the step clock's Dataloader phase:
    one fetch a step, and the phase holds nothing else but perfrun's own
    few microseconds around it."""
    steps = len(run.rank0().rows)
    # The epoch's end (StopIteration) is no fetch: no batch.
    assert lp["fetches"] + lp["first_fetches"] == steps
    pipeline = lp["fetch"] * lp["fetches"]
    phase = fetch_phase_total(run)
    assert pipeline == pytest.approx(phase, rel=0.05), (pipeline, phase)


# -- num_workers=0: stages against the script's stopwatch ---------------------------------


def test_the_stages_of_a_fetch_are_what_the_script_times(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun(DECODE, "--steps", "40", "--work", "20")
    report = finished(run)
    lp = main_loader(report)
    assert lp["settings"]["num_workers"] == 0 and lp["first_fetches"] == 1
    getitem, collate = (v / 1e3 for v in printed(run.out, "GETITEM"))
    found = stages(lp)
    # The script times from a batch's first __getitem__ to its collate, and
    # the collate; perfrun the fetcher's fetch and its collate_fn: the same
    # work, a loop and a call apart.
    assert found["dataset"] == pytest.approx(getitem, rel=0.05, abs=100e-6)
    assert found["collate"] == pytest.approx(collate, rel=0.25, abs=50e-6)
    # What is left: the sampler, the fetch's own lines, and, on a loaded
    # machine, the scheduler's switches between them (a few percent with
    # two busy processes beside the run on this 2-core machine).
    assert found["other"] + found["sampler"] < 0.10 * lp["fetch"]
    # 32 samples, each a decompression and 20 flips: CPU time, nearly all,
    # or time waiting for a CPU where other processes load the machine.
    assert lp["cpu"] + lp["runq"] == pytest.approx(getitem + collate, rel=0.20)
    assert (lp["tensors"], lp["bytes"]) == (2, 32 * 3 * 32 * 32 * 4 + 32 * 8)
    check_fetches_add_up(run, lp)
    assert lp["held"] == lp["fetches"]


# -- the advice followed: a dataset that waits on reads ---------------------------------


@pytest.mark.timing
def test_the_workers_it_recommends_give_the_step_it_predicts(
    run_perfrun: RunPerfrun, run_python: Callable[..., bytes]
) -> None:
    loop = [DECODE, "--steps", "40", "--work", "5", "--read-us", "300"]
    report = finished(run_perfrun(*loop))
    advice = io_advice(report)
    prediction = advice["evidence"]["pipeline"]["workers_prediction"]
    workers = prediction["num_workers"]
    # Two on an idle 2-core machine (the reads overlap); one where other
    # processes took most of a core during the run (the advice says so).
    assert workers >= 1, advice
    assert advice["actions"][0].startswith(f"num_workers={workers}: ")
    predicted = prediction["step"] / advice["evidence"]["batch_cost_avg"]
    # Made, and timed: the loop as it was, and with the workers, taking
    # turns an epoch each in one process (two processes differ by their
    # load, where one process's epochs share it). It pays:
    # 300 us of waiting a sample now overlaps the model (a step 0.4 of what
    # it was on an idle machine). The prediction holds: at least 40% of the
    # predicted gain is measured, and the step is not far shorter than
    # predicted (the advice did not undersell it). On a machine loaded by
    # other tests the perfrun run the advice came from and the timed runs
    # see different load: a factor of 2.5 either way (measured: 0.43 against
    # a prediction of 0.75 under load, 0.34 against 0.68 in a CI run with
    # both cores busy, 0.6 against 0.6 on an idle machine). A worker that
    # the suite's other processes leave no CPU makes no batches in time
    # (1.10 against 0.75 in one CI run): the claim is timed again, up to
    # three times, and holds when one timing shows it. Advice that did not
    # pay would fail all three.
    seen = []
    for _ in range(3):
        before, after = decode_turns(run_python, loop, 0, workers)
        measured = after["step"] / before["step"]
        seen.append(f"measured {before} -> {after}: {measured:.3f}")
        if measured < 0.95 and 1 - measured >= 0.4 * (1 - predicted) \
                and measured > predicted / 2.5:
            break
    else:
        pytest.fail(f"predicted step ratio {predicted:.3f}; " + "; ".join(seen))


# -- workers: their waits, their table, a slow one --------------------------------------------


def test_workers_are_each_recorded_and_a_slow_one_is_named(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun(DECODE, "--steps", "40", "--work", "10", "--workers", "3",
                      "--slow-worker", "1", json_report=False)
    report = finished(run)
    # Workers print side by side: a line may hold another's output too.
    pids = {int(wid): int(pid) for wid, pid in re.findall(r"WORKER (\d+) (\d+)", run.out)}
    assert sorted(pids) == [0, 1, 2], run.out
    lp = main_loader(report)
    by_pid = {w["pid"]: w for w in lp["workers"]}
    assert set(by_pid) == set(pids.values())
    # Every batch of the epoch was made by one of them: 42 batches, in turn.
    assert sum(w["batches"] for w in by_pid.values()) == 42
    assert [by_pid[pids[i]]["batches"] for i in range(3)] == [14, 14, 14]
    slow = by_pid[pids[1]]
    assert slow["slow"] and not any(w["slow"] for p, w in by_pid.items() if p != pids[1])
    # 3 ms a sample of sleep: 96 ms a batch more than the others.
    others = [w["busy"] for p, w in by_pid.items() if p != pids[1]]
    assert slow["busy"] - max(others) > 0.090
    assert slow["cpu"] < 0.5 * slow["busy"]  # the sleep is no CPU time
    for w in by_pid.values():
        assert w["startup"] is not None and 0 < w["startup"] < 5.0
        assert w["rss_max"] > 50e6
    # The waits add up to the fetch, and the fetches to the Dataloader phase.
    found = stages(lp)
    assert found["other"] < 0.10 * lp["fetch"]
    check_fetches_add_up(run, lp)
    # The table and the advice name it, and the advice says nothing else of
    # the workers: their waits are its. Where other processes (the suite's
    # other runs) took this machine's cores during the run, the advice counts
    # the cores left and may find them full: then, and only then, it may add
    # that the workers' CPU is what fills them.
    assert f"{pids[1]} (slow)" in run.out, run.out
    advice = io_advice(report)
    assert advice["actions"][0].startswith(f"look at worker pid {pids[1]}: "), advice
    others = advice["actions"][1:]
    if "other_cores" in advice["evidence"]["pipeline"]:
        others = [a for a in others
                  if not (a.startswith("a cheaper Dataset") and "available to this rank" in a)]
    assert not any(a.startswith(("num_workers", "raise num_workers", "a cheaper"))
                   for a in others), advice


def test_spawned_workers_are_recorded_too(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun(DECODE, "--steps", "20", "--work", "5", "--workers", "2",
                      "--context", "spawn")
    report = finished(run)
    lp = main_loader(report)
    pids = {int(printed(line, "WORKER")[1]) for line in run.out.splitlines()
            if line.startswith("WORKER ")}
    assert {w["pid"] for w in lp["workers"]} == pids and len(pids) == 2
    assert sum(w["batches"] for w in lp["workers"]) == 22
    # A spawned worker starts a fresh interpreter that imports torch: a
    # start-up of a tenth of a second at least, about the iterator's making
    # (which returns once the processes are started, not running).
    making = run.rank0().data["extra"]["dataloader_init"]["time"]
    for w in lp["workers"]:
        assert 0.1 < w["startup"] < making + 1.0, (lp["workers"], making)
    check_fetches_add_up(run, lp)
    assert report["faults"] == [], report["faults"]


# -- in memory: no workers, a batched index ---------------------------------------------------


@pytest.mark.timing
def test_an_in_memory_loop_is_told_to_batch_not_to_add_workers(
    run_perfrun: RunPerfrun, run_python: Callable[..., bytes]
) -> None:
    report = finished(run_perfrun(IN_MEMORY))
    advice = io_advice(report)
    assert not any(a.startswith(("num_workers=", "raise num_workers")) for a in advice["actions"])
    batched = [a for a in advice["actions"] if a.startswith("index a whole batch at once")]
    keep = [a for a in advice["actions"] if a.startswith("keep num_workers=0")]
    assert keep, advice
    evidence = advice["evidence"]["pipeline"]
    fetch = evidence["fetch"]
    work = evidence["stages"]["dataset"] + evidence["stages"]["collate"]
    estimate = evidence.get("batched_fetch_estimate")
    predicted = None
    if estimate is None:
        # A machine loaded by other tests stretched the per-sample indexing
        # past what counts as in-memory (dataload.PER_SAMPLE_CHEAP): no
        # estimate, and then no batched index advised.
        assert not batched, advice
    else:
        predicted = estimate + fetch - work
        # Said where it pays: 10% of the step at least (about 15% on an
        # idle machine; a machine loaded by other tests can stretch the
        # step more than the fetch).
        pays = work - estimate >= 0.1 * advice["evidence"]["batch_cost_avg"]
        assert bool(batched) == pays, advice
    # Both claims, made and timed: the batched fetch is shorter, and workers
    # make each step cost more.
    plain, batched_run, workers = taking_turns(run_python, "plain", "batched", "workers=2")
    figures = (f"plain {plain}, batched {batched_run}, 2 workers {workers}; "
               f"predicted batched fetch {predicted}")
    assert batched_run["fetch"] < 0.8 * plain["fetch"], figures
    # As short as predicted, or shorter: the prediction keeps the rest of
    # the fetch as measured, and a machine loaded by other tests lengthens it.
    if predicted is not None:
        assert batched_run["fetch"] < predicted * 3, figures
    # In the job's CPU time a step (test_workers_on_an_in_memory_loop_are_
    # taken_away says why: where no core is free, the workers take their
    # share of the cores from the other processes, not from this step).
    assert workers["cpu"] > 1.2 * plain["cpu"], figures


SPIN = "import time\nend = time.time() + 300\nwhile time.time() < end: pass\n"


@pytest.mark.slow
def test_an_in_memory_loop_on_a_loaded_machine_keeps_its_batch_in_process(
    run_perfrun: RunPerfrun, run_python: Callable[..., bytes]
) -> None:
    """Two processes spin beside the run on this 2-core machine: the
    fetch's wall time stretches, but the dataset is judged by its time
    where a core is free, so no worker is advised, and the fetch's CPU
    figures add up to no more than its time (a wait for a CPU around the
    CPU clocks' reads, outside the wall clock's span, is not counted:
    test_pipeline.py shows it on one shared core). Followed under the same
    load, 2 workers make the step longer, as the advice says."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        report = finished(run_perfrun(IN_MEMORY, "--epochs", "4"))
        plain, workers = taking_turns(run_python, "plain", "workers=2")
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    advice = io_advice(report)
    assert not any(a.startswith(("num_workers=", "raise num_workers"))
                   for a in advice["actions"]), advice
    assert any(a.startswith("keep num_workers=0: the dataset is in memory")
               for a in advice["actions"]), advice
    lp = main_loader(report)
    made = stages(lp)["dataset"] + stages(lp)["collate"]
    if lp["cpu"] is not None:  # read on a fetch once in 0.2 s, where not interrupted
        assert lp["cpu"] + (lp["runq"] or 0.0) < 1.5 * made, (lp, made)
    assert workers["step"] > plain["step"], (plain, workers)


@pytest.mark.timing
def test_workers_on_an_in_memory_loop_are_taken_away(
    run_perfrun: RunPerfrun, run_python: Callable[..., bytes]
) -> None:
    report = finished(run_perfrun(IN_MEMORY, "--workers", "2"))
    advice = io_advice(report)
    assert advice["actions"][0].startswith("num_workers=0: "), advice
    prediction = advice["evidence"]["pipeline"]["no_workers_prediction"]
    with_workers, without = taking_turns(run_python, "workers=2", "plain")
    figures = f"2 workers {with_workers}, none {without}; predicted {prediction}"
    predicted_gain = prediction["gain"] * with_workers["step"] / (
        advice["evidence"]["batch_cost_avg"])
    # The gain is the job's CPU time a step, this process's and its
    # workers': what they spend making, pickling and passing each batch
    # (8.3 ms a step against 2.6 ms without them, idle or beside four busy
    # processes alike). Where a core is free the step itself is shorter by
    # much of it (2.5 ms against 4.8); where none is, the workers' share of
    # the cores is taken from the other processes (this one sleeps while it
    # waits for a batch, and runs first when it wakes), and the step may
    # gain nothing: 6.2 ms against 6.5, beside two busy processes and the
    # suite's other worker, though its wait for a batch was 3.2 ms shorter.
    # The prediction is a lower bound on the gain (dataload.py): it holds
    # the shared-memory batches' cost to the model's phases at CONTENTION.
    measured_gain = with_workers["cpu"] - without["cpu"]
    assert measured_gain > 0.1 * with_workers["cpu"], figures
    assert measured_gain > 0.5 * predicted_gain, figures


# -- no DataLoader ---------------------------------------------------------------------------


def test_a_loop_without_a_dataloader_says_so(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun(GET_BATCH, json_report=False)
    report = finished(run)
    assert NO_DATALOADER in run.out, run.out
    assert "Data Pipeline" not in run.out and "Reader Ratio" not in run.out
    assert report["perf"]["dataloader_calls"] == 0 and report["pipeline"] is None
    assert not [a for a in report["advice"] if a["kind"] == "io-bound"]


def test_timer_only_runs_no_pipeline(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun("--timer-only", DECODE, "--steps", "10", "--work", "5", "--workers", "2")
    report = finished(run)
    assert report["pipeline"] is None
    assert not (run.run_dir / "pipeline").exists()
    # Told how to get the stages, not a guess at num_workers.
    for advice in report["advice"]:
        if advice["kind"] == "io-bound":
            assert advice["actions"][-1].startswith("measure the fetch stage by stage")
