"""The CUDA allocator's per-phase peaks, the script's own view of its peaks,
out-of-memory records and the GPU memory analysis (runtime/allocator.py,
analysis/allocator.py).

There is no CUDA on these machines: `StandInAllocator` stands in for the
caching allocator's counters (the nested dict `torch._C._cuda_memoryStats`
returns, its peak reset, its out-of-memory observers, its segments), with
the allocator's rules for what these tests rely on (a peak is the highest
current value since the last reset; reserved memory grows by whole segments
and is kept). The real allocator is checked on a GPU by tests/gpu/test_gpu.py
(scripts/gpu_check.sh): per-phase peaks against the script's own
torch.cuda.max_memory_allocated around each phase, an out-of-memory error at
a known step and phase, creep, and a snapshot read back by
torch.cuda._memory_viz.
"""

from __future__ import annotations

import io
import random
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import flat
from rich.console import Console

from perfrun.analysis.allocator import device_memory, devices_memory, oom_line
from perfrun.analysis.memory import CREEP_MIN_BYTES, MemorySummary
from perfrun.analysis.stats import size
from perfrun.report.memory_blocks import device_memory_block, memory_blocks
from perfrun.report.table import render_blocks
from perfrun.runtime.allocator import (
    BUCKETS,
    AllocatorPhases,
    OutOfMemory,
    PeakView,
    largest_free_block,
    module_on_stack,
)
from perfrun.store.rankfile import _CUDA_MEMORY
from perfrun.store.schema import check

MIB = 1 << 20


class OOMError(RuntimeError):
    pass


class StandInAllocator:
    """The caching allocator's counters for one device (see the module's
    docstring)."""

    SEGMENT = 2 * MIB

    def __init__(self, total: int = 1024 * MIB) -> None:
        self.total = total
        self.cur = {"allocated_bytes": 0, "reserved_bytes": 0, "allocation": 0, "segment": 0}
        self.peak = dict(self.cur)
        self.count = {"allocation": [0, 0]}  # allocated, freed
        self.observers: list[Any] = []
        self.blocks: list[int] = []

    def _set(self, name: str, value: int) -> None:
        self.cur[name] = value
        if value > self.peak[name]:
            self.peak[name] = value

    def malloc(self, n: int) -> None:
        need = self.cur["allocated_bytes"] + n
        if need > self.total:
            for obs in self.observers:
                obs(0, n, self.total, self.total - self.cur["reserved_bytes"])
            raise OOMError(f"CUDA out of memory. Tried to allocate {n} bytes.")
        self._set("allocated_bytes", need)
        self._set("allocation", self.cur["allocation"] + 1)
        self.count["allocation"][0] += 1
        reserved = -(-need // self.SEGMENT) * self.SEGMENT
        if reserved > self.cur["reserved_bytes"]:
            self._set("segment", self.cur["segment"] + 1)
            self._set("reserved_bytes", reserved)
        self.blocks.append(n)

    def free(self, n: int) -> None:
        self.blocks.remove(n)
        self._set("allocated_bytes", self.cur["allocated_bytes"] - n)
        self._set("allocation", self.cur["allocation"] - 1)
        self.count["allocation"][1] += 1

    def memory_stats(self, device: int) -> dict[str, Any]:
        out: dict[str, Any] = {"num_alloc_retries": 0, "num_ooms": 0,
                               "oversize_allocations": {"current": 0, "peak": 0,
                                                        "allocated": 0, "freed": 0}}
        for name, value in self.cur.items():
            made, freed = self.count.get(name, [0, 0])
            stat = {"current": value, "peak": self.peak[name], "allocated": made,
                    "freed": freed}
            out[name] = {"all": dict(stat), "large_pool": dict(stat),
                         "small_pool": {"current": 0, "peak": 0, "allocated": 0, "freed": 0}}
        return out

    def reset_peaks(self, device: int) -> None:
        self.peak = dict(self.cur)

    def segments(self, **kwargs: Any) -> list[dict[str, Any]]:
        free = self.cur["reserved_bytes"] - self.cur["allocated_bytes"]
        return [{"device": 0, "blocks": [{"size": n, "state": "active_allocated"}
                                         for n in self.blocks]
                 + [{"size": free, "state": "inactive"}]}]

    def torch(self) -> Any:
        c = SimpleNamespace(
            _cuda_memoryStats=self.memory_stats,
            _cuda_resetPeakMemoryStats=self.reset_peaks,
            _cuda_attach_out_of_memory_observer=self.observers.append,
        )
        cuda = SimpleNamespace(
            get_device_properties=lambda d: SimpleNamespace(total_memory=self.total),
            memory_snapshot=self.segments,
        )
        return SimpleNamespace(_C=c, cuda=cuda)


def max_memory_allocated(torch: Any) -> int:
    """What torch.cuda.max_memory_allocated() reads: through torch._C at the
    time of the call."""
    return torch._C._cuda_memoryStats(0)["allocated_bytes"]["all"]["peak"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def phases_on(alloc: StandInAllocator, every: float = 0.0, **kw: Any) -> AllocatorPhases:
    return AllocatorPhases(alloc.torch(), lambda: 0, every=every, **kw)


def a_step(alloc: StandInAllocator, p: AllocatorPhases, index: int, batch: int,
           activations: int, grads: int, state: int = 0) -> dict[str, int]:
    """One training step's allocations, phase by phase; returns each
    phase's own highest allocated bytes, as a stopwatch inside it would."""
    truth: dict[str, int] = {}

    def phase(kind: int, name: str, work: Any) -> None:
        p.edge(kind, True, False)
        seen = [alloc.cur["allocated_bytes"]]
        work(seen)
        p.edge(kind, False, False)
        truth[name] = max(seen)

    def track(seen: list[int], op: Any, n: int) -> None:
        op(n)
        seen.append(alloc.cur["allocated_bytes"])

    p.step_begin(index, 0.0)
    phase(0, "dataloader", lambda s: track(s, alloc.malloc, batch))

    def forward(s: list[int]) -> None:
        for _ in range(4):
            track(s, alloc.malloc, activations)
        track(s, alloc.malloc, 3 * activations)  # a temporary
        track(s, alloc.free, 3 * activations)

    def backward(s: list[int]) -> None:
        track(s, alloc.malloc, grads)
        for _ in range(4):
            track(s, alloc.free, activations)
        track(s, alloc.free, batch)

    def optimization(s: list[int]) -> None:
        if state:
            track(s, alloc.malloc, state)
        track(s, alloc.malloc, grads // 2)  # a temporary
        track(s, alloc.free, grads // 2)
        track(s, alloc.free, grads)

    phase(1, "forward", forward)
    phase(2, "backward", backward)
    phase(3, "optimization", optimization)
    p.step_end(index, 0.0, True)
    return truth


def test_each_phase_peak_is_the_highest_allocation_inside_it():
    alloc = StandInAllocator()
    p = phases_on(alloc)
    truths = [a_step(alloc, p, i, 8 * MIB, 20 * MIB, 30 * MIB) for i in range(5)]
    assert len(p.rows) == 5
    for row, truth in zip(p.rows, truths):
        for b, name in enumerate(BUCKETS[:4]):
            assert row[3 + b] == truth[name], name
        # Nothing was allocated between the phases: Others holds no higher peak.
        assert row[3 + 4] <= max(truth.values())
        assert row[3 + 5] == -1  # no evaluation in the step
    # Forward holds the step's peak: 4 activations + the temporary.
    assert p.rows[-1][3 + 1] == 8 * MIB + 4 * 20 * MIB + 60 * MIB


def test_a_closure_s_forward_and_backward_are_their_own_phases():
    alloc = StandInAllocator()
    p = phases_on(alloc)
    p.step_begin(0, 0.0)
    p.edge(3, True, False)   # optimizer.step(closure)
    p.edge(5, True, False)   # the closure
    p.edge(1, True, False)
    alloc.malloc(50 * MIB)
    p.edge(1, False, False)
    p.edge(2, True, False)
    alloc.malloc(70 * MIB)
    alloc.free(70 * MIB)
    alloc.free(50 * MIB)
    p.edge(2, False, False)
    p.edge(5, False, False)
    alloc.malloc(10 * MIB)  # the optimizer's own work
    alloc.free(10 * MIB)
    p.edge(3, False, False)
    p.step_end(0, 0.0, True)
    row = p.rows[0]
    assert row[3 + 1] == 50 * MIB
    assert row[3 + 2] == 120 * MIB
    # The optimizer step's own time includes the closure's code between its
    # forward and its backward, while the forward's 50 MiB were held.
    assert row[3 + 3] == 50 * MIB


def test_evaluation_inside_a_step_is_its_own_bucket():
    alloc = StandInAllocator()
    p = phases_on(alloc)
    p.step_begin(0, 0.0)
    p.edge(1, True, True)
    alloc.malloc(300 * MIB)
    alloc.free(300 * MIB)
    p.edge(1, False, True)
    p.edge(1, True, False)
    alloc.malloc(40 * MIB)
    p.edge(1, False, False)
    p.step_end(0, 0.0, True)
    row = p.rows[0]
    assert row[3 + 5] == 300 * MIB
    assert row[3 + 1] == 40 * MIB


def test_the_script_sees_its_own_peaks_whatever_perfrun_resets():
    """A script that reads and resets its peaks (an epoch's max memory,
    HF's memory tracker) reads what it would without perfrun: a twin
    allocator given the same work, no perfrun on it, is the ground truth."""
    rng = random.Random(7)
    with_perfrun, plain = StandInAllocator(1 << 40), StandInAllocator(1 << 40)
    p = phases_on(with_perfrun)
    script_torch = with_perfrun.torch()
    p.view.undo()
    p = AllocatorPhases(script_torch, lambda: 0, every=0.0)
    live: list[int] = []
    reads = 0
    for step in range(60):
        p.step_begin(step, 0.0)
        for kind in (0, 1, 2, 3):
            p.edge(kind, True, False)
            for _ in range(rng.randint(1, 6)):
                if live and rng.random() < 0.45:
                    n = live.pop(rng.randrange(len(live)))
                    with_perfrun.free(n)
                    plain.free(n)
                else:
                    n = rng.randint(1, 64) * MIB
                    live.append(n)
                    with_perfrun.malloc(n)
                    plain.malloc(n)
            p.edge(kind, False, False)
            if rng.random() < 0.3:
                assert max_memory_allocated(script_torch) == plain.peak["allocated_bytes"]
                full = script_torch._C._cuda_memoryStats(0)
                assert full["reserved_bytes"]["all"]["peak"] == plain.peak["reserved_bytes"]
                reads += 1
            if rng.random() < 0.05:
                script_torch._C._cuda_resetPeakMemoryStats(0)
                plain.reset_peaks(0)
        p.step_end(step, 0.0, True)
    assert reads > 20
    assert max_memory_allocated(script_torch) == plain.peak["allocated_bytes"]
    # perfrun did reset: the allocator's own peak is lower than the script's.
    assert with_perfrun.peak["allocated_bytes"] <= plain.peak["allocated_bytes"]
    p.undo()
    assert script_torch._C._cuda_memoryStats == with_perfrun.memory_stats


def test_one_step_a_second_is_sampled_and_rows_stay_bounded():
    alloc = StandInAllocator()
    clock = Clock()
    p = phases_on(alloc, every=1.0, max_rows=8, clock=clock)
    reads = 0
    stats = alloc.memory_stats

    def counting(device: int) -> Any:
        nonlocal reads
        reads += 1
        return stats(device)

    p.view._stats = counting
    for i in range(200):
        clock.t = i * 0.1  # ten steps a second
        a_step(alloc, p, i, MIB, MIB, MIB)
    # 20 seconds: one step a second (10 readings: its begin, 8 edges, its
    # end) until 8 rows are kept, then thinned by half and the interval
    # doubled, each time.
    assert 12 <= p.sampled <= 14
    assert reads == p.sampled * 10
    assert len(p.rows) <= 8
    assert p.every == 4.0
    steps = [r[0] for r in p.rows]
    assert steps[0] == 0 and all(b - a >= 20 for a, b in zip(steps, steps[1:]))
    assert [r[0] for r in p.rows] == sorted(r[0] for r in p.rows)
    check(p.summary(), _CUDA_MEMORY)


def test_an_uncommitted_step_is_not_kept():
    alloc = StandInAllocator()
    p = phases_on(alloc)
    p.step_begin(0, 0.0)
    p.edge(0, True, False)
    p.edge(0, False, False)
    p.step_end(0, 0.0, False)
    assert p.rows == []


def test_a_fault_switches_the_part_off_and_gives_the_script_its_functions_back():
    alloc = StandInAllocator()
    faults = []
    torch = alloc.torch()
    gone = []

    def stats(device: int) -> Any:
        if gone:
            raise RuntimeError("driver gone")
        return alloc.memory_stats(device)

    torch._C._cuda_memoryStats = stats
    p = AllocatorPhases(torch, lambda: 0, on_fault=lambda w, e: faults.append(w), every=0.0)
    assert torch._C._cuda_memoryStats is not stats
    gone.append(True)
    p.step_begin(0, 0.0)
    assert p.off and faults == ["cuda.memory"]
    assert torch._C._cuda_memoryStats is stats
    a_step(alloc, p, 1, MIB, MIB, MIB)  # no more calls, no raise
    assert p.rows == []


def test_peak_view_folds_every_peak_it_takes_away():
    alloc = StandInAllocator()
    torch = alloc.torch()
    view = PeakView(torch)
    alloc.malloc(100 * MIB)
    alloc.free(100 * MIB)
    view.read_and_reset(0)
    assert alloc.peak["allocated_bytes"] == 0
    seen = torch._C._cuda_memoryStats(0)
    assert seen["allocated_bytes"]["all"]["peak"] == 100 * MIB
    assert seen["allocated_bytes"]["large_pool"]["peak"] == 100 * MIB
    assert seen["allocation"]["all"]["peak"] == 1
    assert seen["oversize_allocations"]["peak"] == 0
    torch._C._cuda_resetPeakMemoryStats(0)
    assert torch._C._cuda_memoryStats(0)["allocated_bytes"]["all"]["peak"] == 0


# -- out of memory -------------------------------------------------------------------


def test_an_out_of_memory_error_is_placed_in_its_step_phase_and_module():
    torch = pytest.importorskip("torch")
    alloc = StandInAllocator(total=64 * MIB)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            alloc.malloc(48 * MIB)  # the activation that no longer fits
            return self.proj(x)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return x

    net = Net()

    def names(module: Any) -> Any:
        for name, sub in net.named_modules():
            if sub is module:
                return f"Net.{name}"
        return None

    dumped = []
    oom = OutOfMemory(alloc.torch(), lambda: {"step": 12, "phase": "forward"}, names,
                      then=lambda: dumped.append(True))
    oom.attach()
    with pytest.raises(OOMError):
        net(torch.zeros(2, 4))
    first = oom.first
    assert first["step"] == 12 and first["phase"] == "forward"
    assert first["module"] == "Net.blocks.1"
    assert first["requested"] == 48 * MIB
    assert first["allocated"] == 48 * MIB
    assert first["reserved"] == 48 * MIB
    assert first["largest_free_block"] == 0
    assert first["main_thread"] is True
    assert dumped == [True]
    summary = oom.summary()
    assert summary["count"] == 1
    check({"oom": summary, "every": 1, "sampled": 0, "events_per_step": 0}, _CUDA_MEMORY)


def test_no_module_is_named_outside_a_forward():
    assert module_on_stack(None, lambda m: "x") is None
    import sys

    assert module_on_stack(sys._getframe(), lambda m: "x") is None


def test_the_largest_free_block_is_the_largest_inactive_one_on_the_device():
    segments = [
        {"device": 0, "blocks": [{"size": 10, "state": "inactive"},
                                 {"size": 99, "state": "active_allocated"}]},
        {"device": 0, "blocks": [{"size": 30, "state": "inactive"}]},
        {"device": 1, "blocks": [{"size": 500, "state": "inactive"}]},
    ]
    assert largest_free_block(segments, 0) == 30
    assert largest_free_block([], 0) is None


# -- the analysis ----------------------------------------------------------------------


def _rows(steps: int, leak: int = 0) -> list[list[int]]:
    """Sampled rows of a run whose steps peak in Backward at 900 MiB; `leak`
    bytes a step kept."""
    rows = []
    for s in range(0, steps, 10):
        kept = leak * s
        peaks = [100 * MIB, 600 * MIB, 900 * MIB, 700 * MIB, 500 * MIB, -1]
        peaks = [p + kept if p >= 0 else p for p in peaks]
        reserved = [p + 64 * MIB if p >= 0 else p for p in peaks]
        rows.append([s, 500 * MIB + kept, 1100 * MIB + kept] + peaks + reserved)
    return rows


def _section(rows: list[list[int]], total: int = 80 * 1024 * MIB, **kw: Any) -> dict[str, Any]:
    out = {"device": 0, "total": total, "every": 1.0, "sampled": len(rows),
           "events_per_step": 120, "buckets": list(BUCKETS), "rows": rows}
    out.update(kw)
    check(out, _CUDA_MEMORY)
    return out


def test_a_flat_run_has_steady_peaks_per_phase_and_no_creep():
    d = device_memory(0, _section(_rows(2000)), warmup=10, last_step=1999)
    assert d is not None and d.creep is None
    peaks = {p.phase: p.allocated for p in d.phases}
    assert peaks == {"dataloader": 100 * MIB, "forward": 600 * MIB, "backward": 900 * MIB,
                     "optimization": 700 * MIB, "others": 500 * MIB}
    assert d.peak_phase == "backward"
    assert d.peak_allocated == 900 * MIB
    assert d.fragmentation == 64 * MIB
    assert d.share(d.peak_allocated) == pytest.approx(900 / (80 * 1024))


def test_allocated_memory_that_grows_each_step_is_creep():
    leak = MIB // 4  # 256 KiB a step: an output kept with its graph
    d = device_memory(0, _section(_rows(2000, leak=leak), total=2048 * MIB),
                      warmup=10, last_step=1999)
    assert d is not None and d.creep is not None
    assert d.creep.slope == pytest.approx(leak)
    # 2 GiB on the device, 500 MiB + 1999 x 256 KiB allocated at the end.
    assert d.creep.full_at == pytest.approx(1999 + (2048 - 500 - 1999 / 4) * 4, abs=8)
    assert leak * 1800 > CREEP_MIN_BYTES


def test_the_memory_summary_shows_gpu_memory_per_phase_and_the_out_of_memory_error():
    oom = {"count": 2, "first": {
        "step": 41, "phase": "backward", "module": None, "main_thread": False, "device": 0,
        "requested": 2 * 1024 * MIB, "device_total": 80 * 1024 * MIB, "device_free": 300 * MIB,
        "allocated": 70 * 1024 * MIB, "reserved": 78 * 1024 * MIB,
        "largest_free_block": 1536 * MIB, "unix": 1.0}, "last": None}
    rows = _rows(400, leak=2 * MIB)
    devices = devices_memory([(0, {"cuda": _section(rows, oom=oom)}, 399)], warmup=5)
    assert len(devices) == 1
    d = devices[0]
    line = oom_line(d, size)
    assert line == ("rank 0 cuda:0: CUDA out of memory in step 41 during backward on "
                    "autograd's thread (no module: backward runs there): asked for 2.0 GiB "
                    "with 70.0 GiB allocated, 78.0 GiB reserved (largest free block 1.5 GiB), "
                    "300 MiB free of 80.0 GiB; 2 out-of-memory errors in all")
    block = device_memory_block(d)
    console = Console(width=100, record=True, file=io.StringIO())
    render_blocks([block], console)
    text = flat(console.export_text())
    assert "Memory Summary (GPU)" in text
    assert "Backward" in text and "set in Backward" in text
    assert "CUDA out of memory in step 41" in text
    assert "allocated memory grows" in text
    summary = MemorySummary(devices=devices)
    assert [b.title for b in memory_blocks(summary)] == ["Memory Summary (GPU)"]
    assert summary.to_dict()["devices"][0]["peak_phase"] == "backward"


def test_advice_names_gpu_creep_and_where_it_grows():
    from perfrun.analysis.advice import memory_creep

    d = device_memory(0, _section(_rows(2000, leak=MIB)), warmup=10, last_step=1999)
    inp = SimpleNamespace(memory=MemorySummary(devices=[d]))
    found = memory_creep(inp)  # type: ignore[arg-type]
    assert len(found) == 1
    assert found[0].kind == "memory-creep"
    assert "GPU memory allocated at the end of a step grew steadily over steps" in \
        found[0].message
    assert any("--memory-snapshot" in a for a in found[0].actions)
    flat = device_memory(0, _section(_rows(2000)), warmup=10, last_step=1999)
    assert memory_creep(SimpleNamespace(memory=MemorySummary(devices=[flat]))) == []  # type: ignore[arg-type]


# -- through the agent ---------------------------------------------------------------------


class StandInHistory:
    """torch.cuda.memory's history functions as --memory-snapshot uses
    them: recording with a bounded ring, metadata attached to each
    allocation, a pickle dumped."""

    def __init__(self, alloc: StandInAllocator) -> None:
        self.alloc = alloc
        self.max_entries: list[int] = []
        self.metadata = ""
        self.entries: list[dict[str, Any]] = []
        malloc = alloc.malloc

        def tagged(n: int) -> None:
            malloc(n)
            if not self.max_entries:
                return  # not recording
            self.entries.append({"action": "alloc", "size": n, "user_metadata": self.metadata})
            del self.entries[:-self.max_entries[-1]]

        alloc.malloc = tagged  # type: ignore[method-assign]

    def _record_memory_history(self, **kw: Any) -> None:
        self.max_entries.append(kw["max_entries"])

    def _set_memory_metadata(self, text: str) -> None:
        self.metadata = text

    def _dump_snapshot(self, path: str) -> None:
        import pickle

        with open(path, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [list(self.entries)]}, f)


def agent_on(tmp_path: Any, alloc: StandInAllocator, **settings: Any) -> Any:
    from test_cuda_safety import make_agent
    from test_gpu_timer import fake_torch

    torch = fake_torch()
    standin = alloc.torch()
    torch._C = standin._C
    torch.cuda.memory_snapshot = standin.cuda.memory_snapshot
    torch.cuda.get_device_properties = lambda d: SimpleNamespace(
        total_memory=alloc.total, uuid=f"uuid-{d}")
    history = StandInHistory(alloc)
    torch.cuda.memory = history
    return make_agent(tmp_path, torch, **settings), history


def train_allocating(agent: Any, alloc: StandInAllocator, steps: int,
                     oom_at: int | None = None) -> None:
    """Steps whose forward allocates 64 MiB of activations that backward
    frees; at step `oom_at` the forward asks for more than the device has."""
    from perfrun.runtime.steps import BWD, DATA, FWD, OPT

    clock = agent.phase_clock
    for step in range(steps):
        for kind in (DATA, FWD, BWD, OPT):
            clock.enter(kind)
            if kind == FWD:
                alloc.malloc(64 * MIB)
                if step == oom_at:
                    try:
                        alloc.malloc(alloc.total)
                    except OOMError:
                        pass
            elif kind == BWD:
                alloc.free(64 * MIB)
            clock.exit()
        if agent.allocator is not None:
            agent.allocator.every = agent.allocator._next = 0.0  # every step sampled


def test_the_agent_saves_gpu_memory_an_out_of_memory_error_and_the_snapshot(tmp_path):
    from perfrun.store.rankfile import read_rank_file

    alloc = StandInAllocator(total=1024 * MIB)
    agent, history = agent_on(tmp_path, alloc, memory_snapshot=True)
    train_allocating(agent, alloc, 12, oom_at=9)
    agent.tracker.finish(agent.phase_clock.now())
    agent.snapshots.dump("end of run")
    agent.write(final=True)
    data = read_rank_file(agent.path).data
    assert data["faults"] == []
    cuda = data["memory"]["cuda"]
    assert [r[0] for r in cuda["rows"]] == list(range(12))
    assert {r[3 + 1] for r in cuda["rows"]} == {64 * MIB}
    assert cuda["total"] == 1024 * MIB
    first = cuda["oom"]["first"]
    assert (first["step"], first["phase"]) == (9, "forward")
    assert first["requested"] == 1024 * MIB and first["allocated"] == 64 * MIB
    assert cuda["snapshot"]["reason"] == "out of memory"
    tags = {e["user_metadata"] for e in history.entries}
    assert "step 9 forward" in tags
    assert history.max_entries[0] == 100_000
    # Sized to the last 3 steps once a step's events were counted.
    assert len(history.max_entries) == 2 and history.max_entries[1] == 10_000
    assert (tmp_path / cuda["snapshot"]["file"]).exists()


def test_timer_only_keeps_the_out_of_memory_observer_and_reads_no_counters(tmp_path):
    from perfrun.store.rankfile import read_rank_file

    alloc = StandInAllocator(total=1024 * MIB)
    agent, _ = agent_on(tmp_path, alloc, timer_only=True)
    reads = []
    stats = alloc.torch()._C._cuda_memoryStats
    agent.torch._C._cuda_memoryStats = lambda d: reads.append(d) or stats(d)
    agent._cuda_from_flush()  # the flush thread, once the script's CUDA exists
    train_allocating(agent, alloc, 6, oom_at=4)
    agent.tracker.finish(agent.phase_clock.now())
    agent.write(final=True)
    cuda = read_rank_file(agent.path).data["memory"]["cuda"]
    assert agent.allocator is None and "rows" not in cuda
    assert (cuda["oom"]["first"]["step"], cuda["oom"]["first"]["phase"]) == (4, "forward")
    assert len(reads) == 1  # the observer's own reading, at the error


def test_a_rank_ended_by_an_out_of_memory_error_says_where_it_happened():
    from test_analysis import _rank_rows, make_rank

    from perfrun.analysis.ranks import rank_problem

    rank = make_rank(_rank_rows(8, n=7), status="finished", exception="OutOfMemoryError")
    rank.data["memory"] = {"children": {}, "cuda": {"oom": {"count": 1, "first": {
        "step": 7, "phase": "forward", "module": "Net.bloat"}}}}
    assert rank_problem(rank) == "raised OutOfMemoryError in step 7 (forward, Net.bloat) " \
        "after 7 steps"


def test_the_metrics_endpoint_serves_the_last_sampled_steps_gpu_memory():
    pytest.importorskip("prometheus_client")
    from perfrun.runtime.metrics import RankMetrics

    readings = {"state": "running", "memory": 900 << 20, "flops": None,
                "gpu_memory": {"allocated": 5 << 30, "reserved": 6 << 30,
                               "peak_allocated": 9 << 30}}
    metrics = RankMetrics({"rank": "0", "node": "n", "job": "j"}, lambda: readings)
    family = {m.name: m for m in metrics.collect()}["perfrun_gpu_memory_bytes"]
    got = {dict(s.labels)["kind"]: s.value for s in family.samples}
    assert got == {"allocated": 5 << 30, "reserved": 6 << 30, "peak_allocated": 9 << 30}
