"""What to change in a DataLoader, decided from what its fetch is made of,
with what the change is predicted to gain.

The I/O-bound rule (advice.py) fires on the Reader Ratio; this says what to
do about it, from the Data Pipeline's stages (pipeline.py), and never
recommends a change the stages do not support:

* **Workers** share out the work of making batches (the dataset's
  `__getitem__` and the collate) over other cores, at a price: each batch
  is moved from the worker to the main process (pickled into shared
  memory, sent, received), and the workers take cores from the main
  process. They are recommended only when the predicted step with them is
  at least WORKERS_MIN_GAIN shorter, and the advice quotes the prediction.
  With W workers and C cores for this rank, and k fetches a step, the step
  is at least each of

      compute + k transfer                          the main process's own work
      s * k * work / W + k transfer                 the workers' throughput
      (s * (k cpu work + compute) + 2k transfer) / C  the machine's CPU time

  where `compute` is the step less its fetches (what stays in the main
  process: the model, and whatever a framework wraps around the fetch),
  `work` the time to make a batch, `cpu work` the CPU time of it (a
  dataset that waits on a file or a network is not CPU-bound), `transfer`
  a batch's trip to the main process (pickled by the worker, received by
  the main process: CPU time on both sides), estimated from the batch's
  tensors and bytes (TRANSFER_BASE, TRANSFER_RATE), and `s` (CONTENTION)
  what processes that share the cores cost each other (caches, memory
  bandwidth, the scheduler). scripts/bench_pipeline.py measures the prediction against
  the steps the change gives, on loaders whose work and compute differ.
* **A whole batch indexed at once**: an in-memory dataset's fetch is the
  per-sample indexing and `default_collate`, one small tensor per sample
  stacked again; one index per tensor of a batch (a BatchSampler with
  `batch_size=None`, or a `__getitems__`) does the same in one copy. Said
  when the collate is torch's own, the dataset costs little per sample
  (PER_SAMPLE_CHEAP, its time less its wait for a CPU: a loaded machine
  does not make indexing look like work) and the predicted fetch (from
  the batch's bytes: GATHER_RATE, GATHER_PER_TENSOR) shortens the step by
  WORKERS_MIN_GAIN at least. Otherwise an in-memory
  fetch is said for what it is, and that workers would not pay.
* **No workers**: where workers make the batches in time and the main
  process waits on their transfer, the step without workers is predicted
  from the workers' time a batch and the main process's own work, their
  CPU time less the contention the workers cause (CONTENTION): a lower bound on
  the gain, since the shared-memory batches also cost the model's phases
  (their pages faulted in, their storage freed) more than CONTENTION says.
  Otherwise a transfer that its bytes make long, or its many tensors, is
  said for what it is: a larger prefetch_factor does not shorten it.
* **A slow worker** is named, with its time per batch against the others'.

Pure functions of numbers: the measurements come in, sentences and the
numbers they rest on go out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from perfrun.analysis.pipeline import LoaderPipeline
from perfrun.analysis.stats import duration

#: The least predicted gain (a fraction of the step) worth a change.
WORKERS_MIN_GAIN = 0.10
#: How much slower CPU work runs while workers and the main process share
#: the cores (measured: a worker's CPU time a batch against the main
#: process's for the same batches, and the model's against its own alone).
CONTENTION = 1.15
#: Workers and the model that keep this share of the rank's cores busy
#: leave no core for another worker.
SATURATED = 0.7
#: A batch's trip from a worker to the main process: a fixed cost...
TRANSFER_BASE = 0.5e-3
#: ... and its bytes at this rate (bytes per second).
TRANSFER_RATE = 0.5e9
#: A dataset's `__getitem__` cheaper than this per sample (seconds) is
#: in-memory indexing: its cost is the per-sample calls, not the data.
PER_SAMPLE_CHEAP = 20e-6
#: One index of a whole batch: a fixed cost per tensor (seconds)...
GATHER_PER_TENSOR = 20e-6
#: ... and its bytes copied at this rate (bytes per second).
GATHER_RATE = 4e9
#: A batch of more tensors than this pays for each one's trip from a worker.
MANY_TENSORS = 4
#: torch's own collate functions: stacking samples, converting a batch.
DEFAULT_COLLATES = ("default_collate", "default_convert")
#: Share of a dataset's time that is CPU below which it waits on I/O.
IO_WAIT_CPU = 0.5


@dataclass
class Finding:
    """What the stages say: a sentence for the message, what to try, and
    the numbers both rest on."""

    message: str = ""
    actions: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)


def transfer_estimate(tensors: Optional[int], nbytes: Optional[int]) -> Optional[float]:
    """A batch's trip from a worker, before any worker ran: per batch, plus
    its bytes at TRANSFER_RATE. None when the batch was not measured."""
    if tensors is None or nbytes is None:
        return None
    return TRANSFER_BASE + nbytes / TRANSFER_RATE


def gather_estimate(tensors: Optional[int], nbytes: Optional[int]) -> Optional[float]:
    """One index per tensor of a batch: what a batched fetch costs."""
    if not tensors or nbytes is None:
        return None
    return tensors * GATHER_PER_TENSOR + nbytes / GATHER_RATE


def predicted_step(compute: float, work: float, cpu_work: float, transfer: float,
                   workers: int, cores: int, per_step: float = 1.0) -> float:
    """The step with `workers` workers (see the module docstring); `work`,
    `cpu_work` and `transfer` are per batch, `per_step` batches a step."""
    work, cpu_work, transfer = work * per_step, cpu_work * per_step, transfer * per_step
    return max(compute + transfer, CONTENTION * work / workers + transfer,
               (CONTENTION * (cpu_work + compute) + 2 * transfer) / max(1, cores))


def best_workers(compute: float, work: float, cpu_work: float, transfer: float,
                 cores: int, io_wait: bool, per_step: float = 1.0) -> tuple[int, float]:
    """The number of workers with the shortest predicted step (the fewest
    among equals), and that step. A dataset that waits on I/O gains from
    more workers than cores; one that computes, from no more."""
    limit = max(1, cores) * (2 if io_wait else 1)
    best = (1, predicted_step(compute, work, cpu_work, transfer, 1, cores, per_step))
    for w in range(2, limit + 1):
        step = predicted_step(compute, work, cpu_work, transfer, w, cores, per_step)
        if step < best[1] * 0.99:
            best = (w, step)
    return best


def less_cpu_wait(spent: float, runq: Optional[float], over: float) -> float:
    """A stage's time `spent` less its share of `runq`, the time waiting for
    a CPU measured over `over` seconds of work that includes the stage: what
    the stage takes where a core is free. What an in-memory dataset is
    judged by: on a loaded machine its wall time stretches with the run
    queue, and 5 us of indexing a sample read as 25 would pass for a
    dataset that does real work."""
    if not runq or over <= 0:
        return spent
    return spent * max(0.0, 1.0 - min(runq, over) / over)


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return "?"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def judge(lp: LoaderPipeline, batch: float, reader: float, cores: Optional[int],
          per_step: float = 1.0) -> Finding:
    """What to change in the loader `lp` that the steps wait on, from its
    stages: `batch` and `reader` are the Perf Summary's batch_cost and
    reader_cost (seconds per step), `cores` the cores this rank may use,
    `per_step` the fetches a step makes (more than one when gradients
    accumulate over several batches)."""
    out = Finding()
    if lp.fetch is None or not lp.fetches:
        return out
    per_step = max(1.0, per_step)
    # What stays in the main process whatever the loader does: the step
    # less its fetches. The reader_cost can hold more than the fetches (a
    # framework's wrapper that moves the batch, prefetches the next one):
    # that part stays too.
    fetching = min(reader, per_step * lp.fetch)
    compute = max(0.0, batch - fetching)
    out.evidence["stages"] = {s.name: s.per_batch for s in lp.stages}
    out.evidence["fetch"] = lp.fetch
    out.evidence["fetches"] = lp.fetches
    out.evidence["fetches_per_step"] = per_step
    out.evidence["held"] = lp.held
    out.evidence["compute"] = compute
    if lp.tensors is not None:
        out.evidence["batch"] = {"tensors": lp.tensors, "bytes": lp.bytes}
    if lp.num_workers:
        _judge_workers(lp, out, batch, compute, cores, per_step)
    else:
        _judge_main(lp, out, batch, compute, cores, per_step)
    slow = lp.slow_worker
    if slow is not None and slow.busy is not None:
        median = lp.usual_busy
        out.evidence["slow_worker"] = {"pid": slow.pid, "busy": slow.busy, "median": median}
        out.actions.insert(0, (
            f"look at worker pid {slow.pid}: it takes {duration(slow.busy)} a batch against "
            f"{duration(median or 0.0)} for the others (a shard, a file or a sample kind of "
            "its own?); the main process takes the batches in turn from each worker, so the "
            "loader runs at the slowest one's pace"
        ))
    return out


def _judge_main(lp: LoaderPipeline, out: Finding, batch: float, compute: float,
                cores: Optional[int], per_step: float) -> None:
    """num_workers=0: the main process makes every batch."""
    dataset, collate = lp.per_batch("dataset"), lp.per_batch("collate")
    work = dataset + collate
    cpu_work = lp.cpu if lp.cpu is not None else work
    # Time waiting for a CPU (a loaded machine) is time the work wanted the
    # CPU: not the dataset's own waiting on a file.
    runq = lp.runq if lp.runq is not None else 0.0
    samples = lp.samples
    per_sample = dataset / samples if samples else None
    # Judged in-memory or not on the dataset's time where a core is free.
    own_per_sample = less_cpu_wait(dataset, runq, work) / samples if samples else None
    io_wait = work > 0 and cpu_work + runq < IO_WAIT_CPU * work
    # The largest stage that a change to the loader could shorten: not the
    # time around the fetch, nor what is left unexplained.
    top = max((s for s in lp.stages if s.name not in ("around", "other")),
              key=lambda s: s.per_batch, default=lp.stages[0])
    parts = [f"{_title(s.name)} {duration(s.per_batch)}" for s in lp.stages
             if s.name != "other" and s.per_batch >= 0.01 * lp.fetch]
    out.message = (f"The batch is made in this process: {', '.join(parts)} of a "
                   f"{duration(lp.fetch)} fetch")
    if per_sample is not None:
        out.message += f" ({samples} samples, {duration(per_sample)} each in the dataset)"
        out.evidence["per_sample"] = per_sample
    if work > 0:
        share = min(1.0, cpu_work / work)
        out.message += (f"; {share * 100:.0f}% of the dataset and collate is CPU time"
                        if not io_wait else
                        f"; only {share * 100:.0f}% of the dataset and collate is CPU time: "
                        "it waits (on files, a network, a lock)")
        if runq >= 0.05 * work:
            out.message += (f", {min(1.0, runq / work) * 100:.0f}% waiting for a CPU (other "
                            "processes keep the cores busy)")
            out.evidence["runq_share"] = runq / work
        out.evidence["cpu_share"] = share
    out.message += "."
    transfer = transfer_estimate(lp.tensors, lp.bytes)
    cheap = own_per_sample is not None and own_per_sample < PER_SAMPLE_CHEAP
    if own_per_sample is not None and own_per_sample < 0.95 * (per_sample or 0.0):
        out.evidence["per_sample_free_core"] = own_per_sample
    # A collate_fn of the script's own does work of its own (padding,
    # tokenizing, augmenting) that a batched index would not do for it.
    default = lp.settings.get("collate_fn") in DEFAULT_COLLATES
    # In-memory indexing with torch's collate: what a worker would do is
    # copy memory, and each batch would cost more to move than to make.
    # Its fetch only looks long on a loaded machine (which slows the
    # worker's transfer as much): no workers, whatever the model says.
    in_memory = cheap and default
    recommended = False
    if transfer is not None and cores:
        out.evidence["transfer_estimate"] = transfer
        out.evidence["cores"] = cores
        workers, step = best_workers(compute, work, cpu_work, transfer, cores, io_wait,
                                     per_step)
        gain = batch - step
        out.evidence["workers_prediction"] = {"num_workers": workers, "step": step,
                                              "gain": gain}
        if gain >= WORKERS_MIN_GAIN * batch and not in_memory:
            recommended = True
            beyond = (f"; more workers than the {cores} cores, as the dataset mostly waits "
                      "(torch warns of it)" if workers > cores else "")
            out.actions.append(
                f"num_workers={workers}: the dataset and collate take {duration(work)} a "
                f"batch, which {workers} worker{'s' if workers > 1 else ''} would make while "
                f"the model runs; predicted: the step from {duration(batch)} to about "
                f"{duration(step)} (a batch of {lp.tensors} tensors, {_bytes(lp.bytes)}, "
                f"takes about {duration(transfer)} to reach this process){beyond}"
            )
    if recommended:
        return
    gather = gather_estimate(lp.tensors, lp.bytes)
    if gather is not None and cheap:
        out.evidence["batched_fetch_estimate"] = gather
    batched_gain = per_step * (work - gather) if gather is not None else 0.0
    if (default and top.name in ("dataset", "collate") and cheap and gather is not None
            and batched_gain >= WORKERS_MIN_GAIN * batch):
        out.actions.append(
            f"index a whole batch at once, as the per-sample indexing and collate cost "
            f"{duration(work)} a batch: DataLoader(dataset, sampler=BatchSampler(RandomSampler"
            f"(dataset), batch_size={samples}, drop_last=...), batch_size=None) for a "
            "TensorDataset, or a Dataset __getitems__ that slices its tensors; predicted: the "
            f"fetch falls from {duration(lp.fetch)} to about {duration(gather + lp.fetch - work)}"
        )
    elif top.name == "collate" and per_step * collate >= WORKERS_MIN_GAIN * batch:
        out.actions.append(
            f"a cheaper collate_fn: it takes {duration(collate)} of the {duration(lp.fetch)} "
            "fetch (stack into tensors made once, not per sample)"
        )
    elif top.name == "dataset" and per_step * dataset >= WORKERS_MIN_GAIN * batch:
        out.actions.append(
            f"a cheaper Dataset __getitem__: it takes {duration(dataset)} of the "
            f"{duration(lp.fetch)} fetch (decode or augment once and cache, smaller files)"
        )
    if transfer is not None and "workers_prediction" in out.evidence:
        if in_memory:
            out.actions.append(
                "keep num_workers=0: the dataset is in memory, and a worker would do the "
                "same indexing and stacking, then pickle each batch "
                f"({lp.tensors} tensors, {_bytes(lp.bytes)}) into shared memory for this "
                f"process to receive (about {duration(transfer)} a batch), on a core the "
                "model uses"
            )
        elif transfer >= work:
            out.actions.append(
                f"keep num_workers=0: from a worker, a batch of {lp.tensors} tensors "
                f"({_bytes(lp.bytes)}) would take about {duration(transfer)} to reach this "
                f"process, against {duration(work)} to make it here"
            )
        else:
            predicted = out.evidence["workers_prediction"]
            out.actions.append(
                f"keep num_workers=0: workers are predicted to gain less than "
                f"{WORKERS_MIN_GAIN * 100:.0f}% of the step (with "
                f"num_workers={predicted['num_workers']}: {duration(batch)} to about "
                f"{duration(predicted['step'])}), as the model and the batch's trip from a "
                "worker keep the cores busy"
            )
    elif transfer is None or not cores:
        out.actions.append(
            "measure before adding workers: the batch's size or the machine's cores were not "
            "recorded, so what workers would gain cannot be predicted"
        )


def _judge_workers(lp: LoaderPipeline, out: Finding, batch: float, compute: float,
                   cores: Optional[int], per_step: float) -> None:
    """num_workers > 0: the workers make the batches; the main process waits."""
    workers = lp.num_workers
    # A slow worker is its own finding (judge): what the others do says
    # whether the loader has anything else to fix.
    timed = lp.usual_workers
    making = (sum(w.busy * w.batches for w in timed) / sum(w.batches for w in timed)
              if timed else None)
    making_cpu = [w.cpu for w in timed if w.cpu is not None]
    cpu_making = sum(making_cpu) / len(making_cpu) if making_cpu else making
    making_runq = [w.runq for w in timed if w.runq is not None]
    runq_making = sum(making_runq) / len(making_runq) if making_runq else 0.0
    idle = [w.idle_share for w in timed if w.idle_share is not None]
    idle_share = sum(idle) / len(idle) if idle else None
    by_worker = lp.per_batch("worker dataset") + lp.per_batch("worker collate")
    transfer = lp.per_batch("transfer")
    held = lp.held
    out.evidence.update({"num_workers": workers, "making": making,
                         "worker_idle_share": idle_share})
    out.message = (f"{held} of {lp.fetches} fetches waited on the workers: "
                   f"{duration(by_worker)} a fetch for a batch still being made, "
                   f"{duration(transfer)} for one made and not yet here")
    if making is not None:
        out.message += f"; a worker makes a batch in {duration(making)}"
        if idle_share is not None:
            out.message += f" and is idle {idle_share * 100:.0f}% of its time"
    out.message += "."
    if making is None:
        return
    if lp.slow_worker is not None and by_worker >= transfer:
        # The waits are on the slow worker: until it is fixed, what more or
        # cheaper workers would gain cannot be told.
        return
    cpu_making = cpu_making or making
    busy = (per_step * cpu_making + compute) / batch if batch > 0 else 0.0
    saturated = bool(cores) and busy >= SATURATED * (cores or 1)
    # The workers wait (on files, a lock) more than they compute, or wait
    # for a CPU.
    waiting = cpu_making + runq_making < IO_WAIT_CPU * making
    out.evidence["cores_busy"] = busy
    # In-memory indexing with torch's collate, in workers: each batch is
    # memory copied once to make it and again to send it. Whether the
    # workers keep up or not, the batch belongs in the main process.
    # Judged on the workers' dataset time where a core is free (see
    # less_cpu_wait): their run-queue wait is measured over their busy time.
    dataset = [less_cpu_wait(w.dataset, w.runq, w.busy or 0.0) for w in timed
               if w.dataset is not None]
    samples = lp.samples
    per_sample = (sum(dataset) / len(dataset) / samples) if dataset and samples else None
    in_memory = (per_sample is not None and per_sample < PER_SAMPLE_CHEAP
                 and lp.settings.get("collate_fn") in DEFAULT_COLLATES)
    if in_memory:
        out.evidence["per_sample"] = per_sample
        if _no_workers(lp, out, batch, compute, per_step, making, cpu_making, transfer):
            return
    if by_worker >= transfer or saturated:
        # The workers cannot keep up, or the cores are taken.
        if not saturated and cores and (workers < cores or waiting):
            more, step = best_workers(compute, making, cpu_making, transfer, cores, waiting,
                                      per_step)
            gain = batch - step
            out.evidence["workers_prediction"] = {"num_workers": more, "step": step,
                                                  "gain": gain}
            if more > workers and gain >= WORKERS_MIN_GAIN * batch:
                reason = (f"the workers spend {duration(cpu_making)} of CPU on each "
                          f"{duration(making)} batch and wait the rest, which more of them "
                          "overlap" if waiting else f"the {cores} cores have room for them")
                out.actions.append(
                    f"raise num_workers from {workers} to {more} ({reason}): predicted, the "
                    f"step from {duration(batch)} to about {duration(step)}"
                )
                return
        stage = ("dataset" if lp.per_batch("worker dataset") >= lp.per_batch("worker collate")
                 else "collate")
        cost = [w.dataset if stage == "dataset" else w.collate for w in timed]
        known = [c for c in cost if c is not None]
        each = sum(known) / len(known) if known else 0.0
        where = (f"the {cores} core{'s' if cores != 1 else ''} available to this rank"
                 if cores else "the cores")
        if saturated:
            why = (f"the workers ({duration(cpu_making)} of CPU a batch) and the model "
                   f"({duration(compute)} a step) keep {where} {busy * 100 / (cores or 1):.0f}% "
                   "busy")
        elif waiting:
            why = (f"a worker waits {duration(making - cpu_making)} of its {duration(making)} "
                   "a batch (on files, a network, a lock, a sleep)")
        else:
            why = f"num_workers={workers} already uses {where}"
        out.actions.append(
            f"a cheaper {'Dataset __getitem__' if stage == 'dataset' else 'collate_fn'} "
            f"(decode or augment once and cache, smaller samples): {why}, and the {stage} "
            f"takes {duration(each)} of each worker's {duration(making)} a batch"
        )
        return
    # Batches are made in time and wait to be moved.
    if not in_memory and _no_workers(lp, out, batch, compute, per_step, making, cpu_making,
                                     transfer):
        return
    tensors, nbytes = lp.tensors, lp.bytes
    if tensors is not None and tensors > MANY_TENSORS:
        out.actions.append(
            f"fewer, larger tensors in a batch: each of its {tensors} tensors is sent from "
            f"the worker on its own, and a batch takes {duration(transfer)} to reach this "
            "process"
        )
    elif nbytes is not None and nbytes / TRANSFER_RATE > TRANSFER_BASE:
        out.actions.append(
            f"a smaller batch in bytes ({_bytes(nbytes)} now: uint8 images converted to "
            f"float in the main process or on the GPU, crops made in the worker): a batch "
            f"takes {duration(transfer)} to reach this process"
        )


def _no_workers(lp: LoaderPipeline, out: Finding, batch: float, compute: float,
                per_step: float, making: float, cpu_making: float, transfer: float) -> bool:
    """Recommend num_workers=0 where the step predicted without workers is
    WORKERS_MIN_GAIN shorter; True when it is."""
    # Made here, a batch takes its CPU time, without the contention, and
    # whatever it waited (a file, a network) as it is.
    made_here = max(0.0, making - cpu_making) + cpu_making / CONTENTION
    step = compute / CONTENTION + per_step * made_here
    gain = batch - step
    out.evidence["no_workers_prediction"] = {"step": step, "gain": gain}
    if gain < WORKERS_MIN_GAIN * batch:
        return False
    out.actions.append(
        f"num_workers=0: a batch takes {duration(making)} to make, "
        f"{duration(cpu_making)} of it CPU time, and "
        f"{duration(transfer)} to reach this process; predicted, the step from "
        f"{duration(batch)} to about {duration(step)} or less with the batch made here"
    )
    return True


def _title(name: str) -> str:
    return {"dataset": "dataset (__getitem__)", "pin": "pin_memory"}.get(name, name)


def cores_for_rank(cpu_count: Optional[int], ranks_per_host: int,
                   other_cores: Optional[float] = None) -> Optional[int]:
    """The cores one rank and its DataLoader workers may use: the host's,
    less what other processes took on average during the run (what was
    free then is what workers would have had), shared by its ranks."""
    if not cpu_count:
        return None
    free = cpu_count - (other_cores or 0.0)
    return max(1, int(round(max(free, 1.0))) // max(1, ranks_per_host))


