"""The results format's names: kept apart from results.py so the code that
starts inside every rank imports nothing it does not need."""

from __future__ import annotations

FORMAT = "perfrun-results"
VERSION = 1

# Step columns, in row order. Phase times are exclusive (a phase nested in
# another is subtracted from its parent); `excluded` is time inside the step's
# span that is not part of the step (evaluation passes, DataLoader iterator
# creation and exhaustion), so step time = end - start - excluded.
STEP_COLUMNS = (
    "start",
    "end",
    "dataloader",
    "forward",
    "backward",
    "optimization",
    "excluded",
    "dataloader_calls",
    "forward_calls",
    "backward_calls",
    "optimization_calls",
    "samples",
    "gpu_dataloader",
    "gpu_forward",
    "gpu_backward",
    "gpu_optimization",
    "gpu_step",
)
COL = {name: i for i, name in enumerate(STEP_COLUMNS)}
PHASES = ("dataloader", "forward", "backward", "optimization")
GPU_COLUMNS = tuple("gpu_" + p for p in PHASES) + ("gpu_step",)


def rank_filename(rank: int, restart: int = 0) -> str:
    return f"rank{rank}.json" if restart == 0 else f"rank{rank}.restart{restart}.json"


#: What a run in which no rank imported torch reports (shared by the full
#: report and the launcher's short path for such runs).
NO_TORCH = "no PyTorch training loop was seen: the script never imported torch"

#: Said when perfrun saw no torch at all: the likeliest reason in a script
#: that does train is that it trains in a process perfrun never entered.
BOOTSTRAP_HINT = (
    "perfrun measures only the Python process it starts (under torchrun, its "
    "workers): training in a process the script starts itself (python -E, -I or -S, "
    "subprocess, multiprocessing) or after it re-executes itself (os.exec*) is not measured"
)
