"""The culprit decision (analysis/straggler.py) on hand-built ranks.

The ranks are simulated as data-parallel training does it: each rank does its
own work in each phase, and the Backward phase ends for all of them when the
last rank has finished its own backward work (the gradient all-reduce), so
the victims' extra time shows up in Backward.
"""

from __future__ import annotations

import random
import statistics
from typing import Any, Optional

import pytest
from builders import MS, make_rank, make_run

from perfrun.analysis.advice import AdviceInputs, slow_ranks
from perfrun.analysis.build import build_report
from perfrun.analysis.ranks import multi_rank_summary, paced_phase
from perfrun.analysis.straggler import (
    CULPRIT_MIN_CONSISTENCY,
    RankSteps,
    decide,
)
from perfrun.store.rankfile import RankResult
from perfrun.store.stepfile import STEP_COLUMNS

BASE = {"dataloader": 2 * MS, "forward": 8 * MS, "backward": 10 * MS, "optimization": 3 * MS,
        "others": 1 * MS}


def simulate(
    n_ranks: int,
    steps: int = 20,
    extra: Optional[dict[int, dict[str, float]]] = None,
    noise: float = 0.0,
    wait_in: str = "backward",
    seed: int = 1,
    origins: Optional[list[float]] = None,
    hosts: Optional[list[str]] = None,
    release: Optional[dict[int, list[float]]] = None,
) -> list[RankResult]:
    """Rows for `n_ranks` ranks in lock-step, the collective ending `wait_in`
    when the last rank is done with its own work there. `release[r]`: how
    long after the collective ends rank r leaves it, step after step (the
    list repeated), as a loaded machine hands the result to a rank it had
    descheduled."""
    rng = random.Random(seed)
    extra = extra or {}
    order = ("dataloader", "forward", "backward", "optimization", "others")
    w = order.index(wait_in)
    origins = origins or [1000.0 + 0.25 * r for r in range(n_ranks)]
    t = [5.0] * n_ranks  # absolute start of the next step, per rank
    rows: list[list[list[Any]]] = [[] for _ in range(n_ranks)]
    for k in range(steps):
        own = []
        for r in range(n_ranks):
            d = {}
            for p in order:
                v = BASE[p] + extra.get(r, {}).get(p, 0.0)
                d[p] = max(0.0, v + (rng.gauss(0.0, noise) if noise else 0.0))
            own.append(d)
        # Everyone finishes the waiting phase together.
        arrive = [t[r] + sum(own[r][p] for p in order[:w]) for r in range(n_ranks)]
        done = max(arrive[r] + own[r][order[w]] for r in range(n_ranks))
        for r in range(n_ranks):
            d = dict(own[r])
            late = (release or {}).get(r)
            d[order[w]] = done - arrive[r] + (late[k % len(late)] if late else 0.0)
            start = t[r]
            end = start + sum(d.values())
            values = {c: None for c in STEP_COLUMNS}
            values.update({p: d[p] for p in order[:4]})
            values.update(start=start - origins[r], end=end - origins[r], excluded=0.0,
                          dataloader_calls=1, forward_calls=1, backward_calls=1,
                          optimization_calls=1)
            rows[r].append([values[c] for c in STEP_COLUMNS])
            t[r] = end
    out = []
    for r in range(n_ranks):
        rank = make_rank(rows[r], rank=r, world_size=n_ranks,
                         hostname=(hosts[r] if hosts else "host0"))
        rank.data["started_unix"] = origins[r]
        out.append(rank)
    return out


def verdict(ranks: list[RankResult], warmup: int = 2) -> Any:
    summary = multi_rank_summary(ranks, warmup)
    return summary.straggler


def test_slow_dataloader_names_the_culprit_not_the_victims() -> None:
    v = verdict(simulate(4, extra={1: {"dataloader": 40 * MS}}))
    assert v.wait_phase == "backward"
    assert v.culprit == 1
    assert v.culprit_phase == "dataloader"
    assert v.phase_loss == pytest.approx(40 * MS, rel=1e-6)
    assert v.lateness == pytest.approx(40 * MS, rel=1e-6)
    assert v.victims == (0, 2, 3)
    assert v.consistency == 1.0
    # The slowest rank in Backward is a victim: the old rule would name it.
    assert max(v.skew, key=lambda s: s.excess).quantity in ("dataloader", "backward")


def test_two_ranks_are_told_apart_by_time_order() -> None:
    # With two ranks the per-phase excesses are symmetric; only the order
    # on the common clock says which one waited.
    v = verdict(simulate(2, extra={0: {"forward": 20 * MS}}))
    assert (v.culprit, v.culprit_phase, v.victims) == (0, "forward", (1,))
    assert v.phase_loss == pytest.approx(20 * MS, rel=1e-6)


def test_slow_optimizer_under_zero_waits_in_optimization() -> None:
    v = verdict(simulate(3, extra={2: {"forward": 30 * MS}}, wait_in="optimization"))
    assert (v.wait_phase, v.culprit, v.culprit_phase) == ("optimization", 2, "forward")
    assert v.victims == (0, 1)


def test_work_after_the_step_delays_the_next_one() -> None:
    v = verdict(simulate(3, extra={0: {"others": 25 * MS}}))
    assert (v.culprit, v.culprit_phase) == (0, "others")
    assert v.phase_loss == pytest.approx(25 * MS, rel=1e-6)


def test_healthy_ranks_invent_no_culprit() -> None:
    for seed in range(20):
        v = verdict(simulate(4, noise=0.3 * MS, seed=seed))
        assert v.culprit is None, v
        assert v.reason
    # Ranks in lock-step (DDP's all-reduce every step), none late: said so,
    # not "they do not wait for each other".
    v = verdict(simulate(2))
    assert v.culprit is None and "keep pace with each other" in v.reason, v.reason


def test_noise_moves_the_latest_arrival() -> None:
    # A straggler below the threshold share of the step is not named.
    v = verdict(simulate(2, extra={1: {"dataloader": 0.5 * MS}}, noise=0.05 * MS))
    assert v.culprit is None
    assert "threshold" in v.reason


def test_inconsistent_latest_rank_is_not_a_culprit() -> None:
    # Big noise: someone is always late, never the same one.
    v = verdict(simulate(4, noise=4 * MS, seed=3))
    assert v.culprit is None
    assert v.consistency < CULPRIT_MIN_CONSISTENCY or "threshold" in v.reason


def test_ranks_that_never_wait_have_no_wait_phase() -> None:
    # Independent ranks (no collective): each just runs at its own pace.
    ranks = []
    for r, fw in enumerate((8 * MS, 30 * MS)):
        rows = []
        t = 0.0
        for _ in range(10):
            values = {c: None for c in STEP_COLUMNS}
            values.update(start=t, end=t + fw + 4 * MS, dataloader=2 * MS, forward=fw,
                          backward=2 * MS, optimization=0.0, excluded=0.0)
            rows.append([values[c] for c in STEP_COLUMNS])
            t += fw + 4 * MS + r * 0.001
        rank = make_rank(rows, rank=r, world_size=2)
        rank.data["started_unix"] = 100.0
        ranks.append(rank)
    v = verdict(ranks)
    assert v.wait_phase is None and v.culprit is None
    assert "differ by more than 10%" in v.reason and "no collective paces them" in v.reason
    # The advice falls back to the slowest rank per phase.
    advice = slow_ranks(AdviceInputs(ranks=multi_rank_summary(ranks, 2)))
    assert advice and advice[0].evidence["rank"] == 1
    # Independent ranks that set a process group up (to gather a metric at
    # the end) but call no model through DDP: the same.
    ddp(ranks, {"world_size": 2, "backend": "gloo", "wrappers": []})
    assert verdict(ranks).reason == v.reason


#: A rank file's record of a model called through DDP (runtime/modules.py).
DDP = {"world_size": 2, "backend": "gloo", "wrappers": ["DistributedDataParallel"]}


def ddp(ranks: list[RankResult], record: Optional[dict[str, Any]] = None) -> list[RankResult]:
    for rank in ranks:
        rank.data["distributed"] = dict(record or DDP)
    return ranks


def _step_medians_and_means(ranks: list[RankResult], warmup: int = 2) -> tuple[Any, Any]:
    spans = [[row[1] - row[0] for row in rank.rows[warmup:]] for rank in ranks]
    return [statistics.median(s) for s in spans], [statistics.fmean(s) for s in spans]


def test_paced_ranks_are_told_by_their_mean_step_not_their_median() -> None:
    # DDP on a loaded machine: the all-reduce hands its result to each rank
    # in turn a little late (5 ms), so their step medians differ by 17%
    # while their means, the whole time over the steps, are the same: they
    # cross the collective together every step. Not "no collective paces
    # them" (a 2-rank DDP job measured medians of 4.7 and 5.6 ms a step on
    # means of 5.70 and 5.70).
    ranks = simulate(2, release={0: [5 * MS, 0.0, 0.0], 1: [0.0, 5 * MS, 0.0]})
    medians, means = _step_medians_and_means(ranks)
    assert min(medians) < 0.9 * max(medians)
    assert means[0] == pytest.approx(means[1], rel=1e-9)
    v = verdict(ranks)
    assert v.culprit is None and "no collective" not in v.reason, v.reason
    assert "keep pace with each other" in v.reason


def test_ddp_ranks_wait_in_backward_whatever_their_times_say() -> None:
    # Released 10 ms apart from the all-reduce in turn, the ranks leave
    # Backward a third of a step apart: their times alone read as ranks
    # that never wait for each other.
    jitter = {0: [10 * MS, 0.0, 0.0], 1: [0.0, 10 * MS, 0.0]}
    alone = verdict(simulate(2, release=jitter))
    assert "no collective paces them" in alone.reason
    # Their rank files say the model is called through DDP: its all-reduce
    # paces them in Backward every step, and the verdict says so.
    ranks = ddp(simulate(2, release=jitter))
    v = verdict(ranks)
    assert (v.wait_phase, v.culprit) == ("backward", None)
    assert "no collective" not in v.reason
    assert v.reason.startswith("a collective makes the ranks wait for each other in backward "
                               "every step (DDP's all-reduce of the gradients)"), v.reason
    # Paced ranks: the slowest rank in a phase may be a victim, so no
    # slow-rank advice is read from the phases.
    assert slow_ranks(AdviceInputs(ranks=multi_rank_summary(ranks, 2))) == []
    # A rank that is slow is still named, its victim waiting in Backward.
    v = verdict(ddp(simulate(2, extra={1: {"dataloader": 20 * MS}}, release=jitter)))
    assert (v.wait_phase, v.culprit, v.culprit_phase, v.victims) == (
        "backward", 1, "dataloader", (0,))
    assert v.phase_loss == pytest.approx(20 * MS, rel=1e-6)


def test_only_a_ddp_model_tells_that_the_ranks_are_paced() -> None:
    ranks = simulate(2)
    assert paced_phase(ranks) is None  # files from before the record
    assert paced_phase(ddp(ranks)) == "backward"
    # One rank's word is enough (every rank of a DDP job takes part).
    ranks[0].data["distributed"] = None
    assert paced_phase(ranks) == "backward"
    # A process group alone, or a wrapper whose collectives pace no one
    # phase, says nothing of where the ranks wait.
    assert paced_phase(ddp(simulate(2), {"world_size": 2, "backend": "gloo",
                                         "wrappers": []})) is None
    assert paced_phase(ddp(simulate(2), {"world_size": 2, "backend": "nccl",
                                         "wrappers": ["FSDPModule"]})) is None


def test_hosts_with_offset_clocks_are_aligned_from_the_step_ends() -> None:
    # Rank 2's host clock is 3 s ahead: its started_unix is off by 3 s.
    origins = [1000.0, 1000.1, 1003.2, 1003.3]
    ranks = simulate(4, extra={3: {"dataloader": 40 * MS}}, origins=origins,
                     hosts=["a", "a", "b", "b"])
    for r in ranks[2:]:
        r.data["started_unix"] += 3.0
    v = verdict(ranks)
    assert "2 hosts" in v.clock
    assert v.culprit == 3 and v.culprit_phase == "dataloader"
    assert v.clock_error < 0.05


def test_too_few_common_steps_gives_no_verdict() -> None:
    assert verdict(simulate(2, steps=4), warmup=2) is None
    assert decide([]) is None
    one = RankSteps(rank=0, host=None, origin=0.0, index=[], table=None)
    assert decide([one]) is None


def test_advice_names_the_culprit_and_the_victims() -> None:
    ranks = simulate(4, extra={1: {"dataloader": 40 * MS}})
    advice = slow_ranks(AdviceInputs(ranks=multi_rank_summary(ranks, 2)))
    assert len(advice) == 1
    a = advice[0]
    assert a.evidence["rank"] == 1 and a.evidence["culprit_phase"] == "dataloader"
    assert a.message.startswith("rank 1 loses 39.1 ms per step in Dataloader; "
                                "ranks 0,2,3 wait for it in Backward")


def test_healthy_advice_is_quiet() -> None:
    ranks = simulate(4, noise=0.3 * MS)
    assert slow_ranks(AdviceInputs(ranks=multi_rank_summary(ranks, 2))) == []


def test_report_json_carries_the_verdict() -> None:
    run = make_run(simulate(2, extra={1: {"forward": 20 * MS}}))
    report = build_report(run)
    data = report.ranks.to_dict()["straggler"]
    assert data["culprit"] == 1 and data["victims"] == [0]
    assert data["thresholds"]["min_consistency"] == CULPRIT_MIN_CONSISTENCY
