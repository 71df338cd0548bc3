"""Window tables from a torch.profiler trace: pure functions over the trace's
events, so they are unit-tested on hand-made events, the window computes them
from the trace it just recorded, and `perfrun analyze` from traces a user
already has (analysis/tracefile.py reads them compactly).

Correctness rules that Paddle's tables break and these keep:

* One window for every table. It runs from the first step edge to the last,
  or, where GPU work launched in the window ends later, to the end of that
  work: a kernel belongs to the window when the CUDA call that launched it
  (found by correlation id) was made in it. Work launched before the first
  step or after the last is in no table.
* Steps are perfrun's own step ranges, else torch.profiler's
  `ProfilerStep#N` ranges; a trace with neither is one span.
* Overview time per event type is the *union* of that type's intervals
  (several threads or streams overlapping are merged before summing), so no
  type exceeds 100%. Each GPU's busy time (any kernel, copy or memset on it),
  idle time and utilisation are given over the window and over the GPU's
  own span (its first event's start to its last event's end).
* perfrun's phase ranges nest (forward and backward inside an optimizer
  step's closure): a phase's time is its range less the phase ranges inside
  it, as the step rows count it, so the Overview and the Model Summary agree.
* Kernels are grouped by their full name: shortened for display, a shared
  short name is numbered, never merged.
* A kernel's (or copy's) GPU time belongs to the op that launched it: the
  innermost op around the CUDA runtime call with the kernel's correlation id.
  Only where no runtime call has it does the kernel's External id name the op
  (older Kineto writes the correlation id there, which is no op's id).
* A synchronisation is a synchronising CUDA call (stream / device / event
  synchronize, a blocking memcpy), counted once per op call that made it
  (`.item()` is one, its memcpy and synchronize inside are not more). An
  `aten::_local_scalar_dense` on a CPU tensor makes no CUDA call: no sync.
* The Distributed table's communication is the GPU's communication kernels
  where there is a GPU, the host's communication ranges only where not.
* Evaluation passes are out of every table, as they are out of the step
  rows: a step's range less its `Eval` ranges is its ProfileStep time, the
  ops, annotations, runtime calls and GPU work begun in an `Eval` range are
  counted apart (`evaluation`), and ratios are shares of the window's
  training time (the window less its evaluation).
* Others never goes negative (it is a clamped difference); ratios with a
  zero denominator are None (printed as "-"), never a division error.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from .intervals import Interval, clip, covers, intersect, merge, subtract, total
from .modules import MODULE_PREFIX
from .tracefile import Event, compact

__all__ = [
    "Interval",
    "clip",
    "display_names",
    "evaluation_ranges",
    "exclusive_phases",
    "intersect",
    "is_communication",
    "memory_summary",
    "merge",
    "short_kernel_name",
    "subtract",
    "summarize",
    "total",
]

# perfrun's own annotations in the trace (recorded during the window).
PHASE_PREFIX = "perfrun: "
STEP_PREFIX = "perfrun: ProfileStep#"
TORCH_STEP_PREFIX = "ProfilerStep#"
PHASE_TYPES = ("Dataloader", "Forward", "Backward", "Optimization")
#: An evaluation pass (no gradient, no optimizer step) inside the window:
#: the step tables leave it out of the steps, and so does every window table.
EVAL_RANGE = PHASE_PREFIX + "Eval"

CPU_TYPES = ("ProfileStep",) + PHASE_TYPES + ("Operator", "CudaRuntime", "UserDefined")
GPU_TYPES = ("Kernel", "Memcpy", "Memset", "Communication")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_HOST_CATS = frozenset(("cpu_op", "user_annotation") + RUNTIME_CATS)

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
# CUDA calls that block the host until the device has caught up. The async
# memcpy is not one by itself: `.item()` pairs it with a stream synchronize.
SYNC_RUNTIME = frozenset(
    (
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyToSymbol",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD",
        "cuMemcpyHtoD_v2",
    )
)
# Shortened kernel names are cut only past this: a table too narrow for one
# cuts it in the middle, keeping a "#k" suffix (report/table.py).
KERNEL_NAME_WIDTH = 160


def exclusive_phases(ranges: Sequence[Any]) -> list[tuple[str, list[Interval]]]:
    """perfrun's phase ranges (one thread, properly nested) as (phase name,
    its own intervals: the range less the phase ranges nested in it), in
    time order."""
    items = sorted(compact(ranges), key=lambda e: (e.ts, -(e.dur or 0.0)))
    out: list[tuple[str, list[Interval]]] = []
    children: list[list[Interval]] = []
    stack: list[int] = []
    ends: list[float] = []
    for e in items:
        start, end = e.ts, e.end
        while stack and start >= ends[-1] - 1e-3:
            stack.pop()
            ends.pop()
        if stack:
            children[stack[-1]].append((start, end))
        stack.append(len(out))
        ends.append(end)
        out.append((e.name[len(PHASE_PREFIX):], [(start, end)]))
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




def display_names(
    full: dict[str, float], width: int = KERNEL_NAME_WIDTH
) -> dict[str, str]:
    """Display name of each full kernel name (`full`: name -> total time):
    the shortened name where it is the only one of its kind; where several
    full names shorten alike, each gets "#k" (k=1 for the most time), so no
    two rows read the same and none is merged."""
    short: dict[str, list[str]] = {}
    for name in full:
        short.setdefault(short_kernel_name(name, width), []).append(name)
    out: dict[str, str] = {}
    # Shared names are numbered within groups of the name cut to leave room
    # for the number, so two groups that only differ past the cut are not
    # numbered alike.
    numbered: dict[str, list[str]] = {}
    for s, names in short.items():
        if len(names) == 1:
            out[names[0]] = s
        else:
            for name in names:
                numbered.setdefault(short_kernel_name(name, width - 5), []).append(name)
    for base, names in numbered.items():
        names.sort(key=lambda n: (-full[n], n))
        for k, name in enumerate(names, 1):
            out[name] = f"{base} #{k}"
    return out


_comm_cache: dict[str, bool] = {}


def is_communication(name: str) -> bool:
    known = _comm_cache.get(name)
    if known is not None:
        return known
    if name.startswith("aten::"):
        # No aten op is a collective (aten::broadcast_tensors, aten::broadcast_to).
        answer = False
    else:
        answer = bool(_COMM_OP.search(name)) or "nccl" in name.lower()
    if len(_comm_cache) < 100_000:
        _comm_cache[name] = answer
    return answer


# Host-side events torch nests into one call tree per thread.
_TREE_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
# 1: an op (a runtime call's maker), 2: a runtime call, 0: an annotation.
_TREE_KINDS = {"cpu_op": 1, "user_annotation": 0, "cuda_runtime": 2, "cuda_driver": 2}


def _events(events: Any) -> list[Event]:
    """`events` as compact Events (a list of them is taken as it is)."""
    if isinstance(events, list) and (not events or isinstance(events[0], Event)):
        return events
    return compact(events)


def call_trees(spans: Sequence[Any]) -> tuple[dict[int, int], dict[int, int]]:
    """One sweep over each host thread's call tree (indices into `spans`):

    * the events torch's own aggregation drops, as {index: index of the call
      they are part of}: an event whose parent has the same name and no
      other child is one call seen twice (an op redispatching to itself,
      `aten::div_` inside `aten::div_`), so counting both would double its
      calls and time. Same rule as
      torch.autograd.profiler_util.EventList._remove_dup_nodes;
    * for each CUDA runtime call, the innermost op around it (after those
      drops): the op that made the call.
    """
    events = _events(list(spans))
    threads: dict[tuple[Any, Any], list[tuple[int, int, int, int]]] = {}
    kinds = _TREE_KINDS
    for i, e in enumerate(events):
        kind = kinds.get(e.cat)
        if kind is not None and e.dur is not None:
            # Integer nanoseconds: microsecond floats near 4e12 cannot tell
            # a child that ends with its parent from one that ends after it.
            start = round(e.ts * 1000)
            key = (e.pid, e.tid)
            items = threads.get(key)
            if items is None:
                items = threads[key] = []
            items.append((start, -(start + round(e.dur * 1000)), i, kind))
    parent: dict[int, int] = {}
    nchild: dict[int, int] = {}
    op_of: dict[int, int] = {}  # runtime call -> innermost op
    order: list[int] = []
    for items in threads.values():
        items.sort()
        # The open ranges: their ends, indices, and innermost op (or -1).
        ends: list[int] = []
        idxs: list[int] = []
        inner: list[int] = []
        for start, neg_end, i, kind in items:
            end = -neg_end
            while ends and (start >= ends[-1] or end > ends[-1]):
                ends.pop()
                idxs.pop()
                inner.pop()
            if kind == 2:
                # A runtime call is a leaf (nothing nests in it, and it is
                # never its parent's redispatch): it only counts as a child.
                if idxs:
                    p = idxs[-1]
                    nchild[p] = nchild.get(p, 0) + 1
                    if inner[-1] >= 0:
                        op_of[i] = inner[-1]
                continue
            if idxs:
                p = idxs[-1]
                parent[i] = p
                nchild[p] = nchild.get(p, 0) + 1
                op = i if kind == 1 else inner[-1]
            else:
                op = i if kind == 1 else -1
            ends.append(end)
            idxs.append(i)
            inner.append(op)
            order.append(i)
    # In time order, parents before children: a dropped event's children
    # become its call's children.
    dropped: dict[int, int] = {}
    for i in order:
        p = parent.get(i)
        if p is None:
            continue
        q = dropped.get(p, p)
        if nchild.get(q, 0) == 1 and events[q].name == events[i].name:
            dropped[i] = q
            nchild[q] = nchild.get(i, 0)
    return dropped, {c: dropped.get(o, o) for c, o in op_of.items()}


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


def _copy_kind(name: str) -> str:
    for k in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP"):
        if k in name:
            return f"Memcpy {k}"
    return "Memcpy DtoD"


def _gpu_index(e: Event) -> Any:
    if isinstance(e.device, int):
        return e.device
    return e.pid if isinstance(e.pid, int) else 0


def evaluation_ranges(spans: Iterable[Any]) -> list[Interval]:
    """The window's evaluation passes as the step tracker excludes them from
    its steps, merged and sorted: from a pass's first `Eval` range to the
    end of its last, where no other phase and no step edge comes between
    (StepTracker's evaluation span: what runs between two validation
    forwards is evaluation; the accuracy computed after the last one is
    the step's)."""
    events = _events(spans if isinstance(spans, list) else list(spans))
    steps: list[float] = []  # step range starts
    top: list[tuple[float, float, bool]] = []  # top-level phases: start, end, is eval
    for e in sorted(
        (e for e in events if e.cat == "user_annotation" and e.dur is not None
         and e.name.startswith(PHASE_PREFIX)),
        key=lambda e: (e.ts, -(e.dur or 0.0)),
    ):
        if e.name.startswith(STEP_PREFIX):
            steps.append(e.ts)
        elif not top or e.ts >= top[-1][1] - 1e-3:
            top.append((e.ts, e.end, e.name == EVAL_RANGE))
    out: list[list[float]] = []
    joinable = False  # the last top-level phase was evaluation
    for a, b, is_eval in top:
        if is_eval:
            if joinable and bisect_right(steps, out[-1][1]) == bisect_right(steps, a):
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        joinable = is_eval
    return merge((a, b) for a, b in out)


def window_span(
    spans: Sequence[Event],
) -> tuple[str, list[Event], float, float]:
    """Where the window's steps come from ("perfrun", "ProfilerStep" or
    "trace"), its step ranges, and the host-side window [lo, hi]."""
    steps = [e for e in spans if e.cat == "user_annotation" and e.name.startswith(STEP_PREFIX)]
    source = "perfrun"
    if not steps:
        steps = [
            e
            for e in spans
            if e.cat in ("user_annotation", "cpu_op") and e.name.startswith(TORCH_STEP_PREFIX)
        ]
        source = "ProfilerStep"
    if steps:
        return source, steps, min(e.ts for e in steps), max(e.end for e in steps)
    host = [e for e in spans if e.cat not in GPU_CATS and e.cat != "gpu_user_annotation"]
    pool = host or list(spans)
    if not pool:
        return "trace", [], 0.0, 0.0
    return "trace", [], min(e.ts for e in pool), max(e.end for e in pool)


#: Operators named in the window's Others, the longest first.
OTHERS_TOP = 8


def others_in_steps(step_ivs: Sequence[Interval], phase_ranges: Sequence[Any],
                    op_calls: Sequence[tuple[str, float, float, Any]], lo: float, hi: float,
                    ) -> dict[str, Any]:
    """Others in the window's steps: their time outside every phase range
    (`time`), the part of it the operators that began there took
    (`operators`: the union of their calls, so an operator inside another
    counts once), and those operators by name, outermost calls only
    (`top`, OTHERS_TOP of them). The rest of Others is the loop's own
    Python, and whatever it called that the profiler does not record as an
    operator. Seconds; the trace's times are microseconds."""
    phases = merge((e.ts, e.ts + e.dur) for e in phase_ranges)
    starts = [a for a, _ in phases]
    steps = merge(clip(step_ivs, lo, hi))
    step_starts = [a for a, _ in steps]
    outside = sum(total(subtract(iv, phases)) for iv in steps) / 1e6
    threads: dict[Any, list[tuple[float, float, str]]] = {}
    for name, ts, dur, tid in op_calls:
        if covers(steps, step_starts, ts) and not covers(phases, starts, ts):
            threads.setdefault(tid, []).append((ts, -dur, name))
    by_name: dict[str, list[float]] = {}
    spans: list[Interval] = []
    for calls in threads.values():
        calls.sort()
        end = float("-inf")
        for ts, neg_dur, name in calls:
            if ts >= end:  # not inside the call before it: outermost
                end = ts - neg_dur
                spans.append((ts, end))
                by_name.setdefault(name, []).append(-neg_dur / 1e6)
    top = sorted(by_name.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:OTHERS_TOP]
    return {"time": outside, "operators": total(merge(spans)) / 1e6,
            "top": [{"name": n, "calls": len(d), "total": sum(d)} for n, d in top]}


def summarize(events: Iterable[Any], steps: Optional[int] = None,
              evaluation: Optional[list[Interval]] = None) -> dict[str, Any]:
    """Aggregate a window's trace events (dicts as in the JSON, or the
    compact Events of tracefile.py) into the data every window table is
    printed from. Times in seconds (the trace's are microseconds). `steps`:
    how many steps the window holds (default: the step ranges found);
    `evaluation`: its evaluation passes, where the caller has them already
    (default: `evaluation_ranges` of the events)."""
    evs = _events(events)
    spans = [e for e in evs if e.ph == "X" and e.dur is not None]
    source, step_spans, lo, hi_cpu = window_span(spans)
    if steps is None:
        steps = len(step_spans)
    step_ids = sorted(
        int(n) for n in (e.name.rpartition("#")[2] for e in step_spans) if n.isdigit()
    )
    every = source == "trace"  # no steps: the whole trace is the window

    # Evaluation passes: whatever begins in one is counted apart.
    eval_ivs = evaluation_ranges(spans) if evaluation is None else evaluation
    eval_starts = [a for a, _ in eval_ivs]
    eval_ops = 0
    eval_op_time = 0.0
    eval_runtime: set[int] = set()

    dropped, launched_by = call_trees(spans)
    runtime_by_corr: dict[Any, int] = {}
    op_by_ext: dict[Any, int] = {}
    runtime_in: list[int] = []
    by_type: dict[str, list[Interval]] = {t: [] for t in CPU_TYPES + GPU_TYPES}
    calls: dict[str, int] = dict.fromkeys(by_type, 0)
    ops: dict[str, list[float]] = {}
    op_flops: dict[str, float] = {}
    user: dict[str, list[float]] = {}
    comm_cpu: list[Interval] = []
    compute_cpu: list[Interval] = []
    phase_ranges: list[Event] = []
    # Operator calls (name, start, duration, thread): which ran between
    # the phases, in Others.
    op_calls: list[tuple[str, float, float, Any]] = []
    step_ivs = by_type["ProfileStep"]
    op_ivs = by_type["Operator"]
    runtime_ivs = by_type["CudaRuntime"]
    torch_steps = source == "ProfilerStep"
    for i, e in enumerate(spans):
        cat = e.cat
        if cat not in _HOST_CATS:
            continue
        ts = e.ts
        end = ts + e.dur
        # Started in the window, or running when it opened.
        inside = every or (ts < hi_cpu and (ts >= lo or end > lo))
        name = e.name
        if cat == "cpu_op":
            if e.ext is not None:
                op_by_ext[e.ext] = dropped.get(i, i)
            if not inside or i in dropped:
                continue
            if torch_steps and name.startswith(TORCH_STEP_PREFIX):
                step_ivs.append((ts, end))
                continue
            if eval_ivs and covers(eval_ivs, eval_starts, ts):
                eval_ops += 1
                eval_op_time += e.dur / 1e6
                continue
            op_ivs.append((ts, end))
            op_calls.append((name, ts, e.dur, e.tid))
            durs = ops.get(name)
            if durs is None:
                durs = ops[name] = []
            durs.append(e.dur / 1e6)
            if e.args:
                flops = e.args.get("flops")
                if flops:
                    try:
                        op_flops[name] = op_flops.get(name, 0.0) + float(flops)
                    except (TypeError, ValueError):
                        pass
            if is_communication(name):
                comm_cpu.append((ts, end))
            else:
                compute_cpu.append((ts, end))
        elif cat == "user_annotation":
            if not inside or i in dropped:
                continue
            if name.startswith(STEP_PREFIX) or (torch_steps and name.startswith(TORCH_STEP_PREFIX)):
                step_ivs.append((ts, end))
            elif name.startswith(PHASE_PREFIX):
                phase_ranges.append(e)
            elif name.startswith(MODULE_PREFIX):
                pass  # perfrun's own per-module ranges (the Module Summary's)
            elif eval_ivs and covers(eval_ivs, eval_starts, ts):
                pass  # the script's own ranges in an evaluation pass
            elif is_communication(name):
                comm_cpu.append((ts, end))
            elif not name.startswith(_TORCH_ANNOTATIONS):
                by_type["UserDefined"].append((ts, end))
                calls["UserDefined"] += 1
                user.setdefault(name, []).append(e.dur / 1e6)
        else:  # a CUDA runtime or driver call
            if e.corr is not None:
                runtime_by_corr[e.corr] = i
            if eval_ivs and covers(eval_ivs, eval_starts, ts):
                eval_runtime.add(i)
            elif inside:
                runtime_in.append(i)
                runtime_ivs.append((ts, end))
    calls["ProfileStep"] = len(step_ivs)
    calls["Operator"] = len(op_ivs)
    calls["CudaRuntime"] = len(runtime_ivs)

    def in_host(e: Event) -> bool:
        return every or (e.ts < hi_cpu and (e.ts >= lo or e.end > lo))

    # GPU work of the window: launched in it (by correlation), or, with no
    # launch in the trace, running in it.
    gpu_in: list[tuple[Event, Optional[int]]] = []  # (event, launching runtime call)
    for e in spans:
        if e.cat not in GPU_CATS:
            continue
        rt = runtime_by_corr.get(e.corr) if e.corr is not None else None
        if rt is not None:
            if rt in eval_runtime:
                continue  # launched by an evaluation pass
            if in_host(spans[rt]):
                gpu_in.append((e, rt))
        elif every or (e.ts < hi_cpu and e.end > lo):
            gpu_in.append((e, None))
    hi = max([hi_cpu] + [e.end for e, _ in gpu_in]) if gpu_in and not every else hi_cpu
    if every and gpu_in:
        lo = min([lo] + [e.ts for e, _ in gpu_in])
        hi = max([hi] + [e.end for e, _ in gpu_in])
    window = hi - lo
    # The tables are the window's training: its evaluation passes are out
    # of every row, and so out of the time the ratios are shares of.
    eval_s = total(clip(eval_ivs, lo, hi)) / 1e6
    window_s = (window / 1e6) - eval_s
    if eval_ivs:
        step_ivs[:] = [piece for iv in step_ivs for piece in subtract(iv, eval_ivs)]

    # GPU side: kernels by full name, copies, per-device busy time, and each
    # op call's GPU time.
    kernels: dict[str, list[float]] = {}
    memcpy: dict[str, list[float]] = {}
    comm_gpu: list[Interval] = []
    compute_gpu: list[Interval] = []
    per_device: dict[Any, list[Interval]] = {}
    call_gpu: dict[int, float] = {}
    op_kernels: dict[str, dict[str, list[float]]] = {}
    for e, rt in gpu_in:
        iv = (max(e.ts, lo), e.end)
        d = e.dur / 1e6
        per_device.setdefault(_gpu_index(e), []).append(iv)
        if e.cat == "kernel":
            kernels.setdefault(e.name, []).append(d)
            if is_communication(e.name):
                by_type["Communication"].append(iv)
                calls["Communication"] += 1
                comm_gpu.append(iv)
            else:
                by_type["Kernel"].append(iv)
                calls["Kernel"] += 1
                compute_gpu.append(iv)
        elif e.cat == "gpu_memcpy":
            by_type["Memcpy"].append(iv)
            calls["Memcpy"] += 1
            memcpy.setdefault(_copy_kind(e.name), []).append(d)
        else:
            by_type["Memset"].append(iv)
            calls["Memset"] += 1
            memcpy.setdefault("Memset", []).append(d)
        if rt is not None:
            call = launched_by.get(rt)
        elif e.ext is not None and e.ext != e.corr:
            call = op_by_ext.get(e.ext)
        else:
            call = None
        if call is not None and in_host(spans[call]):
            call_gpu[call] = call_gpu.get(call, 0.0) + d
            op_kernels.setdefault(spans[call].name, {}).setdefault(e.name, []).append(d)

    for name, own in exclusive_phases(phase_ranges):
        if name in by_type:
            by_type[name].extend(own)
            calls[name] += 1
    others = others_in_steps(step_ivs, phase_ranges, op_calls, lo, hi)

    overview = []
    for t in CPU_TYPES + GPU_TYPES:
        busy = total(merge(clip(by_type[t], lo, hi))) / 1e6
        overview.append(
            {
                "type": t,
                "side": "gpu" if t in GPU_TYPES else "cpu",
                "calls": calls[t],
                "time": busy,
                "ratio": _ratio(busy, window_s),
            }
        )

    gpus = []
    for device in sorted(per_device, key=str):
        ivs = merge(per_device[device])
        busy = total(ivs) / 1e6
        span = (ivs[-1][1] - ivs[0][0]) / 1e6 if ivs else 0.0
        gpus.append(
            {
                "device": device,
                "events": len(per_device[device]),
                "busy": busy,
                "idle": max(0.0, window_s - busy),
                "utilization": _ratio(busy, window_s),
                "span": span,
                "span_idle": max(0.0, span - busy),
                "span_utilization": _ratio(busy, span),
            }
        )

    def dist_side(comm: list[Interval], compute: list[Interval]) -> dict[str, Any]:
        c = merge(clip(comm, lo, hi))
        k = merge(clip(compute, lo, hi))
        both = total(intersect(c, k)) / 1e6
        tc, tk = total(c) / 1e6, total(k) / 1e6
        return {
            "communication": tc,
            "computation": tk,
            "overlap": both,
            "communication_ratio": _ratio(tc, window_s),
            "computation_ratio": _ratio(tk, window_s),
            "overlap_ratio": _ratio(both, window_s),
            "overlap_of_communication": _ratio(both, tc),
        }

    # Synchronisations: synchronising CUDA calls, one per op call that made
    # them (or per call, made outside any op).
    sync_keys: dict[Any, str] = {}
    for i in runtime_in:
        e = spans[i]
        if e.name in SYNC_RUNTIME:
            op = launched_by.get(i)
            if op is None:
                sync_keys[("call", i)] = e.name
            else:
                sync_keys.setdefault(("op", op), spans[op].name)
    sync_by: dict[str, int] = {}
    for name in sync_keys.values():
        sync_by[name] = sync_by.get(name, 0) + 1
    sync_calls = len(sync_keys)

    per_call: dict[str, list[float]] = {}
    for call, t in call_gpu.items():
        per_call.setdefault(spans[call].name, []).append(t)

    def gpu_stats(name: str) -> dict[str, Any]:
        launched = per_call.get(name)
        if not launched:
            return {"gpu_total": None, "gpu_avg": None, "gpu_max": None, "gpu_min": None}
        n = max(len(ops[name]), len(launched))
        s = sum(launched)
        # Calls that launched no kernel took no GPU time.
        idle = [0.0] if n > len(launched) else []
        return {
            "gpu_total": s,
            "gpu_avg": s / n,
            "gpu_max": max(launched),
            "gpu_min": min(launched + idle),
        }

    kernel_totals = {n: sum(d) for n, d in kernels.items()}
    kernel_total = sum(kernel_totals.values())
    launched_names = {k for per in op_kernels.values() for k in per}
    shown = display_names(
        {**{n: 0.0 for n in launched_names}, **kernel_totals}
    )
    kernel_calls = sum(len(d) for d in kernels.values())
    gpu_present = bool(gpu_in)
    return {
        "steps": steps,
        "steps_from": source,
        "step_ids": [step_ids[0], step_ids[-1]] if step_ids else None,
        "window_time": window_s,
        "evaluation": {
            "passes": len(clip(eval_ivs, lo, hi)),
            "time": eval_s,
            "operator_calls": eval_ops,
            "operator_time": eval_op_time,
        },
        "window_gpu_tail": max(0.0, (hi - hi_cpu) / 1e6) if not every else 0.0,
        "others": others,
        "overview": overview,
        "gpus": gpus,
        "operators": [
            {
                "name": n,
                **_stats(d),
                "ratio": _ratio(sum(d), window_s),
                **gpu_stats(n),
                "flops": op_flops.get(n),
                "kernels": [
                    {"name": shown.get(k, k), "full_name": k, **_stats(v)}
                    for k, v in op_kernels.get(n, {}).items()
                ],
            }
            for n, d in ops.items()
        ],
        "kernels": [
            {
                "name": shown[n],
                "full_name": n,
                **_stats(d),
                "ratio": _ratio(kernel_totals[n], kernel_total),
            }
            for n, d in kernels.items()
        ],
        "kernel_total": {
            "calls": kernel_calls,
            "total": kernel_total,
            "ratio": _ratio(kernel_total, window_s),
        },
        "user_defined": [
            {"name": n, **_stats(d), "ratio": _ratio(sum(d), window_s)} for n, d in user.items()
        ],
        "memory_manipulation": {
            "copies": [{"name": n, **_stats(d)} for n, d in memcpy.items()],
            "sync_calls": sync_calls,
            "sync_per_step": sync_calls / steps if steps else None,
            "sync_by_op": dict(sorted(sync_by.items(), key=lambda kv: (-kv[1], kv[0]))),
        },
        "distributed": {
            "basis": "gpu" if gpu_present else "cpu",
            "cpu": dist_side(comm_cpu, compute_cpu),
            "gpu": dist_side(comm_gpu, compute_gpu),
        },
        "memory": memory_summary(evs, spans, (lo, hi) if not every else None),
    }


def _device(args: dict[str, Any]) -> str:
    return f"{'cuda' if args.get('Device Type') == 1 else 'cpu'}:{args.get('Device Id', -1)}"


def memory_summary(
    events: Sequence[Any], spans: Sequence[Any], window: Optional[Interval] = None
) -> dict[str, Any]:
    """Peak allocated / reserved per device, peak per phase, and the ops that
    allocate most (from `profile_memory` instant events in `window`)."""
    events = _events(events)
    spans = _events(spans)
    mem = [e for e in events if e.ph == "i" and e.name == "[memory]"]
    if window is not None:
        mem = [e for e in mem if window[0] <= e.ts <= window[1]]
    if not mem:
        return {"recorded": False}
    devices: dict[str, dict[str, int]] = {}
    for e in mem:
        a = e.args
        d = devices.setdefault(_device(a), {"peak_allocated": 0, "peak_reserved": 0})
        d["peak_allocated"] = max(d["peak_allocated"], int(a.get("Total Allocated", 0) or 0))
        d["peak_reserved"] = max(d["peak_reserved"], int(a.get("Total Reserved", 0) or 0))
    # Innermost op / phase around each allocation: one sweep over time with
    # a stack of open ops per thread (ranges on one thread nest properly; an
    # op open on another thread did not allocate) and one of open phases
    # (the phase is the process's: backward's device threads are in it).
    points: list[tuple[float, int, float, int, Any, str, int, int, str]] = []
    for e in spans:
        cat = e.cat
        name = e.name
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
        thread = (e.pid, e.tid)
        end = e.end
        # Opening at one time: outer ranges first.
        points.append((e.ts, 0, -end, kind, thread, name, 0, 0, ""))
        points.append((end, 2, 0.0, kind, thread, name, 0, 0, ""))
    for e in mem:
        a = e.args
        points.append(
            (
                e.ts,
                1,
                0.0,
                2,
                (e.pid, e.tid),
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
