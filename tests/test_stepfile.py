"""Results format 2: the append-only step file (perfrun/store/stepfile.py), read
back by store/rankfile.py, written by the rank's agent as steps become final."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from perfrun.analysis.build import build_report
from perfrun.runtime.agent import Agent
from perfrun.settings import Settings
from perfrun.store.files import ResultsError
from perfrun.store.layout import steps_path
from perfrun.store.rankfile import VERSION, read_rank_file
from perfrun.store.results import read_run
from perfrun.store.stepfile import (
    BLOCK,
    COL,
    STEP_COLUMNS,
    StepWriter,
    damage,
    header,
    read,
)
from tests.builders import MS, make_rank, make_rows, train_agent

WIDTH = len(STEP_COLUMNS)
ROW_BYTES = 8 * WIDTH


def write_v2(folder: Path, rows: list[list[Any]], rank: int = 0, **doc: Any) -> Path:
    """A format-2 rank: its document, and its steps in a step file."""
    data = make_rank(rows, rank=rank).data
    data.update(doc)
    writer = StepWriter(str(folder / f"rank{rank}.steps"), STEP_COLUMNS)
    writer.append(rows)
    writer.close()
    data["steps"] = {"columns": list(STEP_COLUMNS), "file": f"rank{rank}.steps",
                     "count": writer.written}
    path = folder / f"rank{rank}.json"
    path.write_text(json.dumps(data))
    return path


def write_v1(folder: Path, rows: list[list[Any]], rank: int = 0) -> Path:
    data = make_rank(rows, rank=rank).data
    data["version"] = 1
    data["steps"] = {"columns": list(STEP_COLUMNS), "rows": rows}
    path = folder / f"rank{rank}.json"
    path.write_text(json.dumps(data))
    return path


PHASE_SETS = (
    [{"dataloader": MS, "forward": 2 * MS, "backward": 3 * MS, "optimization": MS,
      "others": MS, "samples": 32}] * 12
    + [{"forward": 4 * MS, "others": 2 * MS, "excluded": MS}] * 3
)
ROWS = make_rows(PHASE_SETS)


def test_steps_read_back_exactly_with_missing_values(tmp_path: Path) -> None:
    rank = read_rank_file(str(write_v2(tmp_path, ROWS)))
    assert rank.n_steps == len(ROWS)
    assert rank.rows == ROWS  # None stays None; counts come back as integers
    assert rank.table.shape == (len(ROWS), WIDTH)
    assert all(type(v) is int for v in rank.column("forward_calls"))


def test_a_format_1_file_reports_the_same_as_format_2(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_v1(tmp_path / "a", ROWS)
    write_v2(tmp_path / "b", ROWS)
    one = build_report(read_run(str(tmp_path / "a"))).to_dict()
    two = build_report(read_run(str(tmp_path / "b"))).to_dict()
    for doc in (one, two):
        doc["title"].pop("run_dir")
    assert one == two
    assert one["perf"]["steps"] == len(ROWS) - 1  # the default warm-up: one step


def test_a_row_cut_short_by_a_kill_is_left_out(tmp_path: Path) -> None:
    path = write_v2(tmp_path, ROWS)
    steps = tmp_path / "rank0.steps"
    with open(steps, "ab") as f:
        f.write(b"\x00" * (ROW_BYTES - 3))  # most of one more row
    assert read_rank_file(str(path)).n_steps == len(ROWS)


def test_steps_beyond_the_rank_files_count_are_kept(tmp_path: Path) -> None:
    """A rank killed between appending steps and rewriting its rank file:
    the step file holds more than the rank file says, and all of it counts."""
    path = write_v2(tmp_path, ROWS, status="running")
    data = json.loads(path.read_text())
    data["steps"]["count"] = 3
    path.write_text(json.dumps(data))
    rank = read_rank_file(str(path))
    assert rank.n_steps == len(ROWS) and rank.steps_note is None


def test_a_step_file_cut_short_is_used_as_far_as_it_goes_and_said(tmp_path: Path) -> None:
    """A step file that holds fewer steps than its rank file counts lost
    them after the rank wrote them (a rank rewrites its rank file only
    after appending): the steps left are whole, so they are used, and the
    report says which."""
    path = write_v2(tmp_path, ROWS)
    steps = tmp_path / "rank0.steps"
    keep = len(header(STEP_COLUMNS)) + 4 * ROW_BYTES + 50  # 4 steps and part of one
    steps.write_bytes(steps.read_bytes()[:keep])
    rank = read_rank_file(str(path))
    assert rank.n_steps == 4 and rank.rows == ROWS[:4]
    note = (f"its step file rank0.steps is cut short: it holds 4 steps of the {len(ROWS)} "
            f"rank0.json counts, so this report uses steps 0 to 3 and steps 4 to "
            f"{len(ROWS) - 1} are lost")
    assert rank.steps_note == note
    report = build_report(read_run(str(tmp_path)))
    assert report.title.steps_recorded == 4
    assert report.problems[0] == f"rank 0: {note}"
    steps.write_bytes(steps.read_bytes()[:len(header(STEP_COLUMNS))])
    assert read_rank_file(str(path)).steps_note.endswith(
        f"this report has none of them, and steps 0 to {len(ROWS) - 1} are lost")


def test_steps_after_a_final_save_are_left_out_and_said(tmp_path: Path) -> None:
    """A rank's final save comes after its last step: rows after the count
    it saved were added to the file afterwards, and are not the rank's."""
    path = write_v2(tmp_path, ROWS)
    data = json.loads(path.read_text())
    data["steps"]["count"] = 10
    path.write_text(json.dumps(data))
    rank = read_rank_file(str(path))
    assert rank.n_steps == 10 and rank.rows == ROWS[:10]
    assert rank.steps_note == (
        f"its step file rank0.steps holds {len(ROWS) - 10} steps after the 10 rank0.json "
        f"counts at its final save: steps 10 to {len(ROWS) - 1} are left out of this report")


def _table(rows: list[list[Any]]) -> Any:
    import numpy as np

    return np.array([[math.nan if v is None else v for v in r] for r in rows], dtype=float)


def test_what_a_rank_writes_is_no_damage() -> None:
    """Real steps pass, values not recorded (NaN) included; a phase a hair
    below zero (exclusive times are differences) too."""
    rows = [list(r) for r in ROWS]
    rows[2][COL["forward"]] = -1e-9
    assert damage(_table(rows)) is None
    assert damage(_table(rows), limit=rows[-1][COL["end"]]) is None
    assert damage(_table(rows)[:0]) is None


def _set(column: str, value: float, step: int = 5) -> Any:
    def change(rows: list[list[Any]]) -> None:
        rows[step][COL[column]] = value
    return change


@pytest.mark.parametrize(
    "change, why",
    [
        (_set("end", math.inf), "step 5 has end = inf s"),
        (_set("start", -3.1e14), "step 5 has start = -3.1e+14 s"),
        (_set("end", 0.001), "step 5 ends (0.001 s) before it starts"),
        (_set("start", 0.001), "step 5 starts (0.001 s) before the step before it ended: "
                               "the steps are out of time order"),
        (_set("dataloader", -0.5), "step 5 has dataloader = -0.5 s"),
        (_set("backward", 1.29e115), "step 5 has backward = 1.29e+115 s"),
        (_set("gpu_step", -math.inf), "step 5 has gpu_step = -inf s"),
        (_set("forward_calls", 2.5), "step 5 has forward_calls = 2.5"),
        (_set("samples", -9.2e18), "step 5 has samples = -9.2e+18"),
        (_set("samples", 1e300), "step 5 has samples = 1e+300"),
        (_set("start", math.nan, 7), "step 7 has no 'start' time"),
    ],
)
def test_a_row_no_rank_writes_is_named(change: Any, why: str) -> None:
    rows = [list(r) for r in ROWS]
    change(rows)
    assert damage(_table(rows)).startswith(why)


def test_damage_is_found_across_blocks_and_after_the_final_save() -> None:
    table = _table(ROWS)
    # A block that starts before the block before it ended.
    assert damage(table[8:], 8, previous_end=float(table[8, COL["end"]])).startswith(
        "step 8 starts")
    assert damage(table[8:], 8, previous_end=float(table[7, COL["end"]])) is None
    last = float(table[-1, COL["end"]])
    assert damage(table, limit=last - MS).startswith(f"step {len(ROWS) - 1} ends at")


def test_garbage_in_a_step_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """Bytes no rank wrote (here random ones over steps 3 to 6) refuse the
    file: averaged, they print step times of 1e115 ms."""
    import random

    path = write_v2(tmp_path, ROWS)
    steps = tmp_path / "rank0.steps"
    data = bytearray(steps.read_bytes())
    offset = len(header(STEP_COLUMNS))
    rng = random.Random(1)
    for i in range(offset + 3 * ROW_BYTES, offset + 7 * ROW_BYTES):
        data[i] = rng.randrange(256)
    steps.write_bytes(bytes(data))
    with pytest.raises(ResultsError) as err:
        read_rank_file(str(path))
    message = str(err.value)
    assert message.startswith(f"cannot read {steps}: step 3 has ")
    assert message.endswith(": the file is damaged") and "\n" not in message


def test_columns_are_mapped_by_name(tmp_path: Path) -> None:
    """A step file from another version, with its columns reordered and one
    more: read by name, the unknown one left out."""
    columns = ["end", "start", "future"] + list(STEP_COLUMNS[2:])
    writer = StepWriter(str(tmp_path / "rank0.steps"), columns)
    writer.append([[r[1], r[0], 7.0] + r[2:] for r in ROWS])
    writer.close()
    data = make_rank([]).data
    data["steps"] = {"columns": columns, "file": "rank0.steps", "count": len(ROWS)}
    (tmp_path / "rank0.json").write_text(json.dumps(data))
    assert read_rank_file(str(tmp_path / "rank0.json")).rows == ROWS


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.unlink(),
         "rank0.steps: no such file (the step file of a rank file; copy both)"),
        (lambda p: p.write_bytes(b"garbage"), "is not a perfrun step file (no header)"),
        (lambda p: p.write_bytes(b"{}\n"), "is not a perfrun step file"),
        (
            lambda p: p.write_bytes(
                header(STEP_COLUMNS).replace(b'"version":1', b'"version":9')
            ),
            "has step file version 9; this perfrun reads up to version 1: upgrade perfrun",
        ),
    ],
)
def test_a_damaged_step_file_is_one_line(tmp_path: Path, damage: Any, message: str) -> None:
    path = write_v2(tmp_path, ROWS)
    damage(tmp_path / "rank0.steps")
    with pytest.raises(ResultsError) as err:
        read_rank_file(str(path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_step_without_a_start_is_refused_by_step(tmp_path: Path) -> None:
    rows = [list(r) for r in ROWS]
    rows[4][COL["start"]] = None
    path = write_v2(tmp_path, rows)
    with pytest.raises(ResultsError, match=r"step 4 has no 'start' time"):
        read_rank_file(str(path))


def test_a_step_file_name_must_be_beside_the_rank_file(tmp_path: Path) -> None:
    path = write_v2(tmp_path, ROWS)
    data = json.loads(path.read_text())
    data["steps"]["file"] = "../elsewhere.steps"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="steps.file"):
        read_rank_file(str(path))


def test_rows_are_aligned_after_the_header() -> None:
    for n in range(1, 40):
        assert len(header([f"c{i}" for i in range(n)])) % 8 == 0


def test_steps_path_goes_with_the_rank_file() -> None:
    assert steps_path("/r/rank3.json") == "/r/rank3.steps"
    assert steps_path("/r/rank3.restart2.json") == "/r/rank3.restart2.steps"


# -- the writer inside a rank ---------------------------------------------------


def make_agent(tmp_path: Path) -> Agent:
    payload = dataclasses.asdict(Settings(script="train.py", nvtx=False))
    payload["run_dir"] = str(tmp_path)
    agent = Agent(payload)
    agent.step_writer = StepWriter(steps_path(agent.path), STEP_COLUMNS)  # as start() does
    return agent


train = train_agent


@pytest.fixture()
def no_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_rank_env")
def test_each_save_appends_only_what_is_new_and_the_rank_keeps_none_of_it(
    tmp_path: Path,
) -> None:
    """What makes a long run's memory flat and its flushes cheap: every
    save appends exactly the steps committed since the last one, the
    tracker then holds none of them, and the rank file does not grow."""
    agent = make_agent(tmp_path)
    steps = Path(agent.step_writer.path)
    sizes, docs = [], []
    for _ in range(5):
        train(agent, 200)
        before = steps.stat().st_size
        agent.write()
        sizes.append(steps.stat().st_size - before)
        docs.append(Path(agent.path).stat().st_size)
        assert len(agent.tracker.rows) == 0  # all written, none held
    # 200 loop bodies per round; the first round's last step (and each
    # round's) commits when the next round's first fetch begins.
    assert sizes == [199 * ROW_BYTES] + [200 * ROW_BYTES] * 4
    assert max(docs) - min(docs) < 64  # a few digits of counters, not rows
    agent.tracker.finish(agent.phase_clock.now())
    agent.write(final=True)
    rank = read_rank_file(agent.path)
    assert rank.n_steps == 1000 == rank.data["steps"]["count"]
    assert rank.data["version"] == VERSION == 2
    flush = rank.data["extra"]["flush"]
    # The saves before the last one (a save cannot time itself in the file
    # it writes), and the step file as the last one left it.
    assert flush["calls"] == 5 and flush["bytes"] == steps.stat().st_size
    starts = rank.column("start")
    assert starts == sorted(starts) and 0.0 <= starts[0] < 60.0  # since the rank began
    assert all(math.isnan(v) for v in read(str(steps))[1][:, COL["gpu_step"]])


@pytest.mark.usefixtures("no_rank_env")
def test_a_save_copies_and_writes_a_block_at_a_time_and_a_failed_write_loses_nothing(
    tmp_path: Path,
) -> None:
    """A save copies the new rows a block (512 rows) at a time, so the
    flush thread never holds the GIL for a copy of megabytes; when a write
    fails part-way, the blocks written are dropped from the rank and the
    rest are written by the next save: no row lost, none twice."""
    agent = make_agent(tmp_path)
    writer = agent.step_writer
    calls: list[int] = []
    real = writer._write

    def failing_third(data: bytes) -> None:
        calls.append(len(data) // ROW_BYTES)  # rows in this write
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(data)

    writer._write = failing_third  # type: ignore[method-assign]
    train(agent, BLOCK * 3 + 101)  # 3 blocks and 100 rows committed
    with pytest.raises(OSError):
        agent._append_ready(False)
    assert calls == [BLOCK, BLOCK, BLOCK]
    assert writer.written == 2 * BLOCK and agent.tracker.base == 2 * BLOCK
    agent._append_ready(False)
    assert calls[3:] == [BLOCK, 100]
    agent.tracker.finish(agent.phase_clock.now())
    agent.write(final=True)
    starts = read_rank_file(agent.path).column("start")
    assert len(starts) == BLOCK * 3 + 101 and starts == sorted(set(starts))


@pytest.mark.usefixtures("no_rank_env")
def test_a_flush_that_comes_after_the_final_save_writes_nothing(tmp_path: Path) -> None:
    """The flush thread can be past its wait when the run ends, and then
    takes the save lock right after the final save. On a full disk the
    final save has just given back the space it held: a flush that
    appended the held steps then would leave a step file with more rows
    than the rank file counts (and says were not saved), since the
    process exits before that flush rewrites the rank file. The final
    save is the last word."""
    agent = make_agent(tmp_path)
    writer = agent.step_writer
    real = writer._write
    full = [True]

    def write(data: bytes) -> None:
        if full[0]:
            raise OSError(28, "No space left on device")
        real(data)

    agent.write()  # nothing held yet: the step file has its header only
    writer._write = write  # type: ignore[method-assign]
    train(agent, 31)
    agent.tracker.finish(agent.phase_clock.now())
    agent.write(final=True)
    size = Path(writer.path).stat().st_size
    rank = read_rank_file(agent.path)
    assert rank.n_steps == 0 and rank.data["unsaved"]["steps"] == 31
    full[0] = False  # the reserve given back: room again
    agent.write()  # the flush thread's late round
    assert Path(writer.path).stat().st_size == size
    assert read_rank_file(agent.path).data["unsaved"]["steps"] == 31


@pytest.mark.usefixtures("no_rank_env")
def test_a_batch_size_given_is_every_steps_samples(tmp_path: Path) -> None:
    payload = dataclasses.asdict(Settings(script="train.py", nvtx=False, batch_size=48))
    payload["run_dir"] = str(tmp_path)
    agent = Agent(payload)
    agent.step_writer = StepWriter(steps_path(agent.path), STEP_COLUMNS)
    train(agent, 10)
    agent.tracker.finish(agent.phase_clock.now())
    agent.write(final=True)
    assert read_rank_file(agent.path).column("samples") == [48] * 10
    os.remove(agent.path)


def test_the_row_width_is_the_formats() -> None:
    from perfrun.runtime.steps import WIDTH

    assert WIDTH == len(STEP_COLUMNS)


@pytest.mark.usefixtures("no_rank_env")
def test_held_steps_are_no_objects_for_the_cyclic_collector(tmp_path: Path) -> None:
    """Steps wait seconds for a save: as objects the collector tracks they
    would reach its oldest generation and set off full collections, which
    stall a script with torch's heap for 100 ms and more. Held steps are
    packed floats: thousands of them add no tracked object."""
    import gc

    agent = make_agent(tmp_path)
    train(agent, 10)
    gc.collect()
    before = len(gc.get_objects())
    train(agent, 5000)
    gc.collect()
    assert agent.tracker.held >= 5000
    assert len(gc.get_objects()) - before < 50


def test_a_report_reads_each_step_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report over long ranks costs what reading their step files once
    costs: one pass over each rank (rankpass.py) gives every figure, the
    page's and the straggler check's included, and checks the rows on the
    way; with FLOPs counted, the FLOP rates reuse the Ranks table's median
    steps. Only the counted step's row is read again (mapped: one row)."""
    import perfrun.store.rankfile as rankfile
    import perfrun.store.stepfile as stepfile

    flops = {"counted": True, "step": 2, "reason": None, "forward": 2_000_000,
             "backward": 4_000_000, "optimizer": 0, "calls": {"forward": 1}, "ops": {},
             "dtype": "float32", "autocast": False, "tf32": None, "device": "cpu",
             "device_name": None, "seconds": 0.01, "notes": []}
    for rank in (0, 1):
        write_v2(tmp_path, ROWS, rank=rank, world_size=2, flops=flops)
    reads: dict[str, int] = {}
    real_read, real_blocks = stepfile.read, rankfile.blocks

    def counting(path: str, mapped: bool = False) -> Any:
        if not mapped:  # a whole file read; mapped reads touch what they slice
            reads[os.path.basename(path)] = reads.get(os.path.basename(path), 0) + 1
        return real_read(path, mapped)

    def passes(path: str, *args: Any, **kwargs: Any) -> Any:
        reads[os.path.basename(path)] = reads.get(os.path.basename(path), 0) + 1
        return real_blocks(path, *args, **kwargs)

    monkeypatch.setattr(stepfile, "read", counting)
    monkeypatch.setattr(rankfile, "blocks", passes)
    run = read_run(str(tmp_path), check_steps=False)
    assert reads == {}
    report = build_report(run, series=True)
    assert report.flops is not None and [r.rank for r in report.flops.ranks] == [0, 1]
    assert report.flops.ranks[1].seconds == pytest.approx(8 * MS)
    assert report.series is not None and len(report.series.boxes) == 2
    assert reads == {"rank0.steps": 1, "rank1.steps": 1}
    # Read and checked at once (the default), the rows are read for the check.
    reads.clear()
    build_report(read_run(str(tmp_path)))
    assert reads == {"rank0.steps": 2, "rank1.steps": 2}


def test_a_step_file_left_to_check_is_checked_before_any_row_is_used(tmp_path: Path) -> None:
    """Read with check_steps=False, a damaged step file is refused by the
    report's pass over it, in the words the reading would have used, and
    by every other way to its rows before they are used."""
    rows = [list(r) for r in ROWS]
    rows[5][COL["forward"]] = -1.0
    write_v2(tmp_path, rows)
    with pytest.raises(ResultsError) as eager:
        read_run(str(tmp_path))
    run = read_run(str(tmp_path), check_steps=False)
    with pytest.raises(ResultsError) as deferred:
        build_report(run)
    assert str(deferred.value) == str(eager.value)
    assert "step 5 has forward = -1 s" in str(eager.value)
    rank = run.ranks[0]
    for use in (lambda: rank.table, rank.mapped, lambda: rank.take([0]), lambda: rank.rows):
        with pytest.raises(ResultsError):
            use()


def test_steps_stream_in_blocks_as_they_are_read_whole(tmp_path: Path) -> None:
    """stepfile.blocks gives the rows read_table gives, a block at a time
    into one buffer: in any block size, in the file's own column order or
    another, up to a stop."""
    import numpy as np

    from perfrun.store.stepfile import blocks, read_table

    write_v2(tmp_path, ROWS)
    path = str(tmp_path / "rank0.steps")
    whole = read_table(path)
    for rows in (1, 4, len(ROWS), 1000):
        got = np.concatenate([block.copy() for _, block in blocks(path, rows=rows)])
        np.testing.assert_array_equal(got, whole)
    got = np.concatenate([block.copy() for _, block in blocks(path, 7, rows=3)])
    np.testing.assert_array_equal(got, whole[:7])
    columns = ["end", "start", "future"] + list(STEP_COLUMNS[2:])
    writer = StepWriter(str(tmp_path / "other.steps"), columns)
    writer.append([[r[1], r[0], 7.0] + r[2:] for r in ROWS])
    writer.close()
    got = np.concatenate([b.copy() for _, b in blocks(str(tmp_path / "other.steps"), rows=5)])
    np.testing.assert_array_equal(got, whole)


def test_the_straggler_check_holds_a_bounded_sample_of_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over long ranks the straggler check compares at most STRAGGLER_STEPS
    steps, evenly spaced, read rank by rank: a report over many ranks does
    not hold all their steps at once."""
    import perfrun.analysis.ranks as summary

    for rank in (0, 1):
        write_v2(tmp_path, make_rows(PHASE_SETS * 4), rank=rank, world_size=2)
    seen: list[int] = []
    real = summary.decide_straggler

    def counting(ranks: Any, **kwargs: Any) -> Any:
        seen.extend(len(r.index) for r in ranks)
        return real(ranks, **kwargs)

    monkeypatch.setattr(summary, "decide_straggler", counting)
    monkeypatch.setattr(summary, "STRAGGLER_STEPS", 10)
    build_report(read_run(str(tmp_path)))
    assert seen == [10, 10]
    monkeypatch.setattr(summary, "STRAGGLER_STEPS", 1000)
    seen.clear()
    report = build_report(read_run(str(tmp_path)))
    assert seen == [report.perf.steps] * 2  # all the steady steps
