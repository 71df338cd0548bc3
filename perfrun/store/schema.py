"""A small declarative validator for perfrun's files, and values shown in
one-line messages.

Results, baselines and configs come from disk, and a file of the right shape
but the wrong types (`"steps": "x"`, `"rank": null`) would otherwise surface
as a traceback deep inside the report. Each format declares its spec as
plain data in its own module (rankfile.py, runmeta.py, baseline.py) and
checks a document once, on read, so everything downstream may trust the
types it indexes into. Keys a spec does not name are allowed: a minor
addition to a format must not make older readers refuse the file.

Standard library only: the rank imports this module at start.
"""

from __future__ import annotations

import math

from ..errors import PerfrunError

#: The most characters of a user's value an error message shows: a value can
#: be arbitrarily large (a YAML alias bomb expands to millions of nodes), and
#: a one-line message must stay one short line.
SHOWN_CHARS = 60


def shown(value: object) -> str:
    """`value` as the user wrote it, capped at SHOWN_CHARS. Containers are
    summarised before repr so that an enormous value is never rendered."""
    if isinstance(value, (list, tuple, dict)) and len(value) > SHOWN_CHARS:
        return f"a {'mapping' if isinstance(value, dict) else 'list'} of {len(value)} items"
    text = _bounded_repr(value, SHOWN_CHARS + 1)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _bounded_repr(value: object, budget: int) -> str:
    """repr that stops once `budget` characters are written: nested
    containers may be small at the top and huge below."""
    if isinstance(value, (list, tuple)):
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        parts = []
        used = 1
        for item in value:
            if used > budget:
                break
            part = _bounded_repr(item, budget - used)
            parts.append(part)
            used += len(part) + 2
        return open_ + ", ".join(parts) + close
    if isinstance(value, dict):
        parts = []
        used = 1
        for k, v in value.items():
            if used > budget:
                break
            part = f"{_bounded_repr(k, budget)}: {_bounded_repr(v, budget - used)}"
            parts.append(part)
            used += len(part) + 2
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, str) and len(value) > budget:
        value = value[:budget]
    return repr(value)


def type_name(value: object) -> str:
    """The JSON name of a value's type, for messages about JSON files."""
    if value is None:
        return "null"
    return type(value).__name__


class SchemaError(PerfrunError, ValueError):
    """A value does not have its declared type; `where` is the field path
    (`steps.rows`, `ranks[0].env`) and the message is one line."""

    slug = "schema"

    def __init__(self, where: str, expected: str, got: str) -> None:
        self.where = where
        self.expected = expected
        self.got = got
        super().__init__(f"{where}: expected {expected}, got {got}" if where else
                         f"expected {expected}, got {got}")


class Spec:
    """One declared type; `what` is how a message names it ("an integer")."""

    what = "a value"

    def check(self, value: object, where: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def fail(self, value: object, where: str) -> SchemaError:
        return SchemaError(where, self.what, type_name(value))


class Kind(Spec):
    """A JSON scalar or container of given Python types (bool is never an
    integer here, although Python says it is)."""

    def __init__(self, what: str, *types: type) -> None:
        self.what = what
        self.types = types

    def check(self, value: object, where: str) -> None:
        if isinstance(value, bool) and bool not in self.types:
            raise self.fail(value, where)
        if not isinstance(value, self.types):
            raise self.fail(value, where)


class Opt(Spec):
    """`spec`, or null."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.what = f"{spec.what} or null"

    def check(self, value: object, where: str) -> None:
        if value is not None:
            try:
                self.spec.check(value, where)
            except SchemaError as exc:
                if exc.where == where:  # the value itself: say null was allowed
                    raise self.fail(value, where) from None
                raise


class ListOf(Spec):
    """A list whose every item is `item`; `length` fixes its length."""

    def __init__(self, item: Spec, length: int | None = None, what: str | None = None) -> None:
        self.item = item
        self.length = length
        self.what = what or (
            "a list" if length is None else f"a list of {length}"
        )

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, list) or (self.length is not None and len(value) != self.length):
            raise self.fail(value, where)
        if self.item is not ANY:
            for i, item in enumerate(value):
                self.item.check(item, f"{where}[{i}]")


class Obj(Spec):
    """A mapping whose named keys, when present, have their declared types."""

    what = "an object"

    def __init__(self, fields: dict[str, Spec] | None = None, values: Spec | None = None) -> None:
        self.fields = fields or {}
        self.values = values

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise self.fail(value, where)
        for key, spec in self.fields.items():
            if key in value:
                spec.check(value[key], f"{where}.{key}" if where else key)
        if self.values is not None:
            for key, item in value.items():
                if key not in self.fields:
                    self.values.check(item, f"{where}.{key}" if where else str(key))


class _Any(Spec):
    def check(self, value: object, where: str) -> None:
        return None


ANY = _Any()
INT = Kind("an integer", int)
NUMBER = Kind("a number", int, float)
STR = Kind("a string", str)
BOOL = Kind("true or false", bool)
LIST = ListOf(ANY)
OBJ = Obj()


def check(value: object, spec: Spec, where: str = "") -> None:
    """Raise SchemaError at the first field of `value` not matching `spec`."""
    spec.check(value, where)


# -- values read back -------------------------------------------------------------------
#
# A document that passed its spec may still hold a value where a reader
# wants a number it did not declare (an older file, a section the spec
# leaves open). These turn such a value into what the reader needs, or
# None, never an exception: a damaged field costs its figure, not the
# report. JSON's true and false are never numbers here.


def is_number(value: object) -> bool:
    """A JSON number: int or float, not bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_number(value: object) -> float | None:
    """A JSON number as a float, else None."""
    return float(value) if is_number(value) else None  # type: ignore[arg-type]


def as_finite(value: object) -> float | None:
    """A finite number (a numeric string too), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def finite_or_zero(value: object) -> float:
    """A time cell: a missing or non-finite value counts as zero."""
    number = as_finite(value)
    return 0.0 if number is None else number


def as_int(value: object) -> int | None:
    """An integer (a float or numeric string truncated), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError, OverflowError):
        return None
