"""The detailed window's tables as format-neutral blocks (primitives.py):
Overview, Model, Operator, Kernel, Distributed, Memory Manipulation, Memory,
UserDefined. Every table honours --sort-by, --row-limit and --time-unit."""

from __future__ import annotations

from typing import Any, Optional

from perfrun.analysis.trace import PHASE_TYPES
from perfrun.analysis.window import WindowReport, sort_rows
from perfrun.report.primitives import (
    DASH,
    Block,
    Column,
    LinesBlock,
    TableBlock,
    fmt_bytes,
    fmt_num,
    middle,
)
from perfrun.report.summary_blocks import model_block

UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _unit(view: dict[str, Any]) -> tuple[str, float]:
    unit = view.get("time_unit") or "ms"
    return unit, UNITS[unit]


def _pct(value: Optional[float]) -> str:
    return DASH if value is None else f"{value * 100:.2f}"


def _times(r: dict[str, Any], f: float) -> list[str]:
    return [fmt_num(r.get(k), 3, f) for k in ("total", "avg", "max", "min")]


def _time_columns(kind: str) -> list[Column]:
    return [Column(f"{kind} Total"), Column("Avg"), Column("Max"), Column("Min")]


def _name(text: str, width: int = 56) -> str:
    """Kernel names run to hundreds of characters of template arguments; the
    Markdown has no width to fit, so the blocks cap them, in the middle (see
    `middle`), and the terminal narrows them further where it must."""
    return middle(text, width)


def _stat_groups() -> list[list[int]]:
    """Column groups of a Name, Calls, Total, Avg, Max, Min, <share> table,
    which a narrow terminal stacks: Calls, Total and the share (or calls per
    step) say where the time goes and come first; Avg, Max and Min say how
    it spreads."""
    return [[1, 2, 6], [3, 4, 5]]


_MODULE_SORT = {
    "cpu-total": "total",
    "cpu-avg": "total",
    "cpu-max": "total",
    "cpu-min": "total",
    "gpu-total": "gpu_total",
    "gpu-avg": "gpu_total",
    "gpu-max": "gpu_total",
    "gpu-min": "gpu_total",
    "calls": "calls",
}


def tree_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Depth-first from the roots, each module's children (and the roots)
    slowest first: the tree reads top-down to where the time goes."""
    return [r for r, _level in _tree(rows)]


def _tree(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """tree_order's rows with their level in the tree as shown, which is not
    the qualified name's depth where a never-called container (ModuleList)
    was skipped: `transformer.h.3` sits right under the model."""
    names = {r["name"] for r in rows}
    children: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        parent = r.get("parent", "")
        while parent and parent not in names:  # an ancestor that was never called
            parent = parent.rsplit(".", 1)[0] if "." in parent else ""
        children.setdefault(parent if parent != r["name"] else "", []).append(r)
    out: list[tuple[dict[str, Any], int]] = []

    def walk(key: str, level: int) -> None:
        for r in sorted(children.get(key, []), key=lambda r: -r.get("total", 0.0)):
            out.append((r, level))
            walk(r["name"], level + 1)

    walk("", 0)
    return out


def module_label(row: dict[str, Any]) -> str:
    """A module's name as the Module Summary shows it: its qualified name,
    and its type where the last part of the name is an index
    (`net.0 (Linear)`): the children of an nn.Sequential or a ModuleList
    are named `0`, `1`, `2`, which alone say nothing of what they are."""
    name = str(row["name"])
    kind = str(row.get("type") or "")
    if kind and name.rsplit(".", 1)[-1].isdigit():
        return f"{name} ({kind})"
    return name


def _module_block(modules: dict[str, Any], view: dict[str, Any], unit: str, f: float) -> Block:
    """The module tree (or, with --sort-by other than the default, a flat
    list in that order), then the repeated blocks grouped."""
    rows_in = list(modules.get("modules", []))
    sort_by = str(view.get("sort_by") or "cpu-total")
    limit = int(view.get("row_limit") or 20)
    has_gpu = any(
        r.get("gpu_forward") is not None or r.get("gpu_backward") is not None for r in rows_in
    )
    has_recompute = any((r.get("recompute") or 0.0) > 0 for r in rows_in)
    if sort_by == "name":
        ordered = [(r, 0) for r in sorted(rows_in, key=lambda r: r["name"])]
    elif sort_by == "cpu-total":
        ordered = _tree(rows_in)
    else:
        key = _MODULE_SORT.get(sort_by, "total")
        for r in rows_in:
            r["gpu_total"] = (r.get("gpu_forward") or 0.0) + (r.get("gpu_backward") or 0.0)
        ordered = [(r, 0) for r in sorted(rows_in, key=lambda r: -(r.get(key) or 0.0))]
    tree = sort_by == "cpu-total"
    rows = []
    for r, level in ordered[: max(limit, 1) * 4 if tree else limit]:
        indent = "  " * level
        row = [
            indent + module_label(r),
            str(r["calls"]),
            fmt_num(r["forward"], 3, f),
            fmt_num(r["backward"], 3, f),
        ]
        if has_recompute:
            row.append(fmt_num(r.get("recompute") or 0.0, 3, f))
        if has_gpu:
            row += [fmt_num(r.get("gpu_forward"), 3, f), fmt_num(r.get("gpu_backward"), 3, f)]
        row.append(_pct(r.get("share")))
        rows.append(row)
    columns = [
        Column("Module", "left"),
        Column("Calls"),
        Column(f"Forward ({unit})"),
        Column(f"Backward ({unit})"),
    ]
    if has_recompute:
        columns.append(Column(f"of which recompute ({unit})"))
    if has_gpu:
        columns += [Column("GPU fwd"), Column("GPU bwd")]
    columns.append(Column("Share of step (%)"))
    # The GPU columns stack under the CPU ones on a narrow terminal: a deep
    # tree's indented names need the room.
    gpu_columns = [i for i, c in enumerate(columns) if c.header.startswith("GPU")]
    groups = [[i for i in range(1, len(columns)) if i not in gpu_columns]]
    if gpu_columns:
        groups.append(gpu_columns)
    footer = []
    for g in modules.get("groups", [])[:limit]:
        vs = g.get("slowest_vs_median")
        flag = "  <- stands out" if vs is not None and vs > 0.2 else ""
        kind = f" ({g['type']})" if g.get("type") else ""
        footer.append(
            f"{g['pattern']}{kind}: {g['members']} blocks, "
            f"{fmt_num(g['total'], 3, f)} {unit} in all, "
            f"median {fmt_num(g['median'], 3, f)} {unit}; slowest {g['slowest']} "
            f"{fmt_num(g['slowest_total'], 3, f)} {unit}"
            + (f" ({vs * 100:+.0f}% vs median){flag}" if vs is not None else "")
        )
    info = [
        f"time unit: {unit}",
        "backward from each forward op's autograd sequence number; "
        "a module's time includes its submodules'",
    ]
    if modules.get("eval_calls"):
        info.append(f"{modules['eval_calls']} module calls in evaluation passes left out "
                    "(as the step tables leave evaluation out of the steps)")
    if has_recompute:
        info.append("recompute: forwards run again inside backward (activation "
                    "checkpointing), counted in Backward")
    compiled = [r["name"] for r in rows_in if str(r.get("type") or "").endswith("(compiled)")]
    if compiled:
        info.append(
            f"compiled (torch.compile runs it as one graph; perfrun does not look inside): "
            f"{', '.join(compiled[:5])}"
        )
    return TableBlock("module", "Module Summary", info, columns, rows, footer=footer,
                      groups=groups)


def _evaluation_note(evaluated: dict[str, Any], unit: str, f: float) -> str:
    """The window's evaluation passes, left out of its tables as the step
    tables leave them out of the steps."""
    passes = int(evaluated["passes"])
    return (
        f"evaluation: {passes} pass{'es' if passes != 1 else ''} in the window "
        f"({fmt_num(evaluated.get('time'), 3, f)} {unit}, "
        f"{int(evaluated.get('operator_calls') or 0)} operator calls) left out of every "
        "window table, as the step tables leave them out of the steps; ratios are shares "
        "of the window less them"
    )


def _evaluated_ops(summary: dict[str, Any]) -> list[str]:
    calls = int((summary.get("evaluation") or {}).get("operator_calls") or 0)
    return [f"{calls} operator calls in evaluation passes left out"] if calls else []


def _share(x: dict[str, Any], key: str, f: float) -> str:
    return f"{fmt_num(x.get(key), 3, f)} ({_pct(x.get(key + '_ratio'))}%)"


def window_blocks(w: WindowReport, view: dict[str, Any], show: Any) -> list[Block]:
    out: list[Block] = []
    # The page's tables scroll (report/html.py): they may show whole names.
    names = int(view.get("name_width") or 56)
    unit, f = _unit(view)
    limit = int(view.get("row_limit") or 20)
    sort_by = str(view.get("sort_by") or "cpu-total")
    start, end = w.window
    info = [w.label or f"steps [{start}, {end})", f"time unit: {unit}"]
    if w.overhead is not None:
        medians = (f"median {fmt_num(w.window_median, 3, 1e3)} ms over {w.window_count:,} "
                   f"steps vs {fmt_num(w.outside_median, 3, 1e3)} ms over {w.outside_count:,}, "
                   f"which spread by ±{(w.outside_spread or 0.0) * 100:.0f}%")
        if w.overhead_measurable:
            info.append(f"profiler overhead: window steps {w.overhead * 100:+.1f}% vs steps "
                        f"outside ({medians})")
        else:
            info.append(f"profiler overhead: not measurable: window steps "
                        f"{w.overhead * 100:+.1f}% vs steps outside, within or below their "
                        f"own spread ({medians})")
    if w.warnings:
        out.append(LinesBlock("window-warnings", "Detailed window", list(w.warnings), "warning"))
    ref = w.reference
    if ref is None:
        return out
    s = ref.summary
    steps = s.get("steps") or 0

    if show("overview"):
        rows = []
        foreign = s.get("steps_from", "perfrun") != "perfrun"
        for o in s.get("overview", []):
            if o["calls"] == 0 and (
                o["side"] == "gpu" or o["type"] == "CudaRuntime"
                or (foreign and o["type"] in PHASE_TYPES)
            ):
                continue
            rows.append([o["type"], str(o["calls"]), fmt_num(o["time"], 3, f), _pct(o["ratio"])])
        notes = [
            "time per type is the union of its events (overlaps merged), so no type "
            "exceeds 100%"
        ]
        evaluated = s.get("evaluation") or {}
        if evaluated.get("passes"):
            notes.append(_evaluation_note(evaluated, unit, f))
        gpu_rows = []
        for g in s.get("gpus") or []:
            label = f"GPU {g['device']}"
            gpu_rows.append(
                [f"{label} busy", str(g["events"]), fmt_num(g["busy"], 3, f),
                 _pct(g["utilization"])]
            )
            gpu_rows.append([f"{label} idle", DASH, fmt_num(g["idle"], 3, f),
                             _pct(1.0 - g["utilization"] if g["utilization"] is not None
                                  else None)])
            notes.append(
                f"{label}: busy {_pct(g['span_utilization'])}% of its own span (first to last "
                f"GPU event, {fmt_num(g['span'], 3, f)} {unit}; idle "
                f"{fmt_num(g['span_idle'], 3, f)} {unit} in it)"
            )
        tail = s.get("window_gpu_tail") or 0.0
        if tail > 0:
            notes.append(
                f"GPU work launched in the window ran {fmt_num(tail, 3, f)} {unit} past the "
                "last step edge: the window, and every table, includes it"
            )
        out.append(
            TableBlock(
                "overview",
                "Overview Summary",
                info + list(w.notes) + notes,
                [
                    Column("Event type", "left"),
                    Column("Calls"),
                    Column(f"Time ({unit})"),
                    Column("Ratio (%)"),
                ],
                rows + gpu_rows,
                breaks={len(rows)} if gpu_rows else set(),
            )
        )

    if w.model is not None and show("model"):
        block = model_block(w.model)
        block.key = "window-model"
        block.title = "Model Summary (window)"
        out.append(block)

    modules = s.get("modules") or {}
    if modules.get("recorded"):
        out.append(_module_block(modules, view, unit, f))
    elif modules.get("opaque"):
        out.append(LinesBlock("module", "Module Summary", [
            f"{name}: compiled in place (model.compile()); torch.compile runs it as one graph "
            "and perfrun does not look inside it or hook it (a hook would add a guard)"
            for name in modules["opaque"]
        ]))

    ops = s.get("operators", [])
    if ops and show("op"):
        # GPU time only where the window ran GPU work, MFLOPs only where the
        # profiler counted FLOPs (--with-flops): a column of dashes says
        # nothing and takes a terminal's width.
        has_gpu = any(r.get("gpu_total") is not None for r in ops)
        has_flops = any(r.get("flops") for r in ops)
        rows = []
        for r in sort_rows(ops, sort_by)[:limit]:
            flops = r.get("flops")
            row = [_name(r["name"], names), str(r["calls"]), *_times(r, f), _pct(r.get("ratio"))]
            if has_gpu:
                row.append(fmt_num(r.get("gpu_total"), 3, f))
            if has_flops:
                row.append(f"{flops / 1e6:.1f}" if flops else DASH)
            rows.append(row)
            if view.get("op_detail"):
                for k in sort_rows(r.get("kernels", []), "cpu-total"):
                    row = ["  " + _name(k["name"], names - 2), str(k["calls"]), *([DASH] * 5)]
                    if has_gpu:
                        row.append(fmt_num(k.get("total"), 3, f))
                    if has_flops:
                        row.append(DASH)
                    rows.append(row)
        columns = [Column("Name", "left"), Column("Calls"), *_time_columns("CPU"),
                   Column("Ratio (%)")]
        if has_gpu:
            columns.append(Column("GPU Total"))
        if has_flops:
            columns.append(Column("MFLOPs"))
        extra = list(range(7, len(columns)))
        out.append(
            TableBlock(
                "operator",
                "Operator Summary",
                [f"sorted by {sort_by}", f"time unit: {unit}", f"{len(ops)} operators"]
                + _evaluated_ops(s),
                columns,
                rows,
                footer=["An operator's time includes the operators it calls."],
                groups=[[1, 2, 3, 4, 5, 6]] + ([extra] if extra else []),
            )
        )

    kernels = s.get("kernels", [])
    if kernels and show("kernel"):
        rows = [
            [_name(r["name"], names), str(r["calls"]), *_times(r, f), _pct(r.get("ratio"))]
            for r in sort_rows(kernels, sort_by)[:limit]
        ]
        kt = s.get("kernel_total") or {}
        shown = len(rows)
        if kt:
            rows.append(
                [f"Total ({len(kernels)} kernels)", str(kt.get("calls", 0)),
                 fmt_num(kt.get("total"), 3, f), DASH, DASH, DASH, "100.00"]
            )
        kinfo = [f"sorted by {sort_by}", f"time unit: {unit}"]
        if any(str(r["name"]).rsplit(" #", 1)[-1].isdigit() for r in kernels):
            kinfo.append(
                "kernels whose shortened names match are numbered #1, #2... (most time "
                "first), not merged; --format json has each one's full name"
            )
        if kt.get("ratio") is not None:
            kinfo.append(
                f"kernel time summed: {_pct(kt['ratio'])}% of the window (streams running at "
                "once can take it past 100%)"
            )
        out.append(
            TableBlock(
                "kernel",
                "Kernel Summary",
                kinfo,
                [
                    Column("Name", "left"),
                    Column("Calls"),
                    *_time_columns("GPU"),
                    Column("Ratio (%)"),
                ],
                rows,
                strong={shown} if kt else set(),
                breaks={shown} if kt else set(),
                groups=_stat_groups(),
            )
        )

    if show("dist"):
        rows = []
        comm: list[tuple[int, float]] = []
        basis = "cpu"
        for rw in w.ranks:
            d = rw.summary.get("distributed", {})
            side = d.get("basis") or ("gpu" if (d.get("gpu") or {}).get("computation") else "cpu")
            basis = "gpu" if side == "gpu" else basis
            x = d.get(side) or {}
            if not x.get("communication") and not x.get("computation"):
                continue
            comm.append((rw.rank, x.get("communication") or 0.0))
            rows.append(
                [
                    f"rank {rw.rank} ({side.upper()})",
                    _share(x, "communication", f),
                    _share(x, "computation", f),
                    _share(x, "overlap", f),
                ]
            )
        if any(c > 0 for _r, c in comm):
            footer = []
            if len(comm) > 1:
                most = max(comm, key=lambda c: c[1])
                least = min(comm, key=lambda c: c[1])
                what = "communication kernels" if basis == "gpu" else "communication"
                footer.append(
                    f"rank {most[0]} spends the most time in {what} "
                    f"({fmt_num(most[1], 3, f)} {unit} vs {fmt_num(least[1], 3, f)} {unit} on "
                    f"rank {least[0]}): it waits on the others"
                )
            out.append(
                TableBlock(
                    "distributed",
                    "Distributed Summary",
                    [
                        f"time unit: {unit}; ratio of the window",
                        "GPU: communication kernels (NCCL) against the other kernels on the "
                        "GPU; CPU: the host's communication calls, for ranks without a GPU",
                    ],
                    [
                        Column("Rank", "left"),
                        Column("Communication"),
                        Column("Computation"),
                        Column("Overlap"),
                    ],
                    rows,
                    footer=footer,
                    groups=[[1, 2], [3]],
                )
            )

    mm = s.get("memory_manipulation") or {}
    if show("memcpy") and (mm.get("copies") or mm.get("sync_calls")):
        rows = [
            [
                r["name"],
                str(r["calls"]),
                *_times(r, f),
                f"{r['calls'] / steps:.2f}" if steps else DASH,
            ]
            for r in sort_rows(mm.get("copies", []), sort_by)[:limit]
        ]
        rows.append(
            [
                "Synchronisations (.item(), .cpu(), synchronize)",
                str(mm.get("sync_calls", 0)),
                *([DASH] * 4),
                f"{mm['sync_per_step']:.2f}" if mm.get("sync_per_step") is not None else DASH,
            ]
        )
        out.append(
            TableBlock(
                "memcpy",
                "Memory Manipulation Summary",
                [f"time unit: {unit}"],
                [
                    Column("Name", "left"),
                    Column("Calls"),
                    *_time_columns("GPU"),
                    Column("Per step"),
                ],
                rows,
                groups=_stat_groups(),
                footer=["Each synchronisation stalls the CPU until the device catches up."]
                + (
                    ["Made by: " + ", ".join(
                        f"{name} {n}" for name, n in list(mm["sync_by_op"].items())[:5])]
                    if mm.get("sync_by_op") else []
                ),
            )
        )

    mem = s.get("memory") or {}
    if show("mem") and mem.get("recorded"):
        rows = [
            [dev, fmt_bytes(d.get("peak_allocated")), fmt_bytes(d.get("peak_reserved"))]
            for dev, d in sorted((mem.get("devices") or {}).items())
        ]
        for phase, peak in sorted((mem.get("peak_by_phase") or {}).items()):
            rows.append([f"  peak during {phase}", fmt_bytes(peak), DASH])
        for a in (mem.get("top_allocators") or [])[:limit]:
            rows.append([f"  allocated by {a['name']}", fmt_bytes(a["bytes"]), DASH])
        out.append(
            TableBlock(
                "memory",
                "Memory Summary",
                [],
                [
                    Column("Device / phase / operator", "left"),
                    Column("Allocated"),
                    Column("Reserved"),
                ],
                rows,
            )
        )

    user = s.get("user_defined", [])
    if user:
        rows = [
            [_name(r["name"], names), str(r["calls"]), *_times(r, f), _pct(r.get("ratio"))]
            for r in sort_rows(user, sort_by)[:limit]
        ]
        out.append(
            TableBlock(
                "userdefined",
                "UserDefined Summary",
                [f"time unit: {unit}"],
                [
                    Column("Name", "left"),
                    Column("Calls"),
                    *_time_columns("CPU"),
                    Column("Ratio (%)"),
                ],
                rows,
                groups=_stat_groups(),
            )
        )
    trace = s.get("trace")
    if trace:
        out.append(
            LinesBlock(
                "trace",
                None,
                [
                    f"Trace of the window (rank {ref.rank}): {trace}{_trace_size(s)} in the run "
                    "folder; open it in "
                    "https://ui.perfetto.dev or TensorBoard's profiler plugin "
                    f"(exported in {s.get('export_seconds', 0):.2f} s)"
                ],
                "info",
                False,
            )
        )
    return out


def _trace_size(s: dict[str, Any]) -> str:
    """` (12.3 MiB)`: the trace file's size as written (bounded by
    --max-trace-mb; runtime/window.py), where the run recorded it."""
    size = s.get("trace_bytes")
    if not isinstance(size, (int, float)) or isinstance(size, bool):
        return ""
    mib = 1 << 20
    return f" ({size / 1024:.0f} KiB)" if size < mib else f" ({size / mib:.1f} MiB)"
