"""A comparison (perfrun compare, or a gated run) as blocks, shared by the
terminal table, the Markdown and the page as the run report's are, and as
JUnit XML (report/__init__.py's `render_comparison` picks the format).
JUnit's XML escaping is imported by `render_junit` alone (see there)."""

from __future__ import annotations

from typing import Optional

from perfrun.analysis.compare import Comparison
from perfrun.analysis.gate import Verdict
from perfrun.report.primitives import (
    DASH,
    Block,
    Column,
    LinesBlock,
    TableBlock,
    TitleBlock,
    fmt_sig,
)


def _value(v: Optional[float], unit: str) -> str:
    if v is None:
        return DASH
    if unit == "s":
        return f"{v * 1e3:.3f} ms"
    return fmt_sig(v)  # a throughput: as the Perf Summary prints it


def _change(v: Optional[float]) -> str:
    return DASH if v is None else f"{v * 100:+.1f}%"


def verdict_line(c: Comparison) -> str:
    if c.problem:
        return f"NO MEASUREMENT: {c.problem}"
    if c.gate is None:
        tp = c.throughput_change
        return "no gate (give --max-regression to decide)" + (
            f"; throughput {_change(tp)}" if tp is not None else ""
        )
    g = c.gate
    tp = c.throughput_change
    extra = f"; throughput {_change(tp)}" if tp is not None else ""
    return f"{g.verdict.value.upper()}: {g.reason}{extra}"


def comparison_blocks(c: Comparison) -> list[Block]:
    out: list[Block] = [
        TitleBlock("perfrun compare", [("Baseline", c.base_label), ("Current", c.current_label)])
    ]
    level = "info"
    if c.problem or (c.gate is not None and c.gate.verdict == Verdict.FAIL):
        level = "error"
    elif c.gate is not None and c.gate.verdict == Verdict.INCONCLUSIVE:
        level = "warning"
    out.append(LinesBlock("verdict", "Verdict", [verdict_line(c)], level))
    columns = [Column("Name", "left"), Column("Baseline"), Column("Current"), Column("Change")]
    for group, title in (("perf", "Perf Summary"), ("model", "Model Summary (avg per step)")):
        rows = [
            [
                ("  " if group == "model" and r.name != "ProfileStep" else "") + r.name,
                _value(r.base, r.unit),
                _value(r.current, r.unit),
                _change(r.change),
            ]
            for r in c.rows
            if r.group == group
        ]
        if rows:
            out.append(TableBlock(group, title, [], columns, rows))
    if c.mismatches:
        out.append(LinesBlock("mismatch", "Environments differ", list(c.mismatches), "warning"))
    if c.gate is not None and c.gate.ratio is not None:
        g = c.gate
        out.append(
            LinesBlock(
                "method",
                None,
                [
                    f"Gate: ratio of median step times over {g.current_steps} current and "
                    f"{g.baseline_steps} baseline steady-state steps, 95% interval from a block "
                    f"bootstrap (blocks of {g.block} consecutive steps)."
                ],
                "info",
                False,
            )
        )
    return out


def render_junit(c: Comparison) -> str:
    """One test case per decision, so CI systems show the gate like a test."""
    # Here, not at the top: xml.sax loads urllib and http (20 ms), which
    # every `perfrun report` would pay for a format it does not print.
    from xml.sax.saxutils import escape, quoteattr

    name = "step_time"
    message = verdict_line(c)
    failed = c.problem is not None or (c.gate is not None and c.gate.verdict == Verdict.FAIL)
    skipped = c.gate is not None and c.gate.verdict == Verdict.INCONCLUSIVE
    body = ""
    if failed:
        body = f"<failure message={quoteattr(message)}>{escape(message)}</failure>"
    elif skipped:
        body = f"<skipped message={quoteattr(message)}/>"
    details = "\n".join(
        f"{r.name}: {_value(r.base, r.unit)} -> {_value(r.current, r.unit)} ({_change(r.change)})"
        for r in c.rows
    )
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        f'<testsuites name="perfrun" tests="1" failures="{int(failed)}" '
        f'skipped="{int(skipped)}">\n'
        f'  <testsuite name="perfrun.gate" tests="1" failures="{int(failed)}" '
        f'skipped="{int(skipped)}">\n'
        f'    <testcase classname="perfrun.gate" name="{name}">{body}'
        f"<system-out>{escape(details)}</system-out></testcase>\n"
        "  </testsuite>\n"
        "</testsuites>\n"
    )
