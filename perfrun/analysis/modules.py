"""The Module Summary: forward and backward time per submodule, from the
window's trace.

Forward time of a module is the total of its `perfrun.module: NAME` ranges.
Backward time needs no backward hooks: every forward op carries an autograd
sequence number, and the backward op that autograd runs for it
(`autograd::engine::evaluate_function: XBackward0`) carries the same one. A
module's backward time is the total of the backward ops whose sequence
numbers belong to forward ops run inside the module's ranges (its submodules
included). GPU time, where there is a GPU, is the kernels launched by those
ops (linked by External id).

Recomputation under activation checkpointing (`perfrun.recompute: NAME`
ranges, a module's forward run again inside backward) is part of the
backward op that triggered it, so it is already in Backward; it is shown
apart as Recompute and never added to Forward.

Evaluation passes are out of it, as they are out of the step tables: a
module called inside one of the window's `Eval` ranges (a `torch.no_grad()`
validation forward) counts that call in `eval_calls`, not in its calls or
its time.

Repeated blocks are grouped only among siblings of one class, so a
Sequential of Linear and ReLU layers is not "5 blocks".
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Any, Optional

from .intervals import Interval, covers, merge

MODULE_PREFIX = "perfrun.module: "
RECOMPUTE_PREFIX = "perfrun.recompute: "
_BACKWARD = "autograd::engine::evaluate_function:"
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def pattern(name: str) -> str:
    """`transformer.h.3.attn` -> `transformer.h.*.attn`: repeated blocks
    grouped by class and position."""
    return _INDEX.sub("*", name)


def summarize_modules(
    events: Sequence[dict[str, Any]],
    step_time: float,
    tree: Optional[dict[str, Any]] = None,
    evaluation: Sequence[Interval] = (),
) -> dict[str, Any]:
    """Per module: calls, forward / backward CPU (and GPU) seconds, share of
    the window's step time; plus the repeated blocks grouped. `tree` maps a
    qualified name to (depth, parent name) as the hooks saw the model;
    `evaluation`: the window's evaluation passes (trace.evaluation_ranges)."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    passes = merge(evaluation)
    starts = [a for a, _ in passes]
    eval_calls: dict[str, int] = {}
    ranges: list[tuple[float, float, str, Any]] = []
    recomputed: dict[str, float] = {}
    recompute_ranges: list[tuple[float, float, str, Any]] = []
    order: dict[str, int] = {}
    for e in spans:
        name = e.get("name", "")
        if e.get("cat") != "user_annotation":
            continue
        if name.startswith(MODULE_PREFIX):
            qual = name[len(MODULE_PREFIX) :]
            order.setdefault(qual, len(order))
            if passes and covers(passes, starts, e["ts"]):
                eval_calls[qual] = eval_calls.get(qual, 0) + 1
                continue
            ranges.append((e["ts"], e["ts"] + e["dur"], qual, e.get("tid")))
        elif name.startswith(RECOMPUTE_PREFIX):
            qual = name[len(RECOMPUTE_PREFIX) :]
            recomputed[qual] = recomputed.get(qual, 0.0) + e["dur"] / 1e6
            recompute_ranges.append((e["ts"], e["ts"] + e["dur"], qual, e.get("tid")))
    if not order:
        opaque = [q for q, v in (tree or {}).items()
                  if len(v) > 2 and str(v[2]).endswith("(compiled in place)")]
        return {"recorded": False, "modules": [], "groups": [], "opaque": opaque}
    stats: dict[str, dict[str, Any]] = {
        q: {
            "name": q,
            "depth": _depth(q, tree),
            "parent": _parent(q, tree),
            "type": _kind(q, tree),
            "shapes": _shapes(q, tree),
            "calls": 0,
            "eval_calls": eval_calls.get(q, 0),
            "forward": 0.0,
            "backward": 0.0,
            "recompute": recomputed.get(q, 0.0),
            "gpu_forward": None,
            "gpu_backward": None,
        }
        for q in order
    }
    if tree:
        # Containers that are never called (ModuleDict, ModuleList) have no
        # row: hang their children on the nearest ancestor that has one.
        for row in stats.values():
            parent = row["parent"]
            while parent and parent not in stats and parent in tree:
                parent = str(tree[parent][1])
            row["parent"] = parent if parent in stats else ""
    for s, t, q, _tid in ranges:
        stats[q]["calls"] += 1
        stats[q]["forward"] += (t - s) / 1e6

    # Forward ops -> the modules whose ranges contain them (same thread).
    ops = sorted(
        (
            e
            for e in spans
            if e.get("cat") == "cpu_op" and not e.get("name", "").startswith(_BACKWARD)
        ),
        key=lambda e: e["ts"],
    )
    by_tid: dict[Any, list[tuple[float, float, str]]] = {}
    for s, t, q, tid in sorted(ranges):
        by_tid.setdefault(tid, []).append((s, t, q))
    seq_owner: dict[Any, list[str]] = {}
    ext_owner: dict[Any, list[str]] = {}
    for tid, rs in by_tid.items():
        stack: list[tuple[float, float, str]] = []
        i = 0
        for op in (o for o in ops if o.get("tid") == tid):
            ts = op["ts"]
            while i < len(rs) and rs[i][0] <= ts:
                stack.append(rs[i])
                i += 1
            stack = [r for r in stack if r[1] >= ts]
            if not stack:
                continue
            owners = [r[2] for r in stack]
            args = op.get("args") or {}
            seq = args.get("Sequence number")
            if seq is not None and seq not in seq_owner:
                seq_owner[seq] = owners
            ext = args.get("External id")
            if ext is not None:
                ext_owner[ext] = owners
    kernels_by_ext: dict[Any, float] = {}
    for e in spans:
        if e.get("cat") == "kernel":
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                kernels_by_ext[ext] = kernels_by_ext.get(ext, 0.0) + e["dur"] / 1e6
    backward_ext: dict[Any, list[str]] = {}
    backward_spans: dict[Any, list[tuple[float, float, list[str]]]] = {}
    for e in spans:
        if e.get("cat") == "cpu_op" and e.get("name", "").startswith(_BACKWARD):
            args = e.get("args") or {}
            owners = seq_owner.get(args.get("Sequence number"))
            if not owners:
                continue
            for q in set(owners):
                stats[q]["backward"] += e["dur"] / 1e6
            ext = args.get("External id")
            if ext is not None:
                backward_ext[ext] = owners
            backward_spans.setdefault(e.get("tid"), []).append(
                (e["ts"], e["ts"] + e["dur"], owners)
            )
    # A recompute is backward time of the module recomputed: inside one of
    # its own backward ops (non-reentrant checkpointing unpacks its saved
    # tensors there) it is counted already; inside another's (reentrant
    # checkpointing recomputes in the backward of the checkpoint call, the
    # caller's) it is added, so no module's recompute exceeds its Backward.
    for s, t, q, tid in recompute_ranges:
        if q in stats and not any(
                bs <= s and t <= bt and q in owners for bs, bt, owners in
                backward_spans.get(tid, ())):
            stats[q]["backward"] += (t - s) / 1e6
    if kernels_by_ext and backward_spans:
        # A kernel is linked to the innermost op that launched it (`aten::mm`
        # inside `AddmmBackward0`), not to the evaluate_function around it:
        # every op inside a backward span counts for that span's modules.
        for tid, rs in backward_spans.items():
            rs.sort(key=lambda r: r[0])
            open_spans: list[tuple[float, float, list[str]]] = []
            i = 0
            for op in sorted(
                (o for o in spans if o.get("cat") == "cpu_op" and o.get("tid") == tid),
                key=lambda o: o["ts"],
            ):
                ts = op["ts"]
                while i < len(rs) and rs[i][0] <= ts:
                    open_spans.append(rs[i])
                    i += 1
                open_spans = [r for r in open_spans if r[1] >= ts]
                ext = (op.get("args") or {}).get("External id")
                if open_spans and ext is not None and ext not in backward_ext:
                    backward_ext[ext] = open_spans[-1][2]
    if kernels_by_ext:
        for owner_map, key in ((ext_owner, "gpu_forward"), (backward_ext, "gpu_backward")):
            for ext, owners in owner_map.items():
                gpu = kernels_by_ext.get(ext)
                if gpu:
                    for q in set(owners):
                        stats[q][key] = (stats[q][key] or 0.0) + gpu
    # A module called only in evaluation passes has no row.
    rows = sorted((r for r in stats.values() if r["calls"]), key=lambda r: order[r["name"]])
    kept = {r["name"] for r in rows}
    for r in rows:
        if r["parent"] in stats and r["parent"] not in kept:
            r["parent"] = ""
    _roll_up_recompute(rows)
    for r in rows:
        total = r["forward"] + r["backward"]
        r["total"] = total
        r["share"] = total / step_time if step_time > 0 else None
    evaluated = sum(eval_calls.values())
    if not rows:
        return {"recorded": False, "modules": [], "groups": [], "opaque": [],
                "eval_calls": evaluated}
    return {"recorded": True, "modules": rows, "groups": group_blocks(rows),
            "eval_calls": evaluated}


def _roll_up_recompute(rows: list[dict[str, Any]]) -> None:
    """A module not recomputed itself whose children were (a model whose
    blocks are checkpointed) shows its children's recompute: part of its
    own Backward. One recomputed itself shows its own, which holds its
    children's already."""
    children: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        children.setdefault(r["parent"] or "", []).append(r)

    def rolled(r: dict[str, Any], depth: int = 0) -> float:
        if r["recompute"] > 0.0 or depth > 64:
            return float(r["recompute"])
        total = sum(rolled(c, depth + 1) for c in children.get(r["name"], ()) if c is not r)
        r["recompute"] = total
        return total

    for r in rows:
        if not r["parent"]:
            rolled(r)


def _depth(name: str, tree: Optional[dict[str, Any]]) -> int:
    if tree and name in tree:
        return int(tree[name][0])
    return name.count(".")


def _kind(name: str, tree: Optional[dict[str, Any]]) -> Optional[str]:
    if tree and name in tree and len(tree[name]) > 2:
        return str(tree[name][2])
    return None


def _shapes(name: str, tree: Optional[dict[str, Any]]) -> Optional[str]:
    """Its parameters' shapes (files from before they were recorded: None)."""
    if tree and name in tree and len(tree[name]) > 3:
        return str(tree[name][3])
    return None


def _parent(name: str, tree: Optional[dict[str, Any]]) -> str:
    if tree and name in tree:
        return str(tree[name][1])
    return name.rsplit(".", 1)[0] if "." in name else ""


def group_blocks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeated blocks (`h.0` … `h.11`) aggregated by position, class and
    parameters' shapes, so one slow block stands out against its siblings
    of the same kind doing the same work: a Linear 64->256 is no sibling
    of a Linear 256->10 (rows from files without a class, or without
    shapes, are grouped by what they have)."""
    groups: dict[tuple[str, Any, Any], list[dict[str, Any]]] = {}
    for r in rows:
        p = pattern(r["name"])
        if p != r["name"]:
            groups.setdefault((p, r.get("type"), r.get("shapes")), []).append(r)
    out = []
    for (p, kind, _), members in groups.items():
        if len(members) < 2:
            continue
        totals = [m["total"] for m in members]
        median = statistics.median(totals)
        slowest = max(members, key=lambda m: m["total"])
        out.append(
            {
                "pattern": p,
                "type": kind,
                "members": len(members),
                "total": sum(totals),
                "median": median,
                "slowest": slowest["name"],
                "slowest_total": slowest["total"],
                "slowest_vs_median": (slowest["total"] / median - 1.0) if median > 0 else None,
            }
        )
    return sorted(out, key=lambda g: -g["total"])


def outstanding(groups: Sequence[dict[str, Any]], ratio: float = 0.2) -> list[dict[str, Any]]:
    """Groups whose slowest member exceeds the median of its siblings by more
    than `ratio`."""
    return [g for g in groups if (g.get("slowest_vs_median") or 0.0) > ratio]
