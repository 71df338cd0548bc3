"""The report as GitHub-flavoured Markdown: for pull-request comments and
`$GITHUB_STEP_SUMMARY`. The text depends only on the report's numbers (no
terminal width, no dates), so tests can compare it with stored text."""

from __future__ import annotations

from perfrun.analysis.report import Report
from perfrun.report.content import blocks
from perfrun.report.primitives import Block, LinesBlock, TableBlock, TitleBlock


def _cell(text: str) -> str:
    """A table cell: pipes would end the cell, and leading spaces (the Model
    Summary's indentation) are collapsed by Markdown, so both are escaped."""
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    stripped = text.lstrip(" ")
    return "&nbsp;" * (len(text) - len(stripped)) + stripped


def _code(text: str) -> str:
    """An inline code span that survives backticks inside `text`."""
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _table(block: TableBlock) -> list[str]:
    """Every column in one table: a block's `groups` are for a terminal too
    narrow for it, and a Markdown viewer scrolls a wide table instead."""
    header = "| " + " | ".join(_cell(c.header) for c in block.columns) + " |"
    rule = "| " + " | ".join(":---" if c.align == "left" else "---:" for c in block.columns) + " |"
    lines = [header, rule]
    for index, row in enumerate(block.rows):
        cells = [_cell(c) for c in row]
        if index in block.strong and cells[0]:
            cells[0] = f"**{cells[0]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_markdown(report: Report) -> str:
    return render_markdown_blocks(blocks(report))


def render_markdown_blocks(items: list[Block]) -> str:
    out: list[str] = []
    for block in items:
        if isinstance(block, TitleBlock):
            out.append(f"## {block.heading}")
            out.append("")
            for label, text in block.entries:
                value = _code(text) if label in block.code_labels else text
                out.append(f"- **{label}:** {value}")
        elif isinstance(block, LinesBlock):
            if block.title:
                out.append(f"**{block.title}**")
                out.append("")
            for line in block.lines:
                out.append(f"- {line}" if block.bullets else f"**{line}**")
        else:
            out.append(f"### {block.title}")
            out.append("")
            for info in block.info:
                out.append(info)
                out.append("")
            out.extend(_table(block))
            if block.footer:
                out.append("")
                out.extend(block.footer)
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
