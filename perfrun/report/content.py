"""The Report, top to bottom, as blocks: what every text renderer prints
and the page lays out (primitives.py has the block types)."""

from __future__ import annotations

from typing import Any, Optional

from perfrun.analysis.report import Report
from perfrun.analysis.window import TraceAnalysis
from perfrun.report.memory_blocks import memory_blocks
from perfrun.report.primitives import (
    Block,
    LinesBlock,
    TitleBlock,
    fmt_sig,
    plural,
    time_unit,
)
from perfrun.report.summary_blocks import (
    device_block,
    model_block,
    perf_block,
    pipeline_blocks,
    ranks_block,
    with_flops,
)
from perfrun.report.window_blocks import window_blocks


def _ranks_phrase(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks))


def extras_unit(times: list[float]) -> tuple[str, float]:
    """The unit of the "Outside the steps" block: seconds from 10 s, else
    milliseconds from 1 ms, else microseconds."""
    top = max((t for t in times if t is not None), default=0.0)
    if top >= 10.0:
        return "s", 1.0
    return time_unit(top, coarse="ms")


def advice_block(report: Report) -> Optional[LinesBlock]:
    """Each piece of advice as one item: what was measured, then what to try.
    The numbers it quotes are in the JSON report under `advice[].evidence`;
    advice that rests on no numbers is not printed."""
    lines = [a.text() for a in report.advice if a.evidence]
    return LinesBlock("advice", "Advice", lines) if lines else None


def disturbed_block(report: Report) -> Optional[LinesBlock]:
    """At the top of the report: what disturbed the measurement, each with
    its figures (the JSON report has them under `disturbed[].evidence`)."""
    flags = report.disturbed
    if not flags:
        return None
    return LinesBlock(
        "disturbed",
        "Measurement disturbed: these figures may not be the script's own",
        [f.message for f in flags],
        "warning",
    )


def blocks(report: Report, view: Optional[dict[str, Any]] = None) -> list[Block]:
    """The report, top to bottom, as every text renderer prints it. `view`:
    how the window's tables are shown, when not the report's own (the page
    shows every row and whole names)."""
    out: list[Block] = [TitleBlock("perfrun", report.title.entries())]
    if report.problem:
        out.append(LinesBlock("problem", None, [f"perfrun: {report.problem}"], "error", False))
    disturbed = disturbed_block(report)
    if disturbed is not None:
        out.append(disturbed)
    if report.perf is not None:
        out.append(perf_block(report.perf, report.title.warmup, report.title.window_steps))
    if report.model is not None and report.show("model"):
        out.append(with_flops(model_block(report.model), report.flops))
    if report.pipeline is not None:
        out.extend(pipeline_blocks(report.pipeline))
    if report.ranks is not None and report.show("dist"):
        out.append(ranks_block(report.ranks))
    if report.device is not None and report.show("device"):
        out.append(device_block(report.device, report.title.world_size))
    if report.memory is not None and report.show("device"):
        out.extend(memory_blocks(report.memory, int(report.view.get("row_limit") or 20)))
    if report.window is not None:
        out.extend(window_blocks(report.window, report.view if view is None else view,
                                 report.show))
    advice = advice_block(report)
    if advice is not None:
        out.append(advice)
    if report.extras:
        lines = []
        # One unit for the block, chosen once from its largest time: lines
        # read one under the other compare at a glance only in one unit.
        unit, factor = extras_unit([e.time for e in report.extras])
        for e in report.extras:
            detail = f" ({e.detail})" if e.detail else ""
            time = fmt_sig(e.time, factor=factor)
            lines.append(f"{e.name}: {plural(e.calls, e.unit)}, {time} {unit}{detail}")
        out.append(LinesBlock("extras", "Outside the steps (whole run)", lines))
    if report.problems:
        out.append(LinesBlock("problems", "Ranks with problems", list(report.problems), "warning"))
    if report.faults:
        multi = report.title.world_size > 1
        lines = [
            str(f) + (f" on {_ranks_phrase(f.ranks)}" if multi and f.ranks else "")
            for f in report.faults
        ]
        out.append(
            LinesBlock("faults", "perfrun's own hooks failed (the script was not affected)",
                       lines, "warning")
        )
    if report.notes:
        out.append(LinesBlock("notes", "Notes", list(report.notes)))
    return out


def analysis_blocks(analysis: TraceAnalysis, view: dict[str, Any]) -> list[Block]:
    """`perfrun analyze`, top to bottom: which trace is which rank, the
    window tables, and notes on what could not be read."""
    traces = ", ".join(f"rank {rank}: {path}" for path, rank, _s in analysis.traces)
    items: list[Block] = [
        TitleBlock("perfrun analyze", [("Traces", traces)], code_labels=("Traces",)),
        *window_blocks(analysis.window, view, lambda _key: True),
    ]
    if analysis.notes:
        items.append(LinesBlock("notes", "Notes", list(analysis.notes)))
    return items
