"""The window tables' arithmetic on hand-made trace events: interval
algebra, the Overview's unions, every table's numbers on a small trace whose
answers are worked out by hand, kernel names, and every --sort-by key."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from perfrun.analysis.trace import (
    clip,
    intersect,
    memory_summary,
    merge,
    short_kernel_name,
    summarize,
    total,
)
from perfrun.analysis.window import SORT_FIELDS, RankWindow, WindowReport, sort_rows
from perfrun.report.primitives import TableBlock
from perfrun.report.window_blocks import window_blocks

US = 1e-6
#: Trace timestamps are microseconds since some epoch: big numbers, like a
#: real trace's, so the arithmetic meets their rounding.
T0 = 4_500_000_000_000.0

CPU_PID, GPU_PID = 100, 0
MAIN, GLOO, AUTOGRAD = 1, 2, 3  # host threads
STREAM_A, STREAM_B = 7, 13  # CUDA streams


def ev(
    name: str,
    cat: str,
    start: float,
    end: float,
    *,
    tid: int = MAIN,
    pid: int = CPU_PID,
    ext: Optional[int] = None,
) -> dict[str, Any]:
    """A complete ("X") event from `start` to `end` µs after T0."""
    e: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": T0 + start,
        "dur": float(end - start),
        "args": {},
    }
    if ext is not None:
        e["args"]["External id"] = ext
    return e


def op(name: str, start: float, end: float, **kw: Any) -> dict[str, Any]:
    return ev(name, "cpu_op", start, end, **kw)


def ann(name: str, start: float, end: float, **kw: Any) -> dict[str, Any]:
    return ev(name, "user_annotation", start, end, **kw)


def kernel(name: str, start: float, end: float, *, stream: int = STREAM_A, **kw: Any):
    return ev(name, "kernel", start, end, pid=GPU_PID, tid=stream, **kw)


def runtime(name: str, start: float, end: float, **kw: Any) -> dict[str, Any]:
    return ev(name, "cuda_runtime", start, end, **kw)


def mem(
    at: float,
    size: int,
    allocated: int,
    reserved: int = 0,
    *,
    tid: int = MAIN,
    device: tuple[int, int] = (1, 0),
) -> dict[str, Any]:
    """A `profile_memory` instant event (device type 1 is CUDA, 0 the CPU)."""
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": CPU_PID,
        "tid": tid,
        "ts": T0 + at,
        "args": {
            "Total Reserved": reserved,
            "Total Allocated": allocated,
            "Bytes": size,
            "Device Id": device[1],
            "Device Type": device[0],
        },
    }


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in rows}


def overview(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["type"]: o for o in summary["overview"]}


def us(value: float) -> Any:
    """`value` microseconds, in the summary's seconds (to a nanosecond)."""
    return pytest.approx(value * US, abs=1e-9)


# -- interval arithmetic -----------------------------------------------------------


def test_merge_edge_cases() -> None:
    assert merge([]) == []
    # Empty and reversed intervals are nothing.
    assert merge([(5.0, 5.0), (7.0, 6.0)]) == []
    # Unsorted input; touching intervals join; a contained one disappears.
    assert merge([(4.0, 6.0), (0.0, 2.0), (2.0, 3.0), (4.5, 5.0)]) == [(0.0, 3.0), (4.0, 6.0)]
    # An interval reaching past several others swallows them.
    assert merge([(1.0, 2.0), (0.0, 10.0), (3.0, 4.0), (9.0, 12.0)]) == [(0.0, 12.0)]
    assert total(merge([(0.0, 1.0), (0.5, 1.5), (3.0, 4.0)])) == 2.5


def test_clip_edge_cases() -> None:
    intervals = [(0.0, 2.0), (2.0, 4.0), (5.0, 6.0), (7.0, 20.0), (-5.0, 30.0)]
    assert clip(intervals, 2.0, 10.0) == [(2.0, 4.0), (5.0, 6.0), (7.0, 10.0), (2.0, 10.0)]
    # Touching the window's edge from outside is not inside it.
    assert clip([(0.0, 2.0), (10.0, 11.0)], 2.0, 10.0) == []
    assert clip([], 0.0, 1.0) == []
    assert clip([(0.0, 1.0)], 5.0, 5.0) == []


def test_intersect_edge_cases() -> None:
    assert intersect([], [(0.0, 1.0)]) == []
    assert intersect([(0.0, 1.0)], []) == []
    assert intersect([(0.0, 1.0)], [(2.0, 3.0)]) == []
    # Touching is not overlapping.
    assert intersect([(0.0, 1.0)], [(1.0, 2.0)]) == []
    assert intersect([(0.0, 10.0)], [(2.0, 3.0), (4.0, 5.0), (9.0, 12.0)]) == [
        (2.0, 3.0),
        (4.0, 5.0),
        (9.0, 10.0),
    ]
    assert intersect([(0.0, 2.0), (3.0, 5.0), (6.0, 8.0)], [(1.0, 7.0)]) == [
        (1.0, 2.0),
        (3.0, 5.0),
        (6.0, 7.0),
    ]
    # Symmetric.
    a, b = [(0.0, 2.0), (4.0, 9.0)], [(1.0, 5.0), (8.0, 10.0)]
    assert intersect(a, b) == intersect(b, a) == [(1.0, 2.0), (4.0, 5.0), (8.0, 9.0)]


# -- Overview ------------------------------------------------------------------------


def test_overview_is_the_union_of_one_type_across_threads() -> None:
    # Two operators on two threads overlap for 50 µs: the Operator row is
    # busy for 150 µs of the 200 µs window, not 200.
    events = [
        ann("perfrun: ProfileStep#0", 0, 200),
        op("aten::mm", 0, 100, tid=MAIN),
        op("aten::add", 50, 150, tid=AUTOGRAD),
    ]
    o = overview(summarize(events, 1))["Operator"]
    assert o["calls"] == 2
    assert o["time"] == us(150)
    assert o["ratio"] == pytest.approx(0.75)


def test_overview_never_exceeds_the_window() -> None:
    # Four threads busy for the whole window, and an op that starts before
    # the first step and one that ends after the last: still 100% at most.
    events = [ann("perfrun: ProfileStep#3", 0, 200)]
    events += [op("aten::mm", 0, 200, tid=t) for t in range(4)]
    events += [op("aten::add", -50, 20, tid=9), op("aten::add", 150, 400, tid=9)]
    for o in summarize(events, 1)["overview"]:
        assert o["time"] <= 200 * US + 1e-12, o
        assert o["ratio"] is None or o["ratio"] <= 1.0 + 1e-9, o
    o = overview(summarize(events, 1))["Operator"]
    assert o["calls"] == 6
    assert o["ratio"] == pytest.approx(1.0)


def test_empty_trace_has_no_ratios_and_no_errors() -> None:
    s = summarize([], 0)
    assert s["window_time"] == 0.0
    assert all(o["ratio"] is None and o["calls"] == 0 for o in s["overview"])
    assert s["operators"] == [] and s["kernels"] == [] and s["user_defined"] == []
    mm = s["memory_manipulation"]
    assert mm == {"copies": [], "sync_calls": 0, "sync_per_step": None, "sync_by_op": {}}
    assert s["distributed"]["cpu"]["communication_ratio"] is None
    assert s["memory"] == {"recorded": False}


# -- one window, every table -------------------------------------------------------

GEMM = "void gemm_kernel<float, cutlass::Epilogue<float> >(float*, float const*, int)"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def window_events() -> list[dict[str, Any]]:
    """Two 500 µs steps of a GPU training loop, numbers chosen so every table's
    answer can be worked out by hand (see the test below)."""
    events = [
        # perfrun's steps and phases.
        ann("perfrun: ProfileStep#5", 0, 500),
        ann("perfrun: ProfileStep#6", 500, 1000),
        ann("perfrun: Dataloader", 0, 50),
        ann("perfrun: Dataloader", 500, 550),
        ann("perfrun: Forward", 50, 250),
        ann("perfrun: Forward", 550, 750),
        ann("perfrun: Backward", 250, 400),
        ann("perfrun: Backward", 750, 900),
        ann("perfrun: Optimization", 400, 480),
        ann("perfrun: Optimization", 900, 980),
        # torch's own annotations: not the user's.
        ann("ProfilerStep#3", 0, 500),
        ann("ProfilerStep#4", 500, 1000),
        ann("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 5, 45),
        ann("Optimizer.step#SGD.step", 400, 450),
        ann("Optimizer.zero_grad#SGD.zero_grad", 900, 905),
        # The user's own range, once a step.
        ann("my: bookkeeping", 460, 478),
        ann("my: bookkeeping", 960, 978),
        # Forward: linear -> addmm -> a GEMM kernel, each step.
        op("aten::linear", 60, 200, ext=10),
        op("aten::addmm", 70, 190, ext=11),
        runtime("cudaLaunchKernel", 80, 85, ext=11),
        kernel(GEMM, 100, 300, ext=11),
        op("aten::linear", 560, 700, ext=20),
        op("aten::addmm", 570, 690, ext=21),
        runtime("cudaLaunchKernel", 580, 585, ext=21),
        kernel(GEMM, 600, 700, ext=21),
        # Backward: a host-to-device copy, a memset, an op that redispatches
        # to itself (torch counts it once), an op on autograd's thread.
        op("aten::copy_", 260, 280, ext=30),
        ev("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 262, 272, pid=GPU_PID,
           tid=STREAM_A, ext=30),
        ev("Memset (Device)", "gpu_memset", 300, 302, pid=GPU_PID, tid=STREAM_A),
        op("aten::div_", 300, 340, ext=31),
        op("aten::div_", 302, 338, ext=32),
        op("aten::fill_", 315, 325, ext=34),
        op("aten::mm", 310, 330, tid=AUTOGRAD, ext=33),
        # Gradients all-reduced: the c10d op on the main thread, gloo's work
        # on its own thread, and a NCCL kernel on a second stream overlapping
        # the GEMM for 50 µs.
        op("c10d::allreduce_", 410, 430, ext=40),
        ann("gloo:all_reduce", 320, 420, tid=GLOO),
        kernel(NCCL, 250, 450, stream=STREAM_B, ext=40),
        # `.item()`: one synchronisation, whose cudaStreamSynchronize is not
        # counted a second time.
        op("aten::item", 850, 880, ext=50),
        op("aten::_local_scalar_dense", 852, 878, ext=51),
        runtime("cudaMemcpyAsync", 855, 860, ext=51),
        runtime("cudaStreamSynchronize", 861, 876, ext=51),
        ev("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 856, 862, pid=GPU_PID,
           tid=STREAM_A, ext=51),
        # A bare stream synchronisation (`.cpu()`) and a device one.
        runtime("cudaStreamSynchronize", 905, 915),
        runtime("cudaDeviceSynchronize", 990, 995),
        # Memory: on cuda:0, allocations inside the ops, one on autograd's
        # thread while the main thread is inside aten::fill_, one free.
        mem(75, 4096, 4096, 8192),
        mem(265, 1024, 5120, 8192),
        mem(320, 2048, 7168, 16384, tid=AUTOGRAD),
        mem(390, -4096, 3072, 16384),
        mem(575, 512, 3584, 16384),
        # Flow and metadata events are not spans.
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "pid": GPU_PID, "tid": STREAM_A,
         "ts": T0 + 100, "id": 11},
        {"ph": "M", "name": "thread_name", "pid": CPU_PID, "tid": MAIN,
         "args": {"name": "python"}},
    ]
    return events


def test_summary_of_a_hand_made_window() -> None:
    s = summarize(window_events(), 2)
    assert s["steps"] == 2
    assert s["window_time"] == us(1000)

    o = overview(s)
    assert (o["ProfileStep"]["calls"], o["ProfileStep"]["time"]) == (2, us(1000))
    assert o["ProfileStep"]["ratio"] == pytest.approx(1.0)
    assert (o["Dataloader"]["calls"], o["Dataloader"]["time"]) == (2, us(100))
    assert (o["Forward"]["calls"], o["Forward"]["time"]) == (2, us(400))
    assert (o["Backward"]["calls"], o["Backward"]["time"]) == (2, us(300))
    assert (o["Optimization"]["calls"], o["Optimization"]["time"]) == (2, us(160))
    # The redispatched aten::div_ is one call; aten::fill_, and aten::mm on
    # autograd's thread, lie inside the div_, so they add no time.
    assert o["Operator"]["calls"] == 11
    assert o["Operator"]["time"] == us(140 + 20 + 40 + 20 + 140 + 30)
    assert (o["CudaRuntime"]["calls"], o["CudaRuntime"]["time"]) == (6, us(5 + 5 + 5 + 15 + 10 + 5))
    assert (o["UserDefined"]["calls"], o["UserDefined"]["time"]) == (2, us(36))
    assert (o["Kernel"]["calls"], o["Kernel"]["time"]) == (2, us(300))
    assert (o["Communication"]["calls"], o["Communication"]["time"]) == (1, us(200))
    assert (o["Memcpy"]["calls"], o["Memcpy"]["time"]) == (2, us(16))
    assert (o["Memset"]["calls"], o["Memset"]["time"]) == (1, us(2))
    assert {t for t, row in o.items() if row["side"] == "gpu"} == {
        "Kernel", "Memcpy", "Memset", "Communication"
    }

    # Operators: CPU statistics, and the GPU time of the kernels each
    # launched (linked by External id: the kernel belongs to aten::addmm,
    # not to the aten::linear that called it).
    ops = by_name(s["operators"])
    assert set(ops) == {
        "aten::linear", "aten::addmm", "aten::copy_", "aten::div_", "aten::fill_", "aten::mm",
        "c10d::allreduce_", "aten::item", "aten::_local_scalar_dense",
    }
    addmm = ops["aten::addmm"]
    assert addmm["calls"] == 2
    assert (addmm["total"], addmm["avg"], addmm["max"], addmm["min"]) == (
        us(240), us(120), us(120), us(120)
    )
    assert (addmm["gpu_total"], addmm["gpu_avg"], addmm["gpu_max"], addmm["gpu_min"]) == (
        us(300), us(150), us(200), us(100)
    )
    assert [(k["name"], k["calls"]) for k in addmm["kernels"]] == [
        ("gemm_kernel<float, cutlass::Epilogue<...> >", 2)
    ]
    assert addmm["kernels"][0]["total"] == us(300)
    assert ops["aten::linear"]["gpu_total"] is None
    assert ops["aten::linear"]["kernels"] == []
    assert ops["aten::linear"]["ratio"] == pytest.approx(280 / 1000)
    nccl = ops["c10d::allreduce_"]["kernels"][0]["name"]
    assert nccl == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    assert (ops["aten::div_"]["calls"], ops["aten::div_"]["total"]) == (1, us(40))

    # Kernels: GPU time, shares of all kernel time.
    ks = by_name(s["kernels"])
    assert set(ks) == {
        "gemm_kernel<float, cutlass::Epilogue<...> >", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    }
    gemm = ks["gemm_kernel<float, cutlass::Epilogue<...> >"]
    assert (gemm["calls"], gemm["total"], gemm["max"], gemm["min"]) == (
        2, us(300), us(200), us(100)
    )
    assert gemm["ratio"] == pytest.approx(0.6)
    assert ks["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["ratio"] == pytest.approx(0.4)

    # UserDefined: only the user's range.
    assert [(u["name"], u["calls"]) for u in s["user_defined"]] == [("my: bookkeeping", 2)]
    assert s["user_defined"][0]["total"] == us(36)

    # Memory manipulation: copies by direction, memsets, synchronisations.
    mm = s["memory_manipulation"]
    copies = by_name(mm["copies"])
    assert set(copies) == {"Memcpy HtoD", "Memcpy DtoH", "Memset"}
    assert (copies["Memcpy HtoD"]["calls"], copies["Memcpy HtoD"]["total"]) == (1, us(10))
    assert (copies["Memcpy DtoH"]["calls"], copies["Memcpy DtoH"]["total"]) == (1, us(6))
    assert (copies["Memset"]["calls"], copies["Memset"]["total"]) == (1, us(2))
    # .item() once, the bare cudaStreamSynchronize, cudaDeviceSynchronize.
    assert mm["sync_calls"] == 3
    assert mm["sync_per_step"] == 1.5

    # Distributed. CPU: c10d op [410, 430] and gloo's work [320, 420] make
    # 110 µs of communication; computation is every other op's union, 370
    # µs; they overlap where aten::div_ [300, 340] meets gloo's work.
    cpu = s["distributed"]["cpu"]
    assert cpu["communication"] == us(110)
    assert cpu["computation"] == us(370)
    assert cpu["overlap"] == us(20)
    assert cpu["communication_ratio"] == pytest.approx(0.11)
    assert cpu["overlap_ratio"] == pytest.approx(0.02)
    # GPU: the NCCL kernel [250, 450] against the GEMMs [100, 300] and
    # [600, 700].
    gpu = s["distributed"]["gpu"]
    assert gpu["communication"] == us(200)
    assert gpu["computation"] == us(300)
    assert gpu["overlap"] == us(50)
    assert gpu["overlap_ratio"] == pytest.approx(0.05)


def test_memory_of_a_hand_made_window() -> None:
    m = summarize(window_events(), 2)["memory"]
    assert m["recorded"] is True
    assert m["devices"] == {"cuda:0": {"peak_allocated": 7168, "peak_reserved": 16384}}
    assert m["peak_by_phase"] == {"Forward": 4096, "Backward": 7168}
    # Each allocation goes to the innermost op open on its own thread: the
    # 2048 bytes to aten::mm on autograd's thread, not to the aten::fill_
    # the main thread opened after it; a free counts for nothing.
    assert m["top_allocators"] == [
        {"name": "aten::addmm", "bytes": 4096 + 512},
        {"name": "aten::mm", "bytes": 2048},
        {"name": "aten::copy_", "bytes": 1024},
    ]


def test_memory_innermost_op_and_devices_apart() -> None:
    events = [
        ann("perfrun: ProfileStep#0", 0, 100),
        ann("perfrun: Forward", 0, 100),
        # Same start: the outer op opens first, whatever the list's order.
        op("aten::empty", 10, 20),
        op("aten::zeros", 10, 40),
        mem(10, 100, 100, device=(0, -1)),
        # Allocated at the very end of an op: still inside it.
        mem(40, 1000, 2000, device=(1, 0)),
        mem(60, 50, 150, device=(0, -1)),
    ]
    spans = [e for e in events if e["ph"] == "X"]
    m = memory_summary(events, spans)
    assert m["devices"] == {
        "cpu:-1": {"peak_allocated": 150, "peak_reserved": 0},
        "cuda:0": {"peak_allocated": 2000, "peak_reserved": 0},
    }
    # Totals of two devices are not compared: one peak per device.
    assert m["peak_by_phase"] == {"Forward (cpu:-1)": 150, "Forward (cuda:0)": 2000}
    assert m["top_allocators"] == [
        {"name": "aten::zeros", "bytes": 1000},
        {"name": "aten::empty", "bytes": 100},
    ]


def test_no_gpu_means_no_synchronisation() -> None:
    # On the CPU `.item()` reads memory the CPU already has: nothing waits.
    events = [
        ann("perfrun: ProfileStep#0", 0, 100),
        op("aten::item", 10, 20),
        op("aten::_local_scalar_dense", 11, 19),
    ]
    s = summarize(events, 1)
    assert s["memory_manipulation"]["sync_calls"] == 0
    assert s["memory_manipulation"]["sync_per_step"] == 0.0
    assert s["kernels"] == []
    assert by_name(s["operators"])["aten::_local_scalar_dense"]["gpu_total"] is None


def test_torch_annotations_are_not_user_defined() -> None:
    torch_own = [
        "ProfilerStep#3",
        "Optimizer.step#SGD.step",
        "Optimizer.zero_grad#Adam.zero_grad",
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
        "## forward ##",
        "autograd::engine::evaluate_function: AddmmBackward0",
    ]
    events = [ann("perfrun: ProfileStep#0", 0, 100)]
    events += [ann(name, 10 + i, 20 + i) for i, name in enumerate(torch_own)]
    # Nor are perfrun's own per-module ranges (the Module Summary's).
    events += [ann("perfrun.module: encoder.layers.0", 30, 45)]
    events += [ann("train: log metrics", 50, 60), ann("train: log metrics", 70, 75)]
    s = summarize(events, 1)
    assert [(u["name"], u["calls"]) for u in s["user_defined"]] == [("train: log metrics", 2)]
    assert s["user_defined"][0]["total"] == us(15)
    assert s["user_defined"][0]["ratio"] == pytest.approx(0.15)
    assert overview(s)["UserDefined"]["calls"] == 2


def test_an_op_redispatching_to_itself_counts_once() -> None:
    # As torch's own key_averages() does: a child with its parent's name and
    # no sibling is the same call. A same-named child with a sibling, or in
    # a parent of another name, is a call of its own.
    events = [
        ann("perfrun: ProfileStep#0", 0, 1000),
        op("aten::div_", 0, 100),
        op("aten::div_", 10, 90),
        op("aten::div_", 20, 80),  # three deep: one call
        op("aten::add", 200, 300),
        op("aten::add", 210, 240),
        op("aten::mul", 250, 260),  # add's second child: both adds count
        op("aten::to", 400, 500),
        op("aten::_to_copy", 410, 490),
        op("aten::to", 420, 480),  # not its parent's name: counts
        op("aten::div_", 600, 700, tid=AUTOGRAD),  # another thread: not nested
    ]
    ops = by_name(summarize(events, 1)["operators"])
    assert ops["aten::div_"]["calls"] == 2
    assert ops["aten::div_"]["total"] == us(200)
    assert ops["aten::add"]["calls"] == 2
    assert ops["aten::to"]["calls"] == 2


def test_kernels_of_a_redispatched_op_stay_with_it() -> None:
    events = [
        ann("perfrun: ProfileStep#0", 0, 100),
        op("aten::copy_", 0, 50, ext=1),
        op("aten::copy_", 5, 45, ext=2),
        runtime("cudaLaunchKernel", 10, 12, ext=2),
        kernel("void copy_kernel<float>(float*)", 20, 30, ext=2),
        runtime("cudaStreamSynchronize", 46, 48, ext=1),
    ]
    copy = by_name(summarize(events, 1)["operators"])["aten::copy_"]
    assert copy["calls"] == 2  # the outer copy_ has a second child: two calls
    assert copy["gpu_total"] == us(10)
    events.pop()  # now the inner copy_ is the outer's only child: one call
    copy = by_name(summarize(events, 1)["operators"])["aten::copy_"]
    assert copy["calls"] == 1
    assert copy["total"] == us(50)
    # Its kernel, launched by the dropped inner call, is still the op's.
    assert (copy["gpu_total"], copy["gpu_avg"]) == (us(10), us(10))


def test_gpu_stats_of_an_op_count_calls_without_kernels() -> None:
    events = [
        ann("perfrun: ProfileStep#0", 0, 100),
        op("aten::copy_", 0, 10, ext=1),  # a CPU copy: no kernel
        op("aten::copy_", 20, 30, ext=2),
        kernel("void copy_kernel<float>(float*)", 25, 33, ext=2),
        kernel("void copy_kernel<float>(float*)", 34, 36, ext=2),
    ]
    copy = by_name(summarize(events, 1)["operators"])["aten::copy_"]
    assert (copy["gpu_total"], copy["gpu_avg"], copy["gpu_max"], copy["gpu_min"]) == (
        us(10), us(5), us(10), us(0)
    )


def test_kernels_listed_before_their_ops_are_linked() -> None:
    events = [
        kernel("void k<float>(float*)", 50, 60, ext=7),
        ann("perfrun: ProfileStep#0", 0, 100),
        op("aten::relu", 10, 40, ext=7),
    ]
    relu = by_name(summarize(events, 1)["operators"])["aten::relu"]
    assert relu["gpu_total"] == us(10)
    assert relu["kernels"][0]["name"] == "k<float>"


def test_broadcast_tensors_is_not_communication() -> None:
    events = [
        ann("perfrun: ProfileStep#0", 0, 100),
        op("aten::broadcast_tensors", 0, 10),
        op("aten::mse_loss", 10, 30),
    ]
    cpu = summarize(events, 1)["distributed"]["cpu"]
    assert cpu["communication"] == 0.0
    assert cpu["computation"] == us(30)


# -- kernel names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3>)",
            "at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<...>, "
            "at::detail::Array<...> >",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
            "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>"
            "::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, "
            "4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
            "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::"
            "{lambda(float, float)#1}>, unsigned int, float, 4>)",
            "at::native::reduce_kernel<512, 1, at::native::ReduceOp<...> >",
        ),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
            "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
            "at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
            "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>"
            "(cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4::Params)",
            "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>",
        ),
        (
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        ),
        ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn"),
    ],
    ids=["elementwise", "reduce-with-lambda", "anonymous-namespace", "cutlass", "nccl", "plain"],
)
def test_short_kernel_name(name: str, short: str) -> None:
    assert short_kernel_name(name, width=200) == short


def test_short_kernel_name_is_cut_to_width() -> None:
    name = "void " + "a" * 100 + "<int>(int)"
    short = short_kernel_name(name, width=40)
    assert len(short) == 40 and short.endswith("...")
    assert short_kernel_name("", width=40) == ""


# -- sorting ---------------------------------------------------------------------

CPU_FIELDS = ("total", "avg", "max", "min")
GPU_FIELDS = ("gpu_total", "gpu_avg", "gpu_max", "gpu_min")


def rows_ordered_by(field: str, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows a, b, c whose `field` grows a -> c while every other field
    (and the name) orders them the other way, so only a sort on `field`
    puts c first."""
    rows = []
    for i, name in enumerate(("c", "b", "a")):
        row: dict[str, Any] = {"name": name}
        for f in fields:
            row[f] = (1 + i) * 1e-3
        row["calls"] = 1 + i
        rows.append(row)
    for i, row in enumerate(rows):
        row[field] = (10 - i) * 1e-3 if field != "calls" else 10 - i
    return rows


@pytest.mark.parametrize("sort_by", sorted(SORT_FIELDS))
def test_sort_rows_honours_every_key_on_operator_rows(sort_by: str) -> None:
    field = SORT_FIELDS[sort_by]
    if field == "name":
        rows = rows_ordered_by("total", CPU_FIELDS + GPU_FIELDS)
        assert [r["name"] for r in sort_rows(rows, sort_by)] == ["a", "b", "c"]
        return
    rows = rows_ordered_by(field, CPU_FIELDS + GPU_FIELDS)
    assert [r["name"] for r in sort_rows(rows, sort_by)] == ["c", "b", "a"]


@pytest.mark.parametrize("sort_by", sorted(SORT_FIELDS))
def test_sort_rows_honours_every_key_on_gpu_only_kernel_rows(sort_by: str) -> None:
    # Kernel rows carry GPU time in total/avg/max/min: gpu-avg sorts on avg,
    # cpu-avg too (the only time they have).
    field = SORT_FIELDS[sort_by]
    if field == "name":
        rows = rows_ordered_by("total", CPU_FIELDS)
        assert [r["name"] for r in sort_rows(rows, sort_by)] == ["a", "b", "c"]
        return
    own = {"gpu_total": "total", "gpu_avg": "avg", "gpu_max": "max", "gpu_min": "min"}
    rows = rows_ordered_by(own.get(field, field), CPU_FIELDS)
    assert all("gpu_total" not in r for r in rows)
    assert [r["name"] for r in sort_rows(rows, sort_by)] == ["c", "b", "a"]


def test_sort_rows_gpu_keys_on_a_cpu_only_run_sort_by_cpu_time() -> None:
    rows = rows_ordered_by("avg", CPU_FIELDS)
    for r in rows:
        r.update(dict.fromkeys(GPU_FIELDS))
    assert [r["name"] for r in sort_rows(rows, "gpu-avg")] == ["c", "b", "a"]


def test_sort_rows_puts_rows_without_gpu_time_last_and_ties_by_name() -> None:
    rows = [
        {"name": "z", "total": 5.0, "gpu_total": None, "calls": 1},
        {"name": "y", "total": 1.0, "gpu_total": 2.0, "calls": 1},
        {"name": "x", "total": 1.0, "gpu_total": 2.0, "calls": 1},
    ]
    assert [r["name"] for r in sort_rows(rows, "gpu-total")] == ["x", "y", "z"]
    assert [r["name"] for r in sort_rows(rows, "calls")] == ["x", "y", "z"]
    assert sort_rows([], "gpu-min") == []


def test_summary_rows_sort_on_real_fields() -> None:
    # Every sort key names a field the summary's operator rows really carry.
    ops = summarize(window_events(), 2)["operators"]
    for sort_by, field in SORT_FIELDS.items():
        assert all(field in r for r in ops), sort_by
    order = [r["name"] for r in sort_rows(ops, "gpu-max")]
    assert order[:2] == ["aten::addmm", "c10d::allreduce_"]
    assert [r["name"] for r in sort_rows(ops, "calls")][:2] == ["aten::addmm", "aten::linear"]


# -- the tables honour the view options -----------------------------------------------


def blocks(sort_by: str, limit: int, unit: str = "us") -> dict[str, TableBlock]:
    report = WindowReport(window=(5, 7), ranks=[RankWindow(0, summarize(window_events(), 2))])
    view = {"sort_by": sort_by, "row_limit": limit, "time_unit": unit}
    out = window_blocks(report, view, lambda _key: True)
    return {b.key: b for b in out if isinstance(b, TableBlock)}


def test_window_tables_honour_sort_row_limit_and_unit() -> None:
    tables = blocks("cpu-total", 2)
    assert [r[0] for r in tables["operator"].rows] == ["aten::linear", "aten::addmm"]
    # 280 µs printed in µs.
    assert tables["operator"].rows[0][2] == "280.000"
    assert [r[0] for r in tables["kernel"].rows] == [
        "gemm_kernel<float, cutlass::Epilogue<...> >",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "Total (2 kernels)",
    ]
    # The total row: every kernel, whatever the row limit.
    assert tables["kernel"].rows[-1][1:3] == ["3", "500.000"]
    # Copies sorted by time and cut to the limit; the sync line always last.
    assert [r[0] for r in tables["memcpy"].rows][:-1] == ["Memcpy HtoD", "Memcpy DtoH"]
    assert tables["memcpy"].rows[-1][1] == "3"
    tables = blocks("name", 3, "ms")
    assert [r[0] for r in tables["operator"].rows] == [
        "aten::_local_scalar_dense", "aten::addmm", "aten::copy_"
    ]
    assert tables["operator"].rows[1][2] == "0.240"
    assert [r[0] for r in tables["memcpy"].rows][:-1] == ["Memcpy DtoH", "Memcpy HtoD", "Memset"]
    # With a GPU, communication is the GPU's communication kernels.
    assert [r[0] for r in tables["distributed"].rows] == ["rank 0 (GPU)"]


# -- nested phases: the Overview counts what the step rows count ---------------------


def test_overview_phase_time_excludes_phases_nested_in_it() -> None:
    # Lightning's automatic optimization: Optimization 0..100 holds a
    # Closure 5..80, which holds Forward 10..30 and Backward 40..70. The rows
    # count Optimization 25 (the update), Forward 20, Backward 30 and the
    # closure's own 25 as Others; the Overview must say the same.
    events = [
        ann("perfrun: ProfileStep#3", 0, 110),
        ann("perfrun: Dataloader", 0, 0),
        ann("perfrun: Optimization", 0, 100),
        ann("perfrun: Closure", 5, 80),
        ann("perfrun: Forward", 10, 30),
        ann("perfrun: Backward", 40, 70),
    ]
    rows = {r["type"]: r for r in summarize(events, 1)["overview"]}
    got = {t: (rows[t]["calls"], rows[t]["time"]) for t in ("Optimization", "Forward", "Backward")}
    assert got == {
        "Optimization": (1, pytest.approx(25 * US)),
        "Forward": (1, pytest.approx(20 * US)),
        "Backward": (1, pytest.approx(30 * US)),
    }
    assert "Closure" not in rows


# -- evaluation passes: out of every window table, as out of the step rows -----------


def full_batch_steps_with_evaluation() -> list[dict[str, Any]]:
    """Two steps of a full-batch loop (PyG's examples): zero_grad, forward,
    backward, step, then `test()` under no_grad: two validation forwards
    with an argmax after each, and the accuracy's sum after the last."""
    events = []
    for k, t in enumerate((0.0, 1000.0)):
        events += [
            ann(f"perfrun: ProfileStep#{k + 10}", t, t + 1000),
            ann("perfrun: Optimization", t + 10, t + 20),
            ann("perfrun: Forward", t + 20, t + 220),
            op("aten::mm", t + 30, t + 200),
            ann("perfrun: Backward", t + 230, t + 430),
            op("aten::mm", t + 240, t + 420),
            ann("perfrun: Optimization", t + 440, t + 480),
            # Evaluation: first forward, its argmax, the second forward.
            ann("perfrun: Eval", t + 500, t + 600),
            op("aten::mm", t + 510, t + 590),
            op("aten::argmax", t + 610, t + 620),
            ann("perfrun: Eval", t + 630, t + 730),
            op("aten::mm", t + 640, t + 720),
            op("aten::argmax", t + 740, t + 750),
            # The accuracy after the last forward is the step's (Others).
            op("aten::sum", t + 760, t + 770),
        ]
    return events


def test_evaluation_passes_are_out_of_every_window_table() -> None:
    from perfrun.analysis.trace import evaluation_ranges
    from perfrun.analysis.tracefile import compact

    events = full_batch_steps_with_evaluation()
    # One pass per step, from the first Eval range to the end of the last.
    assert evaluation_ranges(compact(events)) == [(T0 + 500, T0 + 730), (T0 + 1500, T0 + 1730)]
    s = summarize(events, 2)
    rows = overview(s)
    # The step rows count 1000 - 230 µs a step: the window's ProfileStep too.
    assert rows["ProfileStep"]["time"] == pytest.approx(2 * 770 * US)
    assert s["window_time"] == pytest.approx(2 * 770 * US)
    assert rows["ProfileStep"]["ratio"] == pytest.approx(1.0)
    assert s["evaluation"] == {
        "passes": 2,
        "time": pytest.approx(2 * 230 * US),
        "operator_calls": 6,
        "operator_time": pytest.approx(2 * 170 * US),
    }
    ops = by_name(s["operators"])
    assert ops["aten::mm"]["calls"] == 4  # the training forward and backward, twice
    assert ops["aten::sum"]["calls"] == 2
    # The argmax after the first forward is inside the pass; after the
    # second, the pass has ended (as StepTracker's span ends with its last
    # evaluation event).
    assert ops["aten::argmax"]["calls"] == 2
    assert rows["Operator"]["calls"] == 8


def test_an_evaluation_pass_ends_at_a_training_phase_or_a_step_edge() -> None:
    from perfrun.analysis.trace import evaluation_ranges
    from perfrun.analysis.tracefile import compact

    events = [
        ann("perfrun: ProfileStep#1", 0, 100),
        ann("perfrun: Eval", 10, 20),
        ann("perfrun: Forward", 25, 30),  # a training phase between: two passes
        ann("perfrun: Eval", 40, 50),
        ann("perfrun: Forward", 42, 48),  # nested in the pass: not a training phase
        ann("perfrun: Eval", 60, 90),
        ann("perfrun: ProfileStep#2", 100, 200),
        ann("perfrun: Eval", 110, 120),  # the next step's: a pass of its own
    ]
    assert evaluation_ranges(compact(events)) == [
        (T0 + 10, T0 + 20), (T0 + 40, T0 + 90), (T0 + 110, T0 + 120),
    ]
    assert evaluation_ranges(compact(events[:1])) == []


def test_module_calls_in_evaluation_passes_are_counted_apart() -> None:
    from perfrun.analysis.modules import summarize_modules

    events = [
        ann("perfrun.module: gcn", 20, 220),
        ann("perfrun.module: gcn.conv1", 30, 120),
        ann("perfrun.module: gcn", 500, 600),
        ann("perfrun.module: gcn.conv1", 510, 550),
        ann("perfrun.module: head", 640, 700),  # only ever called in evaluation
    ]
    out = summarize_modules(events, 770 * US, None, [(T0 + 500, T0 + 730)])
    rows = by_name(out["modules"])
    assert set(rows) == {"gcn", "gcn.conv1"}
    assert (rows["gcn"]["calls"], rows["gcn"]["eval_calls"]) == (1, 1)
    assert rows["gcn"]["forward"] == pytest.approx(200 * US)
    assert out["eval_calls"] == 3


def test_untraced_time_at_phase_edges_is_said_as_such() -> None:
    from builders import make_rows

    from perfrun.analysis.summary import model_summary
    from perfrun.analysis.window import untraced

    # Five steps of 10 ms: Forward 3 ms each in the step rows.
    model = model_summary(make_rows([{"forward": 0.003, "backward": 0.004}] * 5))
    agree = [{"type": "Forward", "time": 0.015 - 200e-6}, {"type": "Backward", "time": 0.020}]
    assert untraced(model, agree) == []
    # 2.1 ms that the trace's Forward ranges do not hold (a gap at an edge).
    gap = [{"type": "Forward", "time": 0.015 - 2.1e-3}, {"type": "Backward", "time": 0.020}]
    (line,) = untraced(model, gap)
    assert line.startswith("Forward: the step table counts 2.100 ms more than the trace's")
    assert "no trace event" in line


def test_rename_phases_follows_the_step_trackers_final_names() -> None:
    from perfrun.runtime.window import rename_phases

    # Step 4: an evaluation batch fetched with gradients on (named Dataloader
    # when it began, Eval once its forward was seen), then its forward.
    events = [
        ann("perfrun: ProfileStep#4", 0, 100),
        ann("perfrun: Dataloader", 1, 10),
        ann("perfrun: Eval", 11, 30),
        ann("perfrun: Dataloader", 40, 50),
        ann("perfrun: Forward", 51, 60),
        ann("perfrun: Closure", 52, 58),  # nested: not one of the step's top-level phases
        ann("perfrun: ProfileStep#5", 100, 120),
        ann("perfrun: Dataloader", 101, 102),
    ]
    renamed = rename_phases(events, {4: ["Eval", "Eval", "Dataloader", "Forward"], 5: ["X", "Y"]})
    assert renamed == 1
    assert [e["name"] for e in events][1:5] == [
        "perfrun: Eval", "perfrun: Eval", "perfrun: Dataloader", "perfrun: Forward",
    ]
    # Step 5's list does not match its ranges one for one: left as it was.
    assert events[-1]["name"] == "perfrun: Dataloader"


# -- links, names, window: the rules real traces broke ---------------------------------


def corr(e: dict[str, Any], correlation: int) -> dict[str, Any]:
    e["args"]["correlation"] = correlation
    return e


def test_a_kernel_belongs_to_the_op_around_its_launch_not_to_its_external_id() -> None:
    # Older Kineto writes the correlation id into a kernel's External id:
    # here it is 11, which is also aten::relu's own External id. The kernel
    # was launched inside aten::mm (its runtime call has correlation 11).
    events = [
        ann("ProfilerStep#7", 0, 100),
        op("aten::relu", 0, 5, ext=11),
        op("aten::mm", 10, 40, ext=3),
        corr(runtime("cudaLaunchKernel", 12, 14, ext=11), 11),
        corr(kernel("void gemm<float>(float*)", 20, 50, ext=11), 11),
    ]
    ops = by_name(summarize(events)["operators"])
    assert ops["aten::mm"]["gpu_total"] == us(30)
    assert ops["aten::relu"]["gpu_total"] is None


def test_kernels_that_shorten_alike_are_numbered_not_merged() -> None:
    a = "void elementwise_kernel<128, 2, Functor<float, Add> >(int, Functor<float, Add>)"
    b = "void elementwise_kernel<128, 2, Functor<float, Mul> >(int, Functor<float, Mul>)"
    events = [
        ann("ProfilerStep#1", 0, 100),
        kernel(a, 10, 20),
        kernel(b, 20, 50),
        kernel(b, 50, 60),
    ]
    rows = {r["full_name"]: r for r in summarize(events)["kernels"]}
    assert (rows[a]["calls"], rows[b]["calls"]) == (1, 2)
    assert rows[b]["name"] == "elementwise_kernel<128, 2, Functor<...> > #1"  # most time
    assert rows[a]["name"] == "elementwise_kernel<128, 2, Functor<...> > #2"


def test_gpu_work_launched_in_the_window_counts_past_its_last_edge() -> None:
    events = [
        ann("ProfilerStep#1", 0, 100),
        ann("ProfilerStep#2", 100, 200),
        corr(runtime("cudaLaunchKernel", 190, 195), 5),
        corr(kernel("void late<float>(float*)", 196, 300), 5),
        # Launched after the last step: in no table.
        corr(runtime("cudaLaunchKernel", 210, 215), 6),
        corr(kernel("void after<float>(float*)", 300, 310), 6),
    ]
    s = summarize(events)
    assert (s["steps"], s["steps_from"], s["step_ids"]) == (2, "ProfilerStep", [1, 2])
    assert s["window_time"] == us(300) and s["window_gpu_tail"] == us(100)
    assert [k["name"] for k in s["kernels"]] == ["late<float>"]
    (g,) = s["gpus"]
    assert (g["busy"], g["utilization"]) == (us(104), pytest.approx(104 / 300))
    assert g["span_utilization"] == pytest.approx(1.0)
    o = overview(s)
    assert o["ProfileStep"]["calls"] == 2 and o["Kernel"]["ratio"] == pytest.approx(104 / 300)


def test_item_on_a_cpu_tensor_is_no_synchronisation_even_beside_a_gpu() -> None:
    events = [
        ann("ProfilerStep#0", 0, 100),
        op("aten::_local_scalar_dense", 1, 2),  # a CPU tensor: no CUDA call
        op("aten::_local_scalar_dense", 10, 20),
        runtime("cudaMemcpyAsync", 11, 12),
        runtime("cudaStreamSynchronize", 12, 19),
        op("aten::nonzero", 30, 40),
        runtime("cudaStreamSynchronize", 31, 39),
        kernel("void k<float>(float*)", 5, 9),
    ]
    mm = summarize(events)["memory_manipulation"]
    assert mm["sync_calls"] == 2
    assert mm["sync_by_op"] == {"aten::_local_scalar_dense": 1, "aten::nonzero": 1}


def test_under_nsys_the_report_says_where_the_gpu_tables_are() -> None:
    from builders import make_rank, make_rows

    from perfrun.analysis.window import window_report

    rows = make_rows([{"forward": 0.01}] * 12)
    for nsys in (False, True):
        rank = make_rank(rows, window=[4, 6], settings={"nsys": nsys, "scheduler": [4, 6]})
        rank.data["window_summary"] = summarize(window_events(), 2)
        w = window_report([rank], rank, (4, 6), warmup=0)
        assert w is not None
        out = window_blocks(w, {}, lambda _key: True)
        overview_info = next(b for b in out if b.key == "overview").info
        said = [line for line in overview_info if "nsys report" in line]
        assert bool(said) is nsys
    assert "nsys/rank<R>.nsys-rep" in said[0]


@pytest.mark.parametrize("warm", [0, 1])
@pytest.mark.parametrize("active", [1, 2, 5])
def test_the_window_schedule_is_torchs_without_its_warning(warm: int, active: int) -> None:
    """perfrun's schedule takes the actions torch.profiler.schedule(wait=0,
    warmup=warm, active=active, repeat=1) takes, step by step, and a window
    from step 0 (warm 0) warns nothing: torch's own would, from perfrun's
    file, in the script's output."""
    import warnings

    import torch

    from perfrun.runtime.window import schedule_action, torch_schedule

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        theirs = torch.profiler.schedule(wait=0, warmup=warm, active=active, repeat=1)
        ours = torch_schedule(torch, warm, active)
        actions = [ours(step) for step in range(warm + active + 3)]
    assert [a.name for a in actions] == [theirs(step).name for step in range(warm + active + 3)]
    assert [schedule_action(s, warm, active) for s in range(warm + active + 3)] == [
        a.name for a in actions]
    assert len(warned) == (1 if warm == 0 else 0)  # torch's own schedule, not ours


def test_others_is_the_steps_time_outside_the_phases_and_its_operators_are_named() -> None:
    """Two steps of 1,000 us; phases cover 600 us of each. Between them the
    loop runs an index (with an op nested in it, counted once), a loss and
    a hand-written update; an op inside Forward and one before the first
    step are not Others'."""
    events = [
        ann("perfrun: ProfileStep#0", 0, 1000), ann("perfrun: ProfileStep#1", 1000, 2000),
        ann("perfrun: Forward", 100, 400), ann("perfrun: Backward", 500, 800),
        ann("perfrun: Forward", 1100, 1400), ann("perfrun: Backward", 1500, 1800),
        op("aten::addmm", 150, 350),  # in Forward
        op("aten::rand", -50, -10),  # before the window's steps
        op("aten::index", 10, 60), op("aten::slice", 20, 30),  # nested: counted once
        op("aten::index", 1010, 1070),
        op("aten::cross_entropy_loss", 420, 480), op("aten::cross_entropy_loss", 1420, 1490),
        op("aten::sub_", 850, 900), op("aten::sub_", 1850, 1880),
    ]
    others = summarize(events)["others"]
    assert others["time"] == pytest.approx(2 * 400e-6)
    assert others["operators"] == pytest.approx((50 + 60 + 60 + 70 + 50 + 30) * 1e-6)
    assert [(t["name"], t["calls"]) for t in others["top"]] == [
        ("aten::cross_entropy_loss", 2), ("aten::index", 2), ("aten::sub_", 2)]
    assert others["top"][0]["total"] == pytest.approx(130e-6)
