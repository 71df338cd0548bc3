"""Pure analysis of per-step results: statistics and the summaries the
reports print. Nothing here imports torch, touches files or starts processes,
so every number can be checked against hand-written rows."""

from __future__ import annotations

from perfrun.analysis.stats import Rate, Stats, default_warmup
from perfrun.analysis.summary import (
    DeviceSummary,
    ExtraRow,
    Fault,
    ModelRow,
    ModelSummary,
    MultiRankSummary,
    PerfSummary,
    RankRow,
    Report,
    SlowRank,
    Title,
    build_report,
    device_summary,
    model_summary,
    multi_rank_summary,
    perf_summary,
    rank_problem,
    steady_rows,
)

__all__ = [
    "DeviceSummary",
    "ExtraRow",
    "Fault",
    "ModelRow",
    "ModelSummary",
    "MultiRankSummary",
    "PerfSummary",
    "RankRow",
    "Rate",
    "Report",
    "SlowRank",
    "Stats",
    "Title",
    "build_report",
    "default_warmup",
    "device_summary",
    "model_summary",
    "multi_rank_summary",
    "perf_summary",
    "rank_problem",
    "steady_rows",
]
