"""The results format on disk: atomic writes, reading, merging ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfrun.store.files import ResultsError, atomic_write_text
from perfrun.store.results import read_run
from perfrun.store.stepfile import STEP_COLUMNS


def _rank(rank: int, world: int, restart: int = 0, rows: int = 2) -> dict:
    row = [0.0, 1.0] + [0.0] * (len(STEP_COLUMNS) - 2)
    return {"format": "perfrun-results", "version": 1, "rank": rank, "world_size": world,
            "restart": restart, "status": "finished",
            "steps": {"columns": list(STEP_COLUMNS), "rows": [row] * rows}}


def _write(folder: Path, name: str, doc: dict) -> None:
    (folder / name).write_text(json.dumps(doc))


def test_missing_ranks_are_listed_on_one_node(tmp_path: Path) -> None:
    _write(tmp_path, "rank0.json", _rank(0, 4))
    _write(tmp_path, "rank1.json", _rank(1, 4))
    _write(tmp_path, "run.json", {"expected_ranks": 4, "nnodes": None})
    run = read_run(str(tmp_path))
    assert [r.rank for r in run.ranks] == [0, 1]
    assert run.missing == [2, 3]


def test_other_nodes_ranks_are_not_missing(tmp_path: Path) -> None:
    # Two nodes: this node's perfrun holds ranks 0 and 1 of 4; ranks 2 and 3
    # are in the other node's run folder, not lost.
    _write(tmp_path, "rank0.json", _rank(0, 4))
    _write(tmp_path, "rank1.json", _rank(1, 4))
    _write(tmp_path, "run.json", {"expected_ranks": 2, "nnodes": "2"})
    assert read_run(str(tmp_path)).missing == []


def test_a_job_folders_missing_ranks_are_the_jobs(tmp_path: Path) -> None:
    # One folder for the whole two-node job (launcher/job.py): its run.json counts
    # the job's ranks, so a rank no node wrote is missing.
    _write(tmp_path, "rank0.json", _rank(0, 4))
    _write(tmp_path, "rank1.json", _rank(1, 4))
    _write(tmp_path, "rank3.json", _rank(3, 4))
    _write(tmp_path, "run.json", {"expected_ranks": 4, "nnodes": "2",
                                  "job": {"id": "x", "world_size": 4}})
    assert read_run(str(tmp_path)).missing == [2]


def test_the_last_restart_of_a_rank_wins(tmp_path: Path) -> None:
    _write(tmp_path, "rank0.json", _rank(0, 1, rows=5))
    _write(tmp_path, "rank0.restart1.json", _rank(0, 1, restart=1, rows=3))
    [rank] = read_run(str(tmp_path)).ranks
    assert rank.restart == 1 and len(rank.rows) == 3


def test_atomic_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "rank0.json"
    atomic_write_text(str(target), "{}")
    atomic_write_text(str(target), '{"a": 1}')
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["rank0.json"]


def test_a_folder_without_results_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="holds no perfrun results"):
        read_run(str(tmp_path))


def test_a_file_named_as_a_run_folder_is_said_to_be_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`perfrun report FILE`: not "no such results folder" for a file that
    exists, but what it is and what reads it, in one line, exit 66."""
    from perfrun import cli
    from perfrun.exitcodes import ExitCode

    run = tmp_path / "run"
    run.mkdir()
    _write(run, "rank0.json", _rank(0, 1))
    _write(tmp_path, "base.json", {"format": "perfrun-baseline", "version": 1})
    _write(tmp_path, "trace.json", {"traceEvents": []})
    said = {
        run / "rank0.json": f"is a file of the run folder {run}: give the folder (perfrun "
                            f"report {run})",
        tmp_path / "base.json": "is a baseline file, not a results folder: compare a run "
                                f"with it (perfrun compare {tmp_path / 'base.json'} RUN)",
        tmp_path / "trace.json": "is a file, not a results folder: give a run folder or a "
                                 "log folder (a torch.profiler trace is read by perfrun "
                                 "analyze)",
    }
    for path, why in said.items():
        with pytest.raises(ResultsError) as refused:
            read_run(str(path))
        assert str(refused.value) == f"{path} {why}"
        assert cli.main(["report", str(path)]) == ExitCode.BAD_RESULTS
        assert capsys.readouterr().err == f"perfrun: error: {path} {why}\n"
    with pytest.raises(ResultsError, match="no such results folder"):
        read_run(str(tmp_path / "nowhere"))
