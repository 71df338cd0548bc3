"""The YAML config file (`--config`) and the `-o Profiler.KEY=VALUE`
overrides, read into Settings field changes (settings.py holds the fields;
each field's `yaml=` converter says how its `Profiler:` key is read).

The format is the `Profiler:` section of Paddle's GPT configs, so the
training config itself can be passed: every other section is ignored. The
file is the user's and may be anything: it is loaded with the safe loader,
and refused, with one line that says why, where it expands through its
aliases past MAX_YAML_VALUES, nests too deeply or is malformed. yaml is
imported by the functions that use it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .settings import OPTION, Settings, SettingsError, as_written, capped, names_shown, option_of
from .store.schema import shown

#: The `Profiler:` keys we understand (the fields with `yaml=`), each to the
#: Settings field it sets, in field order: the order an error lists them in.
_PROFILER_FIELDS = {
    spec.yaml_key or f.name: f
    for f in dataclasses.fields(Settings)
    if (spec := option_of(f)) is not None and spec.yaml is not None
}
PROFILER_KEYS = {key: f.name for key, f in _PROFILER_FIELDS.items()}


# -- YAML config ---------------------------------------------------------------

#: The most values the YAML document may expand to through its aliases. A
#: training config has hundreds; an "alias bomb" (anchors of anchors, 9
#: levels of 9) has hundreds of millions, loads in milliseconds because the
#: loader shares the objects, and then exhausts memory in anything that walks
#: it, an error message included.
MAX_YAML_VALUES = 100_000


def _yaml_loader() -> type:
    """SafeLoader that refuses documents whose aliases expand beyond
    MAX_YAML_VALUES values, or refer to themselves, before constructing
    them."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def construct_document(self, node: Any) -> Any:
            _check_expansion(node)
            return super().construct_document(node)

    return BoundedLoader


class _TooLarge(Exception):
    pass


def _check_expansion(root: Any) -> None:
    """Count the values `root` stands for once every alias is expanded. A
    node met again through an alias counts its whole size again, so the
    count is what a walk of the loaded value would visit; each node's size
    is computed once, so the count itself is cheap."""
    import yaml

    sizes: dict[int, int] = {}
    in_progress: set[int] = set()
    # Iterative post-order walk: a deeply nested document must not hit
    # Python's recursion limit here.
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            sizes[key] = 1
            continue
        if children_done:
            in_progress.discard(key)
            total = 1 + sum(sizes[id(c)] for c in children)
            if total > MAX_YAML_VALUES:
                raise _TooLarge(f"its aliases expand to more than {MAX_YAML_VALUES:,} values")
            sizes[key] = total
            continue
        if key in in_progress:
            raise _TooLarge("an alias refers to the value that contains it")
        in_progress.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in in_progress:
                raise _TooLarge("an alias refers to the value that contains it")
            if id(child) not in sizes:
                stack.append((child, False))


def _load_yaml(text: str, origin: str) -> Any:
    """Parse YAML text with the bounded loader; every failure is one line."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except _TooLarge as exc:
        raise SettingsError(f"{origin}: refusing YAML: {exc}") from None
    except RecursionError:
        raise SettingsError(f"{origin}: YAML nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
        raise SettingsError(f"{origin}: malformed YAML{where}: {capped(problem)}") from None


def profiler_section_to_changes(section: Any, origin: str) -> dict[str, Any]:
    """Turn a `Profiler:` mapping into Settings field changes.

    Unknown keys are an error that lists the valid ones: a misspelt key that
    is silently ignored costs a user a whole profiling run.
    """
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise SettingsError(
            f"{origin}: Profiler: expected a mapping (the Profiler section), "
            f"got {as_written(section)}"
        )
    unknown = [k for k in section if k not in PROFILER_KEYS]
    if unknown:
        raise SettingsError(
            f"{origin}: unknown Profiler key(s) {names_shown(unknown)}; "
            f"valid keys: {', '.join(PROFILER_KEYS)}"
        )
    changes: dict[str, Any] = {}
    for key, value in section.items():
        target = _PROFILER_FIELDS[key]
        converted = target.metadata[OPTION].yaml(origin, key, value)
        if converted is None and target.default is not None:
            # null: the default (summary, keep, max_trace_mb: settings with
            # no "unset" value); where the default is None, it unsets.
            continue
        changes[target.name] = converted
    return changes


def load_config(path: str) -> dict[str, Any]:
    """Read a YAML file's `Profiler:` section as Settings changes."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise SettingsError(f"config file not found: {path}") from None
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SettingsError(
            f"cannot read config file {path}: not UTF-8 text "
            f"(byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    data = _load_yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(
            f"{path}: expected a mapping with a Profiler section, got {as_written(data)}"
        )
    return profiler_section_to_changes(data.get("Profiler"), path)


def parse_override(text: str) -> dict[str, Any]:
    """`Profiler.scheduler=[100,110]` -> Settings changes."""
    if "=" not in text:
        raise SettingsError(f"override {shown(text)} must look like Profiler.KEY=VALUE")
    dotted, raw = text.split("=", 1)
    parts = dotted.strip().split(".")
    if parts[0] != "Profiler" or len(parts) < 2:
        raise SettingsError(f"override {shown(text)}: only Profiler.* keys can be overridden")
    try:
        value = _load_yaml(raw, "override") if raw.strip() else None
    except SettingsError:
        raise SettingsError(f"override {shown(text)}: cannot parse the value") from None
    section: dict[str, Any] = {}
    node = section
    for part in parts[1:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return profiler_section_to_changes(section, "override")
