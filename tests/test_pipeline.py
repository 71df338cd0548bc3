"""The input pipeline, stage by stage: the Data Pipeline's numbers from
hand-built fetch and batch tables (analysis/pipeline.py), what the advice
makes of them (analysis/dataload.py), and the main process's timing on a
real DataLoader in this process (runtime/pipeline.py): the same batches,
stages that add up to the fetch, and the iterator left as torch made it.

Real runs of real loops, with workers, a slow worker, and the advice
followed and timed, are in test_e2e_pipeline.py."""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from builders import MS, make_rank, make_rows, make_run
from torch.utils.data import DataLoader, TensorDataset

from perfrun.analysis import dataload
from perfrun.analysis.build import build_report
from perfrun.analysis.dataload import CONTENTION, judge, predicted_step, transfer_estimate
from perfrun.analysis.pipeline import (
    HELD_WAIT,
    LoaderPipeline,
    Stage,
    summarize,
    workers_of,
)
from perfrun.report import render_markdown
from perfrun.report.summary_blocks import NO_DATALOADER
from perfrun.runtime.pipeline import (
    SAMPLE_ALL,
    SAMPLE_EVERY,
    Pipeline,
    ThreadClock,
    WorkerLoop,
    batch_bytes,
)
from perfrun.store.pipelinefile import BATCH_COLUMNS, FETCH_COLUMNS, STARTED, read_fetches

NAN = math.nan
F = {c: i for i, c in enumerate(FETCH_COLUMNS)}
B = {c: i for i, c in enumerate(BATCH_COLUMNS)}


def fetch_row(start: float, **values: float) -> list[float]:
    row = [NAN] * len(FETCH_COLUMNS)
    row[F["start"]] = start
    row[F["first"]] = 0.0
    row[F["weight"]] = 1.0
    for name, value in values.items():
        row[F[name]] = value
    return row


def batch_row(**values: float) -> list[float]:
    row = [NAN] * len(BATCH_COLUMNS)
    for name, value in values.items():
        row[B[name]] = value
    return row


# -- stages from fetch rows, num_workers=0 ----------------------------------------------------


def test_stages_are_weighted_means_and_the_first_fetch_is_apart() -> None:
    rows = [
        # An iterator's first fetch: start-up, left out of the per-batch figures.
        fetch_row(0.0, end=0.010, sampler=0.0, dataset=0.009, collate=0.001, first=1.0,
                  tensors=2, bytes=1000, weight=1),
        # Timed once in 4 (weight 4): 3 ms in the dataset, 1 in the collate.
        fetch_row(1.0, end=1.0041, sampler=0.0001, dataset=0.003, collate=0.001, weight=4),
        # Timed every time (weight 1): the collate is the larger stage.
        fetch_row(2.0, end=2.0041, sampler=0.0001, dataset=0.001, collate=0.003, weight=1),
    ]
    lp = summarize({"num_workers": 0, "batch_size": 32}, 0, np.array(rows))
    assert lp.fetches == 5 and lp.first_fetches == 1
    assert lp.first_fetch == pytest.approx(0.010)
    assert (lp.tensors, lp.bytes) == (2, 1000)
    assert lp.fetch == pytest.approx(0.0041)
    assert lp.per_batch("dataset") == pytest.approx((4 * 0.003 + 0.001) / 5)
    assert lp.per_batch("collate") == pytest.approx((4 * 0.001 + 0.003) / 5)
    assert lp.per_batch("other") == pytest.approx(0.0, abs=1e-9)
    # Without workers every fetch held its step up, put on its largest stage.
    assert (lp.held, lp.stage("dataset").held, lp.stage("collate").held) == (5, 4, 1)
    shares = sum(s.share for s in lp.stages)
    assert shares == pytest.approx(1.0)


# -- stages from fetch rows and the workers' batch rows ----------------------------------------


def test_a_wait_is_put_on_what_it_waited_for() -> None:
    batches = np.array([
        # The worker's loop ran 0.25 s after its iterator began to be made.
        batch_row(task=STARTED, got=0.0, fetched=-0.25, rss=1e8),
        # Task 0, made before the fetch began: its wait is the transfer.
        batch_row(task=0, got=0.5, fetched=0.9, sent=0.9, collate=0.1, rss=2e8, cpu=0.3),
        # Task 1, made while the main process waited; its dataset the larger part.
        batch_row(task=1, got=1.0, fetched=2.002, sent=2.002, collate=0.2, rss=2e8, cpu=0.9),
        # Task 2, whose collate is the larger part.
        batch_row(task=2, got=2.5, fetched=3.0015, sent=3.0015, collate=0.4, rss=3e8, cpu=0.5),
    ])
    pid = 77.0
    rows = np.array([
        fetch_row(1.0, end=1.003, sampler=1e-5, send=2e-5, wait=0.0029, task=0, worker_pid=pid),
        fetch_row(2.0, end=2.003, sampler=1e-5, send=2e-5, wait=0.0029, task=1, worker_pid=pid),
        fetch_row(3.0, end=3.002, sampler=1e-5, send=2e-5, wait=0.0019, task=2, worker_pid=pid),
        # No record of the worker (it was killed): the wait stays a wait.
        fetch_row(4.0, end=4.001, wait=0.0009, task=3, worker_pid=99.0),
        # A short wait, no record of its task either: under HELD_WAIT, it held nothing.
        fetch_row(5.0, end=5.0001, wait=HELD_WAIT / 2, task=4, worker_pid=pid),
    ])
    lp = summarize({"num_workers": 1}, 0, rows, [(int(pid), batches)])
    per = {s.name: s.per_batch * lp.fetches for s in lp.stages}
    assert per["worker dataset"] == pytest.approx(0.002)  # task 1: made 2 ms into the wait
    assert per["worker collate"] == pytest.approx(0.0015)  # task 2
    assert per["transfer"] == pytest.approx(0.0029 + 0.0009 + 0.0004)
    assert per["wait"] == pytest.approx(0.0009 + HELD_WAIT / 2)
    assert per["send"] == pytest.approx(6e-5)
    assert lp.held == 4
    held = {s.name: s.held for s in lp.stages}
    assert held["transfer"] == 1 and held["worker dataset"] == 1
    assert held["worker collate"] == 1 and held["wait"] == 1
    [worker] = lp.workers
    assert worker.batches == 3 and worker.startup == pytest.approx(0.25)
    assert worker.busy == pytest.approx((0.4 + 1.002 + 0.5015) / 3)
    assert worker.collate == pytest.approx((0.1 + 0.2 + 0.4) / 3)
    assert worker.cpu == pytest.approx((0.3 + 0.9 + 0.5) / 3)
    assert worker.rss_max == 3e8
    # Idle: from each batch handed over to the next task.
    assert worker.idle_share == pytest.approx((0.1 + 0.498) / (3.0015 - 0.5))


def test_a_slow_worker_is_named_and_equal_ones_are_not() -> None:
    def worker(busy: float, n: int = 10) -> Any:
        rows = [batch_row(task=STARTED, got=0.0)]
        rows += [batch_row(task=k, got=float(k), fetched=k + busy, sent=k + busy, collate=0.0)
                 for k in range(n)]
        return np.array(rows)

    slow = workers_of([(1, worker(0.010)), (2, worker(0.011)), (3, worker(0.030))])
    assert [w.slow for w in slow] == [False, False, True]
    even = workers_of([(1, worker(0.010)), (2, worker(0.014))])
    assert not any(w.slow for w in even)
    # Half again as slow, but by 0.1 ms a batch: noise, not a slow worker.
    tiny = workers_of([(1, worker(0.0002)), (2, worker(0.0002)), (3, worker(0.0003))])
    assert not any(w.slow for w in tiny)
    # Two batches of ten lost to a loaded machine's scheduler: a longer
    # mean, the same median; not slow.
    unlucky = worker(0.001)
    unlucky[1:3, B["fetched"]] += 0.050
    crew = workers_of([(1, worker(0.001)), (2, unlucky), (3, worker(0.001))])
    assert crew[1].busy > 5 * crew[0].busy and not any(w.slow for w in crew)
    # Slower, but the loop waited on the others as much: nothing held up.
    waits = {1: 0.1, 2: 0.1, 3: 0.12}
    assert not any(w.slow for w in workers_of(
        [(1, worker(0.010)), (2, worker(0.011)), (3, worker(0.030))], waits))
    waits = {1: 0.01, 2: 0.01, 3: 0.5}
    assert [w.slow for w in workers_of(
        [(1, worker(0.010)), (2, worker(0.011)), (3, worker(0.030))], waits)] == [
        False, False, True]


# -- the advice ------------------------------------------------------------------------------


def loader(*, workers: int = 0, batch_size: int = 32, dataset: float = 0.0,
           collate: float = 0.0, cpu: float | None = None, tensors: int = 2,
           nbytes: int = 400_000, workers_rows: list[Any] | None = None,
           stages: list[Stage] | None = None,
           collate_fn: str = "default_collate") -> LoaderPipeline:
    fetch = dataset + collate
    if stages is None:
        stages = [Stage("dataset", dataset, dataset / fetch),
                  Stage("collate", collate, collate / fetch)]
        fetch = sum(s.per_batch for s in stages)
    else:
        fetch = sum(s.per_batch for s in stages)
    settings = {"num_workers": workers, "batch_size": batch_size, "dataset": "Images",
                "prefetch_factor": 2 if workers else None, "collate_fn": collate_fn}
    return LoaderPipeline(loader=0, settings=settings, fetches=100, fetch=fetch,
                          stages=stages, held=100, workers=workers_rows or [],
                          tensors=tensors, bytes=nbytes, cpu=fetch if cpu is None else cpu)


def test_workers_are_recommended_with_the_step_they_predict() -> None:
    lp = loader(dataset=0.0138, collate=0.0002)
    found = judge(lp, batch=0.021, reader=0.014, cores=2)
    [action] = found.actions
    transfer = transfer_estimate(2, 400_000)
    step = predicted_step(0.007, 0.014, 0.014, transfer, 2, 2)
    assert step == pytest.approx((CONTENTION * 0.021 + 2 * transfer) / 2)
    assert found.evidence["workers_prediction"] == {"num_workers": 2, "step": step,
                                                    "gain": 0.021 - step}
    assert action.startswith("num_workers=2: the dataset and collate take 14.0 ms a batch")
    assert f"the step from 21.0 ms to about {dataload.duration(step)}" in action
    assert "(32 samples, 431 us each in the dataset)" in found.message
    assert "100% of the dataset and collate is CPU time" in found.message


def test_what_a_framework_wraps_around_the_fetch_stays_in_the_main_process() -> None:
    # accelerate's loader: an 0.85 ms fetch in a 1.8 ms wait for data (the
    # rest moves the batch and prefetches the next), in an 8.5 ms step.
    lp = loader(dataset=0.00021, collate=0.00064, nbytes=66_000)
    found = judge(lp, batch=8.5e-3, reader=1.8e-3, cores=2)
    assert found.evidence["compute"] == pytest.approx(8.5e-3 - 0.85e-3)
    # One worker would take the 0.85 ms and add a transfer: under 10% of the step.
    assert found.evidence["workers_prediction"]["gain"] < dataload.WORKERS_MIN_GAIN * 8.5e-3
    assert not any(a.startswith("num_workers=") for a in found.actions)


def test_keeping_the_batch_in_process_says_why() -> None:
    # A decode-like dataset (2 ms a batch of 32) beside a 30 ms model: a
    # worker would pay, but by less than 10% of the step.
    lp = loader(dataset=0.002, collate=0.0, nbytes=100_000)
    found = judge(lp, batch=0.032, reader=0.002, cores=2)
    [keep] = found.actions
    assert keep.startswith("keep num_workers=0: workers are predicted to gain less than 10%")
    step = found.evidence["workers_prediction"]["step"]
    assert f"32.0 ms to about {dataload.duration(step)}" in keep
    # A large batch made quickly: its trip from a worker is the longer.
    lp = loader(dataset=0.0008, collate=0.0002, nbytes=4_000_000, batch_size=4)
    found = judge(lp, batch=0.004, reader=0.001, cores=2)
    [keep] = [a for a in found.actions if a.startswith("keep")]
    assert "(4.0 MB) would take about 8.50 ms to reach this process, against 1.00 ms" in keep


def test_batches_accumulated_into_a_step_are_all_its_work() -> None:
    # 4 fetches of 3 ms a step of 20 ms: 12 ms of the step is making batches.
    lp = loader(dataset=0.003, collate=0.0, nbytes=100_000)
    one = judge(lp, batch=0.020, reader=0.012, cores=2)  # as if a step fetched once
    four = judge(lp, batch=0.020, reader=0.012, cores=2, per_step=4)
    assert four.evidence["compute"] == pytest.approx(0.008)
    transfer = transfer_estimate(2, 100_000)
    assert four.evidence["workers_prediction"]["step"] == pytest.approx(
        predicted_step(0.008, 0.003, 0.003, transfer, 2, 2, per_step=4))
    # Read as one fetch a step, 9 ms of batch-making would be taken for the
    # model's, and the gain from workers for less than half of what it is.
    gains = [found.evidence["workers_prediction"]["gain"] for found in (one, four)]
    assert gains[1] > 2 * gains[0]


def test_an_in_memory_fetch_stays_in_process_and_is_batched_where_it_pays() -> None:
    # 64 samples at 2.5 us and a stack: 260 us of a 1.1 ms step.
    lp = loader(batch_size=64, dataset=0.16e-3, collate=0.1e-3, nbytes=200_000)
    found = judge(lp, batch=1.1e-3, reader=0.27e-3, cores=2)
    assert not any(a.startswith("num_workers=") for a in found.actions)
    batched, keep = found.actions
    gather = 2 * dataload.GATHER_PER_TENSOR + 200_000 / dataload.GATHER_RATE
    assert found.evidence["batched_fetch_estimate"] == pytest.approx(gather)
    assert batched.startswith("index a whole batch at once")
    assert "BatchSampler(RandomSampler(dataset), batch_size=64" in batched
    assert f"falls from 260 us to about {dataload.duration(gather)}" in batched
    assert keep.startswith("keep num_workers=0: the dataset is in memory")
    assert "(about 900 us a batch)" in keep
    # On a loaded machine a fetch of 512 such samples takes 1.5 ms of a 3 ms
    # step: still memory copied, which workers would only have to send.
    slowed = loader(batch_size=512, dataset=1.0e-3, collate=0.5e-3, nbytes=200_000)
    found = judge(slowed, batch=3e-3, reader=1.5e-3, cores=2)
    assert found.evidence["workers_prediction"]["gain"] > dataload.WORKERS_MIN_GAIN * 3e-3
    assert not any(a.startswith("num_workers=") for a in found.actions)
    # A collate_fn of the script's own: a batched index would skip its work.
    own = loader(batch_size=64, dataset=0.16e-3, collate=0.1e-3, nbytes=200_000,
                 collate_fn="pad_and_tokenize")
    found = judge(own, batch=1.1e-3, reader=0.27e-3, cores=2)
    assert not any(a.startswith("index a whole batch") for a in found.actions)
    # The same fetch beside a long step: batching would not pay, and is not said.
    found = judge(lp, batch=10e-3, reader=0.27e-3, cores=2)
    assert [a.split(":")[0] for a in found.actions] == ["keep num_workers=0"]


def test_an_in_memory_dataset_on_a_loaded_machine_is_still_in_memory() -> None:
    """64 samples indexed at 5 us each, read as 25 us a sample because the
    machine's other processes keep this one waiting for a CPU 80% of the
    time: judged by its time where a core is free, it is in memory, and
    workers (which a naive reading predicts to shorten the step by 30%)
    are not advised: they would only copy and send the same memory."""
    stretched = dataclasses.replace(
        loader(batch_size=64, dataset=1.6e-3, collate=0.5e-3, cpu=0.42e-3, nbytes=200_000),
        runq=1.68e-3)
    found = judge(stretched, batch=3e-3, reader=2.1e-3, cores=2)
    assert found.evidence["workers_prediction"]["gain"] > 0.25 * 3e-3
    assert not any(a.startswith("num_workers=") for a in found.actions), found.actions
    assert any(a.startswith("keep num_workers=0: the dataset is in memory")
               for a in found.actions), found.actions
    assert found.evidence["per_sample_free_core"] == pytest.approx(1.6e-3 * 0.2 / 64)
    assert "80% waiting for a CPU" in found.message
    # The same times with no wait for a CPU: 25 us a sample is work, and
    # workers share it out.
    busy = loader(batch_size=64, dataset=1.6e-3, collate=0.5e-3, nbytes=200_000)
    found = judge(busy, batch=3e-3, reader=2.1e-3, cores=2)
    assert found.actions[0].startswith("num_workers=2"), found.actions
    assert "per_sample_free_core" not in found.evidence


def test_a_stage_less_its_wait_for_a_cpu() -> None:
    assert dataload.less_cpu_wait(0.010, None, 0.020) == 0.010
    assert dataload.less_cpu_wait(0.010, 0.0, 0.020) == 0.010
    assert dataload.less_cpu_wait(0.010, 0.005, 0.020) == pytest.approx(0.0075)
    assert dataload.less_cpu_wait(0.010, 0.030, 0.020) == 0.0  # a wait past the work: none left
    assert dataload.less_cpu_wait(0.010, 0.005, 0.0) == 0.010  # nothing to share it over


def test_a_dataset_that_waits_gets_more_workers_than_cores() -> None:
    # 20 ms a batch, 2 ms of it CPU: reading files, not computing.
    lp = loader(dataset=0.02, collate=0.0, cpu=0.002)
    found = judge(lp, batch=0.025, reader=0.02, cores=2)
    assert "only 10% of the dataset and collate is CPU time: it waits" in found.message
    assert found.evidence["workers_prediction"]["num_workers"] == 4


def test_a_dataset_that_waits_for_a_cpu_is_not_taken_for_one_that_reads() -> None:
    # 20 ms a batch, 8 of it CPU and 11 waiting for a CPU: a loaded machine.
    lp = dataclasses.replace(loader(dataset=0.02, collate=0.0, cpu=0.008), runq=0.011)
    found = judge(lp, batch=0.025, reader=0.02, cores=2)
    assert "it waits" not in found.message
    assert "55% waiting for a CPU" in found.message
    # No more workers than cores: the work needs a CPU each.
    assert found.evidence["workers_prediction"]["num_workers"] <= 2


def test_the_thread_clock_reads_cpu_time_and_the_wait_for_a_cpu() -> None:
    clock = ThreadClock()
    cpu0, wait0 = clock.read()
    x = 0
    for i in range(200_000):
        x += i * i
    cpu1, wait1 = clock.read()
    assert cpu1 > cpu0
    if Path("/proc/thread-self/schedstat").exists():
        assert wait1 >= wait0  # the run queue's wait, never going back
    else:
        assert math.isnan(wait1)


SPIN_FOREVER = "print('spinning', flush=True)\nwhile True: pass\n"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists()
                    or not hasattr(os, "sched_setaffinity"),
                    reason="the run queue's wait is read from Linux's schedstat")
def test_spans_between_uninterrupted_reads_add_up_to_cpu_and_the_wait_for_one() -> None:
    """This thread and a spinning process share one core, so the scheduler
    switches between them every few milliseconds, around the clock's
    reads too. A span timed from one read's end to the next one's start
    is CPU time plus the run queue's wait, as the rank reports them,
    wherever neither read was interrupted (READ_SLACK); the spans whose
    reads were interrupted are the ones whose figures would not add up."""
    from perfrun.runtime.pipeline import READ_SLACK

    core = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", SPIN_FOREVER], stdout=subprocess.PIPE)
    mine = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(spinner.pid, {core})
        assert spinner.stdout is not None and spinner.stdout.readline() == b"spinning\n"
        os.sched_setaffinity(0, {core})
        clock = ThreadClock()
        kept, dropped = [], []
        for _ in range(300):
            c0, q0, before0, t0 = clock.read_between()
            x = 0
            for i in range(20_000):  # about 1 ms of work
                x += i
            c1, q1, end, after = clock.read_between()
            span = (end - t0, c1 - c0, q1 - q0)
            if t0 - before0 < READ_SLACK and after - end < READ_SLACK:
                kept.append(span)
            else:
                dropped.append(span)
    finally:
        os.sched_setaffinity(0, mine)
        spinner.kill()
        spinner.wait()
    # The spinner took the core, inside spans or around the reads (where
    # the scheduler often switches: around one span in four here, and
    # some runs not once inside a span).
    assert any(wait > 0 for _, _, wait in kept + dropped), "the core was never shared"
    assert len(kept) > 150, len(dropped)
    wall = sum(k[0] for k in kept)
    accounted = sum(k[1] + k[2] for k in kept)
    assert accounted == pytest.approx(wall, rel=0.05), (wall, accounted, len(dropped))
    for span, used, wait in kept:
        assert used + wait < span + READ_SLACK, (span, used, wait)


def test_workers_that_keep_the_cores_busy_get_a_cheaper_getitem() -> None:
    busy = workers_of([(k, np.array([batch_row(task=STARTED, got=0.0)] + [
        batch_row(task=t, got=float(t), fetched=t + 0.02, sent=t + 0.02, collate=0.001,
                  cpu=0.019) for t in range(10)])) for k in (1, 2)])
    stages = [Stage("worker dataset", 0.004, 0.8), Stage("transfer", 0.001, 0.2)]
    lp = loader(workers=2, stages=stages, workers_rows=busy)
    found = judge(lp, batch=0.012, reader=0.005, cores=2)
    [action] = found.actions
    assert action.startswith("a cheaper Dataset __getitem__")
    assert "keep the 2 cores available to this rank 108% busy" in action


def test_workers_that_cost_more_than_they_save_are_taken_away() -> None:
    # A batch made in 0.3 ms, then 2 ms in transit: the in-memory loop of the
    # issue, slowed down by workers.
    quick = workers_of([(k, np.array([batch_row(task=STARTED, got=0.0)] + [
        batch_row(task=t, got=float(t), fetched=t + 0.0003, sent=t + 0.0003, collate=0.0001,
                  cpu=0.0003) for t in range(10)])) for k in (1, 2)])
    stages = [Stage("transfer", 0.002, 0.95), Stage("other", 0.0001, 0.05)]
    lp = loader(workers=2, stages=stages, workers_rows=quick)
    found = judge(lp, batch=0.0046, reader=0.0021, cores=2)
    [action] = found.actions
    assert action.startswith("num_workers=0: a batch takes 300 us to make, 300 us of it CPU "
                             "time, and 2.00 ms to reach")
    # The main process's 2.5 ms and the batch's 0.3 ms, less the workers' contention.
    assert found.evidence["no_workers_prediction"]["step"] == pytest.approx(
        (0.0025 + 0.0003) / CONTENTION)
    # The same workers, waited on as they make each batch (on a machine
    # other processes load): the batch still belongs here, not in a
    # cheaper __getitem__ or more workers.
    waited = [Stage("worker dataset", 0.002, 0.95), Stage("transfer", 0.0001, 0.05)]
    found = judge(loader(workers=2, stages=waited, workers_rows=quick), batch=0.0046,
                  reader=0.0021, cores=1)
    assert found.actions[0].startswith("num_workers=0: ")
    # A batch that takes 6 ms to make, 5 of them waiting on a file, and is
    # made in time: the workers stay.
    slow = workers_of([(k, np.array([batch_row(task=STARTED, got=0.0)] + [
        batch_row(task=t, got=float(t), fetched=t + 0.006, sent=t + 0.006, collate=0.001,
                  cpu=0.001) for t in range(10)])) for k in (1, 2)])
    lp = loader(workers=2, stages=stages, workers_rows=slow, tensors=8, nbytes=3_000_000)
    found = judge(lp, batch=0.0046, reader=0.0021, cores=2)
    [action] = found.actions
    assert action.startswith("fewer, larger tensors in a batch: each of its 8 tensors")
    lp = loader(workers=2, stages=stages, workers_rows=slow, nbytes=3_000_000)
    [action] = judge(lp, batch=0.0046, reader=0.0021, cores=2).actions
    assert action.startswith("a smaller batch in bytes (3.0 MB now")


def test_a_slow_worker_is_the_one_thing_said_when_the_waits_are_its() -> None:
    def worker(busy: float, cpu: float) -> Any:
        return np.array([batch_row(task=STARTED, got=0.0)] + [
            batch_row(task=t, got=float(t), fetched=t + busy, sent=t + busy, collate=0.0005,
                      cpu=cpu) for t in range(10)])

    # Two workers make a batch in 7 ms of CPU; the third sleeps 100 ms more.
    crew = workers_of([(11, worker(0.007, 0.006)), (12, worker(0.108, 0.008)),
                       (13, worker(0.0065, 0.006))])
    stages = [Stage("worker dataset", 0.029, 0.97), Stage("transfer", 0.0007, 0.03)]
    lp = loader(workers=3, stages=stages, workers_rows=crew)
    assert lp.usual_busy == pytest.approx(0.00675)
    found = judge(lp, batch=0.036, reader=0.029, cores=2)
    [action] = found.actions
    assert action.startswith("look at worker pid 12: it takes 108 ms a batch against 6.75 ms "
                             "for the others")
    # The others' figures, not the slow one's, describe the workers.
    assert "a worker makes a batch in 6.75 ms" in found.message
    assert "workers_prediction" not in found.evidence


def test_the_cores_other_processes_took_are_not_counted() -> None:
    assert dataload.cores_for_rank(2, 1) == 2
    assert dataload.cores_for_rank(2, 1, 0.01) == 2  # a quiet machine's background
    assert dataload.cores_for_rank(2, 1, 1.35) == 1  # a spin loop beside the run
    assert dataload.cores_for_rank(8, 2, 2.2) == 3
    assert dataload.cores_for_rank(2, 1, 3.0) == 1


def test_nothing_is_predicted_without_the_batch_or_the_cores() -> None:
    lp = loader(dataset=0.01, collate=0.0)
    found = judge(lp, batch=0.012, reader=0.01, cores=None)
    assert "workers_prediction" not in found.evidence
    assert found.actions[-1].startswith("measure before adding workers")


# -- the report -------------------------------------------------------------------------------


def test_steps_without_a_dataloader_say_so_not_a_zero_ratio() -> None:
    rows = make_rows([{"forward": 2 * MS, "backward": 3 * MS, "others": MS}] * 10)
    for row in rows:
        row[7] = 0  # no DataLoader fetch in the step
    report = build_report(make_run([make_rank(rows)]))
    assert report.perf is not None and report.perf.no_dataloader
    text = render_markdown(report)
    assert NO_DATALOADER in text and "Reader Ratio: 0.000%" not in text


# -- the main process's timing, in this process ---------------------------------------------------


def _loader(n: int = 96, batch: int = 8) -> DataLoader:
    torch.manual_seed(0)
    data = TensorDataset(torch.arange(n * 4, dtype=torch.float32).view(n, 4),
                         torch.arange(n))
    return DataLoader(data, batch_size=batch, shuffle=True,
                      generator=torch.Generator().manual_seed(1))


def test_timed_fetches_give_the_script_the_same_batches(tmp_path: Path) -> None:
    faults: list[str] = []
    pipeline = Pipeline(str(tmp_path), "rank0", lambda where, exc: faults.append(where))
    plain = [b for b in _loader()]
    timed_loader = _loader()
    entry: dict[str, Any] = {"num_workers": 0, "batch_size": 8}
    stages = pipeline.loader(timed_loader, entry)
    it = iter(timed_loader)
    pipeline.attach(stages, it)
    timed = list(it)
    assert len(timed) == len(plain) == 12
    for (x, y), (tx, ty) in zip(plain, timed):
        assert torch.equal(x, tx) and torch.equal(y, ty)
    # Between fetches the iterator and its fetcher hold torch's own methods.
    assert set(it.__dict__) & {"_next_index", "_get_data"} == set()
    assert "fetch" not in it._dataset_fetcher.__dict__
    pipeline.flush()
    rows = read_fetches(str(tmp_path / "pipeline" / "rank0.loader0.fetches"))
    assert faults == []
    # The first fetch, then one in SAMPLE_EVERY of these cheap ones (every
    # one while the average fetch stays above SAMPLE_ALL: a first fetch
    # slowed down by a loaded machine keeps it there for a few).
    first = rows[0, F["end"]] - rows[0, F["start"]]
    if first < SAMPLE_ALL:
        assert rows.shape[0] == 1 + (12 - 1) // SAMPLE_EVERY
    assert 12 - SAMPLE_EVERY < rows[:, F["weight"]].sum() <= 12
    assert rows[0, F["first"]] == 1.0 and rows[0, F["tensors"]] == 2
    parts = rows[:, [F["sampler"], F["dataset"], F["collate"]]].sum(axis=1)
    fetch = rows[:, F["end"]] - rows[:, F["start"]]
    assert np.all(parts <= fetch)
    assert entry["loader"] == 0 and entry["fetches"] == "rank0.loader0.fetches"


def test_a_worker_loop_travels_to_a_spawned_worker() -> None:
    def torch_loop(*args: Any) -> None:
        pass

    loop = WorkerLoop(torch_loop, "/runs/r", "rank1", 3)
    again = pickle.loads(pickle.dumps(loop))
    assert isinstance(again, WorkerLoop)
    assert (again.run_dir, again.stem, again.loader, again.original) == ("/runs/r", "rank1", 3,
                                                                         None)


def test_batch_bytes_counts_the_tensors_of_any_batch() -> None:
    batch = {"x": torch.zeros(4, 8), "y": [torch.zeros(4, dtype=torch.int64), "label"]}
    assert batch_bytes(batch) == (2, 4 * 8 * 4 + 4 * 8)
    assert batch_bytes("no tensors") == (0, 0)
