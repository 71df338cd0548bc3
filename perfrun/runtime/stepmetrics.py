"""What a rank's metrics endpoint says (--metrics-port; metrics.py serves
it): running totals of the rank's steps, kept the way Prometheus keeps a
histogram, and the rank's state in one word.

Pure over plain data (the step rows the flush thread hands over, and the
status the agent holds), so every figure is tested on hand-built rows
(tests/test_stepmetrics.py) without a server or a process.

The rows come a flush at a time, thousands of them for a fast loop. Each
batch is tallied in whole-array numpy operations, never a Python call per
step: the flush thread's time under the GIL is time the script's thread
waits for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from ..store.stepfile import COL

#: Upper bounds, in seconds, of the step and phase histograms: 1, 2.5 and 5
#: a decade, from 100 us (a small model's step on a CPU) to 250 s (a large
#: model's step with gradient accumulation), so that `histogram_quantile`
#: is within a factor of 2.5 wherever a step falls. Twenty buckets: a
#: scrape of eight ranks stays a few hundred series.
BUCKETS = (
    0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
    10.0, 25.0, 50.0,
    100.0, 250.0,
)
_BOUNDS = np.asarray(BUCKETS)

#: The phases as the metrics name them: the Model Summary's rows, `others`
#: the rest of the step, so that a step's phases add up to its time.
PHASES = ("dataloader", "forward", "backward", "optimization", "others")
_PHASE_COLUMNS = [COL[name] for name in PHASES[:-1]]

#: The states of `perfrun_rank_status`, one series each, 1 for the state the
#: rank is in: running; finished (the script ended by itself); failed (it
#: ended by an uncaught exception, or by os._exit with a status other than
#: 0); stopped (--stop-after or --stop-after-window ended it); signalled (a
#: signal ended it: SIGTERM, or Ctrl-C).
STATES = ("running", "finished", "failed", "stopped", "signalled")


class Histogram:
    """Counts of values by bucket (BUCKETS, then +Inf), their sum and
    count: a Prometheus histogram's figures, added to a batch at a time."""

    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = np.zeros(len(BUCKETS) + 1, dtype=np.int64)
        self.sum = 0.0
        self.count = 0

    def add(self, values: Any) -> None:
        # side="left": a value equal to a bound counts in that bound's
        # bucket, as Prometheus' `le` (less than or equal) says.
        where = np.searchsorted(_BOUNDS, values, side="left")
        self.counts += np.bincount(where, minlength=len(BUCKETS) + 1)
        self.sum += float(values.sum())
        self.count += int(values.shape[0])

    def buckets(self) -> list[tuple[float, int]]:
        """(upper bound, values at or below it), cumulative as Prometheus
        exposes them; the last bound is infinity and holds every value."""
        total = np.cumsum(self.counts)
        return [(bound, int(n)) for bound, n in zip((*BUCKETS, math.inf), total)]


class StepTally:
    """Everything the endpoint says of a rank's steps since it started."""

    def __init__(self) -> None:
        self.steps = 0
        #: Samples of every step, where the rank knows them (0: unknown).
        self.samples = 0.0
        self.step = Histogram()
        self.phases = {name: Histogram() for name in PHASES}
        #: Samples a second of step time over the steps of the latest batch
        #: that knew their samples (None until one did): the Perf Summary's
        #: ips in samples/s, over the last flush.
        self.samples_per_second: Optional[float] = None

    def add(self, rows: Any) -> None:
        """Tally `rows`, an (n, steps.WIDTH) float64 array laid out as
        STEP_COLUMNS: a step's time is end - start - excluded (its
        evaluation passes and DataLoader start-up are not the step), and its
        phases are exclusive, `others` what they leave of it."""
        if rows.shape[0] == 0:
            return
        step = rows[:, COL["end"]] - rows[:, COL["start"]] - np.nan_to_num(rows[:, COL["excluded"]])
        step = np.maximum(step, 0.0)
        phases = np.nan_to_num(rows[:, _PHASE_COLUMNS])
        others = np.maximum(step - phases.sum(axis=1), 0.0)
        self.step.add(step)
        for i, name in enumerate(PHASES[:-1]):
            self.phases[name].add(phases[:, i])
        self.phases["others"].add(others)
        self.steps += int(rows.shape[0])
        samples = float(np.nansum(rows[:, COL["samples"]]))
        if samples > 0:
            self.samples += samples
            seconds = float(step.sum())
            if seconds > 0:
                self.samples_per_second = samples / seconds


def rank_state(status: str, exit: Mapping[str, Any]) -> str:
    """The agent's status and how the script ended (the rank file's
    `status` and `exit`) as one of STATES."""
    if status == "finished":
        os_exit = exit.get("os_exit")
        if exit.get("exception") is not None or (os_exit is not None and os_exit != 0):
            return "failed"
        return "finished"
    return status if status in STATES else "finished"
