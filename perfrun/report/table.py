"""Terminal tables (rich), in the shapes Paddle's profiler prints.

The same output goes to terminals and to CI logs: when the stream is not a
terminal there are no colours and the width is fixed (80 columns, or
`COLUMNS`: prose.pipe_width), so a log file reads the same on every machine
and a test can compare it. Sentences (notes, advice, a table's notes) are
laid out by perfrun/prose.py in both, at most PROSE_WIDTH wide with hanging
indents, never broken inside a path, a command or a number with its unit;
the title's lines (Command, Results) stay whole in a pipe.
"""

from __future__ import annotations

import sys
from typing import IO, Optional

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfrun.analysis.report import Report
from perfrun.prose import PROSE_WIDTH, pipe_width, wrap
from perfrun.report.content import blocks
from perfrun.report.primitives import Block, LinesBlock, TableBlock, TitleBlock, middle_words

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

    Rich already drops colours for non-terminals, but it takes the width of
    whatever terminal stdin or stderr is; a width of its own (pipe_width:
    80, or `COLUMNS`) keeps logs stable and readable at 80 columns.
    """
    if stream is None:
        stream = sys.stdout
    isatty = getattr(stream, "isatty", None)
    is_tty = bool(isatty is not None and isatty())
    return Console(
        file=stream,
        width=width if width is not None else (None if is_tty else pipe_width()),
        color_system="auto" if is_tty else None,
        force_terminal=is_tty,
        no_color=not is_tty,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=False,
    )


#: The narrowest a name column is made before columns are stacked instead:
#: narrower, too many operator names read alike (`aten::…ard0`).
MIN_NAME = 24

#: Characters between two columns: the collapsed padding and the divider.
_GAP = 2


def _spans(block: TableBlock, i: int) -> tuple[int, int]:
    """Column `i`'s narrowest width (its widest cell, or the header's longest
    word, as a header may wrap) and its natural one (the header on one line)."""
    cells = [len(row[i]) for row in block.rows if i < len(row)]
    header = block.columns[i].header
    narrow = max(cells + [len(word) for word in header.split()] + [1])
    return narrow, max(narrow, len(header))


def _has_name(block: TableBlock) -> bool:
    """Whether column 0 is a name, the one column that may be cut: numbers
    never are (a cut number is a wrong number; a cut name is still a name)."""
    return bool(block.columns) and block.columns[0].align == "left"


def _indent(block: TableBlock) -> int:
    """The deepest indentation of a name (the Module Summary's tree)."""
    return max((len(row[0]) - len(row[0].lstrip(" ")) for row in block.rows if row), default=0)


def _cut(name: str, width: int) -> str:
    """`name` in `width` characters, cut in the middle of its text (between
    its words, where it is words), its indentation kept whole so the tree
    still reads as one."""
    text = name.lstrip(" ")
    indent = name[: len(name) - len(text)]
    return indent + middle_words(text, max(width - len(indent), 1))


def _widths(block: TableBlock, columns: list[int], width: int) -> Optional[list[int]]:
    """Widths for `columns` in `width` characters, or None where they do not
    fit even with every header wrapped and the names cut to MIN_NAME.

    The name column takes what the others leave it (up to its own width);
    what is then left over unwraps headers, left to right.
    """
    spans = [_spans(block, i) for i in columns]
    room = width - _GAP * (len(columns) - 1)
    if sum(natural for _, natural in spans) <= room:
        return [natural for _, natural in spans]
    out = [narrow for narrow, _ in spans]
    if _has_name(block) and columns[0] == 0:
        name = spans[0][0]
        out[0] = min(name, room - sum(out[1:]))
        # A tree's indentation is no part of the name: MIN_NAME is what is
        # left to read after it.
        if out[0] < min(name, MIN_NAME + _indent(block)):
            return None
    elif sum(out) > room:
        return None
    spare = room - sum(out)
    for k, (_, natural) in enumerate(spans):
        grow = min(spare, natural - out[k])
        if grow > 0:
            out[k] += grow
            spare -= grow
    return out


def layout(block: TableBlock, width: int) -> list[tuple[list[int], list[int]]]:
    """The tables `block` prints as in `width` characters: (columns, widths)
    for each, every table after the first repeating the key columns.

    One table where it fits; otherwise one per column group (the block's
    `groups`, or all the other columns as one group), and a group that is
    still too wide is split where it overflows. A column alone too wide for
    the terminal is printed at its own width: a number is never cut.
    """
    every = list(range(len(block.columns)))
    whole = _widths(block, every, width)
    if whole is not None:
        return [(every, whole)]
    key = every[: block.key_columns]
    groups = block.groups or [every[block.key_columns:]]
    out: list[tuple[list[int], list[int]]] = []
    for group in groups:
        chunk: list[int] = []
        for i in group:
            if chunk and _widths(block, key + chunk + [i], width) is None:
                out.append((key + chunk, _fixed(block, key + chunk, width)))
                chunk = []
            chunk.append(i)
        if chunk:
            out.append((key + chunk, _fixed(block, key + chunk, width)))
    return out


def _fixed(block: TableBlock, columns: list[int], width: int) -> list[int]:
    """`_widths`, or, for a lone column too wide for `width`, every column at
    its narrowest with the name at MIN_NAME: the line overflows rather than
    a number being cut."""
    fitted = _widths(block, columns, width)
    if fitted is not None:
        return fitted
    out = [_spans(block, i)[0] for i in columns]
    if _has_name(block) and columns[0] == 0:
        out[0] = min(out[0], MIN_NAME + _indent(block))
    return out


def _table(block: TableBlock, columns: list[int], widths: list[int]) -> Table:
    table = Table(box=_BOX, show_edge=False, pad_edge=False, expand=False, collapse_padding=True)
    cut = _has_name(block) and columns[0] == 0
    for i, w in zip(columns, widths):
        col = block.columns[i]
        table.add_column(
            Text(col.header, style="bold"),
            justify="left" if col.align == "left" else "right",
            width=w,
            overflow="fold",
        )
    for index, row in enumerate(block.rows):
        style = "bold" if index in block.strong else None
        if index in block.breaks and index > 0:
            table.add_section()
        cells = [row[i] if i < len(row) else "" for i in columns]
        if cut:
            cells[0] = _cut(cells[0], widths[0])
        table.add_row(*(Text(c) for c in cells), style=style)
    return table


def _tables(block: TableBlock, console: Console) -> list[tuple[Table, int]]:
    """One table, or, when it does not fit the console, one per column group
    (the Operator Summary's CPU columns, then its GPU ones), so no number is
    cut and no row wraps; each with the width it takes."""
    return [
        (_table(block, columns, widths), sum(widths) + _GAP * (len(widths) - 1))
        for columns, widths in layout(block, console.width)
    ]


def _prose(console: Console, text: str, style: str = "", first: str = "", rest: str = "  ",
           label: int = 0, whole: bool = False) -> None:
    """A sentence in lines of the prose width (perfrun/prose.py), on a
    terminal and in a pipe alike: each continuation line indented under its
    first, so a bullet of six lines still reads as one item, and no path,
    command, option or number with its unit is broken across lines.
    `label`: characters at the start printed bold (`Results:`); `whole`:
    on one line, however long."""
    width = None if whole else min(console.width, PROSE_WIDTH)
    for k, line in enumerate(wrap(text, width, first, rest)):
        out = Text(line, style=style)
        if k == 0 and label:
            out.stylize("bold", 0, label)
        console.print(out, soft_wrap=True)


def _print(console: Console, table: Table, width: int = 0) -> None:
    """Print a table to a terminal as rich lays it out; anywhere else (a
    pipe, a file, CI) with no line ending in the spaces that pad its cells.

    `width`: what the table takes; on a console narrower than that, the
    line runs past the edge rather than rich squeezing a number.
    """
    wide = max(console.width, width)
    if console.is_terminal:
        console.print(table, width=wide)
        return
    with console.capture() as captured:
        console.print(table, width=wide)
    lines = [line.rstrip() for line in captured.get().splitlines()]
    console.print(Text("\n".join(lines)), soft_wrap=True)


def render_table(report: Report, console: Console) -> None:
    render_blocks(blocks(report), console)


def render_blocks(items: list[Block], console: Console) -> None:
    """Lay out format-neutral blocks (any report: a run, a comparison)."""
    for block in items:
        if isinstance(block, TitleBlock):
            # What the run was and where it is: in a pipe, one line each,
            # as scripts and people grep a log for `Results:`; laid out in
            # a terminal's width, as the other lines (Steps, Window) are
            # everywhere.
            for label, text in block.entries:
                _prose(console, f"{label}: {text}", label=len(label) + 1,
                       whole=not console.is_terminal and label in block.code_labels)
            console.print()
        elif isinstance(block, LinesBlock):
            style = _LEVEL_STYLE.get(block.level, "")
            if block.title:
                _prose(console, block.title, "bold " + style if style else "bold")
            for line in block.lines:
                if block.bullets:
                    _prose(console, line, style, "  - ", "    ")
                else:
                    _prose(console, line, style)
            console.print()
        else:
            _prose(console, block.title, "bold")
            for info in block.info:
                _prose(console, info, "dim")
            for i, (table, width) in enumerate(_tables(block, console)):
                if i:
                    console.print()
                _print(console, table, width)
            for line in block.footer:
                _prose(console, line)
            console.print()
