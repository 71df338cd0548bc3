"""Window tables from a torch.profiler trace: pure functions over the trace's
event list (Chrome trace format), so they are unit-tested on hand-made events
and `perfrun report` can recompute them.

Correctness rules that Paddle's tables break and these keep:

* Overview time per event type is the *union* of that type's intervals
  (several threads or streams overlapping are merged before summing), and
  every interval is clipped to the window, so no type exceeds 100%.
* perfrun's phase ranges nest (forward and backward inside an optimizer
  step's closure): a phase's time is its range less the phase ranges inside
  it, as the step rows count it, so the Overview and the Model Summary agree.
* Others never goes negative (it is a clamped difference).
* Every table honours every sort key.
* Ratios with a zero denominator are None (printed as "-"), never a division
  error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from .modules import MODULE_PREFIX

# perfrun's own annotations in the trace (recorded during the window).
PHASE_PREFIX = "perfrun: "
STEP_PREFIX = "perfrun: ProfileStep#"
PHASE_TYPES = ("Dataloader", "Forward", "Backward", "Optimization")

CPU_TYPES = ("ProfileStep",) + PHASE_TYPES + ("Operator", "CudaRuntime", "UserDefined")
GPU_TYPES = ("Kernel", "Memcpy", "Memset", "Communication")

# Annotations torch itself adds; not the user's own ranges.
_TORCH_ANNOTATIONS = (
    "ProfilerStep#",
    "Optimizer.step#",
    "Optimizer.zero_grad#",
    "## forward",
    "## backward",
    "autograd::",
    "enumerate(DataLoader)#",
)
_COMM_OP = re.compile(
    r"^(c10d::|gloo:|nccl:|record_param_comms)|(^|::)(all_?reduce|all_?gather|"
    r"reduce_?scatter|broadcast|all_to_all|barrier)",
    re.IGNORECASE,
)
# `.item()` reaches aten::_local_scalar_dense (counted once, not with aten::item).
_SYNC_OPS = ("aten::_local_scalar_dense",)
_SYNC_RUNTIME = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cuMemcpyDtoH_v2",
    "cudaMemcpyAsync",
)

Interval = tuple[float, float]


# -- interval arithmetic --------------------------------------------------------


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
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


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


def exclusive_phases(ranges: Sequence[dict[str, Any]]) -> list[tuple[str, list[Interval]]]:
    """perfrun's phase ranges (one thread, properly nested) as (phase name,
    its own intervals: the range less the phase ranges nested in it), in
    time order."""
    items = sorted(ranges, key=lambda e: (e["ts"], -e["dur"]))
    out: list[tuple[str, list[Interval]]] = []
    children: list[list[Interval]] = []
    stack: list[int] = []
    ends: list[float] = []
    for e in items:
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and start >= ends[-1] - 1e-3:
            stack.pop()
            ends.pop()
        if stack:
            children[stack[-1]].append((start, end))
        stack.append(len(out))
        ends.append(end)
        out.append((str(e.get("name", ""))[len(PHASE_PREFIX):], [(start, end)]))
        children.append([])
    return [
        (name, subtract(iv[0], merge(kids)) if kids else iv)
        for (name, iv), kids in zip(out, children)
    ]


# -- names --------------------------------------------------------------------


def short_kernel_name(name: str, width: int = 72) -> str:
    """`void at::native::vectorized_elementwise_kernel<4, Functor<float>>(int, ...)`
    -> `at::native::vectorized_elementwise_kernel<4, Functor<...>>`: drop the
    return type and parameters, elide nested template arguments."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    # Drop the parameter list: the last top-level "(...)", matched from the
    # end, so that "(anonymous namespace)" earlier in the name stays.
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            if text[i] == ")":
                depth += 1
            elif text[i] == "(":
                depth -= 1
                if depth == 0:
                    text = text[:i]
                    break
    out = []
    depth = 0
    for ch in text:
        if ch == "<":
            depth += 1
            if depth == 2:
                out.append("<...>")
            if depth >= 2:
                continue
        elif ch == ">" and depth > 0:
            depth -= 1
            if depth >= 1:
                continue
        if depth >= 2:
            continue
        out.append(ch)
    short = "".join(out).strip()
    if len(short) > width:
        short = short[: width - 3] + "..."
    return short or name[:width]


def is_communication(name: str) -> bool:
    if name.startswith("aten::"):
        # No aten op is a collective (aten::broadcast_tensors, aten::broadcast_to).
        return False
    return bool(_COMM_OP.search(name)) or "nccl" in name.lower()


# Host-side events torch nests into one call tree per thread.
_TREE_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def redispatched(spans: Sequence[dict[str, Any]]) -> set[int]:
    """Indices (into `spans`) of the events torch's own aggregation drops: an
    event whose parent has the same name and no other child is one call seen
    twice (an op redispatching to itself, `aten::div_` inside `aten::div_`),
    so counting both would double its calls and time. Same rule as
    torch.autograd.profiler_util.EventList._remove_dup_nodes."""
    threads: dict[Any, list[tuple[int, int, int]]] = {}
    for i, e in enumerate(spans):
        if e.get("cat") in _TREE_CATS:
            # Integer nanoseconds: microsecond floats near 4e12 cannot tell
            # a child that ends with its parent from one that ends after it.
            start = round(e["ts"] * 1000)
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(
                (start, start + round(e["dur"] * 1000), i)
            )
    parent: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for events in threads.values():
        events.sort(key=lambda x: (x[0], -x[1]))
        stack: list[tuple[int, int, int]] = []
        for start, end, i in events:
            while stack and (start >= stack[-1][1] or end > stack[-1][1]):
                stack.pop()
            if stack:
                parent[i] = stack[-1][2]
                children.setdefault(stack[-1][2], []).append(i)
            stack.append((start, end, i))
    dropped: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, p in list(parent.items()):
            if (
                i not in dropped
                and spans[p].get("name") == spans[i].get("name")
                and len(children.get(p, ())) == 1
            ):
                dropped.add(i)
                children[p] = children.pop(i, [])
                for c in children[p]:
                    parent[c] = p
                del parent[i]
                changed = True
    return dropped


# -- the summary -----------------------------------------------------------------


def _stats(durations: list[float]) -> dict[str, Any]:
    n = len(durations)
    s = sum(durations)
    return {
        "calls": n,
        "total": s,
        "avg": s / n if n else None,
        "max": max(durations) if n else None,
        "min": min(durations) if n else None,
    }


def _ratio(part: float, whole: float) -> Optional[float]:
    return part / whole if whole > 0 else None


def summarize(events: Sequence[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Aggregate a window's trace events into the data every window table is
    printed from. Times in seconds (the trace's are microseconds)."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    # Kernels keep their link to an op even when the op's redispatched copy
    # (the one that launched them) is dropped: both carry the same name.
    ext_to_op: dict[Any, str] = {}
    for e in spans:
        ext = (e.get("args") or {}).get("External id")
        if e.get("cat") == "cpu_op" and ext is not None:
            ext_to_op[ext] = e.get("name", "")
    dropped = redispatched(spans)
    spans = [e for i, e in enumerate(spans) if i not in dropped]
    step_iv = [
        (e["ts"], e["ts"] + e["dur"])
        for e in spans
        if e.get("cat") == "user_annotation" and e["name"].startswith(STEP_PREFIX)
    ]
    if step_iv:
        lo = min(a for a, _ in step_iv)
        hi = max(b for _, b in step_iv)
    elif spans:
        lo = min(e["ts"] for e in spans)
        hi = max(e["ts"] + e["dur"] for e in spans)
    else:
        lo = hi = 0.0
    window = hi - lo

    by_type: dict[str, list[Interval]] = {t: [] for t in CPU_TYPES + GPU_TYPES}
    calls: dict[str, int] = dict.fromkeys(by_type, 0)
    ops: dict[str, list[float]] = {}
    op_gpu: dict[str, float] = {}
    # GPU time of each op call (its External id): the Operator table's GPU
    # Avg / Max / Min, which --sort-by gpu-avg/max/min sort on.
    call_gpu: dict[Any, float] = {}
    op_flops: dict[str, float] = {}
    op_kernels: dict[str, dict[str, list[float]]] = {}
    kernels: dict[str, list[float]] = {}
    user: dict[str, list[float]] = {}
    memcpy: dict[str, list[float]] = {}
    comm_cpu: list[Interval] = []
    comm_gpu: list[Interval] = []
    compute_cpu: list[Interval] = []
    compute_gpu: list[Interval] = []
    sync_ops: dict[Any, list[Interval]] = {}
    sync_runtime: list[tuple[Any, Interval]] = []
    phase_ranges: list[dict[str, Any]] = []

    for e in spans:
        cat = e.get("cat")
        name = e.get("name", "")
        iv = (e["ts"], e["ts"] + e["dur"])
        if cat == "user_annotation":
            if name.startswith(STEP_PREFIX):
                by_type["ProfileStep"].append(iv)
                calls["ProfileStep"] += 1
            elif name.startswith(PHASE_PREFIX):
                phase_ranges.append(e)
            elif name.startswith(MODULE_PREFIX):
                pass  # perfrun's own per-module ranges (the Module Summary's)
            elif is_communication(name):
                comm_cpu.append(iv)
            elif not name.startswith(_TORCH_ANNOTATIONS):
                by_type["UserDefined"].append(iv)
                calls["UserDefined"] += 1
                user.setdefault(name, []).append(e["dur"] / 1e6)
        elif cat == "cpu_op":
            by_type["Operator"].append(iv)
            calls["Operator"] += 1
            ops.setdefault(name, []).append(e["dur"] / 1e6)
            args = e.get("args") or {}
            if "flops" in args:
                op_flops[name] = op_flops.get(name, 0.0) + float(args["flops"] or 0)
            if is_communication(name):
                comm_cpu.append(iv)
            else:
                compute_cpu.append(iv)
            if name in _SYNC_OPS:
                sync_ops.setdefault((e.get("pid"), e.get("tid")), []).append(iv)
        elif cat in ("cuda_runtime", "cuda_driver"):
            by_type["CudaRuntime"].append(iv)
            calls["CudaRuntime"] += 1
            if name in _SYNC_RUNTIME and name != "cudaMemcpyAsync":
                sync_runtime.append(((e.get("pid"), e.get("tid")), iv))
        elif cat == "kernel":
            short = short_kernel_name(name)
            kernels.setdefault(short, []).append(e["dur"] / 1e6)
            if is_communication(name):
                by_type["Communication"].append(iv)
                calls["Communication"] += 1
                comm_gpu.append(iv)
            else:
                by_type["Kernel"].append(iv)
                calls["Kernel"] += 1
                compute_gpu.append(iv)
            ext = (e.get("args") or {}).get("External id")
            op = ext_to_op.get(ext)
            if op is not None:
                op_gpu[op] = op_gpu.get(op, 0.0) + e["dur"] / 1e6
                call_gpu[ext] = call_gpu.get(ext, 0.0) + e["dur"] / 1e6
                op_kernels.setdefault(op, {}).setdefault(short, []).append(e["dur"] / 1e6)
        elif cat == "gpu_memcpy":
            by_type["Memcpy"].append(iv)
            calls["Memcpy"] += 1
            kind = "DtoD"
            for k in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP"):
                if k in name:
                    kind = k
                    break
            memcpy.setdefault(f"Memcpy {kind}", []).append(e["dur"] / 1e6)
        elif cat == "gpu_memset":
            by_type["Memset"].append(iv)
            calls["Memset"] += 1
            memcpy.setdefault("Memset", []).append(e["dur"] / 1e6)

    for name, own in exclusive_phases(phase_ranges):
        if name in by_type:
            by_type[name].extend(own)
            calls[name] += 1

    overview = []
    for t in CPU_TYPES + GPU_TYPES:
        merged = merge(clip(by_type[t], lo, hi))
        busy = total(merged) / 1e6
        overview.append(
            {
                "type": t,
                "side": "gpu" if t in GPU_TYPES else "cpu",
                "calls": calls[t],
                "time": busy,
                "ratio": _ratio(busy, window / 1e6),
            }
        )

    def dist_side(comm: list[Interval], compute: list[Interval]) -> dict[str, Any]:
        c = merge(clip(comm, lo, hi))
        k = merge(clip(compute, lo, hi))
        both = intersect(c, k)
        w = window / 1e6
        return {
            "communication": total(c) / 1e6,
            "computation": total(k) / 1e6,
            "overlap": total(both) / 1e6,
            "communication_ratio": _ratio(total(c) / 1e6, w),
            "computation_ratio": _ratio(total(k) / 1e6, w),
            "overlap_ratio": _ratio(total(both) / 1e6, w),
        }

    # One `.item()` is one synchronisation: the cudaStreamSynchronize inside
    # its aten::_local_scalar_dense is not counted again.
    sync_calls = sum(len(v) for v in sync_ops.values()) + sum(
        1
        for thread, (a, b) in sync_runtime
        if not any(c <= a and b <= d for c, d in sync_ops.get(thread, ()))
    )
    if not by_type["Kernel"] and not by_type["Communication"] and not by_type["Memcpy"]:
        # No GPU: reading a CPU tensor's value stalls nothing.
        sync_calls = 0
    per_call: dict[str, list[float]] = {}
    for ext, t in call_gpu.items():
        per_call.setdefault(ext_to_op[ext], []).append(t)

    def gpu_stats(name: str) -> dict[str, Any]:
        launched = per_call.get(name)
        if not launched:
            return {"gpu_total": None, "gpu_avg": None, "gpu_max": None, "gpu_min": None}
        n = len(ops[name])
        # Calls that launched no kernel took no GPU time.
        idle = [0.0] if n > len(launched) else []
        return {
            "gpu_total": op_gpu[name],
            "gpu_avg": op_gpu[name] / n,
            "gpu_max": max(launched),
            "gpu_min": min(launched + idle),
        }

    window_s = window / 1e6
    kernel_total = sum(sum(v) for v in kernels.values())
    return {
        "steps": steps,
        "window_time": window_s,
        "overview": overview,
        "operators": [
            {
                "name": n,
                **_stats(d),
                "ratio": _ratio(sum(d), window_s),
                **gpu_stats(n),
                "flops": op_flops.get(n),
                "kernels": [{"name": k, **_stats(v)} for k, v in op_kernels.get(n, {}).items()],
            }
            for n, d in ops.items()
        ],
        "kernels": [
            {"name": n, **_stats(d), "ratio": _ratio(sum(d), kernel_total)}
            for n, d in kernels.items()
        ],
        "user_defined": [
            {"name": n, **_stats(d), "ratio": _ratio(sum(d), window_s)} for n, d in user.items()
        ],
        "memory_manipulation": {
            "copies": [{"name": n, **_stats(d)} for n, d in memcpy.items()],
            "sync_calls": sync_calls,
            "sync_per_step": sync_calls / steps if steps else None,
        },
        "distributed": {
            "cpu": dist_side(comm_cpu, compute_cpu),
            "gpu": dist_side(comm_gpu, compute_gpu),
        },
        "memory": memory_summary(events, spans),
    }


def _device(args: dict[str, Any]) -> str:
    return f"{'cuda' if args.get('Device Type') == 1 else 'cpu'}:{args.get('Device Id', -1)}"


def memory_summary(
    events: Sequence[dict[str, Any]], spans: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Peak allocated / reserved per device, peak per phase, and the ops that
    allocate most (from `profile_memory` instant events)."""
    mem = [e for e in events if e.get("ph") == "i" and e.get("name") == "[memory]"]
    if not mem:
        return {"recorded": False}
    devices: dict[str, dict[str, int]] = {}
    for e in mem:
        a = e.get("args") or {}
        d = devices.setdefault(_device(a), {"peak_allocated": 0, "peak_reserved": 0})
        d["peak_allocated"] = max(d["peak_allocated"], int(a.get("Total Allocated", 0) or 0))
        d["peak_reserved"] = max(d["peak_reserved"], int(a.get("Total Reserved", 0) or 0))
    # Innermost op / phase around each allocation: one sweep over time with
    # a stack of open ops per thread (ranges on one thread nest properly; an
    # op open on another thread did not allocate) and one of open phases
    # (the phase is the process's: backward's device threads are in it).
    points: list[tuple[float, int, float, int, Any, str, int, int, str]] = []
    for e in spans:
        cat = e.get("cat")
        name = e.get("name", "")
        if cat == "cpu_op":
            kind = 0
        elif (
            cat == "user_annotation"
            and name.startswith(PHASE_PREFIX)
            and not name.startswith(STEP_PREFIX)
        ):
            kind = 1
            name = name[len(PHASE_PREFIX) :]
        else:
            continue
        thread = (e.get("pid"), e.get("tid"))
        end = e["ts"] + e["dur"]
        # Opening at one time: outer ranges first.
        points.append((e["ts"], 0, -end, kind, thread, name, 0, 0, ""))
        points.append((end, 2, 0.0, kind, thread, name, 0, 0, ""))
    for e in mem:
        a = e.get("args") or {}
        points.append(
            (
                e["ts"],
                1,
                0.0,
                2,
                (e.get("pid"), e.get("tid")),
                "",
                int(a.get("Bytes", 0) or 0),
                int(a.get("Total Allocated", 0) or 0),
                _device(a),
            )
        )
    points.sort(key=lambda p: (p[0], p[1], p[2]))
    op_stacks: dict[Any, list[str]] = {}
    phase_stack: list[str] = []
    by_op: dict[str, int] = {}
    by_phase: dict[str, int] = {}
    for _ts, order, _end, kind, thread, name, size, allocated, dev in points:
        stack = op_stacks.setdefault(thread, []) if kind != 1 else phase_stack
        if order == 0:
            stack.append(name)
        elif order == 2:
            if name in stack:
                # Remove the innermost range of that name.
                del stack[len(stack) - 1 - stack[::-1].index(name)]
        else:
            if phase_stack:
                # One device's total is not comparable with another's.
                phase = phase_stack[-1] if len(devices) == 1 else f"{phase_stack[-1]} ({dev})"
                by_phase[phase] = max(by_phase.get(phase, 0), allocated)
            if size > 0 and stack:
                by_op[stack[-1]] = by_op.get(stack[-1], 0) + size
    return {
        "recorded": True,
        "devices": devices,
        "peak_by_phase": by_phase,
        "top_allocators": sorted(
            ({"name": n, "bytes": b} for n, b in by_op.items()), key=lambda r: -r["bytes"]
        )[:20],
    }
