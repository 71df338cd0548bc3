"""Terminal tables (rich), in the shapes Paddle's profiler prints.

The same output goes to terminals and to CI logs: when the stream is not a
terminal there are no colours and the width is fixed, so a log file reads the
same on every machine and a test can compare it.
"""

from __future__ import annotations

import sys
from typing import IO, Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfrun.analysis.summary import Report
from perfrun.report.common import Block, LinesBlock, TableBlock, TitleBlock, blocks

#: Width used when the output is not a terminal (a pipe, a file, CI).
PIPE_WIDTH = 120

_LEVEL_STYLE = {"info": "", "warning": "yellow", "error": "bold red"}

# rich's SIMPLE_HEAD, plus a rule between sections (the multi-rank table's
# min / median / max rows), which SIMPLE_HEAD would draw as a blank line.
_BOX = box.Box(
    "    \n"
    "    \n"
    " ── \n"
    "    \n"
    " ── \n"
    " ── \n"
    "    \n"
    "    \n"
)


def make_console(stream: Optional[IO[str]] = None, width: Optional[int] = None) -> Console:
    """A console for `stream` that never emits escape codes into a pipe.

    Rich already drops colours for non-terminals, but it takes the width from
    `COLUMNS` or falls back to 80, which wraps the Model Summary; a fixed
    width keeps logs stable and readable.
    """
    if stream is None:
        stream = sys.stdout
    isatty = getattr(stream, "isatty", None)
    is_tty = bool(isatty is not None and isatty())
    return Console(
        file=stream,
        width=width if width is not None else (None if is_tty else PIPE_WIDTH),
        color_system="auto" if is_tty else None,
        force_terminal=is_tty,
        no_color=not is_tty,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=False,
    )


def _widest(block: TableBlock, i: int) -> int:
    """The widest cell of column `i`, or the header's longest word."""
    return max(
        [len(row[i]) for row in block.rows if i < len(row)]
        + [len(word) for word in block.columns[i].header.split()]
    )


def _table(block: TableBlock, columns: list[int], width: Optional[int] = None) -> Table:
    """`width`: the console's; where the table is wider, the name column
    gives way, never a number (a cut number is a wrong number; a cut name
    is still a name)."""
    table = Table(box=_BOX, show_edge=False, pad_edge=False, expand=False, collapse_padding=True)
    name_room = None
    if width is not None and block.key_columns == 1 and columns and columns[0] == 0:
        others = sum(_widest(block, i) + 2 for i in columns[1:])
        name_room = max(20, width - others)
    for i in columns:
        col = block.columns[i]
        table.add_column(
            Text(col.header, style="bold"),
            justify="left" if col.align == "left" else "right",
            no_wrap=i < block.key_columns,
            max_width=name_room if i == 0 else None,
            overflow="ellipsis" if i == 0 else "fold",
        )
    for index, row in enumerate(block.rows):
        style = "bold" if index in block.strong else None
        if index in block.breaks and index > 0:
            table.add_section()
        table.add_row(*(Text(row[i]) for i in columns), style=style)
    return table


def _tables(block: TableBlock, console: Console) -> list[Table]:
    """One table, or, when it does not fit the console, one per column group
    (the Model Summary's CPU and GPU halves), so nothing wraps mid-number."""
    every = list(range(len(block.columns)))
    if block.groups is None:
        return [_table(block, every, console.width)]
    whole = _table(block, every)
    # Measure without the console's limit: rich clamps a measurement to the
    # width it is given, which would make every table appear to fit.
    wide = console.options.update_width(10_000)
    if console.measure(whole, options=wide).maximum <= console.width:
        return [whole]
    key = list(range(block.key_columns))
    return [_table(block, key + group, console.width) for group in block.groups]


def render_table(report: Report, console: Console) -> None:
    render_blocks(blocks(report), console)


def render_blocks(items: list[Block], console: Console) -> None:
    """Lay out format-neutral blocks (any report: a run, a comparison)."""
    for block in items:
        if isinstance(block, TitleBlock):
            for label, text in block.entries:
                line = Text()
                line.append(f"{label}: ", style="bold")
                line.append(text)
                console.print(line)
            console.print()
        elif isinstance(block, LinesBlock):
            style = _LEVEL_STYLE.get(block.level, "")
            if block.title:
                console.print(Text(block.title, style="bold " + style if style else "bold"))
            for line in block.lines:
                prefix = "  - " if block.bullets else ""
                console.print(Text(prefix + line, style=style))
            console.print()
        else:
            console.print(Text(block.title, style="bold"))
            for info in block.info:
                console.print(Text(info, style="dim"))
            for i, table in enumerate(_tables(block, console)):
                if i:
                    console.print()
                console.print(table)
            for line in block.footer:
                console.print(Text(line))
            console.print()
