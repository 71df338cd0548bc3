"""How the report looks: tables that fit the terminal without cutting a
number, sentences laid out with hanging indents (in a pipe too), a Perf
Summary unit that does not flip between two runs of one script, four
significant figures, no NVML note on machines without an NVIDIA driver,
and the whole output read in a real terminal of 80 and 120 columns."""

from __future__ import annotations

import io
import re
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pynvml
import pytest
from builders import make_rank, make_run
from conftest import Terminal, flat, needs_tmux

from perfrun import commands
from perfrun.analysis.build import build_report
from perfrun.analysis.memory import memory_summary
from perfrun.analysis.stats import Rate, Stats, times
from perfrun.analysis.summary import ModelRow, ModelSummary, PerfSummary
from perfrun.analysis.window import RankWindow, WindowReport
from perfrun.prose import PROSE_WIDTH
from perfrun.report.markdown import render_markdown_blocks
from perfrun.report.memory_blocks import memory_block
from perfrun.report.primitives import (
    ELLIPSIS,
    Column,
    LinesBlock,
    TableBlock,
    bytes_unit,
    column_unit,
    flop_unit,
    fmt_flops,
    fmt_size,
    headed,
    middle,
    middle_words,
    plural,
)
from perfrun.report.summary_blocks import _rate_cell, model_block, perf_block
from perfrun.report.table import MIN_NAME, layout, make_console, render_blocks, render_table
from perfrun.report.window_blocks import module_label, window_blocks
from perfrun.runtime import device
from perfrun.runtime.device import DeviceSampler
from perfrun.store.rankfile import RankResult
from perfrun.store.stepfile import COL, STEP_COLUMNS

MS = 1e-3

# -- a window with long names and wide numbers ------------------------------------------

OP_NAMES = [
    "autograd::engine::evaluate_function: AddmmBackward0",
    "aten::scaled_dot_product_efficient_attention",
    "Optimizer.step#AdamW.step",
    "aten::linear",
    "aten::_local_scalar_dense",
    "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
]
KERNEL_NAMES = [
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x128_16x3_nt_align4>"
    "(cutlass_80_tensorop_s1688gemm_256x128_16x3_nt_align4::Params)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
]


def _times(total: float, calls: int) -> dict[str, Any]:
    return {"total": total, "avg": total / calls, "max": total / calls * 1.5,
            "min": total / calls / 2, "calls": calls}


def _summary() -> dict[str, Any]:
    ops = []
    for i, name in enumerate(OP_NAMES):
        row = {"name": name, **_times(12345.678 * MS / (i + 1), 10 * (i + 1)),
               "ratio": 0.9 / (i + 1), "gpu_total": 23456.789 * MS / (i + 1),
               "flops": 123456789012.0 if i % 2 == 0 else None}
        row.update(gpu_avg=row["gpu_total"] / row["calls"], gpu_max=row["gpu_total"],
                   gpu_min=0.0)
        ops.append(row)
    kernels = [{"name": n, **_times(9876.543 * MS / (i + 1), 1000 * (i + 1)),
                "ratio": 0.5 / (i + 1)} for i, n in enumerate(KERNEL_NAMES)]
    modules = []
    for i, (name, parent) in enumerate([
        ("GPT", ""),
        ("GPT.transformer", "GPT"),
        ("GPT.transformer.h.11", "GPT.transformer"),
        ("GPT.transformer.h.11.attn", "GPT.transformer.h.11"),
        ("GPT.transformer.h.11.attn.c_attn_projection", "GPT.transformer.h.11.attn"),
    ]):
        modules.append({"name": name, "parent": parent, "calls": 120, "type": "Linear",
                        "total": 9999.999 * MS / (i + 1), "forward": 4567.891 * MS / (i + 1),
                        "backward": 5432.108 * MS / (i + 1),
                        "gpu_forward": 4000.0 * MS / (i + 1),
                        "gpu_backward": 5000.0 * MS / (i + 1), "share": 0.98 / (i + 1)})
    return {
        "steps": 10,
        "operators": ops,
        "kernels": kernels,
        "kernel_total": {"calls": 6000, "total": 18000.0 * MS, "ratio": 0.95},
        "modules": {"recorded": True, "modules": modules, "groups": []},
        "distributed": {"basis": "gpu", "gpu": {
            "communication": 1234.567 * MS, "communication_ratio": 0.1234,
            "computation": 9876.543 * MS, "computation_ratio": 0.8765,
            "overlap": 123.456 * MS, "overlap_ratio": 0.0123}},
        "memory_manipulation": {
            "copies": [{"name": "Memcpy HtoD (Pageable -> Device)",
                        **_times(3456.789 * MS, 2000)}],
            "sync_calls": 1234, "sync_per_step": 123.4,
        },
        "user_defined": [{"name": "train/step/forward_and_backward_with_gradient_accumulation",
                          **_times(11111.111 * MS, 10), "ratio": 0.99}],
    }


def _window_tables() -> list[TableBlock]:
    report = WindowReport(window=(5, 15), ranks=[RankWindow(0, _summary())])
    out = window_blocks(report, {"time_unit": "ms", "row_limit": 20}, lambda _key: True)
    return [b for b in out if isinstance(b, TableBlock)]


def _render(items: list[Any], width: int) -> str:
    stream = io.StringIO()
    render_blocks(items, make_console(stream, width))
    return stream.getvalue()


NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _table_lines(text: str, block: TableBlock) -> list[str]:
    """The lines of `block`'s tables: all but its title, its sentences and
    the blank lines between the stacked tables."""
    prose = {block.title, *block.info, *block.footer}
    return [line for line in text.splitlines() if line and line not in prose]


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_wide_window_tables_fit_without_cutting_a_number(width: int) -> None:
    tables = _window_tables()
    assert {b.key for b in tables} >= {
        "operator", "kernel", "memcpy", "userdefined", "distributed", "module"
    }
    for block in tables:
        text = _render([block], width)
        lines = _table_lines(text, block)
        assert lines, block.key
        assert max(len(line) for line in lines) <= width, (block.key, text)
        body = "\n".join(lines)
        # Every number cell, whole, in the output; no cut number anywhere.
        for row in block.rows:
            for cell in row[1:]:
                for token in cell.replace("(", " ").replace(")", " ").replace("%", " ").split():
                    if NUMBER.match(token):
                        assert re.search(rf"(?<![\d.]){re.escape(token)}(?![\d.])", body), (
                            block.key, width, token)
        for line in lines:
            for token in line.split():
                if ELLIPSIS in token:
                    assert not NUMBER.match(token.replace(ELLIPSIS, "")), (block.key, line)
        # Every row's name: whole, or cut in the middle to at least MIN_NAME.
        # A tree's indentation does not count.
        cut = [_cut_name(line) for line in lines if ELLIPSIS in line]
        for row in block.rows:
            name = row[0].strip()
            assert name in body or any(
                name.startswith(head) and name.endswith(tail)
                and len(head) + 1 + len(tail) >= min(MIN_NAME, len(name))
                for head, tail in cut
            ), (block.key, width, name)


def _cut_name(line: str) -> tuple[str, str]:
    """The head and tail of the name cut in `line`: from the line's first
    character to the ellipsis, and from there to the next run of spaces."""
    head, _, rest = line.lstrip().partition(ELLIPSIS)
    return head, rest.split("  ", 1)[0]


def test_operator_table_stacks_its_gpu_columns_at_80_columns() -> None:
    (op,) = [b for b in _window_tables() if b.key == "operator"]
    assert [columns for columns, _ in layout(op, 200)] == [list(range(9))]
    parts = [columns for columns, _ in layout(op, 80)]
    assert parts[-1] == [0, 7, 8]
    assert sum(len(c) - 1 for c in parts) == 8  # every column once, after the name
    for _, widths in layout(op, 80):
        assert widths[0] >= MIN_NAME
    text = _render([op], 80).splitlines()
    name = OP_NAMES[0]
    room = layout(op, 80)[0][1][0]
    # Cut in the first table, whole in the second, which has the room.
    assert any(line.startswith(middle(name, room) + " ") for line in text)
    assert any(line.startswith(name + " ") for line in text)


def test_a_cpu_windows_operator_summary_has_no_gpu_or_mflops_column() -> None:
    """On a CPU (no GPU time recorded) and without --with-flops, the two
    columns would be dashes from top to bottom: at 80 columns a second
    table of 20 rows of "-". They are left out; each comes back alone where
    its figures were recorded."""
    def operator(**keep: bool) -> TableBlock:
        summary = _summary()
        for op in summary["operators"]:
            if not keep.get("gpu"):
                for k in ("gpu_total", "gpu_avg", "gpu_max", "gpu_min"):
                    op.pop(k)
            if not keep.get("flops"):
                op.pop("flops")
        report = WindowReport(window=(5, 15), ranks=[RankWindow(0, summary)])
        [op] = [b for b in window_blocks(report, {"time_unit": "ms"}, lambda _key: True)
                if isinstance(b, TableBlock) and b.key == "operator"]
        return op

    def headers(block: TableBlock) -> list[str]:
        return [c.header for c in block.columns]

    cpu = operator()
    assert headers(cpu) == ["Name", "Calls", "CPU Total", "Avg", "Max", "Min", "Ratio (%)"]
    assert all(len(row) == 7 for row in cpu.rows)
    assert [columns for columns, _ in layout(cpu, 80)] == [list(range(7))]  # one table
    assert headers(operator(gpu=True))[7:] == ["GPU Total"]
    assert headers(operator(flops=True))[7:] == ["MFLOPs"]
    assert headers(operator(gpu=True, flops=True))[7:] == ["GPU Total", "MFLOPs"]


def test_markdown_prints_one_table_with_every_column() -> None:
    (op,) = [b for b in _window_tables() if b.key == "operator"]
    md = render_markdown_blocks([op]).splitlines()
    header = next(line for line in md if line.startswith("| Name"))
    assert header.count("|") == len(op.columns) + 1
    assert "MFLOPs" in header and "CPU Total" in header


def test_names_are_cut_in_the_middle() -> None:
    name = "autograd::engine::evaluate_function: AddmmBackward0"
    assert middle(name, 28) == "autograd::eng…AddmmBackward0"
    assert middle(name, len(name)) == name
    # Cutting again keeps the head and the tail of the original.
    assert middle(middle(name, 40), 28) == middle(name, 28)
    # The blocks cap kernel names for the Markdown the same way.
    (kernel,) = [b for b in _window_tables() if b.key == "kernel"]
    assert kernel.rows[0][0] == middle(KERNEL_NAMES[0], 56)


# -- prose in a pipe ---------------------------------------------------------------------


def test_prose_in_a_pipe_is_wrapped_with_hanging_indents() -> None:
    """A CI log gets sentences of at most PROSE_WIDTH characters, not one
    line of hundreds: each bullet's continuation indented under it, a
    table's note under its first line, and no line ending in spaces."""
    note = ("word " * 60).strip()
    assert len(note) > 290
    footer = "An operator's time includes the operators it calls, " * 4
    table = TableBlock("t", "Table", ["info " * 40], [Column("Name", "left"), Column("Memory",
                       "left")], [["a", "x"], ["bb", "a much longer cell"]], footer=[footer])
    for width in (120, 160):  # a pipe's tables are 120 wide; prose stays at 100
        text = _render([LinesBlock("notes", "Notes", [note]), table], width)
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= PROSE_WIDTH
        start = lines.index("Notes") + 1
        bullet = lines[start:lines.index("", start)]
        assert bullet[0].startswith("  - word") and len(bullet) == 4
        assert all(line.startswith("    word") for line in bullet[1:])
        assert " ".join(line.strip() for line in bullet) == f"- {note}"
        first = next(i for i, line in enumerate(lines) if line.startswith("An operator's"))
        assert lines[first + 1].startswith("  An operator's") or lines[first + 1].startswith(
            "  calls")
        assert not [line for line in lines if line.endswith(" ")]


def test_advice_in_a_pipe_keeps_its_code_commands_and_numbers_whole() -> None:
    """A real advice item, laid out in a pipe: the call to paste, the
    option with its value, the command and each number with its unit on
    one line, where plain word wrapping splits them."""
    advice = (
        "I/O-bound: Reader Ratio 21.721% (above 5%): each step waits 281 us for its batch out "
        "of 1.29 ms. Try: index a whole batch, as the per-sample indexing and collate cost "
        "229.4 us a batch: DataLoader(dataset, sampler=BatchSampler(sampler, batch_size=64), "
        "batch_size=None) for a TensorDataset; predicted: the fetch falls from 285 us to about "
        "99.4 us a batch; or a larger warm-up if the first steps still warm up (--warmup N), or "
        "a window after them: perfrun train.py -- --scheduler 100 110"
    )
    whole = ["DataLoader(dataset, sampler=BatchSampler(sampler, batch_size=64), batch_size=None)",
             "229.4 us", "99.4 us", "--warmup N", "perfrun train.py -- --scheduler 100 110"]
    plain = textwrap.wrap(advice, PROSE_WIDTH, initial_indent="  - ", subsequent_indent="    ")
    assert [w for w in whole if not any(w in line for line in plain)], "nothing to keep whole"
    text = _render([LinesBlock("advice", "Advice", [advice])], 120)
    lines = text.splitlines()[1:-1]
    assert len(lines) > 3 and max(len(line) for line in lines) <= PROSE_WIDTH
    assert lines[0].startswith("  - ") and all(line.startswith("    ") for line in lines[1:])
    for piece in whole:
        assert any(piece in line for line in lines), (piece, text)


def test_prose_on_a_terminal_may_wrap() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    render_blocks([LinesBlock("notes", "Notes", [("word " * 60).strip()])],
                  make_console(stream, 80))
    plain = re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue())
    assert max(len(line) for line in plain.splitlines()) <= 80


# -- the Perf Summary's unit --------------------------------------------------------------


def _perf(step: float, slow: float) -> PerfSummary:
    """Nine steps of `step` seconds and one of `slow`."""
    times = [step] * 9 + [slow]
    return PerfSummary(
        steps=10, reader_cost=Stats.of([step / 10] * 10), batch_cost=Stats.of(times),
        ips=Rate(avg=1 / step, max=1 / step, min=1 / slow), samples_ips=None,
        reader_ratio=0.1,
    )


@pytest.mark.parametrize(("a", "b"), [
    ((0.98, 0.99), (1.02, 1.03)),  # around one second
    ((9.8 * MS, 9.9 * MS), (10.2 * MS, 10.3 * MS)),  # around 10 ms
    ((0.98 * MS, 0.99 * MS), (1.02 * MS, 1.03 * MS)),  # around 1 ms
    ((9.0 * MS, 9.5 * MS), (9.0 * MS, 10.5 * MS)),  # the same steps, one slower outlier
    ((40 * MS, 45 * MS), (40 * MS, 2.0)),  # a step that waited on a checkpoint
])
def test_perf_summary_unit_is_the_same_for_two_runs_of_a_script(
    a: tuple[float, float], b: tuple[float, float]
) -> None:
    first, second = perf_block(_perf(*a), 1, 0), perf_block(_perf(*b), 1, 0)
    assert first.info[0] == second.info[0] == "time unit: ms, ips unit: steps/s"


@pytest.mark.parametrize(("step", "slow", "cells", "ips"), [
    # a small inference loop
    (40e-6, 50e-6, ["0.04100", "0.05000", "0.04000"], ["25000", "25000", "20000"]),
    # the bundled example
    (1.3436e-3, 3.79902e-3, ["1.589", "3.799", "1.344"], ["744.3", "744.3", "263.2"]),
    # a huge model
    (90.0, 100.0, ["91000", "100000", "90000"], ["0.01111", "0.01111", "0.01000"]),
])
def test_perf_summary_keeps_four_figures_from_microseconds_to_minutes(
    step: float, slow: float, cells: list[str], ips: list[str]
) -> None:
    """Four significant figures, what two runs of one script agree on,
    whatever the step's length: no `4162.26370` (five decimals of noise),
    and no 0.00 for a step of microseconds."""
    block = perf_block(_perf(step, slow), 1, 0)
    assert block.rows[1] == ["batch_cost", *cells]
    assert block.rows[2] == ["ips", *ips]


# -- the NVML note -----------------------------------------------------------------------


class _NoDriver:
    """pynvml where nvmlInit fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def nvmlInit(self) -> None:
        raise self.error


@pytest.mark.parametrize("error", [pynvml.NVMLError_LibraryNotFound(),
                                   pynvml.NVMLError_DriverNotLoaded(),
                                   pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)])
def test_no_nvml_note_without_an_nvidia_driver(error: Exception) -> None:
    notes: list[str] = []
    s = DeviceSampler(notes, env={}, nvml=_NoDriver(error))
    assert not s.has_nvml
    assert notes == []


@pytest.mark.parametrize("error", [pynvml.NVMLError_NoPermission(), pynvml.NVMLError_Unknown(),
                                   pynvml.NVMLError_LibRmVersionMismatch()])
def test_nvml_note_where_a_driver_is_there_but_unreadable(error: Exception) -> None:
    notes: list[str] = []
    DeviceSampler(notes, env={}, nvml=_NoDriver(error))
    assert notes == [f"GPU state off: NVML unavailable ({error})"]


@pytest.mark.parametrize("present", [False, True])
def test_no_nvml_note_where_the_machine_has_no_nvidia_driver(
    present: bool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever NVML says, a Linux machine without /proc/driver/nvidia has no driver.
    driver = tmp_path / "nvidia"
    if present:
        driver.mkdir()
    monkeypatch.setattr(device, "DRIVER_PATHS", (str(driver),))
    monkeypatch.setattr(device.sys, "platform", "linux")

    def broken() -> None:
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlInit", broken)
    notes: list[str] = []
    DeviceSampler(notes, env={})
    assert bool(notes) is present


# -- the report in a real terminal, 80 and 120 columns ------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "scripts" / "example_train.py"
#: The terminal's own size, not one the test process was given in COLUMNS
#: (which perfrun, as rich and Python's shutil, would take instead).
SIZED = "env -u COLUMNS -u LINES"


def _bullet_items(screen: list[str], title: str) -> list[list[str]]:
    """The items of the bullet block under `title`: each its lines."""
    if title not in screen:
        return []
    items: list[list[str]] = []
    for line in screen[screen.index(title) + 1:]:
        if not line.strip():
            break
        if line.startswith("  - "):
            items.append([line])
        else:
            assert items and line.startswith("    ") and line[4] != " ", (title, line)
            items[-1].append(line)
    return items


def _check_screen(text: str, width: int) -> list[str]:
    """What must hold at any width: no line the terminal had to wrap (tmux
    gives a wrapped line back whole), sentences within the prose width,
    bullets with hanging indents, `--warmup N` on one line, and one time
    unit in the "Outside the steps" block."""
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    items = [item for title in ("Advice", "Outside the steps (whole run)", "Notes",
                                "Measurement disturbed: these figures may not be the script's own")
             for item in _bullet_items(lines, title)]
    assert any(len(item) > 1 for item in items), text  # some item needed more than a line
    assert all(len(line) <= min(width, PROSE_WIDTH) for item in items for line in item)
    steps = next(i for i, line in enumerate(lines) if line.startswith("Steps: "))
    assert "--warmup N" in lines[steps] + lines[steps + 1]
    outside = [" ".join(item) for item in _bullet_items(lines, "Outside the steps (whole run)")]
    units = {re.search(r", [\d.]+ (s|ms|us) ", item).group(1) for item in outside}  # type: ignore
    assert len(units) == 1, outside
    return lines


@pytest.mark.slow
@needs_tmux
def test_the_report_reads_at_80_and_120_columns_in_a_terminal(tmp_path: Path) -> None:
    """perfrun's own output in a real terminal (tmux) of 80 columns, then
    `perfrun report` of that run in one of 120: the run folder is a line of
    its own, no line is cut mid-path or mid-option, bullets keep their
    hanging indents, and the tables fit (a CPU run's Operator Summary has
    no GPU or MFLOPs column)."""
    # A log folder whose runs' paths fit 80 columns (pytest's own temporary
    # paths do not), and make the notice's one line wider than 80; removed
    # however the test ends.
    short = Path(tempfile.mkdtemp(prefix="perfrun-layout-"))
    try:
        log = short / "log"
        root = Path(__file__).resolve().parents[1]
        run = (f"cd {tmp_path} && PYTHONPATH={root} OMP_NUM_THREADS=1 {sys.executable} -m perfrun "
               f"--log-dir {log} --scheduler 3 6 {EXAMPLE}; echo PERFRUN-EXIT=$?; sleep 600")
        term = Terminal(tmp_path, width=80, height=50)
        try:
            term.start(f"{SIZED} sh -c '{run}'")
            text = term.wait_for(lambda s: "PERFRUN-EXIT=" in s, timeout=180, history="-")
        finally:
            term.close()
        assert "PERFRUN-EXIT=0" in text, text
        lines = _check_screen(text, 80)
        # The start notice: the run folder whole on its own line, to copy.
        head = next(i for i, line in enumerate(lines) if line.startswith("perfrun: profiling "))
        assert lines[head].endswith("; results in"), lines[head]
        run_dir = lines[head + 1].strip()
        assert lines[head + 1] == f"  {run_dir}" and Path(run_dir).is_dir()
        assert len(f"perfrun: profiling {EXAMPLE}; results in {run_dir}") > 80  # it would wrap
        assert any(run_dir in line for line in lines[-8:])  # whole where it says it saved them
        # The tables: Model Summary figures in columns of their own; a CPU run's
        # Operator Summary with neither GPU time nor MFLOPs.
        model = next(line for line in lines if line.startswith("Name ") and "CPU Total" in line)
        assert model.split()[2:8] == ["CPU", "Total", "Avg", "Max", "Min", "Ratio(%)"]
        operator = lines[lines.index("Operator Summary"):]
        operator = operator[:operator.index("")]
        assert not [line for line in operator if "GPU" in line or "MFLOPs" in line], operator

        term = Terminal(tmp_path, width=120, height=50)
        try:
            term.start(f"{SIZED} sh -c 'cd {tmp_path} && PYTHONPATH={root} {sys.executable} -m "
                       f"perfrun report {run_dir}; echo PERFRUN-EXIT=$?; sleep 600'")
            wide = term.wait_for(lambda s: "PERFRUN-EXIT=" in s, timeout=120, history="-")
        finally:
            term.close()
        assert "PERFRUN-EXIT=0" in wide, wide
        lines = _check_screen(wide, 120)
        notes = [line for item in _bullet_items(lines, "Notes") for line in item]
        assert max(len(line) for line in notes) > 80, wide  # laid out for the wider terminal
    finally:
        shutil.rmtree(short, ignore_errors=True)


# -- a long run at 80 columns ---------------------------------------------------------------

MIB = 1 << 20
US = ("us", 1e6)


def test_a_column_of_times_takes_a_coarser_unit_past_five_digits() -> None:
    """A Total over 10^5 steps of 2 ms is 203691393.82 us: the column takes
    the unit in which it has at most five integer digits, and says so; the
    per-step columns keep the table's."""
    assert column_unit([1021.25e-6, 334.64e-6], US) == US
    assert column_unit([203.69], US) == ("s", 1.0)
    assert column_unit([0.93263, 0.1], US) == ("ms", 1e3)  # the slowest of 10^5 steps
    assert column_unit([0.099999], US) == US  # 99999 us: five digits
    assert column_unit([None, float("nan")], US) == US
    assert column_unit([5e6], ("ms", 1e3)) == ("s", 1.0)  # there is none coarser
    assert headed("Max", ("ms", 1e3), US) == "Max (ms)" and headed("Avg", US, US) == "Avg"


def test_sizes_in_one_unit_a_column_and_flops_in_the_prefix_that_suits_them() -> None:
    unit = bytes_unit([309.5 * MIB, 12.34 * MIB, None])
    assert unit[0] == "MiB"
    assert [fmt_size(v, unit) for v in (309.5 * MIB, 12.34 * MIB, None)] == [
        "309.5", "12.34", "-"]
    gib = bytes_unit([12 << 30, 300 * MIB])
    assert gib[0] == "GiB" and fmt_size(300 * MIB, gib) == "0.2930"
    assert bytes_unit([512]) == ("B", 1) and fmt_size(512, ("B", 1)) == "512"
    # A tiny model's rates on a CPU: MFLOP/s, not 0.00523 GFLOP/s or 6.7e-05.
    assert flop_unit([5.23e6, 1.31e7, None], "G") == ("M", 1e6)
    assert flop_unit([6e10], "T") == ("G", 1e9) and flop_unit([3e14], "T") == ("T", 1e12)
    assert flop_unit([3e14], "G") == ("G", 1e9) and flop_unit([0.0], "G") == ("", 1.0)
    assert [fmt_flops(n) for n in (3580, 2.96e7, 1.21e12)] == [
        "3.58 kFLOP", "29.6 MFLOP", "1.21 TFLOP"]
    assert [_rate_cell(v, 1.0) for v in (6.7e-05, 0.000151, 13.07, None)] == [
        "0.0000670", "0.000151", "13.07", "-"]


def test_large_ratios_and_counts_read_in_a_sentence() -> None:
    assert [times(r) for r in (3.24, 86.04, 262.6, 2950.7)] == [
        "3.2x", "86.0x", "263x", "2,951x"]
    assert plural(99_984, "step") == "99,984 steps" and plural(1, "step") == "1 step"


def _long_model(gpu: bool) -> ModelSummary:
    """The Model Summary of 10^5 steps of about 2 ms, one of them 933 ms."""
    def stats(share: float) -> Stats:
        return Stats(n=99_984, total=203.69 * share, avg=2.03724e-3 * share,
                     max=0.93263 * share, min=3.678e-4 * share, median=6.85e-4 * share)

    rows = [ModelRow("ProfileStep", 99_984, stats(1.0), 1.0,
                     stats(0.9) if gpu else None, 0.9 if gpu else None)]
    for name, share in (("Dataloader", 0.0), ("Forward", 0.17), ("Backward", 0.36),
                        ("Optimization", 0.31), ("Others", 0.16)):
        rows.append(ModelRow(name, 199_968 if name == "Optimization" else 99_984,
                             stats(share), share, stats(share) if gpu else None,
                             share if gpu else None))
    return ModelSummary(steps=99_984, rows=rows, has_gpu=gpu)


@pytest.mark.parametrize("gpu", [False, True])
def test_a_long_runs_model_summary_fits_80_columns(gpu: bool) -> None:
    block = model_block(_long_model(gpu))
    headers = [c.header for c in block.columns]
    assert headers[2:6] == ["CPU Total (s)", "Avg", "Max (ms)", "Min"]
    assert block.rows[0][2:6] == ["203.69", "2037.24", "932.63", "367.80"]
    assert block.info[0].startswith("time unit: us, or as a column says")
    text = _render([block], 80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert not re.search(r"\d{6,}\.\d", text), text  # no figure of six integer digits
    if not gpu:
        assert len(layout(block, 80)) == 1  # one table: nothing stacked


def test_sequential_children_are_named_with_their_type() -> None:
    assert module_label({"name": "0", "type": "Linear"}) == "0 (Linear)"
    assert module_label({"name": "net.layers.11", "type": "Block"}) == "net.layers.11 (Block)"
    assert module_label({"name": "net.attn", "type": "Attention"}) == "net.attn"
    assert module_label({"name": "2"}) == "2"  # a file from before types were recorded
    summary = {"steps": 10, "modules": {"recorded": True, "groups": [], "modules": [
        {"name": "Sequential", "parent": "", "calls": 10, "type": "Sequential",
         "total": 0.3, "forward": 0.1, "backward": 0.2, "share": 0.66},
        *({"name": str(i), "parent": "Sequential", "calls": 10, "type": kind,
           "total": 0.1 / (i + 1), "forward": 0.05 / (i + 1), "backward": 0.05 / (i + 1),
           "share": 0.2 / (i + 1)} for i, kind in enumerate(("Linear", "ReLU", "Linear"))),
    ]}}
    report = WindowReport(window=(100, 110), ranks=[RankWindow(0, summary)])
    [module] = [b for b in window_blocks(report, {"time_unit": "ms"}, lambda _key: True)
                if isinstance(b, TableBlock) and b.key == "module"]
    assert [row[0] for row in module.rows] == [
        "Sequential", "  0 (Linear)", "  1 (ReLU)", "  2 (Linear)"]


def test_the_memory_summary_of_a_rank_and_its_workers_is_one_table_in_80_columns() -> None:
    """The rank, its DataLoader workers under it (by what they are and
    their pid), sizes in one unit: one table at 80 columns, where the
    labels `rank 0 DataLoader 0 worker (pid 123456) (private)` and cells of
    `315.3 MiB` made it 112 wide (two tables at 80)."""
    steps = ([k * 0.01 for k in range(5000)], 50.0)
    flat = [[10 * s, 315 * MIB] for s in range(0, 5000, 50)]
    growing = [[10 * s, int(40 * MIB + s * 0.15 * MIB)] for s in range(0, 5000, 50)]
    section = {"limit": 16 << 30,
               "process": {"name": "main", "measure": "rss", "peak": 316 * MIB, "points": flat},
               "children": {str(pid): {"name": "child process", "measure": "uss", "peak": 0,
                                       "points": growing} for pid in (123456, 123457)}}
    workers = {123456: "DataLoader 0 worker", 123457: "DataLoader 0 worker"}
    summary = memory_summary([(0, section, steps)], 3, workers)
    assert summary is not None
    block = memory_block(summary)
    assert [row[0] for row in block.rows] == [
        "rank 0", "  DataLoader 0 worker (pid 123456)", "  DataLoader 0 worker (pid 123457)"]
    assert block.info[0].startswith("size unit: MiB;") and block.rows[0][2:5] == [
        "315.0", "316.0", "315.0"]
    assert len(layout(block, 80)) == 1
    text = _render([block], 80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    # Beside a creep's `+150.0 MiB (R² 1.00)`, a name may be cut: between
    # its words, its pid, the tail, kept.
    assert re.search(r"\n  DataLoader (0 )?… \(pid 123456\) ", text), text


def test_a_name_of_words_is_cut_between_them() -> None:
    assert middle_words("DataLoader 0 worker (pid 123456)", 28) == "DataLoader 0 … (pid 123456)"
    assert middle_words("DataLoader 0 worker (pid 123456)", 40) == (
        "DataLoader 0 worker (pid 123456)")
    # An operator's name, one cut already, or words too long to leave the
    # room used: cut in the middle of the text, as before.
    name = "autograd::engine::evaluate_function: AddmmBackward0"
    assert middle_words(name, 28) == middle(name, 28)
    assert middle_words(middle(name, 40), 28) == middle(name, 28)
    assert middle_words("Synchronisations (.item(), .cpu(), synchronize)", 30) == middle(
        "Synchronisations (.item(), .cpu(), synchronize)", 30)


@pytest.mark.slow
def test_a_long_runs_report_fits_80_columns_in_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report of a run of 10^5 steps of about a millisecond (one of
    them a second), a tiny model's FLOP/s and a DataLoader worker beside
    the rank, as `perfrun report RUN | less` prints it: every line within
    80 columns, its notes laid out with hanging indents, no figure of eight
    digits, no exponent, and the slowest step a round number of medians.
    The short report of a run that never imported torch too."""
    monkeypatch.delenv("COLUMNS", raising=False)
    n = 100_000
    rng = np.random.default_rng(44)
    table = np.full((n, len(STEP_COLUMNS)), np.nan)
    phases = {"forward": rng.uniform(60e-6, 400e-6, n), "backward": rng.uniform(120e-6, 800e-6, n),
              "optimization": rng.uniform(90e-6, 700e-6, n)}
    phases["backward"][n // 2] = 0.9  # a step a thousand times the median
    others = np.full(n, 50e-6)
    step = sum(phases.values()) + others
    end = 1.0 + np.cumsum(step)
    table[:, COL["start"]], table[:, COL["end"]] = end - step, end
    table[:, COL["dataloader"]] = 0.0
    table[:, COL["excluded"]] = 0.0
    for name, times_ in phases.items():
        table[:, COL[name]] = times_
    for name in ("dataloader_calls", "forward_calls", "backward_calls"):
        table[:, COL[name]] = 0 if name == "dataloader_calls" else 1
    table[:, COL["optimization_calls"]] = 2
    data = make_rank([], command="python train.py --epochs 1000").data
    data["flops"] = {"counted": True, "step": 1, "reason": None, "forward": 1536,
                     "backward": 2048, "optimizer": 0,
                     "calls": {"forward": 1, "backward": 1, "optimizer": 1},
                     "ops": {"aten.mm": 2048, "aten.addmm": 1536}, "dtype": "float32",
                     "autocast": False, "tf32": None, "device": "cpu", "device_name": None,
                     "seconds": 0.11, "notes": []}
    at = [int(t * 1000) for t in end[:: n // 100]]
    data["memory"] = {
        "limit": 24 << 30, "children": {
            "123456": {"name": "DataLoader 0 worker", "measure": "uss", "peak": 0,
                       "points": [[t, int(40 * MIB + k * 2 * MIB)] for k, t in enumerate(at)]}},
        "process": {"name": "main", "measure": "rss", "peak": 316 * MIB,
                    "points": [[t, 315 * MIB] for t in at]}}
    rank = RankResult("/runs/r/rank0.json", data, table=table)
    report = build_report(make_run([rank], meta={"command": ["perfrun", "train.py"]}))
    stream = io.StringIO()
    render_table(report, make_console(stream))
    text = stream.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    for title in ("Perf Summary", "Model Summary", "Memory Summary", "Advice"):
        assert title in lines, title
    assert "e-0" not in text and not re.search(r"\d{6,}\.\d", text), text
    assert "Steps: 99,995 counted of 100,000 recorded" in text
    assert re.search(r"slowest step \S+ \S+, [\d,]+x the median", flat(text)), text
    assert "Achieved MFLOP/s" in flat(text)
    # Each note's lines under its first: a bullet's continuation indented.
    for k, line in enumerate(lines[1:], 1):
        if lines[k - 1].startswith("  - ") and line and not line.startswith("  - "):
            assert line.startswith("    "), (lines[k - 1], line)

    run = make_run([], run_dir="/runs/r", meta={"command": ["perfrun", "notorch.py"]})
    commands._print_no_torch(run)
    short = capsys.readouterr().out.splitlines()
    assert short[:2] == ["Command: perfrun notorch.py", "Results: /runs/r"]
    assert max(len(line) for line in short) <= 80, short
    notes = short[short.index("Notes") + 1:]
    assert notes[0].startswith("  - the process perfrun started") and len(notes) > 2
    assert all(line.startswith("    ") for line in notes[1:] if line)
