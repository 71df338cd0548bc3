"""Bottleneck advice: each rule on hand-built numbers (it fires, quoting the
right numbers; it stays quiet below its threshold; it never speaks without
evidence), the Advice block in every report format, and two real runs of a
loop whose DataLoader is slow or fast."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any, Optional

import pytest
from builders import MS, make_rank, make_rows, make_run
from conftest import RunPerfrun

from perfrun.analysis.advice import (
    GPU_UTIL_HIGH,
    GPU_UTIL_LOW,
    OTHERS_SHARE_LIMIT,
    READER_RATIO_LIMIT,
    UNMEASURED,
    Advice,
    AdviceInputs,
    advise,
    cpu_bound,
    duration,
    gpu_bound,
    io_bound,
    slow_ranks,
    sync_stalls,
    unstable_timing,
)
from perfrun.analysis.build import build_report
from perfrun.analysis.device import device_summary
from perfrun.analysis.pipeline import LoaderPipeline, PipelineSummary, Stage
from perfrun.analysis.ranks import multi_rank_summary
from perfrun.analysis.summary import (
    backward_collectives,
    forward_unseen,
    model_summary,
    perf_summary,
)
from perfrun.report import make_console, render_json, render_markdown, render_table

SCRIPT = str(Path(__file__).parent / "scripts" / "adv_loader.py")


def _rows(n: int = 10, **phases: float) -> list:
    return make_rows([dict(phases) for _ in range(n)])


def _inputs(rows: Optional[list] = None, **kwargs: Any) -> AdviceInputs:
    if rows is not None:
        kwargs.setdefault("perf", perf_summary(rows))
        kwargs.setdefault("model", model_summary(rows))
    return AdviceInputs(**kwargs)


def _loader(**settings: Any) -> dict[str, Any]:
    loader = {"num_workers": 0, "pin_memory": False, "persistent_workers": False,
              "prefetch_factor": None, "batch_size": 32, "dataset": "SlowImages"}
    loader.update(settings)
    return loader


def _device(*utils: tuple[float, float], hostname: str = "host0") -> Any:
    """A Device Summary with one GPU per (util_avg, util_max)."""
    gpus = [{"index": i, "name": "NVIDIA H100", "util_avg": a, "util_max": m,
             "mem_used_max": 2**30, "mem_total": 80 * 2**30} for i, (a, m) in enumerate(utils)]
    rank = make_rank(_rows(2, forward=MS), hostname=hostname, device={"gpus": gpus})
    return device_summary([rank])


# -- Advice itself ----------------------------------------------------------------------


def test_advice_cannot_be_made_without_evidence() -> None:
    with pytest.raises(ValueError, match="without evidence"):
        Advice("io-bound", "Reader Ratio 50%", {})
    with pytest.raises(ValueError, match="unknown advice kind"):
        Advice("slow-disk", "x", {"a": 1})


def test_advice_text_and_dict() -> None:
    advice = Advice("gpu-bound", "GPU0 95.0%.", {"gpus": ({"util_avg": 95.0},)}, ("AMP",))
    assert advice.text() == "GPU-bound: GPU0 95.0%. Try: AMP."
    assert advice.to_dict() == {
        "kind": "gpu-bound", "title": "GPU-bound", "message": "GPU0 95.0%.",
        "actions": ["AMP"], "evidence": {"gpus": [{"util_avg": 95.0}]},
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1.5, "1.50 s"), (0.0125, "12.5 ms"), (0.3, "300 ms"), (4.5e-5, "45.0 us"), (0.0, "0 us")],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_nothing_measured_gives_no_advice() -> None:
    assert advise(AdviceInputs()) == []


# -- I/O-bound ----------------------------------------------------------------------------
#
# What the rule says to change comes from the fetch's stages (analysis/
# dataload.py, tested on its own in test_pipeline.py); here: the rule fires on
# the Reader Ratio, quotes it and the loader, recommends nothing the stages do
# not support, and adds what holds whatever the stages say.


def _stages(*, workers: int = 0, batch_size: int = 32, dataset: float = 0.0,
            collate: float = 0.0, cpu: Optional[float] = None, tensors: int = 2,
            nbytes: int = 400_000, **settings: Any) -> LoaderPipeline:
    """A loader's pipeline of `dataset` and `collate` seconds a batch."""
    fetch = dataset + collate
    stages = [Stage("dataset", dataset, dataset / fetch),
              Stage("collate", collate, collate / fetch)]
    return LoaderPipeline(
        loader=0, settings=_loader(num_workers=workers, batch_size=batch_size, **settings),
        fetches=100, fetch=fetch, stages=stages, held=100, tensors=tensors, bytes=nbytes,
        cpu=fetch if cpu is None else cpu)


def test_io_bound_quotes_the_ratio_and_names_the_loader_settings() -> None:
    # 1/8 s of every 1/2 s step in the DataLoader: Reader Ratio 25%.
    rows = _rows(dataloader=1 / 8, forward=1 / 4, others=1 / 8)
    [advice] = io_bound(_inputs(rows, dataloaders=[_loader()], cpu_count=16))
    assert advice.kind == "io-bound"
    assert advice.evidence["reader_ratio"] == 0.25
    assert advice.evidence["reader_cost_avg"] == 0.125
    assert advice.evidence["batch_cost_avg"] == 0.5
    assert advice.evidence["dataloaders"][0]["num_workers"] == 0
    assert "Reader Ratio 25.000% (above 5%)" in advice.message
    assert "waits 125 ms for its batch out of 500 ms" in advice.message
    assert ("DataLoader over SlowImages: num_workers=0, pin_memory=False, "
            "persistent_workers=False, prefetch_factor=None") in advice.message
    # Not measured stage by stage (timer-only): no change is recommended,
    # only how to measure what would pay.
    assert advice.actions == (UNMEASURED,)
    assert not any("num_workers=" in a or "pin_memory" in a for a in advice.actions)


def test_io_bound_recommends_workers_only_with_a_predicted_gain() -> None:
    # 32 samples of 6.25 ms each: the fetch is 200 ms of a 250 ms step, all CPU.
    rows = _rows(dataloader=0.2, forward=0.05)
    pipeline = PipelineSummary([_stages(dataset=0.195, collate=0.005)])
    [advice] = io_bound(_inputs(rows, dataloaders=[_loader()], cpu_count=4, pipeline=pipeline))
    [action] = [a for a in advice.actions if a.startswith("num_workers=")]
    prediction = advice.evidence["pipeline"]["workers_prediction"]
    assert prediction["num_workers"] == 4
    assert "predicted" in action and "the step from 250 ms to about" in action
    # The model's CPU bound on 4 cores: (1.15 x (0.2 + 0.05) + 2 x transfer) / 4.
    transfer = advice.evidence["pipeline"]["transfer_estimate"]
    assert transfer == pytest.approx(0.5e-3 + 400_000 / 0.5e9)
    assert prediction["step"] == pytest.approx(max(0.05 + transfer, 1.15 * 0.2 / 4 + transfer,
                                                   (1.15 * 0.25 + 2 * transfer) / 4))
    assert "200 ms fetch (32 samples, 6.09 ms each in the dataset)" in advice.message


def test_io_bound_keeps_an_in_memory_loader_in_process() -> None:
    # The fetch of a TensorDataset: 64 samples at 3 us, a stack of 786 KB.
    rows = make_rows([{"dataloader": 0.4e-3, "forward": 3e-3}] * 10)
    pipeline = PipelineSummary([_stages(batch_size=64, dataset=0.19e-3, collate=0.2e-3,
                                        nbytes=786_000, dataset_name="TensorDataset",
                                        collate_fn="default_collate")])
    [advice] = io_bound(_inputs(rows, dataloaders=[_loader()], cpu_count=2, pipeline=pipeline))
    assert not any(a.startswith("num_workers=") or "raise num_workers" in a
                   for a in advice.actions)
    [keep] = [a for a in advice.actions if a.startswith("keep num_workers=0")]
    assert keep.startswith("keep num_workers=0: the dataset is in memory")
    assert "pickle each batch (2 tensors, 786.0 KB) into shared memory" in keep
    assert "(about 2.07 ms a batch)" in keep


def test_io_bound_without_stages_on_a_gpu_run_keeps_what_holds() -> None:
    rows = _rows(100, dataloader=1 / 8, forward=3 / 8)
    loader = _loader(num_workers=2, prefetch_factor=2)
    # Ten iterators created, 2 s of start-up in all: 4% of the 50 s of steps.
    inputs = _inputs(rows, dataloaders=[loader], uses_gpu=True, cpu_count=8, ranks_per_host=2,
                     dataloader_init={"calls": 10, "time": 2.0}, steps=100)
    [advice] = io_bound(inputs)
    actions = " | ".join(advice.actions)
    assert "pin_memory=True" in actions
    assert "persistent_workers=True: the iterator was created 10 times and its start-up " \
        "took 2.00 s in all (200 ms each)" in actions
    assert advice.evidence["dataloader_init"] == {"calls": 10, "time": 2.0}
    assert advice.actions[-1] == UNMEASURED


def test_io_bound_persistent_workers_only_for_a_costly_restart() -> None:
    rows = _rows(100, dataloader=1 / 8, forward=3 / 8)
    loader = _loader(num_workers=4)
    cheap = {"calls": 10, "time": 0.5}  # 1% of the steps' 50 s
    [advice] = io_bound(_inputs(rows, dataloaders=[loader], dataloader_init=cheap, steps=100))
    assert not any("persistent_workers" in a for a in advice.actions)
    assert "dataloader_init" not in advice.evidence
    once = {"calls": 1, "time": 5.0}  # created once: nothing to keep alive
    [advice] = io_bound(_inputs(rows, dataloaders=[loader], dataloader_init=once, steps=100))
    assert not any("persistent_workers" in a for a in advice.actions)
    already = _loader(num_workers=4, persistent_workers=True)
    costly = {"calls": 10, "time": 5.0}
    [advice] = io_bound(_inputs(rows, dataloaders=[already], dataloader_init=costly, steps=100))
    assert not any("persistent_workers" in a for a in advice.actions)


def test_io_bound_below_threshold_is_quiet() -> None:
    rows = _rows(dataloader=1 / 64, forward=31 / 64)  # 3.125%
    assert perf_summary(rows).reader_ratio == 1 / 32 < READER_RATIO_LIMIT
    assert io_bound(_inputs(rows, dataloaders=[_loader()])) == []
    assert io_bound(_inputs(_rows(forward=1 / 2), dataloaders=[_loader()])) == []


def test_io_bound_needs_measured_steps() -> None:
    assert io_bound(AdviceInputs(dataloaders=[_loader()])) == []
    assert io_bound(_inputs([], dataloaders=[_loader()])) == []


def test_io_bound_without_a_dataloader_still_quotes_the_ratio() -> None:
    [advice] = io_bound(_inputs(_rows(dataloader=1 / 4, forward=1 / 4)))
    assert "Reader Ratio 50.000%" in advice.message
    assert "dataloaders" not in advice.evidence
    assert advice.actions == (UNMEASURED,)


# -- CPU-bound / GPU-bound ----------------------------------------------------------------


def test_cpu_bound_on_a_gpu_run_quotes_the_utilisation() -> None:
    rows = _rows(forward=3 / 8, others=1 / 8)
    [advice] = cpu_bound(_inputs(rows, uses_gpu=True, device=_device((50.0, 90.0))))
    assert advice.kind == "cpu-bound"
    assert advice.evidence["gpus"] == [
        {"host": "host0", "index": 0, "name": "NVIDIA H100", "util_avg": 50.0}
    ]
    assert advice.evidence["threshold"] == GPU_UTIL_LOW
    assert advice.evidence["others_ratio"] == 25.0
    assert "average GPU utilisation below 80%: GPU0 50.0%" in advice.message
    assert ("Others (what the loop runs between the phases) is 25.0% of the step "
            "(125 ms of 500 ms)") in advice.message
    assert gpu_bound(_inputs(rows, uses_gpu=True, device=_device((50.0, 90.0)))) == []


def test_gpu_bound_quotes_the_utilisation() -> None:
    rows = _rows(forward=1 / 2)
    inputs = _inputs(rows, uses_gpu=True, device=_device((97.5, 100.0)))
    [advice] = gpu_bound(inputs)
    assert advice.evidence == {
        "gpus": [{"host": "host0", "index": 0, "name": "NVIDIA H100", "util_avg": 97.5}],
        "threshold": GPU_UTIL_HIGH,
    }
    assert "average GPU utilisation above 90%: GPU0 97.5%" in advice.message
    assert cpu_bound(inputs) == []


def test_between_the_gpu_thresholds_neither_fires() -> None:
    inputs = _inputs(_rows(forward=1 / 2), uses_gpu=True, device=_device((85.0, 100.0)))
    assert cpu_bound(inputs) == [] and gpu_bound(inputs) == []


def test_idle_gpus_of_the_host_are_not_the_runs() -> None:
    # NVML lists every GPU; GPU0 never did any work, GPU1 is the run's.
    inputs = _inputs(_rows(forward=1 / 2), uses_gpu=True, device=_device((0.0, 0.0), (60.0, 99.0)))
    [advice] = cpu_bound(inputs)
    assert [g["index"] for g in advice.evidence["gpus"]] == [1]
    assert "GPU0" not in advice.message and "GPU1 60.0%" in advice.message


def test_no_gpu_samples_no_gpu_advice() -> None:
    rows = _rows(forward=3 / 8, others=1 / 8)
    # The run timed GPU work but no GPU was sampled (no NVML): nothing to quote.
    assert cpu_bound(_inputs(rows, uses_gpu=True)) == []
    assert gpu_bound(_inputs(rows, uses_gpu=True)) == []
    # GPUs sampled, but the run never used one: no GPU advice either.
    assert gpu_bound(_inputs(rows, device=_device((97.0, 100.0)))) == []
    # A utilisation that was never measured is not 0%.
    assert cpu_bound(_inputs(rows, uses_gpu=True, device=_device())) == []


def test_cpu_only_run_with_a_large_others_share() -> None:
    rows = _rows(dataloader=1 / 8, forward=1 / 4, others=1 / 8)  # Others 25%
    for device in (None, _device((0.0, 0.0))):  # no GPU, or an idle one
        [advice] = cpu_bound(_inputs(rows, device=device))
        assert advice.evidence == {
            "others_ratio": 25.0, "threshold": OTHERS_SHARE_LIMIT,
            "others_avg": 0.125, "step_avg": 0.5, "steps": 10,
        }
        assert "Others is 25.0% of each step (125 ms of 500 ms; above 20%)" in advice.message


def test_others_is_said_as_what_a_window_saw_in_it() -> None:
    """With a detailed window, the operators that ran in Others are named,
    a step each, and what is left of it is the loop's own Python; without
    one, no cause is named, only where to look."""
    rows = _rows(dataloader=1 / 8, forward=1 / 4, others=1 / 8)
    [plain] = cpu_bound(_inputs(rows))
    assert "Python" not in plain.message and "window_others" not in plain.evidence
    assert plain.actions[0].startswith("see what runs between the phases in a detailed window")
    window = {"steps": 4, "others": {"time": 0.4, "operators": 0.3, "top": [
        {"name": "aten::index", "calls": 8, "total": 0.2},
        {"name": "aten::mul", "calls": 6, "total": 0.1}]}}
    [seen] = cpu_bound(_inputs(rows, window_summary=window))
    assert ("In the detailed window Others took 100 ms a step: operators 75.0 ms "
            "(aten::index 50.0 ms in 2 calls, aten::mul 25.0 ms in 1.5 calls), and 25.0 ms "
            "outside any operator: the loop's own Python.") in seen.message
    assert seen.evidence["window_others"]["python"] == pytest.approx(0.1)
    assert not any("detailed window" in a for a in seen.actions)
    # A window written before Others was recorded: as without one.
    [old] = cpu_bound(_inputs(rows, window_summary={"steps": 4}))
    assert old.message == plain.message
    # No DataLoader: the batch's preparation is in Others, and said so.
    no_loader = _rows(forward=1 / 4, others=1 / 4, calls=(0, 1, 1, 1))
    [advice] = cpu_bound(_inputs(no_loader))
    assert "with no DataLoader, the batch's preparation among it" in advice.message


def test_an_unseen_forward_in_others_is_not_blamed_on_the_loop() -> None:
    # A compiled train step: backward and the optimizer timed, the forward
    # traced into the graph and so in Others with the loop's own Python.
    unseen = _rows(dataloader=1 / 8, backward=1 / 4, others=1 / 8, calls=(1, 0, 1, 1))
    assert forward_unseen(model_summary(unseen))
    assert cpu_bound(_inputs(unseen)) == []
    [advice] = cpu_bound(_inputs(unseen, uses_gpu=True, device=_device((50.0, 90.0))))
    assert "GPU0 50.0%" in advice.message and "Others" not in advice.message
    assert "others_ratio" not in advice.evidence
    # The same steps with their forward seen: Others is the loop's own.
    seen = _rows(dataloader=1 / 8, forward=1 / 8, backward=1 / 8, others=1 / 8)
    assert not forward_unseen(model_summary(seen))
    assert [a.kind for a in cpu_bound(_inputs(seen))] == ["cpu-bound"]
    # Steps that never trained, and no steps at all, have no forward to miss.
    assert not forward_unseen(model_summary(_rows(dataloader=1 / 8, calls=(1, 0, 0, 0))))
    assert not forward_unseen(None)


def test_a_short_forward_is_unseen_only_where_the_backward_is_the_models_alone() -> None:
    # Forward a sixteenth of Backward: a module the model calls, the model
    # itself called as `module.forward(x)`; unless the Backward holds a
    # collective (DDP's all-reduce) and the wait in it for the other ranks,
    # where that is the step's expected shape; or nothing says which.
    rows = _rows(dataloader=1 / 8, forward=1 / 64, backward=1 / 4, others=1 / 4)
    model = model_summary(rows)
    assert forward_unseen(model, False)
    assert not forward_unseen(model, True)
    assert not forward_unseen(model, None) and not forward_unseen(model)
    # Others (39% of the step) is the loop's own under DDP, and judged.
    assert cpu_bound(_inputs(rows, backward_collectives=False)) == []
    [advice] = cpu_bound(_inputs(rows, backward_collectives=True))
    assert advice.kind == "cpu-bound" and advice.evidence["others_ratio"] > OTHERS_SHARE_LIMIT
    # No forward at all is unseen whatever the Backward holds.
    unseen = model_summary(_rows(dataloader=1 / 8, backward=1 / 4, calls=(1, 0, 1, 1)))
    assert forward_unseen(unseen, True) and forward_unseen(unseen, None)


#: A rank file's `distributed` record (runtime/modules.py).
_NO_GROUP = {"world_size": None, "backend": None, "wrappers": []}
_DDP = {"world_size": 2, "backend": "gloo", "wrappers": ["DistributedDataParallel"]}


@pytest.mark.parametrize("world_size, record, window, expected", [
    # A process alone in its job: no peer to wait for.
    (1, None, None, False),
    (1, _NO_GROUP, None, False),
    # A model called through DDP; a process group of two without it (the
    # gradients all-reduced by hand); communication in the window's trace.
    (2, _DDP, None, True),
    (1, {**_NO_GROUP, "world_size": 2, "backend": "gloo"}, None, True),
    (2, {**_NO_GROUP, "world_size": 2, "backend": "gloo"}, None, True),
    (1, None, {"cpu": {"communication": 0.004}, "gpu": {"communication": None}}, True),
    (1, _NO_GROUP, {"cpu": {"communication": 0.0}, "gpu": {"communication": None}}, False),
    # A rank of a larger job with no process group seen, or a file from
    # before the record: perfrun cannot tell.
    (2, _NO_GROUP, None, None),
    (2, None, None, None),
], ids=["alone", "alone-recorded", "ddp", "group-alone", "group", "window-comm",
        "window-none", "job-no-group", "job-old-file"])
def test_whether_the_backward_holds_collectives_is_read_from_the_rank_file(
    world_size: int, record: Optional[dict[str, Any]], window: Optional[dict[str, Any]],
    expected: Optional[bool],
) -> None:
    data = make_rank(_rows(2, forward=MS), world_size=world_size).data
    if record is not None:
        data["distributed"] = record
    if window is not None:
        data["window_summary"] = {"steps": 2, "distributed": {"basis": "cpu", **window}}
    assert backward_collectives(data) is expected


def test_cpu_only_run_below_the_others_threshold() -> None:
    rows = _rows(dataloader=1 / 4, forward=3 / 16, others=1 / 16)  # Others 12.5%
    assert cpu_bound(_inputs(rows)) == []


def test_others_share_is_not_judged_when_a_busy_gpu_may_be_the_runs() -> None:
    # A --timer-only run times no GPU work, yet a GPU of its host was busy:
    # whether the run used it is unknown, so neither kind of CPU advice.
    rows = _rows(forward=1 / 4, others=1 / 4)
    assert cpu_bound(_inputs(rows, device=_device((60.0, 100.0)))) == []


# -- synchronisation stalls ------------------------------------------------------------------


def _window(sync_calls: int, gpu_kernels: int, steps: int = 4) -> dict[str, Any]:
    return {
        "steps": steps,
        "overview": [
            {"type": "Operator", "side": "cpu", "calls": 500},
            {"type": "Kernel", "side": "gpu", "calls": gpu_kernels},
            {"type": "Memcpy", "side": "gpu", "calls": 0},
        ],
        "memory_manipulation": {
            "copies": [],
            "sync_calls": sync_calls,
            "sync_per_step": sync_calls / steps,
        },
    }


def test_sync_stalls_quote_copies_per_step() -> None:
    inputs = AdviceInputs(window=(10, 14), window_rank=0, window_summary=_window(6, 300))
    [advice] = sync_stalls(inputs)
    assert advice.kind == "sync-stall"
    assert advice.evidence == {"sync_calls": 6, "sync_per_step": 1.5, "window_steps": 4,
                               "gpu_calls": 300, "window": [10, 14], "rank": 0}
    assert advice.message.startswith(
        "1.50 synchronisations per step (6 in the detailed window [10, 14) of rank 0 "
        "over its 4 steps)"
    )


def test_sync_stalls_name_the_ops_that_synchronise() -> None:
    summary = _window(6, 300)
    summary["memory_manipulation"]["sync_by_op"] = {
        "aten::_local_scalar_dense": 4, "aten::copy_": 1, "cudaDeviceSynchronize": 1,
    }
    [advice] = sync_stalls(AdviceInputs(window=(10, 14), window_summary=summary))
    assert "made by aten::_local_scalar_dense (4), aten::copy_ (1), cudaDeviceSynchronize (1)" \
        in advice.message
    assert advice.evidence["sync_by_op"]["aten::_local_scalar_dense"] == 4


def test_sync_stalls_need_gpu_activity_in_the_window() -> None:
    assert sync_stalls(AdviceInputs(window=(10, 14), window_summary=_window(6, 0))) == []


def test_sync_stalls_quiet_without_copies_or_window() -> None:
    assert sync_stalls(AdviceInputs(window=(10, 14), window_summary=_window(0, 300))) == []
    assert sync_stalls(AdviceInputs(window=(10, 14))) == []
    assert sync_stalls(AdviceInputs(window_summary={"steps": 4})) == []


# -- slow rank ---------------------------------------------------------------------------------


def _ranks(dataloader_ms: list[float], forward_ms: float = 40.0, n: int = 6) -> Any:
    ranks = [
        make_rank(_rows(n, dataloader=d * MS, forward=forward_ms * MS), rank=r,
                  world_size=len(dataloader_ms))
        for r, d in enumerate(dataloader_ms)
    ]
    return multi_rank_summary(ranks, warmup=0)


def test_slow_rank_names_the_rank_the_phase_and_how_much() -> None:
    ranks = _ranks([8.0, 8.0, 8.0, 16.0])
    found = slow_ranks(AdviceInputs(ranks=ranks))
    by_quantity = {a.evidence["quantity"]: a for a in found}
    assert set(by_quantity) == {"dataloader", "step"}
    advice = by_quantity["dataloader"]
    assert advice.evidence["rank"] == 3
    assert advice.evidence["value"] == 16 * MS and advice.evidence["median"] == 8 * MS
    assert advice.evidence["percent_slower"] == pytest.approx(100.0)
    assert advice.message == (
        "rank 3 spends 15.6 ms a step in Dataloader, 100.0% more than the median rank "
        "(7.81 ms), over 4 ranks."
    )
    # Step: 56 vs 48 (x 1/1024 s): 16.7% slower.
    assert by_quantity["step"].evidence["percent_slower"] == pytest.approx(100 / 6)
    assert "rank 3 takes 54.7 ms a step, 16.7% more than the median rank (46.9 ms)" \
        in by_quantity["step"].message


def test_slow_rank_actions_name_the_device_the_ranks_ran_on() -> None:
    from perfrun.analysis.advice import _slow_action

    assert "host CPU" in _slow_action("backward", False)
    assert "GPU" not in _slow_action("backward", False).split(";")[0]
    assert _slow_action("forward", True).startswith("check that rank's GPU (clocks")


def test_slow_rank_below_ten_percent_is_quiet() -> None:
    # Dataloader 9% above the median, and the step even less.
    assert slow_ranks(AdviceInputs(ranks=_ranks([100.0, 100.0, 109.0]))) == []
    assert slow_ranks(AdviceInputs(ranks=_ranks([8.0, 8.0, 8.0]))) == []


def test_slow_rank_ignores_large_percentages_of_tiny_phases() -> None:
    # 0.25 ms more Dataloader than the median (+100%) is 0.6% of a 40 ms step.
    assert slow_ranks(AdviceInputs(ranks=_ranks([0.25, 0.25, 0.5]))) == []


def test_slow_rank_needs_two_ranks_with_steps() -> None:
    assert slow_ranks(AdviceInputs(ranks=_ranks([8.0]))) == []
    assert slow_ranks(AdviceInputs()) == []
    rows = _rows(4, dataloader=8 * MS, forward=40 * MS)
    ranks = [make_rank(rows, rank=0, world_size=2), make_rank(_rows(4, forward=80 * MS), rank=1,
                                                              world_size=2)]
    summary = multi_rank_summary(ranks, warmup=0, missing=[2])
    # Two ranks with steps, one missing: rank 1's step (80 vs median 64) is compared.
    found = slow_ranks(AdviceInputs(ranks=summary))
    assert [a.evidence["rank"] for a in found] == [1, 1, 0]
    assert found[0].evidence["ranks_compared"] == 2


# -- unstable timing ---------------------------------------------------------------------------


def _steps(ms: list[float]) -> AdviceInputs:
    return _inputs(make_rows([{"forward": t * MS} for t in ms]))


def test_unstable_timing_from_a_high_coefficient_of_variation() -> None:
    [advice] = unstable_timing(_steps([16.0, 32.0] * 5))
    assert advice.evidence["cv"] == pytest.approx(0.3514, abs=1e-4)
    assert advice.evidence["max_over_median"] == pytest.approx(32 / 24)
    assert "coefficient of variation 0.35 (stdev 8.24 ms over avg 23.4 ms; above 0.25)" \
        in advice.message
    assert "slowest step 31.2 ms, 1.3x the median 23.4 ms." in advice.message


def test_unstable_timing_from_one_spike() -> None:
    [advice] = unstable_timing(_steps([10.0] * 99 + [35.0]))
    assert advice.evidence["cv"] < 0.25
    assert advice.evidence["max_over_median"] == pytest.approx(3.5)
    assert "slowest step 34.2 ms, 3.5x the median 9.77 ms (above 3x)" in advice.message
    assert "above 0.25" not in advice.message


def test_unstable_timing_names_only_causes_its_measurements_point_to() -> None:
    # A CPU run: kernels are not re-tuned per shape, so shapes are not said;
    # other processes measured on the host are said with their figure.
    steps = _steps([16.0, 32.0] * 5)
    [advice] = unstable_timing(steps)
    assert not any("input shapes" in a for a in advice.actions)
    loaded = _inputs(make_rows([{"forward": t * MS} for t in [16.0, 32.0] * 5]),
                     other_cores=1.4, uses_gpu=True)
    [advice] = unstable_timing(loaded)
    assert any("input shapes" in a for a in advice.actions)
    assert any("they took 1.40 cores on average" in a for a in advice.actions)


def test_cpu_bound_points_to_a_window_not_to_calls_it_did_not_see() -> None:
    # Others 60% of a CPU-only step, no window: what runs there is unmeasured.
    rows = make_rows([{"forward": 2 * MS, "backward": 2 * MS, "others": 6 * MS}] * 10)
    [advice] = cpu_bound(_inputs(rows))
    assert not any(".item()" in a for a in advice.actions)
    assert advice.actions[0].startswith("see what runs between the phases in a detailed window")


def test_stable_or_short_runs_are_not_unstable() -> None:
    assert unstable_timing(_steps([10.0] * 20)) == []
    assert unstable_timing(_steps([10.0, 11.0, 9.0, 10.0, 12.0] * 4)) == []
    assert unstable_timing(_steps([10.0, 10.0, 10.0, 50.0])) == []  # 4 steps say nothing
    assert unstable_timing(AdviceInputs()) == []


# -- in the report ------------------------------------------------------------------------------


def _io_bound_run() -> Any:
    rows = _rows(8, dataloader=1 / 8, forward=1 / 4, others=1 / 8)
    rank = make_rank(rows, settings={"warmup": 1},
                     device={"cpu_count": 16, "gpus": []},
                     extra={"dataloader_init": {"calls": 1, "time": 0.25}})
    rank.data["dataloaders"] = [_loader()]
    return make_run([rank])


def test_report_carries_the_advice() -> None:
    report = build_report(_io_bound_run())
    assert [a.kind for a in report.advice] == ["io-bound", "cpu-bound"]
    data = json.loads(render_json(report))
    io_advice = data["advice"][0]
    assert io_advice["kind"] == "io-bound"
    assert io_advice["evidence"]["reader_ratio"] == 0.25
    assert io_advice["evidence"]["dataloaders"][0]["num_workers"] == 0
    assert io_advice["actions"][-1] == UNMEASURED  # hand-built: no stages to judge by
    assert data == json.loads(json.dumps(report.to_dict()))


def test_advice_block_follows_the_tables() -> None:
    report = build_report(_io_bound_run())
    text = render_markdown(report)
    advice_at = text.index("**Advice**")
    assert text.index("### Model Summary") < advice_at < text.index("**Outside the steps")
    assert "- I/O-bound: Reader Ratio 25.000% (above 5%)" in text
    stream = io.StringIO()
    render_table(report, make_console(stream, width=100))
    table = stream.getvalue()
    assert "Advice" in table and "I/O-bound: Reader Ratio 25.000%" in table
    assert table.index("Model Summary") < table.index("Advice")


def test_no_advice_no_block() -> None:
    rows = _rows(8, dataloader=1 / 64, forward=63 / 64)
    report = build_report(make_run([make_rank(rows)]))
    assert report.advice == []
    assert "Advice" not in render_markdown(report)
    assert report.to_dict()["advice"] == []


def test_advice_without_evidence_is_never_printed() -> None:
    report = build_report(_io_bound_run())
    bare = Advice("io-bound", "x", {"n": 1})
    object.__setattr__(bare, "evidence", {})
    report = dataclasses.replace(report, advice=[bare])
    assert "Advice" not in render_markdown(report)


# -- end to end ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_slow_dataloader_gets_io_advice_naming_num_workers(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun(SCRIPT, "--sleep-ms", "20", json_report=False)
    assert run.returncode == 0, run.describe()
    assert "Advice" in run.out, run.describe()
    assert "I/O-bound: Reader Ratio" in run.out and "num_workers=0" in run.out, run.describe()
    report = run.report()
    [advice] = [a for a in report["advice"] if a["kind"] == "io-bound"]
    assert advice["evidence"]["reader_ratio"] > READER_RATIO_LIMIT
    assert advice["evidence"]["reader_ratio"] == report["perf"]["reader_ratio"]
    [loader] = advice["evidence"]["dataloaders"]
    assert loader["num_workers"] == 0 and loader["dataset"] == "Batches"
    assert "num_workers=0" in advice["message"]
    # 20 ms of sleep a batch, 1% of it CPU: workers overlap it with the
    # model (one, where the model's step is as long as the sleep: on a
    # loaded machine; two where it is shorter).
    prediction = advice["evidence"]["pipeline"]["workers_prediction"]
    assert prediction["num_workers"] >= 1
    assert any(a.startswith(f"num_workers={prediction['num_workers']}: ")
               for a in advice["actions"])


@pytest.mark.slow
def test_fast_dataloader_gets_no_io_advice(run_perfrun: RunPerfrun) -> None:
    run = run_perfrun(SCRIPT, "--sleep-ms", "0")
    assert run.returncode == 0, run.describe()
    report = run.report()
    assert report["perf"]["steps"] > 20
    assert report["perf"]["reader_ratio"] < READER_RATIO_LIMIT
    assert "io-bound" not in [a["kind"] for a in report["advice"]]


def test_io_bound_names_the_training_loader_once() -> None:
    # The validation loader (iterated under no_grad, so "training": False)
    # is not what the steps wait on; two identical training loaders are one.
    rows = _rows(dataloader=1 / 8, forward=1 / 4, others=1 / 8)
    train = {**_loader(), "training": True}
    val = {**_loader(num_workers=4), "training": False}
    [advice] = io_bound(_inputs(rows, dataloaders=[train, val, dict(train)], cpu_count=16))
    assert [d["num_workers"] for d in advice.evidence["dataloaders"]] == [0]
    assert advice.message.count("DataLoader over") == 1
