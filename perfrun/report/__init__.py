"""Renderers: one module per output format, all fed the same `Report`."""

from __future__ import annotations

from typing import IO, Optional

from perfrun.analysis.summary import Report
from perfrun.report.jsonout import render_json
from perfrun.report.markdown import render_markdown
from perfrun.report.table import make_console, render_table

FORMATS = ("table", "json", "markdown")


def render(report: Report, fmt: str, stream: IO[str], width: Optional[int] = None) -> None:
    """Write `report` to `stream` as `fmt` ("table", "json" or "markdown").

    `width` only matters for tables: by default a terminal's own width, or a
    fixed width when `stream` is a pipe or a file.
    """
    if fmt == "table":
        render_table(report, make_console(stream, width))
    elif fmt == "json":
        stream.write(render_json(report) + "\n")
    elif fmt == "markdown":
        stream.write(render_markdown(report))
    else:
        raise ValueError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")
    stream.flush()


__all__ = ["FORMATS", "make_console", "render", "render_json", "render_markdown", "render_table"]
