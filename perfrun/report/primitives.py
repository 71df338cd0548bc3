"""The pieces every renderer is made of: numbers formatted once, and the
format-neutral blocks a report is laid out in.

The terminal tables, the Markdown and the page must say the same thing;
deciding what goes in each cell once (content.py, summary_blocks.py,
window_blocks.py, comparison.py) and leaving the renderers only the layout
is what keeps them from drifting apart. Numbers are formatted here, so a
value prints identically in every format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Union

DASH = "-"
ELLIPSIS = "\u2026"


# -- numbers ------------------------------------------------------------------


def time_unit(seconds: Optional[float], *, coarse: str = "s") -> tuple[str, float]:
    """A unit in which `seconds` prints with useful digits.

    Steps of a small inference loop take tens of microseconds: in seconds
    with five decimals they would print as 0.00004, one significant digit.
    """
    units = [("s", 1.0), ("ms", 1e3), ("us", 1e6)]
    start = [u for u, _ in units].index(coarse)
    candidates = units[start:]
    if seconds is None or seconds <= 0:
        return candidates[0]
    for unit, factor in candidates:
        if seconds * factor >= (0.01 if unit == "s" else 1.0):
            return unit, factor
    return candidates[-1]


#: The Perf Summary's unit, for every run. A unit picked from the run's own
#: step times flips between two runs of one script whose steps sit near the
#: boundary (0.98 s and 1.02 s; 9 ms and 11 ms; or one slow step where the
#: max decides), and the two summaries then read as if one were a thousand
#: times slower. With five decimals, milliseconds give at least three
#: significant digits from 10 microseconds a step (a small inference loop)
#: to steps of minutes, so no run needs another unit.
PERF_UNIT = ("ms", 1e3)


def middle(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut in the middle.

    An operator's or kernel's name says what it is at both ends
    (`autograd::engine::evaluate_function: AddmmBackward0`, a kernel's
    template arguments), so the head and the tail are kept; the tail gets the
    odd character, as it is what tells siblings apart. Cutting a cut name
    again keeps the same head and tail, so a renderer may narrow a name the
    blocks already shortened.
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + text[len(text) - tail:]


def fmt_num(value: Optional[float], decimals: int, factor: float = 1.0) -> str:
    if value is None:
        return DASH
    return f"{value * factor:.{decimals}f}"


#: Significant figures of a figure that varies from run to run (a step
#: time, a throughput): two runs of one script differ in the third digit
#: already, so a fourth is the most that means anything.
SIGNIFICANT = 4


def fmt_sig(value: Optional[float], digits: int = SIGNIFICANT, factor: float = 1.0) -> str:
    """`value * factor` to `digits` significant figures, in plain notation:
    0.2843, 1.344, 744.3, 47633 (a whole number keeps its integer digits;
    an exponent would be harder to read against the row above it)."""
    if value is None or not math.isfinite(value):
        return DASH
    scaled = value * factor
    if scaled == 0:
        return f"{0.0:.{digits - 1}f}"
    exponent = math.floor(math.log10(abs(scaled)))
    decimals = max(0, digits - 1 - exponent)
    text = f"{scaled:.{decimals}f}"
    # 9.9996 rounds up to 10.000: one decimal fewer keeps `digits` figures.
    if decimals and abs(float(text)) >= 10.0 ** (exponent + 1):
        text = f"{scaled:.{decimals - 1}f}"
    return text


def fmt_percent(value: Optional[float], decimals: int = 1) -> str:
    return DASH if value is None else f"{value:.{decimals}f}"


def fmt_bytes(value: Optional[int]) -> str:
    if value is None:
        return DASH
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024.0:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024.0
    return f"{size:.1f} TiB"


def short_hosts(names: list[str]) -> dict[str, str]:
    """Host names without their domain (`node-3.cluster.local` -> `node-3`),
    unless that would make two hosts look the same: a full name would make
    the multi-rank table too wide for a terminal."""
    short = {n: n.split(".", 1)[0] or n for n in names}
    if len(set(short.values())) < len(set(names)):
        return {n: n for n in names}
    return short


def plural(n: int, word: str) -> str:
    if n == 1:
        return f"{n} {word}"
    return f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


# -- blocks --------------------------------------------------------------------


@dataclass
class Column:
    header: str
    align: str = "right"


@dataclass
class TableBlock:
    """A titled table. `strong` rows are printed bold in a terminal;
    `breaks` are row indices that start a new section (a rule above them).
    `groups`, when set, are column index lists a too-narrow terminal may
    print as separate tables, each after the first `key_columns` columns."""

    key: str
    title: str
    info: list[str]
    columns: list[Column]
    rows: list[list[str]]
    footer: list[str] = field(default_factory=list)
    strong: set[int] = field(default_factory=set)
    breaks: set[int] = field(default_factory=set)
    key_columns: int = 1
    groups: Optional[list[list[int]]] = None


@dataclass
class LinesBlock:
    """Sentences: the title, notes, problems. `level` is "info", "warning"
    or "error" and only changes colour in a terminal."""

    key: str
    title: Optional[str]
    lines: list[str]
    level: str = "info"
    bullets: bool = True


@dataclass
class TitleBlock:
    heading: str
    entries: list[tuple[str, str]]
    code_labels: tuple[str, ...] = ("Command", "Results")


Block = Union[TitleBlock, LinesBlock, TableBlock]
