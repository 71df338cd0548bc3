"""scripts/bench_gpu_parts.py takes one part of the default mode out at a
time on a GPU. The GPU arms themselves run only where there is a GPU; what
is checked here is what would otherwise break there, silently or after the
machine's time is spent: that every part it switches off is still where it
reaches for it, and that a script run through its `--inside` wrapper under
perfrun runs and is profiled as it is without the wrapper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import import_file

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench_gpu_parts.py"
TRAIN = ROOT / "tests" / "scripts" / "proc_train.py"


@pytest.fixture(scope="module")
def bench() -> Any:
    return import_file(SCRIPT, "bench_gpu_parts")


def test_every_part_it_switches_off_is_still_there(bench: Any) -> None:
    from perfrun.runtime.agent import Agent
    from perfrun.runtime.allocator import AllocatorPhases
    from perfrun.runtime.cudaside import CudaSide
    from perfrun.runtime.gpu import CudaPhaseTimer

    targets = [(AllocatorPhases, "step_begin"), (CudaPhaseTimer, "_record"),
               (CudaSide, "_maybe_start_cuda")]
    saved = [(cls, name, cls.__dict__[name]) for cls, name in targets]
    assert callable(Agent._update_listener)  # what the no-cuda arm calls
    try:
        for part in bench.PARTS.values():
            part()
        for cls, name, original in saved:
            assert cls.__dict__[name] is not original, (cls, name)
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)
    assert set(bench.ARMS) >= {"plain", "timer-only", "default", *bench.PARTS}


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["no-cuda", "no-events", "no-peaks"])
def test_a_script_run_inside_it_is_profiled_as_itself(run_perfrun: Any, arm: str) -> None:
    run = run_perfrun(str(SCRIPT), "--inside", arm, str(TRAIN), "--steps", "12")
    assert run.returncode == 0, run.describe()
    rank = run.rank0()
    assert rank.n_steps == 12, run.describe()
    assert rank.data["faults"] == [], rank.data["faults"]
