"""perfrun's sentences laid out in a width: an 80-column terminal, or a CI
log read in a browser.

Why not `textwrap` alone: a sentence of perfrun's holds things a reader
copies or reads as one, and a line break inside one makes it wrong to copy
or hard to read: a path, a suggested command (`perfrun train.py --
--scheduler 100 110`), an option with its value (`--warmup N`), a call to
paste (`DataLoader(dataset, batch_size=None)`), a number with its unit
(`99.4 us`). So the words are first joined into such units and lines break
only between units. A unit longer than a line of its own breaks between its
words; a single word (a path) is never cut: the line runs long instead, as
a cut path could not be copied.

Continuation lines take a hanging indent, so an advice item of six lines
still reads as one item under its bullet.

Standard library only: the launcher and the command layer use it before
the script runs.
"""

from __future__ import annotations

import os
import re
from typing import IO, Optional

#: The widest a sentence is laid out, on a terminal or in a pipe: lines of
#: prose longer than this are hard to follow back to their start, and a CI
#: log viewer shows about this much. Tables may be wider (report/table.py).
PROSE_WIDTH = 100

#: The width of what goes to no terminal (a pipe, a file, a CI log): an
#: 80-column terminal's, where such a log is read again (`less`, `cat`, a
#: CI page over ssh), and the same on every machine. `COLUMNS`, where set,
#: wins, as it does on a terminal.
PIPE_WIDTH = 80

#: Words that start a command line when an argument follows them.
_COMMANDS = {"perfrun", "python", "python3", "torchrun", "pip", "nsys"}
#: perfrun's subcommands: the one lower-case word a command may take.
_SUBCOMMANDS = {"run", "report", "compare", "watch", "analyze", "combine", "status"}
#: Units a number is never parted from.
_UNITS = {
    "ns", "us", "µs", "ms", "s", "min", "h", "B", "KB", "MB", "GB", "KiB", "MiB", "GiB", "TiB",
    "%", "GFLOP", "TFLOP", "GFLOP/s", "TFLOP/s", "MHz", "W", "cores", "steps", "x",
}
_NUMBER = re.compile(r"^[~±+-]?\(?[\d,]*\.?\d+(e[+-]?\d+)?$")
_OPTION = re.compile(r"^--?[A-Za-z][\w-]*(=\S*)?$")
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")
_VALUE = re.compile(r"^[+-]?[\d.]+%?$")
_CALL = re.compile(r"[A-Za-z_][\w.]*\(")
_TRAILING = ".,;:)"


def _bare(word: str) -> str:
    """`word` without the punctuation a sentence puts after it."""
    return word.rstrip(_TRAILING)


def _argument(word: str) -> bool:
    """Whether `word` reads as a command-line argument: an option, a path or
    file, a placeholder, a number."""
    bare = _bare(word)
    return bool(
        bare.startswith("-") or "/" in bare or "." in bare.strip(".")
        or _PLACEHOLDER.match(bare) or _VALUE.match(bare)
    )


def _ends_clause(word: str) -> bool:
    return word[-1:] in ",;)" or (word.endswith(":") and not word.endswith("::"))


def _span(words: list[str], i: int) -> int:
    """The end (exclusive) of the unit that starts at words[i]."""
    word = words[i]
    n = len(words)
    # A code span in backticks.
    if word.count("`") % 2:
        for j in range(i + 1, n):
            if "`" in words[j]:
                return j + 1
        return i + 1
    # A call: parentheses opened right after a name, up to where they close.
    if _CALL.search(word):
        depth = 0
        for j in range(i, n):
            depth += words[j].count("(") - words[j].count(")")
            if depth <= 0:
                return j + 1
        return i + 1
    # A command line: the program, then its arguments.
    if word in _COMMANDS and i + 1 < n and (_argument(words[i + 1])
                                            or words[i + 1] in _SUBCOMMANDS):
        j = i + 1
        if words[j] in _SUBCOMMANDS:
            j += 1
            if j < n and not _ends_clause(words[j - 1]):
                j += 1  # what the subcommand reads: a folder, a file
        while j < n and _argument(words[j]) and not _ends_clause(words[j - 1]):
            j += 1
        return j
    # An option and its value(s): `--scheduler START END`, `--warmup N`.
    if _OPTION.match(word.lstrip("(")) and "=" not in word:
        j = i + 1
        while (j < n and not _ends_clause(words[j - 1])
               and (_PLACEHOLDER.match(_bare(words[j])) or _VALUE.match(_bare(words[j])))):
            j += 1
        return j
    # A number and its unit.
    if _NUMBER.match(word) and i + 1 < n and _bare(words[i + 1]) in _UNITS:
        return i + 2
    return i + 1


#: What parts the fields of a line of facts: `time unit: us   per batch over
#: 175 fetches   a batch: 2 tensors, 16.5 KiB`.
_FIELDS = re.compile(r"(\s{3,})")


def units(text: str) -> list[tuple[str, str]]:
    """`text` as (space before, unit) pairs: the pieces a line may break
    between. The spaces inside a unit are kept as written. A line of
    fields, set apart by three spaces or more, is one unit a field, so a
    field is broken only where it is longer than a line of its own (and
    `warm-up steps excluded: 5` is not parted from its 5)."""
    fields = _FIELDS.split(text)
    if len(fields) > 1:
        spaces = [""] + fields[1::2]
        return [(space, field) for space, field in zip(spaces, fields[::2]) if field]
    pieces = re.findall(r"(\s*)(\S+)", text)
    words = [w for _, w in pieces]
    out = []
    i = 0
    while i < len(words):
        j = _span(words, i)
        unit = words[i] + "".join(space + word for space, word in pieces[i + 1 : j])
        out.append((pieces[i][0], unit))
        i = j
    return out


def wrap(text: str, width: Optional[int], first: str = "", rest: str = "") -> list[str]:
    """`text` in lines of at most `width` characters where it can be: the
    first line starts with `first` (a bullet, say), the others with `rest`
    (its hanging indent). `width` None: one line."""
    if not width or width <= 0:
        return [first + text.strip()]
    pending = units(text.strip())
    pending.reverse()  # popped from the end, first unit first
    lines: list[str] = []
    line = first
    empty = True  # nothing but the prefix on `line` yet
    while pending:
        space, unit = pending.pop()
        fresh = width - len(rest if lines or not empty else first)
        if len(unit) > fresh and " " in unit:
            # Too long for a line of its own: broken into its units (a
            # field of a line of facts) or else between its words, from
            # where the line has got to.
            words = units(unit)
            if len(words) < 2:
                words = re.findall(r"(\s*)(\S+)", unit)
            words[0] = (space, words[0][1])
            pending.extend(reversed(words))
            continue
        if empty:
            line += unit
            empty = False
        elif len(line) + len(space) + len(unit) <= width:
            line += space + unit
        else:
            lines.append(line)
            line, empty = rest, True
            pending.append(("", unit))
    if not empty or not lines:
        lines.append(line)
    return [x.rstrip() for x in lines]


def terminal_width(stream: IO[str]) -> Optional[int]:
    """The width to lay sentences out in on `stream`: its terminal's (at
    most PROSE_WIDTH), or None where it is no terminal. `COLUMNS`, where
    set, wins, as it does for the tables (rich) and Python's shutil."""
    try:
        if not stream.isatty():
            return None
        columns = _columns() or os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
    return min(columns, PROSE_WIDTH) if columns > 0 else None


def _columns() -> Optional[int]:
    given = os.environ.get("COLUMNS", "")
    return int(given) if given.isdigit() and int(given) > 0 else None


def pipe_width() -> int:
    """The width of output that goes to no terminal: `COLUMNS` where set,
    else PIPE_WIDTH."""
    return _columns() or PIPE_WIDTH


def stream_width(stream: IO[str]) -> int:
    """The width to lay sentences out in on `stream`, terminal or not: its
    terminal's (at most PROSE_WIDTH), or the pipe's (pipe_width)."""
    return terminal_width(stream) or min(pipe_width(), PROSE_WIDTH)


def for_stream(text: str, stream: IO[str], rest: str = "  ") -> str:
    """`text` as a message on `stream` (stderr): laid out in the terminal's
    width where `stream` is one; one line anywhere else, a log line that
    grep finds whole."""
    return "\n".join(wrap(text, terminal_width(stream), "", rest))


def note_for_stream(text: str, stream: IO[str], rest: str = "  ") -> str:
    """A note (`perfrun: note: ...`) on `stream`: laid out in the terminal's
    width, and in a pipe or a log at the pipe's (stream_width), with a
    hanging indent. An error is one line for the script that greps for it;
    a note of three sentences is read, and on one line of 200 characters
    it is not."""
    return "\n".join(wrap(text, stream_width(stream), "", rest))
