"""The renderers: Markdown against stored text, JSON round trips, terminal
tables readable at 80 and 100 columns."""

from __future__ import annotations

import dataclasses
import io
import json
import re
from typing import Optional

import pytest
from builders import MS, make_rank, make_rows, make_run

from perfrun.analysis.build import build_report
from perfrun.analysis.report import Report
from perfrun.report import make_console, render, render_json, render_markdown, render_table
from perfrun.report.markdown import _cell, _code
from perfrun.store.rankfile import RankResult

NVML_NOTE = "NVML is not available: GPU utilisation is not sampled"


def _single_rank_run():
    # Step 0 is a slow warm-up step; steps 1-5 take 1/4 or 3/8 s, 1/64 s of
    # which in the DataLoader, and carry 16 samples each.
    rows = make_rows([
        {"dataloader": 1 / 64, "forward": f, "backward": 1 / 8, "optimization": 1 / 32,
         "others": 1 / 64, "samples": 16}
        for f in (1.0, 1 / 16, 3 / 16, 1 / 16, 3 / 16, 1 / 16)
    ])
    device = {
        "cpu_process_percent": {"avg": 150.0, "max": 300.0},
        "cpu_system_percent": {"avg": 20.0, "max": 40.0},
        "rss_peak_bytes": 2**30,
        "gpus": [],
    }
    rank = make_rank(
        rows,
        command="python train.py --epochs 1",
        settings={"warmup": 1},
        device=device,
        extra={"eval": {"calls": 1, "forward_calls": 4, "time": 0.5}},
        notes=[NVML_NOTE],
    )
    return make_run([rank], run_dir="perfrun_log/run1")


# The numbers, by hand: step times 0.25, 0.375, 0.25, 0.375, 0.25 s -> total
# 1.5 s, avg 0.3 s; ips 5 / 1.5 = 3.333, 1 / 0.25 = 4, 1 / 0.375 = 2.667 (four
# significant figures); samples/s 80 / 1.5, 16 / 0.25, 16 / 0.375; Reader
# Ratio 0.015625 / 0.3.
EXPECTED_MARKDOWN = """\
## perfrun

- **Command:** `python train.py --epochs 1`
- **Results:** `perfrun_log/run1`
- **Steps:** 5 counted of 6 recorded; warm-up left out: first 1 step (as set)

### Perf Summary

time unit: ms, ips unit: steps/s

Reader Ratio: 5.208%   warm-up steps excluded: 1

|  | avg | max | min |
| :--- | ---: | ---: | ---: |
| reader_cost | 15.62 | 15.62 | 15.62 |
| batch_cost | 300.0 | 375.0 | 250.0 |
| ips | 3.333 | 4.000 | 2.667 |
| ips (samples/s) | 53.33 | 64.00 | 42.67 |

### Model Summary

time unit: ms   Avg / Max / Min: per step (5 steps)   Ratio(%): share of ProfileStep

| Name | Calls | CPU Total | Avg | Max | Min | Ratio(%) |
| :--- | ---: | ---: | ---: | ---: | ---: | ---: |
| **ProfileStep** | 5 | 1500.00 | 300.00 | 375.00 | 250.00 | 100.00 |
| &nbsp;&nbsp;Dataloader | 5 | 78.12 | 15.62 | 15.62 | 15.62 | 5.21 |
| &nbsp;&nbsp;Forward | 5 | 562.50 | 112.50 | 187.50 | 62.50 | 37.50 |
| &nbsp;&nbsp;Backward | 5 | 625.00 | 125.00 | 125.00 | 125.00 | 41.67 |
| &nbsp;&nbsp;Optimization | 5 | 156.25 | 31.25 | 31.25 | 31.25 | 10.42 |
| &nbsp;&nbsp;Others | - | 78.12 | 15.62 | 15.62 | 15.62 | 5.21 |

### Device Summary

| Device | Util avg (%) | Util max (%) | Memory |
| :--- | ---: | ---: | :--- |
| CPU(Process) | 150.0 | 300.0 | peak RSS 1.0 GiB |
| CPU(System) | 20.0 | 40.0 |  |

CPU(Process) is the process's CPU time over all cores, so it can reach 100% x the number \
of cores; CPU(System) is the whole machine, 0-100%.

**Advice**

- I/O-bound: Reader Ratio 5.208% (above 5%): each step waits 15.6 ms for its batch out of \
300 ms. Try: measure the fetch stage by stage before changing num_workers: perfrun's default \
mode (without --timer-only) times the sampler, the dataset, the collate and the workers, and \
says which change would pay.

**Outside the steps (whole run)**

- Eval: 1 call, 500.0 ms (4 forward calls, not counted in steps)

**Notes**

- NVML is not available: GPU utilisation is not sampled
"""


def test_markdown_matches_expected_text() -> None:
    assert render_markdown(build_report(_single_rank_run())) == EXPECTED_MARKDOWN


def _gpu_multi_rank_run():
    def rows(forward_ms: int, n: int) -> list:
        return make_rows([
            {"dataloader": 2 * MS, "forward": forward_ms * MS, "backward": 20 * MS,
             "optimization": 4 * MS, "others": 4 * MS,
             "gpu": {"forward": 8 * MS, "backward": 18 * MS, "optimization": 3 * MS,
                     "step": 30 * MS}}
            for _ in range(n)
        ])

    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util_avg": 71.5, "util_max": 100.0,
             "mem_used_max": 20 * 2**30, "mem_total": 80 * 2**30}]
    device = {"cpu_process_percent": {"avg": 99.0, "max": 120.0},
              "cpu_system_percent": {"avg": 30.0, "max": 50.0},
              "rss_peak_bytes": 3 * 2**30, "gpus": gpus}
    ranks = [
        make_rank(rows(10, 20), rank=0, world_size=4, device=device),
        make_rank(rows(10, 20), rank=1, world_size=4, device=device),
        make_rank(rows(26, 12), rank=2, world_size=4, status="signalled", signal=9,
                  device=device),
    ]
    return make_run(ranks, missing=[3])


def test_markdown_with_gpu_and_several_ranks() -> None:
    text = render_markdown(build_report(_gpu_multi_rank_run()))
    assert "| Name | Calls | CPU Total | Avg | Max | Min | Ratio(%) | " \
        "GPU Total | Avg | Max | Min | Ratio(%) |" in text
    assert "### Ranks" in text
    assert "| 2 | killed | 12 |" in text
    assert "| 3 | no results | - |" in text
    assert "Slowest rank: 2" in text and "40.0% slower than the median" in text
    assert "- rank 2: killed by SIGKILL after 12 steps" in text
    assert "- rank 3: wrote nothing" in text
    # The device appears once although three ranks on one host sampled it.
    assert text.count("GPU0 NVIDIA H100 80GB HBM3") == 1


def test_several_hosts_get_a_host_column_and_one_device_block_each() -> None:
    ranks = [
        make_rank(make_rows([{"forward": MS}] * 4), rank=r, world_size=4, hostname=f"node{r // 2}",
                  device={"cpu_system_percent": {"avg": 10.0 * r, "max": 50.0}})
        for r in range(4)
    ]
    text = render_markdown(build_report(make_run(ranks)))
    assert "| Rank | Host | Status |" in text
    assert "| 3 | node1 | finished |" in text
    assert "| node0 CPU(System) | 0.0 | 50.0 |" in text
    assert "| node1 CPU(System) | 20.0 | 50.0 |" in text
    assert text.count("CPU(System)") == 3  # two rows and the footnote


def test_markdown_without_gpu_has_no_gpu_column() -> None:
    text = render_markdown(build_report(_single_rank_run()))
    assert "GPU Total" not in text and "GPU0" not in text


def test_markdown_cells_and_code_spans_are_escaped() -> None:
    assert _cell("a|b") == "a\\|b"
    assert _cell("  Forward") == "&nbsp;&nbsp;Forward"
    assert _code("python -c 'print(`x`)'") == "``python -c 'print(`x`)'``"


def test_markdown_states_the_problem() -> None:
    text = render_markdown(build_report(make_run([make_rank(torch_imported=False)])))
    assert "**perfrun: no PyTorch training loop was seen: the script never imported torch**" in text
    assert "Perf Summary" not in text


# -- JSON ---------------------------------------------------------------------------------


def test_json_round_trips_with_raw_numbers() -> None:
    report = build_report(_single_rank_run())
    data = json.loads(render_json(report))
    assert data["format"] == "perfrun-report" and data["version"] == 1
    assert data["problem"] is None
    assert data["perf"]["batch_cost"]["avg"] == pytest.approx(0.3)
    assert data["perf"]["batch_cost"]["max"] == 0.375
    assert data["perf"]["reader_ratio"] == pytest.approx(0.015625 / 0.3)
    rows = {r["name"]: r for r in data["model"]["rows"]}
    assert rows["Forward"]["cpu"]["total"] == 0.5625
    assert rows["Others"]["calls"] is None
    assert rows["ProfileStep"]["gpu"] is None
    assert data["title"]["warmup"] == 1 and data["title"]["warmup_default"] is False
    assert data["extras"][0]["name"] == "Eval"
    assert data["notes"] == [NVML_NOTE]
    assert data == json.loads(json.dumps(report.to_dict()))


def test_json_is_strict_even_with_non_finite_values() -> None:
    report = build_report(_single_rank_run())
    assert report.perf is not None
    report.perf = dataclasses.replace(report.perf, reader_ratio=float("inf"))
    text = render_json(report)
    assert "Infinity" not in text
    assert json.loads(text)["perf"]["reader_ratio"] is None


def test_json_of_a_run_with_no_results() -> None:
    data = json.loads(render_json(build_report(make_run([], missing=[0]))))
    assert data["problem"] == "no rank wrote results"
    assert data["perf"] is None and data["model"] is None


# -- terminal tables ------------------------------------------------------------------------


def _table_text(report: Report, width: int) -> str:
    stream = io.StringIO()
    render_table(report, make_console(stream, width=width))
    return stream.getvalue()


def test_table_in_a_pipe_has_no_escape_codes_and_fixed_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    stream = io.StringIO()
    console = make_console(stream)
    assert console.width == 80 and console.color_system is None
    monkeypatch.setenv("COLUMNS", "132")  # as on a terminal, COLUMNS wins
    assert make_console(io.StringIO()).width == 132
    render_table(build_report(_gpu_multi_rank_run()), console)
    text = stream.getvalue()
    assert "\x1b" not in text
    for title in ("Perf Summary", "Model Summary", "Ranks", "Device Summary"):
        assert title in text


@pytest.mark.parametrize(("width", "tables"), [(80, 2), (100, 1)])
def test_table_readable_at_80_and_100_columns(width: int, tables: int) -> None:
    """Every line fits, sentences and tables alike (the title's lines, whole
    in a pipe, aside); each figure of the
    Model Summary in a column of its own, aligned under its header; too
    narrow for the CPU and GPU figures side by side (80), two tables, every
    row whole."""
    text = _table_text(build_report(_gpu_multi_rank_run()), width)
    lines = text.splitlines()
    body = lines[lines.index(""):]  # the title's lines stay whole in a pipe
    assert max(len(line) for line in body) <= width, text
    model = lines[lines.index("Model Summary"):lines.index("Ranks")]
    headers = [i for i, line in enumerate(model) if line.startswith("Name ")]
    assert len(headers) == tables
    step_lines = [line for line in model if line.startswith("ProfileStep")]
    assert len(step_lines) == tables
    assert all(line.endswith("100.00") for line in step_lines)
    for h in headers:
        ends = [m.end() for m in re.finditer(r"Total|Avg|Max|Min|Ratio\(%\)", model[h])]
        assert len(ends) == 10 // tables
        for row in model[h + 2:h + 8]:
            figures = [m.end() for m in re.finditer(r"\d+\.\d+(?= |$)", row)]
            assert figures == ends, (row, model[h])


def test_table_keeps_cpu_and_gpu_side_by_side_when_wide() -> None:
    lines = _table_text(build_report(_gpu_multi_rank_run()), 140).splitlines()
    header = [line for line in lines if "CPU Total" in line]
    assert len(header) == 1 and "GPU Total" in header[0]


def test_table_shows_perf_rows_and_ratio() -> None:
    text = _table_text(build_report(_single_rank_run()), 100)
    assert "Reader Ratio: 5.208%" in text
    assert "batch_cost" in text and "300.0" in text
    assert "ips (samples/s)" in text
    assert "GPU Total" not in text and "GPU0" not in text


def test_table_states_problems_without_tables() -> None:
    text = _table_text(build_report(make_run([make_rank()])), 100)
    assert "perfrun: no PyTorch training loop was seen" in text
    assert "Perf Summary" not in text and "Model Summary" not in text


def test_switched_off_sections_are_not_printed() -> None:
    run = _single_rank_run()
    run.ranks[0].data["settings"]["summary"] = {"device": False, "model": False}
    text = _table_text(build_report(run), 100)
    assert "Perf Summary" in text
    assert "Device Summary" not in text and "Model Summary" not in text


# -- dispatch --------------------------------------------------------------------------------


def test_render_dispatches_on_format() -> None:
    report = build_report(_single_rank_run())
    md = io.StringIO()
    render(report, "markdown", md)
    assert md.getvalue() == EXPECTED_MARKDOWN
    js = io.StringIO()
    render(report, "json", js)
    assert json.loads(js.getvalue())["perf"]["steps"] == 5
    table = io.StringIO()
    render(report, "table", table)
    assert "Perf Summary" in table.getvalue()
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        render(report, "pdf", io.StringIO())


def test_steps_that_trained_with_no_forward_timed_say_why() -> None:
    """A model called inside a compiled function is traced, never timed:
    the report says where its forward went rather than leave Forward at 0
    unexplained."""
    from perfrun.analysis.summary import FORWARD_UNSEEN

    rows = make_rows([dict(dataloader=MS, backward=2 * MS, optimization=MS, others=3 * MS,
                           calls=(1, 0, 1, 1))] * 8)
    report = build_report(make_run([make_rank(rows)]), warmup=0)
    assert FORWARD_UNSEEN in report.notes
    assert FORWARD_UNSEEN in render_markdown(report)
    seen = make_rows([dict(dataloader=MS, forward=MS, backward=2 * MS, optimization=MS)] * 8)
    assert FORWARD_UNSEEN not in build_report(make_run([make_rank(seen)]), warmup=0).notes


def test_a_short_forward_is_blamed_on_module_forward_only_where_the_backward_is_the_models(
) -> None:
    """A Forward under a tenth of the Backward says the model was called as
    `module.forward(x)` (only a module it calls was timed) in one process;
    under DDP the Backward holds the gradients' all-reduce and the wait in
    it for the other ranks, so the same shape says nothing of the sort, and
    where perfrun cannot tell (ranks of a job whose files do not say), it
    says nothing either."""
    rows = make_rows([dict(dataloader=MS, forward=MS, backward=16 * MS, optimization=MS)] * 8)

    def notes(*ranks: RankResult) -> list[str]:
        report = build_report(make_run(list(ranks)), warmup=0)
        return [n for n in report.notes if "`module.forward(x)`" in n]

    def rank(r: int = 0, world_size: int = 1, record: Optional[dict] = None) -> RankResult:
        made = make_rank(rows, rank=r, world_size=world_size)
        if record is not None:
            made.data["distributed"] = record
        return made

    # One process: the note, from files before the record and after it.
    [note] = notes(rank())
    assert note.startswith("the Forward timed (0.977 ms a step) is under 10% of the Backward")
    assert notes(rank(record={"world_size": None, "backend": None, "wrappers": []}))
    # Two ranks of a model called through DDP, on gloo: no note.
    ddp = {"world_size": 2, "backend": "gloo", "wrappers": ["DistributedDataParallel"]}
    assert notes(rank(0, 2, ddp), rank(1, 2, ddp)) == []
    # A process group of two without DDP (gradients all-reduced by hand): none.
    group = {"world_size": 2, "backend": "gloo", "wrappers": []}
    assert notes(rank(0, 2, group), rank(1, 2, group)) == []
    # Two ranks whose files do not say (written before the record): none.
    assert notes(rank(0, 2), rank(1, 2)) == []


def test_evaluation_passes_of_a_model_in_training_mode_are_said_to_be_rollouts() -> None:
    from perfrun.analysis.build import rollouts

    rollout = {"calls": 6, "batches": 0, "forward_calls": 768, "train_mode_forward_calls": 768}
    assert rollouts(rollout)
    # Validation: a loader's batches, or a model in eval mode, or a file
    # written before the count was kept.
    assert not rollouts({**rollout, "batches": 12})
    assert not rollouts({**rollout, "train_mode_forward_calls": 0})
    assert not rollouts({"calls": 6, "batches": 0, "forward_calls": 768})
    assert not rollouts({"calls": 0, "forward_calls": 0, "train_mode_forward_calls": 0})
