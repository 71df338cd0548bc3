"""The summary tables as blocks: Perf, Model (with FLOP rates), Data
Pipeline, Ranks and Device Summaries. The detailed window's Model table is the same block
(window_blocks.py)."""

from __future__ import annotations

from typing import Optional

from perfrun.analysis.device import DeviceSummary
from perfrun.analysis.flops import FlopsSummary
from perfrun.analysis.pipeline import STAGE_TITLES, LoaderPipeline, PipelineSummary
from perfrun.analysis.ranks import RANK_QUANTITIES, MultiRankSummary
from perfrun.analysis.stats import Rate, Stats
from perfrun.analysis.straggler import ranks_phrase
from perfrun.analysis.summary import PHASE_TITLES, ModelSummary, PerfSummary
from perfrun.report.primitives import (
    DASH,
    PERF_UNIT,
    Column,
    TableBlock,
    column_unit,
    flop_unit,
    fmt_bytes,
    fmt_flops,
    fmt_num,
    fmt_percent,
    fmt_sig,
    headed,
    plural,
    short_hosts,
    time_unit,
)
from perfrun.store.stepfile import PHASES

#: The Perf Summary's line for steps that fetched from no DataLoader: their
#: batches were made by the script, in Others, not loaded for free.
NO_DATALOADER = "no DataLoader: batch preparation is counted in Others"
#: ... and for steps that train on a batch fetched before them.
BATCH_REUSED = "no fetch in the counted steps: they train on a batch fetched before them"


#: The Model Summary's figures of a side, each a column of its own.
_STATS = ("total", "avg", "max", "min")


def _stats_units(stats: list[Stats], unit: tuple[str, float]) -> list[tuple[str, float]]:
    """The unit of each of Total, Avg, Max and Min (primitives.column_unit):
    the table's, but a Total over 10^5 steps, or a Max of one step a
    thousand times the median, in a coarser one of its own."""
    return [column_unit([getattr(s, k) for s in stats], unit) for k in _STATS]


def _stats_cells(stats: Stats, ratio: Optional[float], units: list[tuple[str, float]],
                 decimals: int = 2) -> list[str]:
    """Total, Avg, Max, Min and Ratio(%) as cells of their own: in columns
    of their own they line up, row under row, where `a / b / c` in one cell
    did not."""
    cells = [fmt_num(getattr(stats, k), decimals, f) for k, (_u, f) in zip(_STATS, units)]
    return cells + [fmt_percent(ratio, 2)]


def _stats_columns(side: str, units: list[tuple[str, float]],
                   unit: tuple[str, float]) -> list[Column]:
    """`CPU Total`, `Avg`, `Max`, `Min`, `Ratio(%)`: each figure a column of
    its own; the side is named once, on its Total, as in the Operator
    Summary, so CPU and GPU side by side fit 120 columns. A column in a
    unit other than the table's says so (`CPU Total (s)`)."""
    names = (f"{side} Total", "Avg", "Max", "Min")
    return [Column(headed(n, u, unit)) for n, u in zip(names, units)] + [Column("Ratio(%)")]


def perf_block(perf: PerfSummary, warmup: int, window_steps: int) -> TableBlock:
    unit, factor = PERF_UNIT
    counts = []
    if perf.no_dataloader:
        counts.append(NO_DATALOADER)
    elif perf.batch_reused:
        counts.append(BATCH_REUSED)
    elif perf.reader_ratio is not None:
        counts.append(f"Reader Ratio: {perf.reader_ratio * 100:.3f}%")
    counts.append(f"warm-up steps excluded: {warmup}")
    if window_steps:
        counts.append(f"window steps excluded: {window_steps}")
    info = [f"time unit: {unit}, ips unit: steps/s", "   ".join(counts)]

    # Four significant figures (primitives.SIGNIFICANT): what two runs of
    # one script agree on. The unit stays ms for every run (PERF_UNIT).
    def time_row(name: str, s: Stats) -> list[str]:
        return [name] + [fmt_sig(v, factor=factor) for v in (s.avg, s.max, s.min)]

    def rate_row(name: str, r: Rate) -> list[str]:
        return [name] + [fmt_sig(v) for v in (r.avg, r.max, r.min)]

    rows = [
        time_row("reader_cost", perf.reader_cost),
        time_row("batch_cost", perf.batch_cost),
        rate_row("ips", perf.ips),
    ]
    if perf.samples_ips is not None:
        rows.append(rate_row("ips (samples/s)", perf.samples_ips))
    columns = [Column("", "left"), Column("avg"), Column("max"), Column("min")]
    return TableBlock("perf", "Perf Summary", info, columns, rows)


def model_block(model: ModelSummary) -> TableBlock:
    # The median, not the mean: one slow step (a checkpoint, a recompile)
    # must not change the unit of the whole table.
    step = model.row("ProfileStep").cpu
    unit = time_unit(step.median if step.median is not None else step.avg, coarse="ms")
    cpu = _stats_units([row.cpu for row in model.rows], unit)
    gpu = _stats_units([row.gpu for row in model.rows if row.gpu is not None], unit)
    own = any(u != unit for u in cpu + (gpu if model.has_gpu else []))
    info = [
        f"time unit: {unit[0]}" + (", or as a column says" if own else "")
        + f"   Avg / Max / Min: per step ({plural(model.steps, 'step')})   "
        "Ratio(%): share of ProfileStep"
    ]
    columns = [Column("Name", "left"), Column("Calls")]
    columns += _stats_columns("CPU", cpu, unit)
    if model.has_gpu:
        columns += _stats_columns("GPU", gpu, unit)
    rows = []
    for row in model.rows:
        name = row.name if row.is_step else "  " + row.name
        cells = [name, DASH if row.calls is None else str(row.calls)]
        cells += _stats_cells(row.cpu, row.cpu_ratio, cpu)
        if model.has_gpu:
            cells += (_stats_cells(row.gpu, row.gpu_ratio, gpu) if row.gpu is not None
                      else [DASH] * 5)
        rows.append(cells)
    # A terminal too narrow for both sides prints the CPU's, then the GPU's,
    # each after the name and the calls.
    groups = [list(range(2, 7)), list(range(7, 12))] if model.has_gpu else None
    return TableBlock("model", "Model Summary", info, columns, rows, strong={0},
                      key_columns=2, groups=groups)


def _rate_cell(value: Optional[float], factor: float) -> str:
    """A FLOP/s figure: two decimals, or three significant digits below 1
    (a tiny model's rate must not print as 0.00), never with an exponent:
    `6.7e-05` under `0.000151` reads as the larger."""
    if value is None:
        return DASH
    scaled = value * factor
    return f"{scaled:.2f}" if scaled >= 1.0 else fmt_sig(scaled, 3)


def _rate_unit(flops: FlopsSummary) -> tuple[str, float]:
    """The Achieved column's unit: TFLOP/s on a GPU, GFLOP/s on a CPU
    (FlopsSummary.unit), or a smaller one where the column's largest rate
    is under 1 of it (a tiny model's MFLOP/s)."""
    largest = flops.unit[0][0]
    rates = [p.achieved for p in flops.phases]
    if flops.job is not None:
        rates.append(flops.job.achieved)
    prefix, factor = flop_unit(rates, largest)
    return f"{prefix}FLOP/s", 1.0 / factor


def with_flops(block: TableBlock, flops: Optional[FlopsSummary]) -> TableBlock:
    """The Model Summary with achieved FLOP/s (and MFU on a GPU) for the
    rows whose FLOPs were counted (analysis/flops.py); where nothing was
    counted, one line saying why."""
    if flops is None:
        return block
    if not flops.counted:
        block.footer.append(f"FLOP/s: not counted: {flops.reason}")
        return block
    if not any(p.flops for p in flops.phases):
        # Counted, and none found in the phases: the model's operators ran
        # outside them (a model called as `.forward()`, see the notes).
        block.footer.append(f"FLOP/s: none counted on step {flops.step}: no operator with a "
                            "FLOP formula ran inside a timed phase")
        return block
    unit, factor = _rate_unit(flops)
    columns = [Column(f"Achieved {unit}")]
    if flops.on_gpu:
        columns.append(Column("MFU(%)"))
    first = len(block.columns)
    block.columns.extend(columns)
    for row in block.rows:
        rate = flops.rate(row[0].strip())
        value = rate.achieved if rate is not None else None
        row.append(_rate_cell(value, factor))
        if flops.on_gpu:
            share = rate.mfu if rate is not None else None
            row.append(fmt_percent(share * 100.0 if share is not None else None, 1))
    if block.groups is not None:
        block.groups.append(list(range(first, len(block.columns))))
    step = flops.rate("ProfileStep")
    what = f"FLOPs of step {flops.step}" if flops.step is not None else "FLOPs of one step"
    total = f" ({fmt_flops(step.flops)} a step)" if step is not None else ""
    basis = ("Forward / Backward: GPU time" if any(p.basis == "gpu" for p in flops.phases)
             else "CPU time")
    ran = flops.dtype or "unknown dtype"
    if flops.autocast:
        ran += " (autocast)"
    if flops.tf32:
        ran += ", TF32 matmuls"
    block.footer.append(
        f"Achieved {unit}: {what}{total} over the median steady time ({basis}); "
        f"ran in {ran}"
    )
    if flops.on_gpu:
        peak = flops.peak
        if peak is not None:
            name = f"{peak.model} {peak.dtype}" if peak.model else "given"
            block.footer.append(
                f"MFU: over the {name} peak of {peak.flops / 1e12:.1f} dense TFLOP/s "
                f"({peak.source})"
            )
        elif flops.peak_reason:
            block.footer.append(f"MFU: unknown: {flops.peak_reason}")
        if flops.job is not None and flops.job.achieved is not None:
            share = flops.job.mfu
            block.footer.append(
                f"Job ({plural(len(flops.ranks), 'rank')}): "
                f"{_rate_cell(flops.job.achieved, factor)} {unit}"
                + (f", MFU {share * 100.0:.1f}%" if share is not None else "")
            )
    elif flops.job is not None and flops.job.achieved is not None:
        block.footer.append(
            f"Job ({plural(len(flops.ranks), 'rank')}): "
            f"{_rate_cell(flops.job.achieved, factor)} {unit}"
        )
    return block


def _rank_status(status: str) -> str:
    # After the run, "running" means the rank never wrote its final record.
    return {"running": "died", "missing": "no results"}.get(status, status)


def straggler_lines(ranks: MultiRankSummary, factor: float, unit: str) -> list[str]:
    """The culprit (or why none is named) and the skew per phase: the
    slowest rank in a phase may only be waiting for the culprit."""
    v = ranks.straggler
    if v is None:
        return []
    out = []
    if v.culprit is not None and v.culprit_phase is not None:
        title = PHASE_TITLES.get(v.culprit_phase, "Others")
        line = (f"Culprit: rank {v.culprit} loses {fmt_num(v.phase_loss, 2, factor)} {unit} "
                f"per step in {title}")
        if v.victims and v.wait_phase:
            verb = "waits" if len(v.victims) == 1 else "wait"
            line += (f"; {ranks_phrase(v.victims)} {verb} for it in "
                     f"{PHASE_TITLES.get(v.wait_phase, v.wait_phase)}")
        line += f" ({v.share * 100.0:.1f}% of the step)"
        out.append(line)
    elif v.reason:
        out.append(f"No straggler: {v.reason}")
    skews = [
        f"{PHASE_TITLES.get(k.quantity, k.quantity.capitalize())} "
        f"{fmt_num(k.excess, 2, factor)} (rank {k.worst_rank})"
        for k in v.skew if k.quantity != "step"
    ]
    out.append(f"Skew, worst minus median rank ({unit}): " + ", ".join(skews))
    return out


def ranks_block(ranks: MultiRankSummary) -> TableBlock:
    typical = ranks.across["step"].median
    unit, factor = time_unit(typical, coarse="ms")
    hosts = short_hosts(sorted({r.hostname for r in ranks.rows if r.hostname}))
    multi_host = len(hosts) > 1
    columns = [Column("Rank", "left")]
    if multi_host:
        columns.append(Column("Host", "left"))
    columns += [Column("Status", "left"), Column("Steps"), Column("Step")]
    columns += [Column(PHASE_TITLES[p]) for p in PHASES] + [Column("Others")]
    rows = []
    for r in ranks.rows:
        cells = [str(r.rank)]
        if multi_host:
            cells.append(hosts[r.hostname] if r.hostname else DASH)
        cells += [r.outcome or _rank_status(r.status),
                  str(r.steps) if r.status != "missing" else DASH]
        cells.append(fmt_num(r.step_avg, 2, factor))
        cells += [fmt_num(r.phase_avg[p], 2, factor) for p in PHASES]
        cells.append(fmt_num(r.others_avg, 2, factor))
        rows.append(cells)
    first_summary = len(rows)
    for label, attr in (("min", "min"), ("median", "median"), ("max", "max")):
        cells = [label] + ([""] if multi_host else []) + ["", ""]
        cells += [fmt_num(getattr(ranks.across[q], attr), 2, factor) for q in RANK_QUANTITIES]
        rows.append(cells)
    footer = []
    if ranks.slowest is not None:
        s = ranks.slowest
        footer.append(
            f"Slowest rank: {s.rank}, {fmt_num(s.step_avg, 2, factor)} {unit} a step, "
            f"{s.percent_slower:.1f}% slower than the median ({fmt_num(s.median, 2, factor)} "
            f"{unit})"
        )
    footer += straggler_lines(ranks, factor, unit)
    info = [f"time unit: {unit}; averages per step after warm-up; min / median / max across ranks"]
    # A narrow terminal prints where each rank ran and how it ended, then
    # its times: the phases read side by side, so they are never split.
    times = columns.index(next(c for c in columns if c.header == "Step"))
    groups = [list(range(1, times)), list(range(times, len(columns)))]
    return TableBlock("ranks", "Ranks", info, columns, rows, footer=footer,
                      strong=set(range(first_summary, len(rows))), breaks={first_summary},
                      groups=groups)


def device_block(device: DeviceSummary, world_size: int) -> TableBlock:
    multi_host = len(device.hosts) > 1
    names = short_hosts([h.hostname for h in device.hosts])
    rows = []
    footer = []
    for host in device.hosts:
        prefix = f"{names[host.hostname]} " if multi_host else ""
        proc = f"{prefix}CPU(Process)" + (f" rank {host.rank}" if world_size > 1 else "")
        rss = host.rss_peak_bytes
        rows.append([proc, fmt_percent(host.cpu_process_avg), fmt_percent(host.cpu_process_max),
                     f"peak RSS {fmt_bytes(rss)}" if rss is not None else DASH])
        rows.append([f"{prefix}CPU(System)", fmt_percent(host.cpu_system_avg),
                     fmt_percent(host.cpu_system_max), ""])
        for gpu in host.gpus:
            memory = f"max {fmt_bytes(gpu.mem_used_max)} of {fmt_bytes(gpu.mem_total)}"
            rows.append([f"{prefix}GPU{gpu.index} {gpu.name}", fmt_percent(gpu.util_avg),
                         fmt_percent(gpu.util_max), memory])
    footer.append(
        "CPU(Process) is the process's CPU time over all cores, so it can reach "
        "100% x the number of cores; CPU(System) is the whole machine, 0-100%."
    )
    columns = [Column("Device", "left"), Column("Util avg (%)"), Column("Util max (%)"),
               Column("Memory", "left")]
    return TableBlock("device", "Device Summary", [], columns, rows, footer=footer)


def pipeline_blocks(pipeline: PipelineSummary) -> list[TableBlock]:
    """The Data Pipeline: per DataLoader, its fetch stage by stage, and its
    workers (analysis/pipeline.py)."""
    out = []
    for lp in pipeline.loaders:
        if lp.fetch is None:
            continue
        unit, factor = time_unit(lp.fetch, coarse="ms")
        s = lp.settings
        size = f"batch_size {s.get('batch_size')}"
        if s.get("batch_size") is None and lp.samples is not None:
            size = f"{s.get('batch_sampler') or 'batch_sampler'} of {lp.samples}"
        what = (f"DataLoader {lp.loader} over {s.get('dataset') or '?'} ({size}, "
                f"num_workers {lp.num_workers}"
                + ("" if s.get("training", True) else ", iterated without gradients") + ")")
        info = [what]
        facts = [f"time unit: {unit}",
                 f"per batch over {lp.fetches} fetch{'' if lp.fetches == 1 else 'es'}"]
        if lp.tensors is not None:
            facts.append(f"a batch: {plural(lp.tensors, 'tensor')}, {fmt_bytes(lp.bytes)}")
        if lp.first_fetches:
            facts.append(f"an iterator's first fetch: {fmt_num(lp.first_fetch, 2, factor)} {unit} "
                         f"({lp.first_fetches} left out)")
        info.append("   ".join(facts))
        rows = [[STAGE_TITLES.get(st.name, st.name), fmt_num(st.per_batch, 3, factor),
                 fmt_percent(st.share * 100.0, 1),
                 DASH if st.name in ("other", "around") else str(st.held)]
                for st in lp.stages]
        rows.append(["fetch", fmt_num(lp.fetch, 3, factor), fmt_percent(100.0, 1),
                     str(lp.held)])
        footer = []
        if lp.cpu is not None and not lp.num_workers:
            work = lp.per_batch("dataset") + lp.per_batch("collate")
            if work > 0:
                line = (f"CPU time of the dataset and collate: {fmt_num(lp.cpu, 3, factor)} "
                        f"{unit} a batch ({min(100.0, lp.cpu / work * 100.0):.0f}%)")
                if lp.runq is not None and lp.runq >= 0.05 * work:
                    line += (f"; waiting for a CPU: {fmt_num(lp.runq, 3, factor)} {unit} "
                             f"({min(100.0, lp.runq / work * 100.0):.0f}%)")
                footer.append(line)
        columns = [Column("Stage", "left"), Column("per batch"), Column("share (%)"),
                   Column("fetches held up")]
        out.append(TableBlock(f"pipeline-{lp.loader}", "Data Pipeline", info, columns, rows,
                              footer=footer, strong={len(rows) - 1},
                              breaks={len(rows) - 1}))
        if lp.workers:
            out.append(_workers_block(lp, unit, factor))
    return out


def _workers_block(lp: LoaderPipeline, unit: str, factor: float) -> TableBlock:
    rows = []
    for w in lp.workers:
        rows.append([
            str(w.pid) + (" (slow)" if w.slow else ""), str(w.batches),
            fmt_num(w.busy, 3, factor), fmt_num(w.dataset, 3, factor),
            fmt_num(w.collate, 3, factor), fmt_num(w.cpu, 3, factor),
            fmt_percent(w.idle_share * 100.0 if w.idle_share is not None else None, 0),
            fmt_num(w.startup, 1, 1e3), fmt_bytes(int(w.rss_max) if w.rss_max else None),
        ])
    columns = [Column("Worker pid", "left"), Column("batches"), Column("per batch"),
               Column("dataset"), Column("collate"), Column("CPU"), Column("idle (%)"),
               Column("start-up (ms)"), Column("peak RSS")]
    footer = []
    slow = lp.slow_worker
    if slow is not None:
        footer.append(f"Slow worker: pid {slow.pid}, {fmt_num(slow.busy, 3, factor)} {unit} "
                      f"a batch against {fmt_num(lp.usual_busy, 3, factor)} {unit} for the "
                      "others (their median)")
    return TableBlock(f"pipeline-{lp.loader}-workers", "Data Pipeline workers",
                      [f"DataLoader {lp.loader}: time unit {unit}, per batch each worker made"],
                      columns, rows, footer=footer)
