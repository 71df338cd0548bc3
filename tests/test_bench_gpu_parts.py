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


@pytest.mark.slow
def test_the_flush_asleep_arm_still_saves_every_step_at_the_end(run_perfrun: Any,
                                                                 bench: Any) -> None:
    """The no-flush arm's options: no save during the run, all of it at
    the end, so the arm times the default mode less its flushes and loses
    nothing."""
    # 12 steps of 0.25 s: a run of 3 s, past the default flush's 2 s.
    run = run_perfrun(*bench.OPTIONS["no-flush"], str(TRAIN), "--steps", "12", "--sleep",
                      "0.25")
    assert run.returncode == 0, run.describe()
    rank = run.rank0()
    # The two saves of the rank's start (the step file's header, then the
    # rank file once the flush thread is up) and the final one: no flush.
    assert rank.n_steps == 12 and rank.data["extra"]["flush"]["calls"] == 2, run.describe()


def test_a_call_is_timed_per_call(bench: Any) -> None:
    ticks = iter([10.0, 10.5])
    calls: list[int] = []
    assert bench.per_call_us(lambda: calls.append(1), 1000, lambda: next(ticks)) == 500.0
    assert len(calls) == 1000


def test_the_python_path_runs_the_real_agent_with_its_cuda_calls_stood_in_for(
    bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--python-path times perfrun's own code on the GPU path: the CUDA
    timer must be attached, hear every step, and not have switched itself
    off on the stand-in (a fault would time a path that does nothing)."""
    from perfrun.runtime.gpu import CudaPhaseTimer

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    seen: list[CudaPhaseTimer] = []
    real_end = CudaPhaseTimer.step_end

    def step_end(self: CudaPhaseTimer, index: int, t: float, committed: bool) -> None:
        real_end(self, index, t, committed)
        if self not in seen:
            seen.append(self)

    monkeypatch.setattr(CudaPhaseTimer, "step_end", step_end)
    times = bench.python_path(50, str(tmp_path))
    assert list(times) == ["buffered", "live", "live+timer"]
    assert all(us > 0 for us in times.values())
    (timer,) = seen
    assert not timer.off and timer.unknown == 0
    assert len(timer._pending) == 200 + 50 - 1  # every committed step queued its events
