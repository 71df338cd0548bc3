"""Bottleneck advice: what the numbers above suggest trying next.

The rules are the ones Paddle's performance guide walks through: is the loop
waiting on its data (I/O-bound), on the host (CPU-bound) or on the GPU
(GPU-bound); does it stall on synchronisations; does one rank hold the
others back; are the step times even stable enough to compare.

Each rule is a pure function of `AdviceInputs` (numbers the report already
computed, plus a few facts from the reference rank's file: its DataLoaders'
settings, their start-up time, the machine's cores). A rule fires only when
the numbers it rests on were measured: no GPU samples, no GPU advice; no
detailed window, no synchronisation advice. Every `Advice` carries those
numbers in `evidence` and quotes them in its message, so a reader can check
it against the tables, and an `Advice` cannot be made without evidence.

Thresholds (module constants, so tests and readers see one value):

* I/O-bound: Reader Ratio (avg reader_cost / avg batch_cost) above 5%.
  What to change in the DataLoader comes from its fetch's stages and only
  from them (dataload.py: workers only where they are predicted to shorten
  the step, with the prediction quoted); without the stages (timer-only),
  the advice says how to measure them.
* CPU-bound, GPU runs: a GPU the run used averaged under 80% utilisation.
* CPU-bound, CPU-only runs: Others above 20% of the step. Others alone, not
  Others + Dataloader: the DataLoader's share already has its own rule, and
  counting it twice would send the reader after the same milliseconds under
  two names. Others is what is left of the loop itself: Python between the
  calls, logging, metrics, conversions; except when the steps trained but
  timed no forward (the model ran inside a compiled function), or, in one
  process whose Backward holds no collective, a Forward under a tenth of
  the Backward (the model called as `model.forward(x)`), when Others
  holds the forward too and the rule does not judge it.
* GPU-bound: a GPU the run used averaged over 90% utilisation.
* Synchronisation stalls: any synchronisation per step in a detailed window
  that recorded GPU activity (on a CPU, reading a value stalls nothing).
* Slow rank: when the ranks wait for each other (a phase absorbs lateness),
  the culprit decided by straggler.py, never its victims: the rank that
  reaches the waiting phase last, in at least 60% of the steps, by at least
  5% of the median step (and 1 ms) of its own extra work, with the phase
  where it loses the time. Otherwise (ranks that never wait) a rank more than 10% above the
  median rank in the step or in one phase, and by at least 2% of the median
  step (a 50% difference in a phase of 0.1 ms is noise, not a slow rank).
* Memory creep: a process (a rank, or one of its DataLoader workers) whose
  resident memory grows steadily over the steady steps, as analysis/memory.py
  decides; silent on a flat run and on one jump.
* Unstable timing: coefficient of variation of the counted steps above 0.25,
  or the slowest step more than 3x the median, over at least 5 steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from perfrun.analysis.dataload import cores_for_rank, judge
from perfrun.analysis.device import DeviceSummary
from perfrun.analysis.memory import MemorySummary
from perfrun.analysis.pipeline import PipelineSummary
from perfrun.analysis.ranks import RANK_QUANTITIES, MultiRankSummary
from perfrun.analysis.stats import duration, size, times
from perfrun.analysis.straggler import ranks_phrase
from perfrun.analysis.summary import PHASE_TITLES, ModelSummary, PerfSummary, forward_unseen
from perfrun.store.schema import as_finite, as_int

#: Reader Ratio (a fraction) above which the loop is I/O-bound.
READER_RATIO_LIMIT = 0.05
#: GPU utilisation (%) below which the GPU waits on the host.
GPU_UTIL_LOW = 80.0
#: GPU utilisation (%) above which the GPU is the bottleneck.
GPU_UTIL_HIGH = 90.0
#: Share of the step (%) in Others above which a CPU-only loop is held back
#: by its own Python.
OTHERS_SHARE_LIMIT = 20.0
#: How much slower (%) than the median rank a rank must be.
SLOW_RANK_LIMIT = 10.0
#: ... and by how much at least, as a fraction of the median step time.
SLOW_RANK_MIN_SHARE = 0.02
#: Coefficient of variation of the step time above which timing is unstable.
UNSTABLE_CV = 0.25
#: Slowest step over median step above which timing is unstable.
UNSTABLE_SPIKE = 3.0
#: Fewer counted steps than this say nothing about spread.
MIN_STEPS = 5
#: DataLoader start-up worth keeping workers alive for: this fraction of the
#: time the steps took.
INIT_SHARE = 0.02

#: Stable identifiers of the rules, in the order advice is given.
KINDS = ("io-bound", "cpu-bound", "gpu-bound", "sync-stall", "slow-rank", "memory-creep",
         "unstable-timing")

KIND_TITLES = {
    "io-bound": "I/O-bound",
    "cpu-bound": "CPU-bound",
    "gpu-bound": "GPU-bound",
    "sync-stall": "Synchronisation stalls",
    "slow-rank": "Slow rank",
    "memory-creep": "Memory creep",
    "unstable-timing": "Unstable timing",
}

_LOADER_KEYS = (
    "dataset",
    "batch_size",
    "num_workers",
    "pin_memory",
    "persistent_workers",
    "prefetch_factor",
)


@dataclass(frozen=True)
class Advice:
    """One finding. `message` says what was measured, with its numbers;
    `actions` what to try; `evidence` the raw numbers (seconds, fractions,
    percents as named) the message rests on."""

    kind: str
    message: str
    evidence: dict[str, Any]
    actions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KIND_TITLES:
            raise ValueError(f"unknown advice kind {self.kind!r}")
        if not self.evidence:
            raise ValueError(f"{self.kind} advice without evidence")

    @property
    def title(self) -> str:
        return KIND_TITLES[self.kind]

    def text(self) -> str:
        """One line for the reports: title, finding, what to try."""
        line = f"{self.title}: {self.message}"
        if self.actions:
            line += " Try: " + "; ".join(self.actions) + "."
        return line

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "title": self.title,
            "message": self.message,
            "actions": list(self.actions),
            "evidence": _plain(self.evidence),
        }


@dataclass(frozen=True)
class AdviceInputs:
    """What the rules look at. Everything is optional: a rule whose numbers
    are missing does not fire.

    `uses_gpu` is True when the run's own records show CUDA work (GPU phase
    timings): NVML lists every GPU of the host, used or not, so utilisation
    alone does not say the run used a GPU. `dataloaders` are the settings of
    the DataLoaders the reference rank iterated (rank file `dataloaders`),
    `dataloader_init` its `extra.dataloader_init` ({calls, time}), `steps`
    the steps it recorded, `cpu_count` its machine's cores and
    `ranks_per_host` how many ranks share them, `other_cores` how many other
    processes took (host-load evidence). `window_summary` is the
    detailed window's summary of `window_rank`. `backward_collectives`:
    whether the reference rank's Backward may hold collectives
    (summary.backward_collectives; None: not known), which decides whether
    a short Forward means the model's forward went unseen into Others.
    """

    perf: Optional[PerfSummary] = None
    model: Optional[ModelSummary] = None
    ranks: Optional[MultiRankSummary] = None
    device: Optional[DeviceSummary] = None
    uses_gpu: bool = False
    dataloaders: Sequence[Mapping[str, Any]] = ()
    dataloader_init: Optional[Mapping[str, Any]] = None
    steps: int = 0
    cpu_count: Optional[int] = None
    #: The cores other processes took on the host, on average over the run.
    other_cores: Optional[float] = None
    ranks_per_host: int = 1
    window: Optional[tuple[int, int]] = None
    window_summary: Optional[Mapping[str, Any]] = None
    window_rank: Optional[int] = None
    pipeline: Optional[PipelineSummary] = None
    memory: Optional[MemorySummary] = None
    backward_collectives: Optional[bool] = None


Rule = Callable[[AdviceInputs], list[Advice]]


# -- helpers -----------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Evidence as JSON-ready values: tuples become lists, keys strings."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _percent(value: float) -> str:
    return f"{value:.1f}%"


# -- I/O-bound -----------------------------------------------------------------------


def _loader(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: raw.get(k) for k in _LOADER_KEYS}


def _loader_settings(loader: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={loader[k]}" for k in _LOADER_KEYS[2:])


def _loader_actions(
    loader: Mapping[str, Any], inp: AdviceInputs, perf: PerfSummary
) -> tuple[list[str], dict[str, Any]]:
    """What to change in one DataLoader whatever its stages say (its
    iterator's start-up, pinning on a GPU run), and the numbers behind it."""
    actions: list[str] = []
    evidence: dict[str, Any] = {}
    workers = as_int(loader.get("num_workers"))
    if loader.get("pin_memory") is False and inp.uses_gpu:
        actions.append("pin_memory=True, so copies to the GPU come from page-locked memory")
    init = inp.dataloader_init or {}
    calls = as_int(init.get("calls")) or 0
    init_time = as_finite(init.get("time")) or 0.0
    batch_avg = perf.batch_cost.avg or 0.0
    steps = max(inp.steps, perf.steps)
    if (
        loader.get("persistent_workers") is False
        and workers
        and calls > 1
        and init_time > 0.0
        and init_time >= INIT_SHARE * batch_avg * steps
    ):
        evidence["dataloader_init"] = {"calls": calls, "time": init_time}
        actions.append(
            f"persistent_workers=True: the iterator was created {calls} times and its "
            f"start-up took {duration(init_time)} in all ({duration(init_time / calls)} "
            "each), which persistent workers pay once"
        )
    return actions, evidence


#: Said where the fetch was not measured stage by stage.
UNMEASURED = (
    "measure the fetch stage by stage before changing num_workers: perfrun's default mode "
    "(without --timer-only) times the sampler, the dataset, the collate and the workers, "
    "and says which change would pay"
)


def io_bound(inp: AdviceInputs) -> list[Advice]:
    """The loop waits on its data: Reader Ratio above `READER_RATIO_LIMIT`.
    What to change comes from the fetch's stages (dataload.py), and only
    from them: without them, the advice says how to measure them."""
    perf = inp.perf
    if perf is None or not perf.steps:
        return []
    ratio = as_finite(perf.reader_ratio)
    reader = as_finite(perf.reader_cost.avg)
    batch = as_finite(perf.batch_cost.avg)
    if ratio is None or reader is None or batch is None or not ratio > READER_RATIO_LIMIT:
        return []
    evidence: dict[str, Any] = {
        "reader_ratio": ratio,
        "threshold": READER_RATIO_LIMIT,
        "reader_cost_avg": reader,
        "batch_cost_avg": batch,
        "steps": perf.steps,
    }
    message = (
        f"Reader Ratio {ratio * 100:.3f}% (above {READER_RATIO_LIMIT * 100:g}%): "
        f"each step waits {duration(reader)} for its batch out of {duration(batch)}."
    )
    described = [d for d in inp.dataloaders if isinstance(d, Mapping)]
    # The loaders the steps wait on: those iterated with gradients on (an
    # evaluation loader's iterator is made under no_grad); identical ones once.
    training = [d for d in described if d.get("training", True)] or described
    loaders = []
    for d in training:
        loader = _loader(d)
        if loader not in loaders:
            loaders.append(loader)
    actions: list[str] = []
    main = inp.pipeline.main if inp.pipeline is not None else None
    if main is not None and main.fetch is not None:
        loader = _loader(main.settings)
        name = loader.get("dataset") or "a dataset"
        message += f" DataLoader over {name}: {_loader_settings(loader)}."
        evidence["dataloaders"] = [loader]
        calls = perf.dataloader_calls
        per_step = calls / perf.steps if calls else 1.0
        cores = cores_for_rank(inp.cpu_count, inp.ranks_per_host, inp.other_cores)
        found = judge(main, batch, reader, cores, per_step)
        if cores is not None and inp.other_cores and cores_for_rank(
                inp.cpu_count, inp.ranks_per_host) != cores:
            found.message += (f" Other processes took {inp.other_cores:.2f} of the host's "
                              f"{inp.cpu_count} cores on average during the run: the advice "
                              f"counts {cores} for this rank.")
            found.evidence["other_cores"] = inp.other_cores
        if found.message:
            message += " " + found.message
        evidence["pipeline"] = found.evidence
        if inp.cpu_count:
            evidence["cpu_count"] = inp.cpu_count
            evidence["ranks_per_host"] = inp.ranks_per_host
        actions += found.actions
        these, numbers = _loader_actions(loader, inp, perf)
        evidence.update(numbers)
        actions += these
    elif loaders:
        evidence["dataloaders"] = loaders
        several = len(loaders) > 1
        for loader in loaders:
            name = loader.get("dataset") or "a dataset"
            message += f" DataLoader over {name}: {_loader_settings(loader)}."
            these, numbers = _loader_actions(loader, inp, perf)
            evidence.update(numbers)
            actions += [f"({name}) {a}" if several else a for a in these]
        actions.append(UNMEASURED)
    else:
        actions.append(UNMEASURED)
    return [Advice("io-bound", message, evidence, tuple(actions))]


# -- CPU-bound / GPU-bound -------------------------------------------------------------


def _active_gpus(device: Optional[DeviceSummary]) -> list[dict[str, Any]]:
    """GPUs with a measured utilisation that ever rose above zero. NVML
    lists every GPU of the host; one that never did any work was not this
    run's."""
    out: list[dict[str, Any]] = []
    if device is None:
        return out
    for host in device.hosts:
        for gpu in host.gpus:
            avg = as_finite(gpu.util_avg)
            peak = as_finite(gpu.util_max)
            if avg is None or not (peak or avg):
                continue
            out.append(
                {"host": host.hostname, "index": gpu.index, "name": gpu.name, "util_avg": avg}
            )
    return out


def _gpu_names(gpus: Sequence[Mapping[str, Any]], several_hosts: bool) -> str:
    parts = []
    for g in gpus:
        where = f"{g['host']} " if several_hosts else ""
        parts.append(f"{where}GPU{g['index']} {_percent(g['util_avg'])}")
    return ", ".join(parts)


def _others(model: Optional[ModelSummary]) -> Optional[tuple[float, float, float]]:
    """(Others share %, Others avg, step avg) of the Model Summary."""
    if model is None or not model.steps:
        return None
    try:
        others = model.row("Others")
        step = model.row("ProfileStep")
    except KeyError:
        return None
    share = as_finite(others.cpu_ratio)
    avg = as_finite(others.cpu.avg)
    step_avg = as_finite(step.cpu.avg)
    if share is None or avg is None or step_avg is None:
        return None
    return share, avg, step_avg


def _cpu_only(inp: AdviceInputs) -> bool:
    """A run known to use no GPU: it timed no GPU work and no GPU of the host
    did any (a busy GPU the run did not time may still be its own, in
    --timer-only runs, so that case gets no CPU-only advice either)."""
    return not inp.uses_gpu and not _active_gpus(inp.device)


def cpu_bound(inp: AdviceInputs) -> list[Advice]:
    """The host holds the loop back: a GPU the run used averaged under
    `GPU_UTIL_LOW`; on CPU-only runs, Others above `OTHERS_SHARE_LIMIT`."""
    others = _others(inp.model)
    if inp.uses_gpu:
        gpus = _active_gpus(inp.device)
        low = [g for g in gpus if g["util_avg"] < GPU_UTIL_LOW]
        if not low:
            return []
        several_hosts = len({g["host"] for g in gpus}) > 1
        evidence: dict[str, Any] = {"gpus": low, "threshold": GPU_UTIL_LOW}
        message = (
            f"average GPU utilisation below {GPU_UTIL_LOW:g}%: "
            f"{_gpu_names(low, several_hosts)}; the GPU waits for the host to give it work."
        )
        if others is not None and not forward_unseen(inp.model, inp.backward_collectives):
            share, avg, step_avg = others
            evidence.update(others_ratio=share, others_avg=avg, step_avg=step_avg)
            message += (
                f" Others (what the loop runs between the phases) is {_percent(share)} of "
                f"the step ({duration(avg)} of {duration(step_avg)})."
            )
            seen = others_seen(inp.window_summary)
            if seen is not None:
                message += " " + seen[0]
                evidence["window_others"] = seen[1]
        actions = (
            "check the I/O and synchronisation advice, if any, first",
            "fewer, larger kernels: a larger batch, torch.compile, or CUDA graphs cut "
            "launch overhead",
            "move per-step logging and metrics off the critical path",
        )
        return [Advice("cpu-bound", message, evidence, actions)]
    if not _cpu_only(inp) or others is None or forward_unseen(inp.model, inp.backward_collectives):
        # (An unseen forward is in Others: its share says nothing of the
        # loop's own Python; the report's notes say why.)
        return []
    share, avg, step_avg = others
    if not share > OTHERS_SHARE_LIMIT:
        return []
    evidence = {
        "others_ratio": share,
        "threshold": OTHERS_SHARE_LIMIT,
        "others_avg": avg,
        "step_avg": step_avg,
        "steps": inp.model.steps if inp.model else 0,
    }
    message = (
        f"Others is {_percent(share)} of each step ({duration(avg)} of {duration(step_avg)}; "
        f"above {OTHERS_SHARE_LIMIT:g}%): time in none of the four phases, what the loop "
        "runs between the calls perfrun times"
    )
    if inp.perf is not None and inp.perf.no_dataloader:
        message += " (with no DataLoader, the batch's preparation among it)"
    seen = others_seen(inp.window_summary)
    if seen is None:
        # What runs there is not measured outside a window: the advice
        # names where to look, not a cause it has not seen.
        message += "."
        actions: tuple[str, ...] = (
            "see what runs between the phases in a detailed window (--scheduler START END): "
            "this advice then names the operators that run there",
            "then move per-step logging and metrics off the step (every N steps)",
        )
        return [Advice("cpu-bound", message, evidence, actions)]
    message += ". " + seen[0]
    evidence["window_others"] = seen[1]
    actions = (
        "of the operators named, run what need not run every step (logging, metrics) every "
        "N steps",
    )
    return [Advice("cpu-bound", message, evidence, actions)]


def others_seen(summary: Optional[Mapping[str, Any]]) -> Optional[tuple[str, dict[str, Any]]]:
    """What the detailed window saw in Others (trace.others_in_steps): a
    sentence naming the operators that ran there and what is left for the
    loop's own Python, a step each, and its evidence; None without a
    window, or with one written before Others was recorded."""
    if not isinstance(summary, Mapping):
        return None
    others = summary.get("others")
    steps = as_int(summary.get("steps")) or 0
    if not isinstance(others, Mapping) or steps <= 0:
        return None
    time = as_finite(others.get("time"))
    ops = as_finite(others.get("operators"))
    if time is None or ops is None or not time > 0:
        return None
    top = [t for t in others.get("top") or [] if isinstance(t, Mapping)
           and isinstance(t.get("name"), str) and as_finite(t.get("total"))]

    def each(t: Mapping[str, Any]) -> str:
        calls = (as_int(t.get("calls")) or 0) / steps
        count = f"{calls:.0f}" if calls == int(calls) else f"{calls:.1f}"
        return (f"{t['name']} {duration(float(t['total']) / steps)} in {count} "
                f"call{'' if count == '1' else 's'}")

    named = ", ".join(each(t) for t in top[:5])
    python = max(0.0, time - ops)
    sentence = (f"In the detailed window Others took {duration(time / steps)} a step: "
                f"operators {duration(ops / steps)}" + (f" ({named})" if named else "")
                + f", and {duration(python / steps)} outside any operator: the loop's own "
                "Python.")
    return sentence, {"time": time, "operators": ops, "python": python, "steps": steps,
                      "top": [dict(t) for t in top]}


def gpu_bound(inp: AdviceInputs) -> list[Advice]:
    """The GPU is the bottleneck: a GPU the run used averaged over
    `GPU_UTIL_HIGH`."""
    if not inp.uses_gpu:
        return []
    gpus = _active_gpus(inp.device)
    high = [g for g in gpus if g["util_avg"] > GPU_UTIL_HIGH]
    if not high:
        return []
    several_hosts = len({g["host"] for g in gpus}) > 1
    message = (
        f"average GPU utilisation above {GPU_UTIL_HIGH:g}%: {_gpu_names(high, several_hosts)}; "
        "the GPU is busy, so speed-ups must come from the work it does."
    )
    actions = (
        "mixed precision (torch.autocast with bfloat16 or float16)",
        "torch.compile to fuse kernels",
        "find the kernels that dominate in a detailed window (--scheduler START END)",
    )
    return [Advice("gpu-bound", message, {"gpus": high, "threshold": GPU_UTIL_HIGH}, actions)]


# -- synchronisation stalls ------------------------------------------------------------


def _window_gpu_calls(summary: Mapping[str, Any]) -> int:
    calls = 0
    for entry in summary.get("overview") or []:
        if isinstance(entry, Mapping) and entry.get("side") == "gpu":
            calls += as_int(entry.get("calls")) or 0
    return calls


def sync_stalls(inp: AdviceInputs) -> list[Advice]:
    """Synchronisations (synchronising CUDA calls: `.item()`, `.cpu()`,
    synchronize) in the detailed window, when it saw GPU work, and the ops
    that made them."""
    summary = inp.window_summary
    if not isinstance(summary, Mapping):
        return []
    mm = summary.get("memory_manipulation")
    if not isinstance(mm, Mapping):
        return []
    per_step = as_finite(mm.get("sync_per_step"))
    calls = as_int(mm.get("sync_calls")) or 0
    gpu_calls = _window_gpu_calls(summary)
    if per_step is None or not per_step > 0.0 or calls <= 0 or gpu_calls <= 0:
        return []
    steps = as_int(summary.get("steps"))
    evidence: dict[str, Any] = {
        "sync_calls": calls,
        "sync_per_step": per_step,
        "window_steps": steps,
        "gpu_calls": gpu_calls,
    }
    where = "the detailed window"
    if inp.window is not None:
        evidence["window"] = list(inp.window)
        where += f" [{inp.window[0]}, {inp.window[1]})"
    if inp.window_rank is not None:
        evidence["rank"] = inp.window_rank
        where += f" of rank {inp.window_rank}"
    over = f" over its {steps} steps" if steps else ""
    by_op = mm.get("sync_by_op")
    made = ""
    if isinstance(by_op, Mapping) and by_op:
        evidence["sync_by_op"] = dict(by_op)
        top = sorted(by_op.items(), key=lambda kv: -(as_int(kv[1]) or 0))[:3]
        made = "; made by " + ", ".join(f"{name} ({n})" for name, n in top)
    message = (
        f"{per_step:.2f} synchronisations per step ({calls} in {where}{over}{made}): each "
        "makes the CPU wait until the GPU has finished all the work queued before it."
    )
    actions = (
        "keep losses and metrics on the GPU and read them every N steps",
        "avoid .item(), .cpu(), .tolist() and Python conditions on tensor values inside "
        "the step",
        "copy inputs with .to(device, non_blocking=True) from pinned memory",
    )
    return [Advice("sync-stall", message, evidence, actions)]


# -- slow rank -------------------------------------------------------------------------------


_QUANTITY_TITLES = {"step": "the step", "others": "Others", **PHASE_TITLES}

_SLOW_ACTIONS = {
    "dataloader": "check that rank's data shard and its host's disk and CPU",
    "forward": "check that rank's {device} and whether its batches are larger",
    "backward": "check that rank's {device}; in data-parallel training the ranks that wait "
    "for a slow one show the wait in Backward (the gradient all-reduce)",
    "optimization": "check that rank's {device} and whether it holds more parameters or "
    "optimizer state than the others",
    "others": "look for work only that rank does (logging, checkpointing, evaluation)",
    "step": "every step waits for the slowest rank: compare its phases with the others' "
    "in the Ranks table",
}

#: What runs a rank's phases, as the actions name it.
_DEVICE = {True: "GPU (clocks, temperature, other processes)",
           False: "host CPU (other processes on its cores, its CPU threads)"}


def _slow_action(quantity: str, uses_gpu: bool) -> str:
    return _SLOW_ACTIONS.get(quantity, _SLOW_ACTIONS["step"]).format(device=_DEVICE[uses_gpu])


def _rank_values(ranks: MultiRankSummary, quantity: str) -> list[tuple[int, float]]:
    out = []
    for row in ranks.rows:
        if not row.counted:
            continue
        if quantity == "step":
            value = row.step_avg
        elif quantity == "others":
            value = row.others_avg
        else:
            value = row.phase_avg.get(quantity)
        number = as_finite(value)
        if number is not None:
            out.append((row.rank, number))
    return out


def slow_ranks(inp: AdviceInputs) -> list[Advice]:
    """For the step and each phase, the rank furthest above the median rank,
    when it is more than `SLOW_RANK_LIMIT` percent and `SLOW_RANK_MIN_SHARE`
    of the median step above it; the largest differences first."""
    ranks = inp.ranks
    if ranks is None:
        return []
    verdict = getattr(ranks, "straggler", None)
    if verdict is not None and verdict.wait_phase is not None:
        # The ranks wait for each other: the slowest rank in a phase may be
        # a victim, so the culprit decision (straggler.py) speaks instead.
        return culprit_advice(verdict, inp.uses_gpu)
    step_median = as_finite(ranks.across["step"].median) if "step" in ranks.across else None
    if not step_median:
        return []
    found: list[tuple[float, Advice]] = []
    for quantity in RANK_QUANTITIES:
        values = _rank_values(ranks, quantity)
        if len(values) < 2:
            continue
        median = as_finite(ranks.across[quantity].median) if quantity in ranks.across else None
        if median is None:
            continue
        rank, worst = max(values, key=lambda rv: (rv[1], -rv[0]))
        excess = worst - median
        if excess < SLOW_RANK_MIN_SHARE * step_median:
            continue
        percent = (worst / median - 1.0) * 100.0 if median > 0.0 else None
        if percent is not None and not percent > SLOW_RANK_LIMIT:
            continue
        evidence = {
            "rank": rank,
            "quantity": quantity,
            "value": worst,
            "median": median,
            "percent_slower": percent,
            "threshold": SLOW_RANK_LIMIT,
            "ranks_compared": len(values),
            "median_step": step_median,
        }
        if quantity == "step":
            what = f"takes {duration(worst)} a step"
        else:
            what = f"spends {duration(worst)} a step in {_QUANTITY_TITLES[quantity]}"
        if percent is None:
            than = "while the median rank spends none"
        else:
            than = f"{_percent(percent)} more than the median rank ({duration(median)})"
        message = f"rank {rank} {what}, {than}, over {len(values)} ranks."
        found.append((excess, Advice("slow-rank", message, evidence,
                                     (_slow_action(quantity, inp.uses_gpu),))))
    found.sort(key=lambda item: -item[0])
    return [advice for _, advice in found]


def culprit_advice(verdict: Any, uses_gpu: bool = False) -> list[Advice]:
    """The rank the others wait for, the phase where it loses the time, and
    the ranks that wait; nothing when no rank stands out."""
    if verdict.culprit is None or verdict.culprit_phase is None:
        return []
    phase = verdict.culprit_phase
    title = _QUANTITY_TITLES.get(phase, phase)
    wait_title = _QUANTITY_TITLES.get(verdict.wait_phase, verdict.wait_phase)
    message = (
        f"rank {verdict.culprit} loses {duration(verdict.phase_loss)} per step in {title}"
    )
    if verdict.victims:
        verb = "waits" if len(verdict.victims) == 1 else "wait"
        message += f"; {ranks_phrase(verdict.victims)} {verb} for it in {wait_title}"
    message += (
        f" ({_percent(verdict.share * 100.0)} of the {duration(verdict.step_median)} step; "
        f"it arrives last in {verdict.consistency:.0%} of {verdict.steps} steps)."
    )
    evidence = {
        "rank": verdict.culprit,
        "quantity": phase,
        "culprit_phase": phase,
        "wait_phase": verdict.wait_phase,
        "loss_per_step": verdict.phase_loss,
        "lateness": verdict.lateness,
        "loss": verdict.loss,
        "share": verdict.share,
        "victims": list(verdict.victims),
        "consistency": verdict.consistency,
        "median_step": verdict.step_median,
    }
    return [Advice("slow-rank", message, evidence, (_slow_action(phase, uses_gpu),))]


# -- memory creep ----------------------------------------------------------------------------


def memory_creep(inp: AdviceInputs) -> list[Advice]:
    """One finding per kind of process whose memory creeps
    (analysis/memory.py decides): a rank, or a rank's DataLoader workers
    together (each with its own figures), with the slope, the span and the
    step at which the line meets the memory the rank may use."""
    if inp.memory is None:
        return []
    groups: dict[tuple[int, str], list[Any]] = {}
    for p in inp.memory.creeping:
        groups.setdefault((p.rank, p.kind), []).append(p)
    out = []
    for (rank, kind), procs in groups.items():
        worst = max(procs, key=lambda p: p.creep.slope)
        c = worst.creep
        what = "private" if worst.measure == "uss" else "resident"
        if len(procs) == 1:
            who = worst.label
        else:
            pids = ", ".join(str(p.pid) for p in procs)
            who = f"rank {rank}'s {len(procs)} {kind}s (pids {pids})"
        evidence = {
            "processes": [
                {"process": p.label, "pid": p.pid, "measure": p.measure,
                 "bytes_per_1000_steps": p.creep.per_1000_steps,
                 "first_step": p.creep.first_step, "last_step": p.creep.last_step,
                 "first": p.creep.first, "last": p.creep.last, "r2": p.creep.r2,
                 "full_at_step": p.creep.full_at}
                for p in procs
            ],
            "limit": c.limit,
        }
        each = " each" if len(procs) > 1 else ""
        message = (
            f"{who}: {what} memory grew steadily over steps {c.first_step:,}-"
            f"{c.last_step:,}, {size(c.first)} -> {size(c.last)}"
            + (f" in the fastest, pid {worst.pid}" if len(procs) > 1 else "")
            + f": {size(c.per_1000_steps)} per 1,000 steps{each} (a straight line explains "
            f"it: R² {c.r2:.2f})."
        )
        if c.full_at is not None and c.limit:
            message += (f" At that rate it reaches the {size(c.limit)} this rank may use "
                        f"at about step {c.full_at:,}.")
        if "DataLoader" in kind:
            actions = [
                "keep the Dataset's samples in numpy arrays or tensors, not lists or dicts of "
                "Python objects: each worker copies the pages it reads (every access writes a "
                "reference count), so its memory grows with what it has read",
                "look for a cache filled in __getitem__: each worker keeps its own copy",
            ]
        else:
            actions = [
                "look for tensors kept across steps (per-step outputs appended to a list, a "
                "loss summed with its graph: keep `.item()`, or `.detach()` what you keep)",
                "look for caches that only grow",
            ]
        out.append(Advice("memory-creep", message, evidence, tuple(actions)))
    for d in inp.memory.devices:
        c = d.creep
        if c is None:
            continue
        message = (
            f"{d.label}: GPU memory allocated at the end of a step grew steadily over "
            f"steps {c.first_step:,}-{c.last_step:,}, {size(c.first)} -> {size(c.last)}: "
            f"{size(c.per_1000_steps)} per 1,000 steps (R² {c.r2:.2f})."
        )
        if c.full_at is not None and c.limit:
            message += f" At that rate the device's {size(c.limit)} is full at about step " \
                f"{c.full_at:,}."
        evidence = {"rank": d.rank, "device": d.device,
                    "bytes_per_1000_steps": c.per_1000_steps, "first_step": c.first_step,
                    "last_step": c.last_step, "first": c.first, "last": c.last, "r2": c.r2,
                    "full_at_step": c.full_at, "limit": c.limit}
        actions = (
            "look for tensors kept across steps: a loss or an output appended to a list or "
            "summed with its graph (keep `.item()`, or `.detach()` what you keep)",
            "look for caches on the GPU that only grow (a dict of tensors keyed by input)",
            "run again with --memory-snapshot: the snapshot's live allocations say in which "
            "step and phase each was made",
        )
        out.append(Advice("memory-creep", message, evidence, actions))
    return out


# -- unstable timing -------------------------------------------------------------------------


def unstable_timing(inp: AdviceInputs) -> list[Advice]:
    """Steps too uneven for their average to mean much: coefficient of
    variation above `UNSTABLE_CV`, or the slowest step above `UNSTABLE_SPIKE`
    times the median."""
    perf = inp.perf
    if perf is None:
        return []
    stats = perf.batch_cost
    avg, stdev = as_finite(stats.avg), as_finite(stats.stdev)
    median, peak = as_finite(stats.median), as_finite(stats.max)
    if stats.n < MIN_STEPS or not avg or not median or stdev is None or peak is None:
        return []
    cv = stdev / avg
    spike = peak / median
    if not (cv > UNSTABLE_CV or spike > UNSTABLE_SPIKE):
        return []
    evidence = {
        "steps": stats.n,
        "avg": avg,
        "stdev": stdev,
        "median": median,
        "max": peak,
        "cv": cv,
        "max_over_median": spike,
        "cv_threshold": UNSTABLE_CV,
        "spike_threshold": UNSTABLE_SPIKE,
    }
    cv_part = f"coefficient of variation {cv:.2f} (stdev {duration(stdev)} over avg {duration(avg)}"
    cv_part += f"; above {UNSTABLE_CV})" if cv > UNSTABLE_CV else ")"
    spike_part = f"slowest step {duration(peak)}, {times(spike)} the median {duration(median)}"
    spike_part += f" (above {UNSTABLE_SPIKE:g}x)" if spike > UNSTABLE_SPIKE else ""
    message = (
        f"step times vary over the {stats.n:,} counted steps: {cv_part}; {spike_part}. "
        "Averages and comparisons of such a run are unreliable."
    )
    actions = ["look for periodic work (evaluation, checkpointing, logging, garbage collection)"]
    if inp.uses_gpu:
        # Kernels are chosen per shape on a GPU (cuDNN's benchmark mode,
        # compiled graphs); on the CPU a new shape costs no re-tuning.
        actions.append("keep input shapes fixed (padding or bucketing) so kernels are not "
                       "re-tuned")
    if inp.other_cores is not None and inp.other_cores >= 0.5:
        evidence["other_cores"] = inp.other_cores
        actions.append(f"run where other processes do not share the cores: they took "
                       f"{inp.other_cores:.2f} cores on average during the run")
    else:
        actions.append("check for other load on the machine (CPU(System) in the Device "
                       "Summary)")
    actions.append("a larger --warmup if the first counted steps are still warming up")
    return [Advice("unstable-timing", message, evidence, tuple(actions))]


#: The rules, in the order their advice is given.
RULES: tuple[Rule, ...] = (io_bound, cpu_bound, gpu_bound, sync_stalls, slow_ranks, memory_creep,
                          unstable_timing)


def advise(inputs: AdviceInputs, rules: Iterable[Rule] = RULES) -> list[Advice]:
    """Every rule's advice, in rule order."""
    out: list[Advice] = []
    for rule in rules:
        out.extend(rule(inputs))
    return out


# -- from a report -----------------------------------------------------------------------------
