"""perfrun's CUDA paths stay out of the script's way: the agent, the window and
the nsys command, driven through the real step tracker and phase clock with a
stand-in for torch.cuda.

CPU-only torch has no CUDA, so `fake_torch` (tests/test_gpu_timer.py) stands
in for it: it counts the calls that would initialise the driver
(`is_available`), binds events to the device they were first recorded on,
and records cudaProfilerStart/Stop with the device current at the call. What
is tested is perfrun's own logic: CUDA is touched only once the script
initialised it, the device timed is the script's, a faulty timer is detached
without costing a step, a flush between a row's commit and its events being
queued leaves the row for later, and under nsys torch.profiler records CPU
activity only. The real calls are checked on a GPU by the project's GPU
check.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_gpu_timer import fake_torch

from perfrun.launcher.launch import build_command
from perfrun.runtime.agent import Agent
from perfrun.runtime.gpu import work_device
from perfrun.runtime.modules import RootTracker
from perfrun.runtime.window import ProfilerWindow, nsys_tables
from perfrun.settings import Settings
from perfrun.store.layout import steps_path
from perfrun.store.rankfile import read_rank_file
from perfrun.store.stepfile import COL, STEP_COLUMNS, StepWriter
from tests.builders import train_agent

GPU = COL["gpu_dataloader"]


@pytest.fixture(autouse=True)
def rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)


def make_agent(tmp_path: Path, torch: Any, **settings: Any) -> Agent:
    settings.setdefault("nvtx", False)
    payload = dataclasses.asdict(Settings(script="train.py", **settings))
    payload["run_dir"] = str(tmp_path)
    agent = Agent(payload)
    agent.torch = torch
    agent._setup_gpu_and_nvtx(torch)
    # What Agent.start does first (the rest, signal and exit handlers, is
    # not for a test process).
    agent.step_writer = StepWriter(steps_path(agent.path), STEP_COLUMNS)
    return agent


train = train_agent


def rows_of(agent: Agent) -> list[list[Any]]:
    agent.tracker.finish(agent.phase_clock.now())
    agent.write(final=True)
    return read_rank_file(agent.path).rows


class Model:
    def __init__(self, device: int) -> None:
        self.param = SimpleNamespace(is_cuda=True, get_device=lambda: device)

    def parameters(self) -> Any:
        return iter([self.param])


class Loss:
    def parameters(self) -> Any:
        return iter([])


# -- 1. CUDA only once the script initialised it ------------------------------------------


def test_cuda_is_touched_only_after_the_script_initialised_it(tmp_path: Path) -> None:
    torch = fake_torch()
    cuda = torch.cuda
    cuda.initialized = False
    agent = make_agent(tmp_path, torch)
    train(agent, 3)
    assert agent.gpu_timer is None and agent.cuda == {}
    assert cuda.created == 0 and cuda.driver_calls == 0
    cuda.initialized = True  # the script's first CUDA tensor
    train(agent, 3)
    assert agent.gpu_timer is not None
    assert agent.cuda["device"] == 0 and agent.cuda["name"] == "Fake GPU 0"
    rows = rows_of(agent)
    assert len(rows) == 6
    # Steps begun before CUDA existed have no GPU time; the later ones do.
    assert [r[GPU + 4] is None for r in rows] == [True] * 3 + [False] * 3
    assert cuda.driver_calls == 0


def test_cpu_torch_never_looks_for_cuda(tmp_path: Path) -> None:
    torch = fake_torch()
    torch.version.cuda = None
    agent = make_agent(tmp_path, torch)
    train(agent, 3)
    assert agent.gpu_timer is None and torch.cuda.driver_calls == 0


def test_the_window_asks_no_driver_before_cuda_exists(tmp_path: Path) -> None:
    torch = window_torch()
    torch.cuda.initialized = False
    agent = make_agent(tmp_path, torch, scheduler=(1, 3))
    window = ProfilerWindow(agent, torch)
    assert window.activities() == ["CPU"]
    torch.cuda.initialized = True
    assert window.activities() == ["CPU", "CUDA"]
    assert torch.cuda.driver_calls == 0


# -- 2. the device of the script's work -----------------------------------------------------


def test_work_device_rule() -> None:
    torch = fake_torch(device=0, count=4)
    roots = RootTracker()
    assert work_device(torch, roots, local_rank=0) == 0
    # DDP without set_device: the rank's own GPU, not GPU 0.
    assert work_device(torch, roots, local_rank=2) == 2
    # One GPU per rank through CUDA_VISIBLE_DEVICES: device 0 is the rank's.
    assert work_device(fake_torch(device=0, count=1), roots, local_rank=2) == 0
    # The script chose a device: that one.
    torch.cuda.set_device(1)
    assert work_device(torch, roots, local_rank=2) == 1
    # The model's parameters say best, whatever the current device.
    loss, model = Loss(), Model(3)
    roots.see(loss)
    roots.see(model)
    assert work_device(torch, roots, local_rank=2) == 3


def test_ddp_rank_without_set_device_times_its_own_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    torch = fake_torch(device=0, count=2)
    agent = make_agent(tmp_path, torch)
    train(agent, 4)
    assert set(torch.cuda.recorded) == {1}
    assert agent.cuda["device"] == 1 and agent.cuda["current_device"] == 0
    assert all(r[GPU + 4] is not None for r in rows_of(agent))


# -- 4. a faulty timer is detached ----------------------------------------------------------


def test_a_raising_timer_costs_no_step(tmp_path: Path) -> None:
    torch = fake_torch()
    cuda = torch.cuda
    agent = make_agent(tmp_path, torch)
    train(agent, 2)
    timer = agent.gpu_timer
    assert timer is not None

    def broken(self: Any, stream: Any = None) -> None:
        raise RuntimeError("Event device 0 does not match recording stream's device 1.")

    cuda.Event.record = broken
    created = cuda.created
    train(agent, 8)
    assert len(rows_of(agent)) == 10
    assert agent.gpu_timer is None and timer.off
    assert agent.faults["cuda"][0] == 1
    listeners = agent._begin_listeners + agent._end_listeners
    assert all(getattr(f, "__self__", None) is not timer for f in listeners)
    assert agent.phase_clock.listener is None
    assert cuda.created - created <= 1  # nothing after the fault
    assert len(timer._pending) == 0


def test_a_timer_that_raises_at_step_begin_costs_no_step(tmp_path: Path) -> None:
    torch = fake_torch()
    agent = make_agent(tmp_path, torch)
    train(agent, 1)

    def lost() -> int:
        raise RuntimeError("CUDA error: device-side assert triggered")

    torch.cuda.current_device = lost
    train(agent, 9)
    assert len(rows_of(agent)) == 10
    assert agent.gpu_timer is None and "cuda" in agent.faults


# -- 5. a flush between a row's commit and its events -----------------------------------------


def test_a_flush_between_commit_and_step_end_loses_no_gpu_time(tmp_path: Path) -> None:
    torch = fake_torch()
    agent = make_agent(tmp_path, torch)
    train(agent, 1)  # the timer starts at the first step's begin

    def flush(index: int, t: float, committed: bool) -> None:
        agent._append_ready(False)

    # The flush thread runs right after the tracker committed the row and
    # before the timer queued its events.
    agent._end_listeners.insert(0, flush)
    train(agent, 5)
    rows = rows_of(agent)
    assert len(rows) == 6
    assert all(r[GPU + 4] is not None for r in rows)


# -- 8. nsys ------------------------------------------------------------------------------------


class FakeProfile:
    def __init__(self, activities: list[str], **kwargs: Any) -> None:
        self.activities = activities

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def step(self) -> None:
        pass


class FakeRange:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        pass

    def __exit__(self, *args: Any) -> None:
        pass


def window_torch(device: int = 0, count: int = 1) -> Any:
    """fake_torch plus the profiler surface the window calls."""
    torch = fake_torch(device, count)
    torch.profiler = SimpleNamespace(
        ProfilerActivity=SimpleNamespace(CPU="CPU", CUDA="CUDA"),
        profile=FakeProfile,
        ProfilerAction={a: a for a in ("NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE")},
    )
    torch._C = SimpleNamespace(_profiler=SimpleNamespace(_RecordFunctionFast=FakeRange))
    return torch


def test_under_nsys_the_window_records_cpu_only_and_captures_the_script_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    torch = window_torch(device=0, count=2)
    agent = make_agent(tmp_path, torch, nsys=True, scheduler=(1, 3))
    window = ProfilerWindow(agent, torch)
    window._start(0)
    assert window.prof.activities == ["CPU"]
    window._stop()
    # cudaProfilerStart/Stop on the rank's GPU: no context on GPU 0.
    assert torch.cuda.profiler_calls == [("start", 1), ("stop", 1)]
    assert torch.cuda.current_device() == 0
    assert torch.cuda.driver_calls == 0


def test_a_rank_outside_nsys_ranks_keeps_cuda_activity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    torch = window_torch()
    agent = make_agent(tmp_path, torch, nsys=True, nsys_ranks="0", scheduler=(1, 3))
    assert ProfilerWindow(agent, torch).activities() == ["CPU", "CUDA"]


def test_the_rank_document_points_at_the_nsys_report(tmp_path: Path) -> None:
    settings = Settings(script="train.py", nsys=True, scheduler=(2, 5))
    command = build_command(settings, str(tmp_path))
    assert "--cuda-graph-trace=node" in command
    assert "--capture-range=cudaProfilerApi" in command
    output = next(a for a in command if a.startswith("--output="))[len("--output="):]
    where = nsys_tables(0)
    assert where["gpu_tables"] == "nsys"
    assert os.path.join(str(tmp_path), where["nsys_report"]) == output + ".nsys-rep"


def test_nsys_traces_graph_nodes_under_torchrun(tmp_path: Path) -> None:
    settings = Settings(script="train.py", nsys=True, nproc_per_node=2)
    command = build_command(settings, str(tmp_path))
    assert "--cuda-graph-trace=node" in command
    output = next(a for a in command if a.startswith("--output="))
    assert output.endswith(os.path.join("nsys", "rank%q{RANK}"))
