"""The Memory Summary: each rank's GPU memory per phase, from the CUDA
allocator's sampled steps (analysis/allocator.py), then host memory per
process (analysis/memory.py)."""

from __future__ import annotations

from perfrun.analysis.allocator import PHASE_TITLES, DeviceMemory, oom_line
from perfrun.analysis.memory import MemorySummary, ProcessMemory
from perfrun.analysis.stats import size
from perfrun.report.primitives import DASH, Column, TableBlock, bytes_unit, fmt_bytes, fmt_size


def _share(d: DeviceMemory, value: int | None) -> str:
    share = d.share(value)
    return DASH if share is None else f"{share * 100.0:.1f}"


def device_memory_block(d: DeviceMemory) -> TableBlock:
    """A rank's GPU memory: per phase, the steady peak allocated and
    reserved and the allocated peak's share of the device; what sets the
    step's peak, the fragmentation there, creep and out-of-memory errors."""
    unit = bytes_unit(v for p in d.phases for v in (p.allocated, p.allocated_max, p.reserved))
    rows = [[PHASE_TITLES.get(p.phase, p.phase), fmt_size(p.allocated, unit),
             fmt_size(p.allocated_max, unit), fmt_size(p.reserved, unit), _share(d, p.allocated),
             str(p.steps)] for p in d.phases]
    device = d.label + (f" ({size(d.total)})" if d.total else "")
    info = [f"size unit: {unit[0]}; {device}: peak per phase from the CUDA allocator's own "
            "counters, on "
            f"{d.sampled} sampled step{'' if d.sampled == 1 else 's'} (about one a second); "
            "steady: the median sampled step"]
    if d.peak_allocated is not None:
        peak = (f"a step's peak: {size(d.peak_allocated)} allocated"
                + (f" ({_share(d, d.peak_allocated)}% of the device)" if d.total else "")
                + (f", set in {PHASE_TITLES.get(d.peak_phase, d.peak_phase)}"
                   if d.peak_phase else "")
                + (f"; {size(d.peak_reserved)} reserved" if d.peak_reserved else ""))
        if d.fragmentation is not None:
            peak += f"; reserved but not allocated at the peak: {size(d.fragmentation)}"
        info.append(peak)
    footer = []
    if d.creep is not None:
        c = d.creep
        line = (f"allocated memory grows: {size(c.per_1000_steps)} per 1,000 steps over steps "
                f"{c.first_step:,}-{c.last_step:,}")
        if c.full_at is not None:
            line += f"; the device would be full at about step {c.full_at:,}"
        footer.append(line)
    line = oom_line(d, size)
    if line is not None:
        footer.append(line)
    snap = d.snapshot
    if snap is not None:
        footer.append(f"allocator snapshot: {snap.get('file')} ({size(snap.get('bytes') or 0)}, "
                      f"{snap.get('entries')} events at most, written at the "
                      f"{snap.get('reason')}): open it at https://pytorch.org/memory_viz")
    columns = [Column("Phase", "left"), Column("Allocated"), Column("Max"),
               Column("Reserved"), Column("Of device (%)"), Column("Steps")]
    return TableBlock("memory", "Memory Summary (GPU)", info, columns, rows, footer=footer)


def _label(p: ProcessMemory, ranks: set[int]) -> str:
    """A process's row name: `rank 0`, and under it its children, indented,
    by what they are and their pid (`  DataLoader 0 worker (pid 4242)`), the
    rank not said again: the table fits 80 columns. `ranks`: the ranks
    whose own row is in the table. What is measured is said only where it
    is not the usual (a rank's RSS, a child's USS)."""
    usual = "rss" if p.pid is None else "uss"
    odd = "" if p.measure == usual else " (private)" if p.measure == "uss" else " (resident)"
    if p.pid is not None and p.rank in ranks:
        return f"  {p.kind} (pid {p.pid}){odd}"
    return p.label + odd


def memory_blocks(memory: MemorySummary, limit_rows: int = 20) -> list[TableBlock]:
    out = [device_memory_block(d) for d in memory.devices[:limit_rows]]
    if memory.processes:
        out.append(memory_block(memory, limit_rows))
    return out


def memory_block(memory: MemorySummary, limit_rows: int = 20) -> TableBlock:
    """Host memory per process: the rank's and each child's resident set
    where the steady steps begin, at its peak and at the end, and the
    steady growth where memory creeps (analysis/memory.py)."""
    shown = memory.processes[:limit_rows]
    unit = bytes_unit(v for p in shown for v in (p.first, p.peak, p.last))
    ranks = {p.rank for p in shown if p.pid is None}
    rows = []
    for p in shown:
        c = p.creep
        growth = (f"+{fmt_bytes(int(c.per_1000_steps))} (R² {c.r2:.2f})"
                  if c is not None else "no creep" if p.judged else "too few samples")
        rows.append([_label(p, ranks), str(p.samples),
                     fmt_size(p.first, unit), fmt_size(p.peak, unit), fmt_size(p.last, unit),
                     growth])
    info = [f"size unit: {unit[0]}; sampled at each save of the results: a rank's resident "
            "memory (RSS); a child's private memory (USS: a forked worker shares its parent's "
            "pages until it writes them); start: where the steady steps begin"]
    if memory.limit:
        info.append(f"memory a rank may use: {fmt_bytes(memory.limit)}")
    footer = []
    if len(memory.processes) > limit_rows:
        footer.append(f"{len(memory.processes) - limit_rows} more processes in the JSON report")
    columns = [Column("Process", "left"), Column("Samples"), Column("Start"), Column("Peak"),
               Column("End"), Column("Growth / 1,000 steps", "left")]
    return TableBlock("memory", "Memory Summary", info, columns, rows, footer=footer)
