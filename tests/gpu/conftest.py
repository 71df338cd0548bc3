"""Fixtures of the GPU checks: where their figures go.

This folder is a package (it has an `__init__.py`) so that this conftest is
imported as `gpu.conftest`: the tests one folder up import the top-level
`conftest` by name, and a second plain `conftest` module would take its
place in `sys.modules` during collection.

Nothing here imports torch: on a machine without a GPU the whole of
test_gpu.py is skipped at collection, and loading this file must cost
nothing either.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

#: The file every GPU check appends its figures to, one JSON object a line;
#: scripts/gpu_check.sh sets it and prints the file at the end.
FIGURES_ENV = "PERFRUN_GPU_FIGURES"


def figures_path() -> str:
    """`$PERFRUN_GPU_FIGURES`, else a file under `$OUT`, else under /tmp."""
    explicit = os.environ.get(FIGURES_ENV)
    if explicit:
        return explicit
    return os.path.join(os.environ.get("OUT") or "/tmp", "perfrun-gpu-figures.jsonl")


Figures = Callable[..., None]


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    """`figures(**values)` records what a check measured: printed on a
    `FIGURES` line (seen with `-s`) and appended to `figures_path()`, so a
    run's numbers survive even when its assertions fail."""

    def record(**values: Any) -> None:
        entry = {"check": request.node.name, **values}
        line = json.dumps(entry, sort_keys=False, default=str)
        print(f"\nFIGURES {line}", flush=True)
        try:
            with open(figures_path(), "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:
            print(f"(figures not saved to {figures_path()}: {exc})", flush=True)

    return record
