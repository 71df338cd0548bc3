"""Interval arithmetic on (start, end) pairs: the union, clipping,
intersection and difference that every window table is computed with.
Pure and torch-free; times are whatever unit the caller's are."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals as a sorted list of disjoint ones."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1][1] = end
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def total(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [
        (a if a > lo else lo, b if b < hi else hi) for a, b in intervals if b > lo and a < hi
    ]


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two merged (sorted, disjoint) interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(interval: Interval, holes: Sequence[Interval]) -> list[Interval]:
    """`interval` less the merged, sorted intervals `holes`."""
    out: list[Interval] = []
    lo, hi = interval
    for a, b in holes:
        if b <= lo or a >= hi:
            continue
        if a > lo:
            out.append((lo, a))
        lo = max(lo, b)
    if hi > lo:
        out.append((lo, hi))
    return out


def covers(merged: Sequence[Interval], starts: Sequence[float], t: float) -> bool:
    """Is `t` inside one of the merged, sorted intervals (`starts`: their
    start times, for the bisection)?"""
    k = bisect_right(starts, t) - 1
    return k >= 0 and t < merged[k][1]
