"""The window tables on real GPU traces (tests/data/traces/, recorded by
others on machines with NVIDIA GPUs), held against figures computed here
independently: a few lines over the raw JSON each, sharing no code with
perfrun's analysis. Where the data's README gives a figure, it is used as
written.

Each trace exercises one way the tables used to go wrong: kernels merged by
their shortened names, kernels linked to no op in older Kineto, `.item()` on
CPU tensors counted as synchronisations, the Distributed verdict read from
CPU time, GPU work cut off at the last step edge, and `ProfilerStep#N`
steps not understood.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import subprocess
import sys
from functools import cache
from typing import Any

import pytest
from conftest import flat

from perfrun.analysis.trace import summarize
from perfrun.analysis.tracefile import TraceError, load_trace
from perfrun.exitcodes import ExitCode

DATA = os.path.join(os.path.dirname(__file__), "data", "traces")
RANK0 = os.path.join(DATA, "nccl_two_ranks", "rank0.json.gz")
RANK1 = os.path.join(DATA, "nccl_two_ranks", "rank1.json.gz")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
MS = 1e-3


# -- independent computations over the raw JSON ---------------------------------------


@cache
def raw(name: str) -> tuple[dict[str, Any], ...]:
    with gzip.open(os.path.join(DATA, name), "rt", encoding="utf-8") as f:
        return tuple(json.load(f)["traceEvents"])


@cache
def summary(name: str) -> dict[str, Any]:
    return summarize(load_trace(os.path.join(DATA, name)).events)


def union_ms(intervals: list[tuple[float, float]]) -> float:
    out = 0.0
    cur_a = cur_b = None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                out += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        out += cur_b - cur_a
    return out / 1e3


def steps_of(events: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]


def gpu_events(events: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") in GPU_CATS]


def iv(e: dict[str, Any]) -> tuple[float, float]:
    return (e["ts"], e["ts"] + e["dur"])


def is_nccl(e: dict[str, Any]) -> bool:
    return "nccl" in e["name"].lower()


# -- nccl_two_ranks: older Kineto, the README's figures ---------------------------------


def test_rank0_matches_the_independent_figures() -> None:
    s = summary("nccl_two_ranks/rank0.json.gz")
    o = {r["type"]: r for r in s["overview"]}
    assert s["kernel_total"]["total"] / MS == pytest.approx(606.519, abs=5e-4)
    assert o["Kernel"]["time"] / MS == pytest.approx(210.320, abs=5e-4)
    assert o["Communication"]["time"] / MS == pytest.approx(396.199, abs=5e-4)
    gpu = s["distributed"]["gpu"]
    assert gpu["overlap"] / MS == pytest.approx(59.216, abs=5e-4)
    assert gpu["overlap_of_communication"] == pytest.approx(0.1495, abs=5e-5)
    assert (o["Memcpy"]["time"] + o["Memset"]["time"]) / MS == pytest.approx(1.325, abs=5e-4)
    (g,) = s["gpus"]
    assert g["span_idle"] / MS == pytest.approx(675.191, abs=5e-4)
    assert g["span_utilization"] == pytest.approx(0.4479, abs=5e-5)


def test_rank1_matches_a_computation_over_its_json() -> None:
    events = raw("nccl_two_ranks/rank1.json.gz")
    gpu = gpu_events(events)
    kernels = [e for e in gpu if e["cat"] == "kernel"]
    s = summary("nccl_two_ranks/rank1.json.gz")
    o = {r["type"]: r for r in s["overview"]}
    assert s["kernel_total"]["total"] / MS == pytest.approx(sum(e["dur"] for e in kernels) / 1e3)
    nccl = [iv(e) for e in kernels if is_nccl(e)]
    compute = [iv(e) for e in kernels if not is_nccl(e)]
    assert o["Communication"]["time"] / MS == pytest.approx(union_ms(nccl))
    assert o["Kernel"]["time"] / MS == pytest.approx(union_ms(compute))
    overlap = union_ms(nccl) + union_ms(compute) - union_ms(nccl + compute)
    assert s["distributed"]["gpu"]["overlap"] / MS == pytest.approx(overlap, abs=1e-6)
    busy = union_ms([iv(e) for e in gpu])
    span = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / 1e3
    (g,) = s["gpus"]
    assert g["device"] == 1
    assert g["busy"] / MS == pytest.approx(busy)
    assert g["span_idle"] / MS == pytest.approx(span - busy)


def innermost_ops(events: tuple[dict[str, Any], ...]) -> dict[Any, str]:
    """correlation id -> name of the innermost cpu_op around the runtime
    call with that id, on the call's own thread (brute force per thread)."""
    ops: dict[Any, list[dict[str, Any]]] = {}
    for i, e in enumerate(events):
        if e.get("cat") == "cpu_op":
            ops.setdefault((e["pid"], e["tid"]), []).append({**e, "order": i})
    for v in ops.values():
        v.sort(key=lambda e: e["ts"])
    starts = {k: [x["ts"] for x in v] for k, v in ops.items()}
    out = {}
    for e in events:
        if e.get("cat") != "cuda_runtime":
            continue
        thread = ops.get((e["pid"], e["tid"]), [])
        # Back from the last op to start before the call: the first that
        # contains it is the innermost (of two with one start, the later
        # written: torch writes a parent first, and the sort keeps order).
        at = bisect.bisect_right(starts.get((e["pid"], e["tid"]), []), e["ts"])
        for x in reversed(thread[:at]):
            if x["ts"] + x["dur"] >= e["ts"] + e["dur"]:
                out[e["args"]["correlation"]] = x["name"]
                break
    return out


def test_older_kineto_links_kernels_to_ops_through_correlation_ids() -> None:
    events = raw("nccl_two_ranks/rank0.json.gz")
    # The premise: a kernel's External id is its correlation id, no op's id.
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert all(k["args"]["External id"] == k["args"]["correlation"] for k in kernels)
    by_op: dict[str, float] = {}
    made_by = innermost_ops(events)
    for e in gpu_events(events):
        name = made_by.get(e["args"]["correlation"])
        if name is not None:
            by_op[name] = by_op.get(name, 0.0) + e["dur"] / 1e6
    ops = {r["name"]: r for r in summary("nccl_two_ranks/rank0.json.gz")["operators"]}
    got = {n: r["gpu_total"] for n, r in ops.items() if r["gpu_total"]}
    assert len(got) > 20
    assert got.keys() == by_op.keys()
    for name, t in by_op.items():
        assert got[name] == pytest.approx(t), name
    assert got["aten::mm"] > 0.040


def test_newer_kineto_gives_the_same_links_both_ways() -> None:
    # Where External ids do link kernels to ops, the op around the
    # launching call is the same op for (nearly) every kernel.
    events = raw("nccl_data.json.gz")
    op_by_ext = {e["args"]["External id"]: e["name"] for e in events
                 if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    made_by = innermost_ops(events)
    linked = agree = 0
    for k in gpu_events(events):
        a = op_by_ext.get(k["args"].get("External id"))
        b = made_by.get(k["args"].get("correlation"))
        if a is not None and b is not None:
            linked += 1
            agree += a == b
    assert linked > 3000 and agree / linked > 0.99
    ops = summary("nccl_data.json.gz")["operators"]
    total = sum(r["gpu_total"] or 0.0 for r in ops)
    independent = sum(k["dur"] for k in gpu_events(events)
                      if k["args"].get("correlation") in made_by) / 1e6
    assert total == pytest.approx(independent)


# -- kernel names ------------------------------------------------------------------------


def test_kernels_are_grouped_by_their_full_names() -> None:
    events = raw("templated_kernels.json.gz")
    names: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "kernel":
            names[e["name"]] = names.get(e["name"], 0) + 1
    rows = summary("templated_kernels.json.gz")["kernels"]
    assert {r["full_name"]: r["calls"] for r in rows} == names
    shown = [r["name"] for r in rows]
    assert len(set(shown)) == len(shown) == len(names)
    assert all(len(n) <= 160 for n in shown)
    # Several `elementwise_kernel<128, 2, ...>` rows, each its own.
    assert sum(n.startswith("at::native::elementwise_kernel<128, 2,") for n in shown) > 3


# -- synchronisations --------------------------------------------------------------------


def test_only_synchronising_cuda_calls_are_synchronisations() -> None:
    events = raw("sync_copies.json.gz")
    steps = steps_of(events)
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    calls = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] in SYNC]
    inside = [e for e in calls if lo <= e["ts"] < hi]
    assert (len(calls), len(inside)) == (76, 75)  # one after the last step
    scalar = [e for e in events if e.get("name") == "aten::_local_scalar_dense"]
    assert len(scalar) == 945
    mm = summary("sync_copies.json.gz")["memory_manipulation"]
    assert mm["sync_calls"] == 75
    assert mm["sync_per_step"] == pytest.approx(75 / len(steps))
    assert "aten::_local_scalar_dense" not in mm["sync_by_op"]


# -- the window ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["nccl_two_ranks/rank0.json.gz", "nccl_data.json.gz", "sync_copies.json.gz",
     "templated_kernels.json.gz", "kernels_past_last_step.pt.trace.json.gz",
     "cpu_only.pt.trace.json.gz"],
)
def test_profiler_steps_are_steps_and_the_window_holds_their_gpu_work(name: str) -> None:
    events = raw(name)
    steps = steps_of(events)
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    # GPU work launched inside the steps (the launching runtime call found
    # by correlation id), or with no launch in the trace, started in them.
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    end = hi
    for e in gpu_events(events):
        at = launched.get(e["args"].get("correlation"), e["ts"])
        if lo <= at < hi:
            end = max(end, e["ts"] + e["dur"])
    s = summary(name)
    assert s["steps"] == len(steps) and s["steps_from"] == "ProfilerStep"
    assert s["window_time"] / MS == pytest.approx((end - lo) / 1e3)
    for row in s["overview"]:
        assert row["ratio"] is None or row["ratio"] <= 1.0 + 1e-9, row
    for g in s["gpus"]:
        assert g["busy"] <= s["window_time"] + 1e-9


def test_gpu_work_after_the_last_step_edge_is_in_the_window() -> None:
    events = raw("kernels_past_last_step.pt.trace.json.gz")
    hi = max(e["ts"] + e["dur"] for e in steps_of(events))
    tail = max(e["ts"] + e["dur"] for e in gpu_events(events)) - hi
    s = summary("kernels_past_last_step.pt.trace.json.gz")
    assert s["window_gpu_tail"] / MS == pytest.approx(tail / 1e3)
    assert tail / 1e3 == pytest.approx(89.238, abs=1e-3)
    kernels = sum(e["dur"] for e in events if e.get("cat") == "kernel") / 1e6
    assert s["kernel_total"]["total"] == pytest.approx(kernels)
    # One stream: summed kernel time cannot pass the window.
    assert s["kernel_total"]["ratio"] < 1.0


def test_a_trace_without_gpu_events() -> None:
    s = summary("cpu_only.pt.trace.json.gz")
    assert s["gpus"] == [] and s["kernels"] == []
    assert s["distributed"]["basis"] == "cpu"
    assert s["memory_manipulation"]["sync_calls"] == 0


# -- perfrun analyze ---------------------------------------------------------------------


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfrun", "analyze", *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_analyze_prints_the_independent_figures_for_two_ranks() -> None:
    out = analyze(RANK0, RANK1, "--row-limit", "5")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for figure in ("606.519", "210.320", "396.199", "59.216", "44.79", "675.191"):
        assert figure in text, figure
    # The verdict is read from NCCL kernel time, not CPU time.
    assert "rank 0 spends the most time in communication kernels" in text
    # The sentence wraps at 80 columns in a pipe: read as its words.
    assert "(396.199 ms vs 379.053 ms on rank 1)" in " ".join(text.split())
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_analyze_json_and_markdown() -> None:
    out = analyze(RANK0, "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["format"] == "perfrun-analyze" and doc["version"] == 1
    (trace,) = doc["traces"]
    assert trace["summary"]["kernel_total"]["calls"] == 1154
    out = analyze(RANK0, "--format", "markdown", "--time-unit", "us")
    assert out.returncode == 0, out.stderr
    assert "| ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t |" in out.stdout
    assert "396199.000" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no such file"),
        (b"not json at all", "not JSON"),
        (b'{"schemaVersion": 1}', "no traceEvents list"),
        (b"\x1f\x8b\x08\x00broken", "damaged gzip data"),
        (b"\xff\xfe\x00x", "not UTF-8"),
        (b'{"traceEvents": []}', "the trace holds no events"),
        (b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "ts": 0}, '
         b'{"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 5}]}',
         "the trace holds no timed events"),
    ],
    ids=["missing", "not-json", "no-events", "bad-gzip", "not-utf8", "empty", "no-spans"],
)
def test_analyze_refuses_what_is_not_a_trace(tmp_path: Any, content: Any, reason: str) -> None:
    path = tmp_path / "trace.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TraceError, match=reason):
        load_trace(str(path))
    out = analyze(str(path))
    assert out.returncode == ExitCode.BAD_RESULTS
    assert out.stderr.count("\n") == 1 and reason in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_analyze_skips_malformed_events_and_says_so(tmp_path: Any) -> None:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100,
         "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 20, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::bad", "ts": "soon", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::neg", "ts": 5, "dur": -5},
        7,
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    out = analyze(str(path))
    assert out.returncode == 0, out.stderr
    assert "3 malformed events skipped" in flat(out.stdout)
    assert "aten::mm" in out.stdout
