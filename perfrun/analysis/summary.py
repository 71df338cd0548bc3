"""The Perf and Model Summaries: from a rank's counted steps to the numbers
those two tables print.

Everything here is a pure function of the steps, so that `perfrun report
DIR` prints exactly what the live run printed, and so that the arithmetic
(Others, ratios, rates) is unit-tested on hand-written rows rather than
trusted from end-to-end runs. Which steps count is decided apart
(selection.py); the report that holds these summaries is assembled apart
(report.py).

Conventions:

* A step's time is `end - start - excluded` (evaluation passes and DataLoader
  iterator start-up inside the step's span are not part of the step).
* Others is the step time minus its four phases, so the phases plus Others
  add up to the step time by construction. The runtime measures exclusive
  phases inside the step's span, so Others cannot be negative except by float
  noise, which is clamped to zero; a step whose phases exceed it by more than
  `columns.OVERSHOOT_TOLERANCE` is counted and reported as a note, never hidden.
* Model Summary Avg / Max / Min are **per step**, not per call: "Forward
  avg 12 ms" means a step spends 12 ms in forward, however many forward calls
  (micro-batches, GAN halves) it makes. Per-step figures are what add up to
  the step time; per-call figures would not.
* Steps arrive as their Quantities (analysis/columns.py: each step's
  times, computed once, by a pass over a long rank a block at a time), as a
  table, or as rows of lists in tests and hand-built results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from perfrun.analysis.columns import quantities
from perfrun.analysis.digest import per_second, stats_of
from perfrun.analysis.stats import Rate, Stats
from perfrun.store.schema import as_finite, as_int
from perfrun.store.stepfile import PHASES

#: Phase names as the tables print them, in row order.
PHASE_TITLES = {
    "dataloader": "Dataloader",
    "forward": "Forward",
    "backward": "Backward",
    "optimization": "Optimization",
}



# -- Perf Summary ---------------------------------------------------------------


@dataclass(frozen=True)
class PerfSummary:
    """Paddle's timer numbers: reader_cost, batch_cost, ips, Reader Ratio.

    `reader_ratio` is a fraction (0.53 prints as 53.000%); `samples_ips` is
    None unless every counted step knows its batch size, since a rate over
    some of the steps would mix two different runs' worth of time.
    """

    steps: int
    reader_cost: Stats
    batch_cost: Stats
    ips: Rate
    samples_ips: Optional[Rate]
    reader_ratio: Optional[float]
    #: DataLoader fetches in the counted steps (None: not known). With none,
    #: the script makes its batches itself (nanoGPT's `get_batch`, full-batch
    #: graph training, RL rollouts) and that time is in Others, not in a
    #: Reader Ratio of 0%.
    dataloader_calls: Optional[int] = None

    @property
    def no_dataloader(self) -> bool:
        return self.dataloader_calls == 0 and self.steps > 0 and not self.batch_reused

    @property
    def batch_reused(self) -> bool:
        """No fetch in the counted steps, yet each trained on samples: a
        batch fetched once (the whole data set), trained on step after step
        (steps.py: many optimizer steps on one batch)."""
        return (self.dataloader_calls == 0 and self.steps > 0 and self.samples_ips is not None
                and (self.samples_ips.avg or 0.0) > 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "reader_cost": self.reader_cost.to_dict(),
            "batch_cost": self.batch_cost.to_dict(),
            "ips": self.ips.to_dict(),
            "samples_ips": self.samples_ips.to_dict() if self.samples_ips else None,
            "reader_ratio": self.reader_ratio,
            "dataloader_calls": self.dataloader_calls,
        }


def perf_summary(rows: Any) -> PerfSummary:
    """From the counted steps: their Quantities (columns.py), a table or
    rows as lists."""
    q = quantities(rows)
    n = q.n
    batch = q.stats("step")
    reader = q.stats("dataloader")
    total = batch.total or 0.0
    ips = Rate.from_totals(n, total, per_second(q.step))
    samples_ips: Optional[Rate] = None
    tallies = q.tallies
    if n and tallies.samples_known:
        samples_ips = Rate.from_totals(tallies.samples_total, total, tallies.sample_rates)
    if not n:
        ratio: Optional[float] = None
    elif total <= 0.0 or reader.avg is None or batch.avg is None:
        ratio = 0.0
    else:
        ratio = reader.avg / batch.avg
    return PerfSummary(
        dataloader_calls=tallies.calls["dataloader"] if n else None,
        steps=n,
        reader_cost=reader,
        batch_cost=batch,
        ips=ips,
        samples_ips=samples_ips,
        reader_ratio=ratio,
    )


# -- Model Summary --------------------------------------------------------------


@dataclass(frozen=True)
class ModelRow:
    """One line of the Model Summary. `gpu` is None when the run had no GPU
    timings: the renderers then leave the GPU column out entirely."""

    name: str
    calls: Optional[int]
    cpu: Stats
    cpu_ratio: Optional[float]
    gpu: Optional[Stats] = None
    gpu_ratio: Optional[float] = None

    @property
    def is_step(self) -> bool:
        return self.name == "ProfileStep"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "calls": self.calls,
            "cpu": self.cpu.to_dict(),
            "cpu_ratio": self.cpu_ratio,
            "gpu": self.gpu.to_dict() if self.gpu is not None else None,
            "gpu_ratio": self.gpu_ratio,
        }


@dataclass(frozen=True)
class ModelSummary:
    """ProfileStep, then each phase, then Others. Times in seconds (the
    renderers print milliseconds); Avg/Max/Min are per step."""

    steps: int
    rows: list[ModelRow]
    has_gpu: bool
    overshoot_steps: int = 0
    overshoot_max: float = 0.0

    def row(self, name: str) -> ModelRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def calls(self) -> dict[str, int]:
        """Each row's calls by name (0 where none were counted)."""
        return {r.name: r.calls or 0 for r in self.rows}

    @property
    def trained(self) -> bool:
        """A backward or an optimizer step ran in the steps."""
        calls = self.calls()
        return bool(calls.get("Backward") or calls.get("Optimization"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "has_gpu": self.has_gpu,
            "rows": [r.to_dict() for r in self.rows],
            "overshoot_steps": self.overshoot_steps,
            "overshoot_max": self.overshoot_max,
        }


#: Said when the counted steps trained but timed no forward (forward_unseen).
FORWARD_UNSEEN = (
    "no forward was timed in the counted steps, though they trained: the model ran "
    "where perfrun times no module call, inside code torch.compile traced (a compiled "
    "function, or the compiled training_step Lightning makes of a compiled "
    "LightningModule) or not called as an nn.Module, so its forward is counted in Others"
)

#: A forward under this share of its backward is not the model's (a
#: forward costs a third to a half of its backward): what was timed is a
#: module the model calls, and the model itself ran unseen.
FORWARD_HIDDEN = 0.1


def backward_collectives(rank: Mapping[str, Any]) -> Optional[bool]:
    """Whether the rank's Backward may hold collectives, from its rank
    document: True when one of its root modules is a data-parallel wrapper
    (DDP all-reduces the gradients inside Backward), when it saw a process
    group of more than one rank (its `distributed` record), or when its
    detailed window's trace timed communication; False when none of these
    and the rank was alone in its job (no peer to wait for); None otherwise
    (ranks of a larger job that set no process group up when perfrun
    looked: independent ones, or ones that did later). A Backward that
    holds a collective waits there for the other ranks, so its length says
    nothing of the model's own backward."""
    window = rank.get("window_summary")
    dist = window.get("distributed") if isinstance(window, Mapping) else None
    if isinstance(dist, Mapping):
        for side in ("cpu", "gpu"):
            figures = dist.get(side)
            if (isinstance(figures, Mapping)
                    and (as_finite(figures.get("communication")) or 0.0) > 0.0):
                return True
    record = rank.get("distributed")
    if isinstance(record, Mapping):
        group = as_int(record.get("world_size"))
        if record.get("wrappers") or (group is not None and group > 1):
            return True
    return False if as_int(rank.get("world_size")) == 1 else None


def forward_unseen(model: Optional[ModelSummary],
                   collectives: Optional[bool] = None) -> bool:
    """The counted steps trained (a backward or an optimizer step was timed)
    yet timed no forward, or a forward too small to be the model's. The
    model then ran where perfrun times no module call: inside a function
    given to torch.compile (Dynamo traces the model's call there, and a
    traced call is never timed, hooks.py), or called as `model.forward(x)`
    rather than `model(x)` (forward-forward training calls each layer so),
    where only the modules it calls in turn are timed. Its forward is then
    in Others, which is no longer the loop's own Python alone, and the
    report must say so rather than blame the loop.

    A forward small against its backward says so only where the backward
    is the model's alone: `collectives` (backward_collectives) False. Under
    DDP the Backward holds the gradients' all-reduce, and the wait in it
    for the other ranks, so a Forward a tenth of it is the expected shape of
    a step; where that is not known (None) the forward is not judged by it."""
    if model is None or not model.steps:
        return False
    rows = {row.name: row for row in model.rows}
    calls = model.calls()
    if calls.get("Forward", 0) == 0:
        return model.trained
    if collectives is not False:
        return False
    forward, backward = rows.get("Forward"), rows.get("Backward")
    return (forward is not None and backward is not None and calls.get("Backward", 0) > 0
            and forward.cpu.avg < FORWARD_HIDDEN * backward.cpu.avg)


def forward_unseen_note(model: ModelSummary) -> str:
    """The report's note for forward_unseen: what was timed, and where the
    model's forward went."""
    rows = {row.name: row for row in model.rows}
    forward, backward = rows.get("Forward"), rows.get("Backward")
    if forward is None or not forward.calls or backward is None:
        return FORWARD_UNSEEN
    return (
        f"the Forward timed ({forward.cpu.avg * 1e3:.3f} ms a step) is under "
        f"{FORWARD_HIDDEN * 100:.0f}% of the Backward ({backward.cpu.avg * 1e3:.3f} ms): "
        "it is a module the model calls, not the model, which ran where perfrun times no "
        "module call: called as `module.forward(x)` rather than `module(x)`, or inside "
        "code torch.compile traced; the model's forward is counted in Others (call the "
        "model as `module(x)` to have it timed)"
    )


def _ratio(part: Optional[float], whole: Optional[float]) -> Optional[float]:
    if part is None or whole is None or whole <= 0.0:
        return None
    return part / whole * 100.0


def model_summary(rows: Any) -> ModelSummary:
    """From the counted steps: their Quantities (columns.py), a table or
    rows as lists."""
    q = quantities(rows)
    n = q.n
    step = q.stats("step")
    g = q.gpu
    has_gpu = g is not None
    gpu_step = stats_of(g.step) if g is not None else None

    def gpu_pair(values: Any) -> tuple[Optional[Stats], Optional[float]]:
        if gpu_step is None:
            return None, None
        stats = stats_of(values)
        return stats, _ratio(stats.total, gpu_step.total)

    out = [
        ModelRow(
            "ProfileStep", n, step, _ratio(step.total, step.total),
            gpu_step, _ratio(gpu_step.total, gpu_step.total) if gpu_step else None,
        )
    ]
    for phase in PHASES:
        cpu = q.stats(phase)
        calls = q.tallies.calls[phase]
        gpu, gpu_ratio = gpu_pair(g.phases[phase] if g is not None else None)
        out.append(
            ModelRow(PHASE_TITLES[phase], calls, cpu, _ratio(cpu.total, step.total), gpu, gpu_ratio)
        )
    others = q.stats("others")
    gpu, gpu_ratio = gpu_pair(g.others if g is not None else None)
    out.append(ModelRow("Others", None, others, _ratio(others.total, step.total), gpu, gpu_ratio))
    return ModelSummary(
        steps=n,
        rows=out,
        has_gpu=has_gpu,
        overshoot_steps=q.tallies.overshoot_steps,
        overshoot_max=q.tallies.overshoot_max,
    )
