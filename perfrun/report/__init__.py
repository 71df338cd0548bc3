"""Renderers: one module per output format, all fed the same Report (or
Comparison), and `render` / `render_comparison`, the one place a format's
name picks its renderer.

A renderer only lays out what the Report holds: none reads the run again.
The formats each command offers are declared once, in settings.FORMATS.
"""

from __future__ import annotations

from typing import IO, Callable, Optional

from perfrun.analysis.compare import Comparison
from perfrun.analysis.report import Report
from perfrun.analysis.window import TraceAnalysis
from perfrun.report.comparison import comparison_blocks, render_junit
from perfrun.report.content import analysis_blocks
from perfrun.report.html import render_comparison_html, render_html
from perfrun.report.jsonout import render_analysis_json, render_comparison_json, render_json
from perfrun.report.markdown import render_markdown, render_markdown_blocks
from perfrun.report.table import make_console, render_blocks, render_table

#: How each format writes a run's report: (report, stream, width, base_dir).
_REPORT: dict[str, Callable[[Report, IO[str], Optional[int], Optional[str]], None]] = {
    "table": lambda r, s, width, _base: render_table(r, make_console(s, width)),
    "json": lambda r, s, _width, _base: s.write(render_json(r) + "\n"),
    "markdown": lambda r, s, _width, _base: s.write(render_markdown(r)),
    "html": lambda r, s, _width, base: s.write(render_html(r, base)),
}
#: How each format writes a comparison.
_COMPARISON: dict[str, Callable[[Comparison, IO[str]], None]] = {
    "table": lambda c, s: render_blocks(comparison_blocks(c), make_console(s)),
    "json": lambda c, s: s.write(render_comparison_json(c) + "\n"),
    "markdown": lambda c, s: s.write(render_markdown_blocks(comparison_blocks(c))),
    "junit": lambda c, s: s.write(render_junit(c)),
    "html": lambda c, s: s.write(render_comparison_html(c)),
}
#: How each format writes `perfrun analyze`'s tables: (analysis, stream, view).
_ANALYSIS: dict[str, Callable[[TraceAnalysis, IO[str], dict], None]] = {
    "table": lambda a, s, view: render_blocks(analysis_blocks(a, view), make_console(s)),
    "json": lambda a, s, _view: s.write(render_analysis_json(a) + "\n"),
    "markdown": lambda a, s, view: s.write(render_markdown_blocks(analysis_blocks(a, view))),
}
#: The formats a report, a comparison and an analysis can be written in.
FORMATS = tuple(_REPORT)
COMPARISON_FORMATS = tuple(_COMPARISON)
ANALYSIS_FORMATS = tuple(_ANALYSIS)


def render(report: Report, fmt: str, stream: IO[str], width: Optional[int] = None,
           base_dir: Optional[str] = None) -> None:
    """Write `report` to `stream` as `fmt` (one of FORMATS).

    `width` only matters for tables: by default a terminal's own width, or a
    fixed width when `stream` is a pipe or a file. `base_dir` only matters
    for the page: the folder it is written to, for relative links to the
    trace files (None: absolute links).
    """
    renderer = _REPORT.get(fmt)
    if renderer is None:
        raise ValueError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")
    renderer(report, stream, width, base_dir)
    stream.flush()


def render_comparison(comparison: Comparison, fmt: str, stream: IO[str]) -> None:
    """Write `comparison` to `stream` as `fmt` (one of COMPARISON_FORMATS)."""
    renderer = _COMPARISON.get(fmt)
    if renderer is None:
        raise ValueError(f"unknown format {fmt!r}; expected one of "
                         f"{', '.join(COMPARISON_FORMATS)}")
    renderer(comparison, stream)
    stream.flush()


def render_analysis(analysis: TraceAnalysis, fmt: str, stream: IO[str],
                    view: Optional[dict] = None) -> None:
    """Write `perfrun analyze`'s tables to `stream` as `fmt` (one of
    ANALYSIS_FORMATS); `view` as for a report's window tables."""
    renderer = _ANALYSIS.get(fmt)
    if renderer is None:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(ANALYSIS_FORMATS)}")
    renderer(analysis, stream, dict(view or {}))
    stream.flush()


__all__ = [
    "ANALYSIS_FORMATS", "COMPARISON_FORMATS", "FORMATS", "make_console", "render",
    "render_analysis", "render_comparison", "render_json", "render_markdown", "render_table",
]
