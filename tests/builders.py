"""Hand-built results for unit tests: rows whose phase times are known, so a
test can state the expected Others, ratios and rates exactly.

Default values are binary fractions (multiples of 1/1024 s) so sums and
differences are exact in floating point and tests can compare with `==`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from perfrun.store.rankfile import FORMAT, VERSION, RankResult
from perfrun.store.results import RunResults
from perfrun.store.stepfile import STEP_COLUMNS

MS = 1.0 / 1024.0  # "about a millisecond", exactly representable


def make_row(
    start: float = 0.0,
    *,
    dataloader: float = 0.0,
    forward: float = 0.0,
    backward: float = 0.0,
    optimization: float = 0.0,
    others: float = 0.0,
    excluded: float = 0.0,
    calls: Sequence[int] = (1, 1, 1, 1),
    samples: Optional[int] = None,
    gpu: Optional[dict[str, float]] = None,
) -> list[Any]:
    """One step row; `end` is derived so that the phases plus `others` plus
    `excluded` fill the step exactly."""
    end = start + dataloader + forward + backward + optimization + others + excluded
    values: dict[str, Any] = {
        "start": start,
        "end": end,
        "dataloader": dataloader,
        "forward": forward,
        "backward": backward,
        "optimization": optimization,
        "excluded": excluded,
        "dataloader_calls": calls[0],
        "forward_calls": calls[1],
        "backward_calls": calls[2],
        "optimization_calls": calls[3],
        "samples": samples,
    }
    for name in ("gpu_dataloader", "gpu_forward", "gpu_backward", "gpu_optimization", "gpu_step"):
        values[name] = None if gpu is None else gpu.get(name[4:], 0.0)
    return [values[c] for c in STEP_COLUMNS]


def make_rows(phase_sets: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """Consecutive rows from keyword dicts, each starting where the last ended."""
    rows = []
    t = 0.0
    for kw in phase_sets:
        row = make_row(t, **kw)
        rows.append(row)
        t = row[1]
    return rows


def make_rank(
    rows: Sequence[Sequence[Any]] = (),
    *,
    rank: int = 0,
    world_size: int = 1,
    status: str = "finished",
    hostname: str = "host0",
    command: str = "python train.py",
    window: Optional[Sequence[int]] = None,
    torch_imported: bool = True,
    settings: Optional[dict[str, Any]] = None,
    exception: Optional[str] = None,
    signal: Optional[int] = None,
    device: Optional[dict[str, Any]] = None,
    extra: Optional[dict[str, Any]] = None,
    faults: Sequence[dict[str, Any]] = (),
    notes: Sequence[str] = (),
    restart: int = 0,
) -> RankResult:
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "rank": rank,
        "local_rank": rank,
        "world_size": world_size,
        "restart": restart,
        "status": status,
        "exit": {"exception": exception, "signal": signal},
        "env": {
            "hostname": hostname,
            "pid": 1000 + rank,
            "python": "3.11.7",
            "torch": "2.13.0",
            "cuda": None,
            "gpus": [],
            "argv": command.split(),
            "command": command,
            "platform": "linux",
        },
        "settings": dict(settings or {}),
        "window": list(window) if window is not None else None,
        "torch_imported": torch_imported,
        "gpu": False,
        "extra": extra or {},
        "dataloaders": [],
        "device": device or {},
        "faults": list(faults),
        "notes": list(notes),
    }
    return RankResult(path=f"/runs/r/rank{rank}.json", data=data, rows=[list(r) for r in rows])


def make_run(
    ranks: Sequence[RankResult],
    *,
    run_dir: str = "/runs/r",
    missing: Sequence[int] = (),
    meta: Optional[dict[str, Any]] = None,
) -> RunResults:
    return RunResults(run_dir=run_dir, ranks=list(ranks), meta=dict(meta or {}),
                      missing=list(missing))


def train_agent(agent: Any, steps: int) -> None:
    """`steps` loop bodies through a rank agent's phase clock: fetch,
    forward, backward, optimizer step."""
    from perfrun.runtime.steps import BWD, DATA, FWD, OPT

    clock = agent.phase_clock
    for _ in range(steps):
        for kind in (DATA, FWD, BWD, OPT):
            clock.enter(kind)
            clock.exit()
