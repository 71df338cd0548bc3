"""perfrun's figures in the script's experiment tracker: the blocks a point
covers and what it logs (runtime/trackerpoints.py), the record of the runs
(store/trackerfile.py), and the tracker thread's promise that a tracker
that hangs never holds up the flush or the script's close for longer than
the timeout (runtime/trackers.py, with a real TensorBoard writer that
stops answering). The real trackers, read back after real runs, are in
test_e2e_trackers.py."""

from __future__ import annotations

import dataclasses
import math
import threading
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfrun.runtime.agent import Agent
from perfrun.runtime.trackerpoints import (
    TARGET_SECONDS,
    Blocks,
    every_for,
    figures,
    rows_of,
    run_figures,
)
from perfrun.settings import Settings, SettingsError, default_warmup
from perfrun.store import trackerfile
from perfrun.store.layout import steps_path, tracker_path
from perfrun.store.stepfile import COL, STEP_COLUMNS, StepWriter
from tests.builders import train_agent

WIDTH = len(STEP_COLUMNS)
NAN = math.nan


def row(step: float, data: float = 0.0, fwd: float = 0.0, bwd: float = 0.0, opt: float = 0.0,
        samples: float = NAN, start: float = 0.0, excluded: float = 0.0) -> list[float]:
    """One step's row: its span from `start`, its phases (seconds)."""
    r = [NAN] * WIDTH
    r[COL["start"]] = start
    r[COL["end"]] = start + step + excluded
    for name, value in (("dataloader", data), ("forward", fwd), ("backward", bwd),
                        ("optimization", opt), ("excluded", excluded), ("samples", samples)):
        r[COL[name]] = value
    return r


def table(rows: list[list[float]]) -> Any:
    return np.array(rows, dtype=np.float64).reshape(-1, WIDTH)


# -- N: the steps a point covers ----------------------------------------------------


@pytest.mark.parametrize(("step", "expected"), [
    (20.0, 1), (10.0, 1), (6.0, 2), (3.0, 5), (1.0, 10), (0.3, 50), (0.05, 200),
    (0.001, 10_000), (0.00013, 100_000),
])
def test_a_point_covers_about_ten_seconds_on_a_round_number_of_steps(
        step: float, expected: int) -> None:
    assert every_for(step) == expected
    assert expected * step >= TARGET_SECONDS


def test_blocks_close_on_multiples_of_n_and_sum_each_steps_phases() -> None:
    blocks = Blocks(every=4)
    rows = [row(0.010, data=0.002, fwd=0.003, bwd=0.004, opt=0.001, samples=32)] * 10
    points = blocks.add(table(rows[:3]), 0)
    assert points == []
    points = blocks.add(table(rows[3:]), 3)
    assert [(p.first, p.step, p.steps) for p in points] == [(0, 3, 4), (4, 7, 4)]
    last = blocks.close()
    assert last is not None and (last.first, last.step, last.steps) == (8, 9, 2)
    assert blocks.close() is None
    figs = figures(points[0])
    assert figs["perfrun/step_time_ms"] == pytest.approx(10.0)
    assert figs["perfrun/dataloader_ms"] == pytest.approx(2.0)
    assert figs["perfrun/other_ms"] == pytest.approx(0.0, abs=1e-9)
    parts = sum(figs[f"perfrun/{p}_ms"] for p in
                ("dataloader", "forward", "backward", "optimization", "other"))
    assert parts == pytest.approx(figs["perfrun/step_time_ms"])
    assert figs["perfrun/reader_ratio_pct"] == pytest.approx(20.0)
    assert figs["perfrun/ips"] == pytest.approx(100.0)
    assert figs["perfrun/samples_per_s"] == pytest.approx(3200.0)


def test_a_block_after_a_close_starts_afresh_and_ends_on_the_next_multiple() -> None:
    blocks = Blocks(every=5)
    blocks.add(table([row(0.01)] * 3), 0)
    assert blocks.close() is not None  # a tracker run closed after step 2
    points = blocks.add(table([row(0.01)] * 4), 3)
    assert [(p.first, p.step) for p in points] == [(3, 4)]


def test_excluded_time_is_not_step_time_and_unknowns_are_left_out() -> None:
    blocks = Blocks(every=2)
    [point] = blocks.add(table([row(0.010, excluded=0.5), row(0.010, samples=8)]), 0)
    figs = figures(point)
    assert figs["perfrun/step_time_ms"] == pytest.approx(10.0)
    assert "perfrun/samples_per_s" not in figs  # one step did not know its samples
    assert "perfrun/tflops" not in figs and "perfrun/gpu_ms" not in figs
    assert figures(point, flops_per_step=2e9)["perfrun/tflops"] == pytest.approx(0.2)


def test_n_is_chosen_from_the_steps_after_the_first_and_only_grows() -> None:
    blocks = Blocks()
    assert blocks.auto
    # Step 0 pays the setup; two more steps are too few to choose from.
    assert blocks.add(table([row(30.0), row(0.5), row(0.5)]), 0) == []
    assert blocks.every is None
    points = blocks.add(table([row(0.5)] * 30), 3)
    assert blocks.every == 20  # 0.5 s a step: 20 steps are 10 s
    assert [p.step for p in points] == [19]
    # The loop gets 10 times faster: N grows, and the points stay ~10 s apart.
    blocks.add(table([row(0.05)] * 400), 33)
    assert blocks.every == 200
    # Slower again: N stays.
    blocks.add(table([row(1.0)] * 10), 433)
    assert blocks.every == 200


def test_a_run_too_short_to_choose_n_is_one_point() -> None:
    blocks = Blocks()
    blocks.add(table([row(1.0), row(0.2)]), 0)
    last = blocks.close()
    assert last is not None and (last.first, last.step, last.steps) == (0, 1, 2)


def test_rows_are_copied_and_the_trackers_buffer_can_still_grow() -> None:
    buf = array("d", [float(i) for i in range(WIDTH * 1000)])
    rows = rows_of(buf, 999, chunk=64)
    assert rows.shape == (999, WIDTH) and rows[998, 0] == 998 * WIDTH
    buf.extend([0.0] * WIDTH)  # no view of it is alive: resizing works
    del buf[:WIDTH]


def test_a_ranks_own_summary_is_medians_after_the_warmup() -> None:
    rows = [row(5.0, data=5.0)] + [row(0.010 + 0.001 * (i % 3), data=0.001) for i in range(30)]
    figs = run_figures(table(rows), warmup=default_warmup(len(rows)), flops_per_step=1e10)
    assert figs["perfrun/summary/steps"] == 28
    assert figs["perfrun/summary/step_time_ms"] == pytest.approx(11.0)
    assert figs["perfrun/summary/dataloader_ms"] == pytest.approx(1.0)
    assert figs["perfrun/summary/tflops"] == pytest.approx(1e10 / 0.011 / 1e12)
    assert run_figures(table(rows[:1]), warmup=1) == {}


# -- the options ---------------------------------------------------------------------


def test_tracker_options_are_checked() -> None:
    with pytest.raises(SettingsError, match="--tracker-every"):
        Settings(script="t.py", tracker_every=0).validate()
    with pytest.raises(SettingsError, match="--tracker-timeout"):
        Settings(script="t.py", tracker_timeout=0.0).validate()
    Settings(script="t.py", tracker_every=1, tracker=False, tracker_all_ranks=True).validate()


# -- the record -----------------------------------------------------------------------


def test_the_record_is_read_back_and_bad_runs_are_left_out(tmp_path: Path) -> None:
    trackerfile.write(str(tmp_path), "rank0", {
        "rank": 0, "every": 50, "every_auto": True, "points": 3, "dropped": 0,
        "runs": [
            {"kind": "mlflow", "run_id": "abc", "tracking_uri": "file:///x", "points": 3,
             "last_step": 149},
            {"kind": "tensorboard", "log_dir": "", "points": 1, "last_step": 0},
            {"kind": "comet", "id": "x", "points": 0},
        ],
        "problems": ["a line", 7],
    })
    assert Path(tracker_path(str(tmp_path), "rank0")).is_file()
    [record] = trackerfile.read_trackers(str(tmp_path))
    assert [r["kind"] for r in record["runs"]] == ["mlflow"]
    assert record["problems"] == ["a line"]
    (tmp_path / "trackers" / "rank1.json").write_text('{"format": "perfrun-trackers", '
                                                      '"version": 9, "runs": []}')
    assert len(trackerfile.read_trackers(str(tmp_path))) == 1


# -- a tracker that stops answering -------------------------------------------------------


def make_agent(tmp_path: Path, **settings: Any) -> Agent:
    payload = dataclasses.asdict(Settings(script="train.py", nvtx=False, **settings))
    payload["run_dir"] = str(tmp_path)
    agent = Agent(payload)
    agent.step_writer = StepWriter(steps_path(agent.path), STEP_COLUMNS)  # as start() does
    return agent


def test_a_hung_tracker_never_holds_up_the_flush_and_the_close_waits_only_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    from torch.utils.tensorboard import SummaryWriter

    from perfrun.runtime.trackers import QUEUE_POINTS, Trackers

    stuck = threading.Event()

    class StuckWriter(SummaryWriter):
        """A writer on a file system that stopped answering (a hung network
        mount): the script's own scalars still go, perfrun's never return."""

        def add_scalar(self, tag: str, *args: Any, **kwargs: Any) -> None:
            if tag.startswith("perfrun/"):
                stuck.wait()
            super().add_scalar(tag, *args, **kwargs)

    agent = make_agent(tmp_path, tracker_every=1, tracker_timeout=0.5)
    trackers = Trackers(agent)
    trackers.install()
    agent.trackers = trackers
    agent.add_row_consumer(trackers.rows)
    writer = StuckWriter(str(tmp_path / "tb"))
    try:
        # The flush thread's saves: every point queued, none waited for.
        for _ in range(3):
            train_agent(agent, QUEUE_POINTS)
            saver = threading.Thread(target=agent.write)
            saver.start()
            saver.join(30)
            assert not saver.is_alive()
        assert trackers.dropped > 0
        closer = threading.Thread(target=writer.close)
        closer.start()
        closer.join(30)
        assert not closer.is_alive()  # the close waited the timeout, then went on
        agent._finished = True
        trackers.finish()
    finally:
        stuck.set()
        trackers.uninstall()
    [record] = trackerfile.read_trackers(str(tmp_path))
    [run] = record["runs"]
    assert run["kind"] == "tensorboard" and run["log_dir"] == str(tmp_path / "tb")
    assert record["dropped"] == trackers.dropped
    problems = " ".join(record["problems"])
    assert "did not take perfrun's last figures within 0.5 s" in problems
    assert "were dropped" in problems
    assert all(p in agent.notes for p in record["problems"])


def test_a_rank_other_than_0_logs_nothing_unless_asked(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    agent = make_agent(tmp_path)
    agent._setup_trackers()
    assert agent.trackers is None
    agent = make_agent(tmp_path, tracker_all_ranks=True)
    agent._setup_trackers()
    assert agent.trackers is not None and agent.trackers.prefix == "perfrun/rank1/"
    agent = make_agent(tmp_path, tracker=False)
    monkeypatch.setenv("RANK", "0")
    agent._setup_trackers()
    assert agent.trackers is None

