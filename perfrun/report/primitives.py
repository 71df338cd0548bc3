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
from collections.abc import Iterable
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


#: Time units from the finest, with their factors from seconds.
TIME_UNITS = (("us", 1e6), ("ms", 1e3), ("s", 1.0))

#: The most integer digits a figure of a column takes in the table's unit:
#: 99999.99 reads; the total of 10^5 steps of 2 ms in microseconds,
#: 203691393.82, has to be counted off digit by digit.
MAX_DIGITS = 5


def column_unit(values: Iterable[Optional[float]], unit: tuple[str, float]
                ) -> tuple[str, float]:
    """The unit of one column of times (seconds): the table's `unit`, or,
    where the column's largest figure would take more than MAX_DIGITS
    integer digits in it, the first coarser one in which it does not (a
    Total over 10^5 steps in s beside per-step figures in us). One unit for
    the whole column, so its figures still compare row by row."""
    top = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0.0)
    names = [u for u, _ in TIME_UNITS]
    start = names.index(unit[0]) if unit[0] in names else len(names) - 1
    for name, factor in TIME_UNITS[start:]:
        if top * factor < 10.0 ** MAX_DIGITS:
            return name, factor
    return TIME_UNITS[-1]


def headed(header: str, unit: tuple[str, float], table: tuple[str, float]) -> str:
    """A column's header, with its unit where it is not the table's."""
    return header if unit[0] == table[0] else f"{header} ({unit[0]})"


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


def middle_words(text: str, width: int) -> str:
    """`text` in at most `width` characters, whole words cut from its
    middle where it is words (`DataLoader 0 … (pid 123456)`, where `middle`
    gives `DataLoader 0 …r (pid 123456)`): its first and its last words
    kept, as many of the others as fit. A name of fewer than three words,
    one cut already, or one whose words would leave a third of the room
    empty, is cut by `middle`."""
    if len(text) <= width:
        return text
    words = text.split(" ")
    if len(words) < 3 or ELLIPSIS in text or any(not w for w in words):
        return middle(text, width)
    best = ""
    for head in range(1, len(words) - 1):
        for tail in range(1, len(words) - head):
            cut = " ".join(words[:head] + [ELLIPSIS] + words[len(words) - tail:])
            if len(cut) <= width and len(cut) > len(best):
                best = cut
    return best if 3 * len(best) >= 2 * width else middle(text, width)


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


#: Sizes in binary units, with their factors.
BYTE_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))


def bytes_unit(values: Iterable[Optional[float]]) -> tuple[str, int]:
    """One unit for a column of sizes: the largest in which the column's
    largest size is at least 1 (`MiB` for a rank's 309.5 and its workers'
    12.34). A column of `315.3 MiB` and `1.2 GiB` cells has to be read
    cell by cell; in one unit it compares down the column."""
    top = max((abs(v) for v in values if v is not None), default=0)
    out = BYTE_UNITS[0]
    for unit in BYTE_UNITS:
        if top >= unit[1]:
            out = unit
    return out


def fmt_size(value: Optional[float], unit: tuple[str, int]) -> str:
    """`value` bytes in `unit` (bytes_unit), to four significant figures."""
    if value is None:
        return DASH
    return f"{value:.0f}" if unit[1] == 1 else fmt_sig(value / unit[1])


#: FLOP counts and rates in decimal units, with their factors.
FLOP_PREFIXES = (("", 1.0), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12), ("P", 1e15))


def flop_unit(values: Iterable[Optional[float]], largest: str = "P") -> tuple[str, float]:
    """The prefix (and its factor) for FLOPs or FLOP/s: the largest, up to
    `largest` (`T` on a GPU, `G` on a CPU, where rates are spoken of in
    those), in which the largest figure is at least 1: a tiny model's
    13.1 MFLOP/s, not 0.0131 GFLOP/s or 6.7e-05."""
    top = max((abs(v) for v in values if v is not None and math.isfinite(v)), default=0.0)
    out = FLOP_PREFIXES[0]
    for prefix in FLOP_PREFIXES:
        if top >= prefix[1] or prefix[0] == "":
            out = prefix
        if prefix[0] == largest:
            break
    return out


def fmt_flops(value: float) -> str:
    """A number of FLOPs in the prefix that suits it: `29.6 MFLOP`,
    `3.58 kFLOP`, `1.21 TFLOP`."""
    prefix, factor = flop_unit([value])
    return f"{fmt_sig(value, 3, 1.0 / factor)} {prefix}FLOP"


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
    """`1 step`, `99,984 steps`: the digits of thousands grouped, as a
    long run's counts are read in a sentence."""
    if n == 1:
        return f"{n} {word}"
    return f"{n:,} {word}es" if word.endswith("s") else f"{n:,} {word}s"


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
