"""`perfrun combine` (perfrun/combine.py): which copy of a rank is kept,
which folders are one job's, and what the combined folder holds. The
deciders on plain data; the command on hand-made run folders, in-process.
A real two-node run combined is in test_multinode.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from perfrun import combine as combining
from perfrun.cli import main
from perfrun.combine import FolderFacts, RankCopy, choose_copy, mixed_jobs, stem_of
from perfrun.exitcodes import ExitCode
from perfrun.store.results import read_run
from perfrun.store.stepfile import STEP_COLUMNS

# -- the deciders --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, stem",
    [
        ("rank0.json", (0, 0)),
        ("rank12.steps", (12, 0)),
        ("rank3.restart2.json", (3, 2)),
        ("rank3.restart2.steps", (3, 2)),
        ("rank1.pt.trace.json.gz", (1, 0)),
        ("rank1.restart1.pt.trace.json", (1, 1)),
        ("rank4.nsys-rep", (4, 0)),
        (".rank0.raw.json", None),
        (".tmp-12-1-rank0.json", None),
        ("run.json", None),
        ("rankX.json", None),
    ],
)
def test_a_file_belongs_to_the_rank_its_name_starts_with(name: str, stem: Any) -> None:
    assert stem_of(name) == stem


def _copy(folder: str, digest: str = "a", final: bool = True, steps: int = 10,
          extra: int = 0, elapsed: float = 1.0) -> RankCopy:
    return RankCopy(folder, 0, 0, ("rank0.json",), digest, final, steps, extra, elapsed)


def test_identical_copies_are_one() -> None:
    best, why = choose_copy([_copy("a"), _copy("b")])
    assert (best.folder, why) == ("a", "identical copies")


@pytest.mark.parametrize(
    "copies, kept, why",
    [
        ([_copy("a", "1", final=False, steps=50), _copy("b", "2", steps=10)], "b",
         "its final results (the other copy was still running)"),
        ([_copy("a", "1", steps=30), _copy("b", "2", steps=50)], "b",
         "more steps (50 against 30)"),
        ([_copy("a", "1", extra=800), _copy("b", "2", extra=400)], "a",
         "more step data (800 bytes against 400)"),
        ([_copy("a", "1", elapsed=2.0), _copy("b", "2", elapsed=5.0)], "b",
         "ran longer (5.0 s against 2.0 s)"),
        ([_copy("a", "1"), _copy("b", "2")], "a",
         "the first given (the copies differ, but not in status, steps or length)"),
    ],
)
def test_of_copies_that_differ_the_most_complete_is_kept(
    copies: list[RankCopy], kept: str, why: str
) -> None:
    best, reason = choose_copy(copies)
    assert (best.folder, reason) == (kept, why)


def _facts(folder: str, ids: Any = (), scripts: Any = (), worlds: Any = ()) -> FolderFacts:
    return FolderFacts(folder, frozenset(ids), frozenset(scripts), frozenset(worlds))


def test_one_jobs_folders_are_not_mixed() -> None:
    assert mixed_jobs([_facts("a", ["X"], ["t.py"], [4]), _facts("b", ["X"], ["t.py"], [4]),
                       _facts("c", [], [], [])]) is None


@pytest.mark.parametrize(
    "facts, fragment",
    [
        ([_facts("a", ["X"]), _facts("b", ["Y"])], "different job ids: X (a), Y (b)"),
        ([_facts("a", scripts=["t.py"]), _facts("b", scripts=["u.py"])],
         "different scripts: t.py (a), u.py (b)"),
        ([_facts("a", worlds=[4]), _facts("b", worlds=[8])], "different world sizes: 4 (a), 8 (b)"),
    ],
)
def test_folders_of_different_jobs_are_refused(facts: list[FolderFacts], fragment: str) -> None:
    problem = mixed_jobs(facts)
    assert problem is not None and fragment in problem and "\n" not in problem


def test_a_name_perfrun_picks_never_replaces_a_folder() -> None:
    taken = {"out", "out-2"}
    assert combining.default_output("out", taken.__contains__) == "out-3"
    assert combining.default_output("new", taken.__contains__) == "new"


def test_rank_lists_read_as_ranges() -> None:
    assert combining.ranges([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"
    assert combining.ranges([]) == ""


# -- the command on hand-made folders ------------------------------------------------------


def _rank_doc(rank: int, world: int, restart: int = 0, rows: int = 3, status: str = "finished",
              rdzv_id: Optional[str] = "J", script: str = "train.py", node_rank: int = 0) -> dict:
    row = [0.0, 1.0] + [0.0] * (len(STEP_COLUMNS) - 2)
    return {
        "format": "perfrun-results", "version": 1, "rank": rank, "local_rank": 0,
        "world_size": world, "restart": restart, "status": status, "elapsed": float(rows),
        "settings": {"rdzv_id": rdzv_id, "script": script, "node_rank": node_rank,
                     "nnodes": "2"},
        "steps": {"columns": list(STEP_COLUMNS), "rows": [row] * rows},
    }


def _folder(path: Path, ranks: dict[str, dict], extra: Optional[dict[str, bytes]] = None,
            meta: Optional[dict] = None) -> Path:
    path.mkdir(parents=True)
    for name, doc in ranks.items():
        (path / name).write_text(json.dumps(doc))
    for name, data in (extra or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    if meta is not None:
        (path / "run.json").write_text(json.dumps(meta))
    return path


def _combine(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cwd: Path,
             *args: str) -> tuple[int, list[str]]:
    monkeypatch.chdir(cwd)
    code = main(["combine", *args])
    return code, capsys.readouterr().err.splitlines()


def test_a_ranks_files_come_together_from_the_copy_kept(tmp_path: Path, monkeypatch,
                                                         capsys) -> None:
    # Node 0's folder copied twice: once mid-run (rank 0 still running, 2
    # steps), once at the end. Each copy has a step file and a trace beside
    # the rank file; node 1's folder has rank 1, its nsys report, its
    # restart, and node 1's torchrun record.
    _folder(tmp_path / "early", {"rank0.json": _rank_doc(0, 2, rows=2, status="running")},
            {"rank0.steps": b"early", "trace/rank0.pt.trace.json": b"early"})
    _folder(tmp_path / "late", {"rank0.json": _rank_doc(0, 2, rows=5)},
            {"rank0.steps": b"late", "trace/rank0.pt.trace.json": b"late"},
            meta={"started": 10.0, "returncode": 0, "node_rank": 0, "launcher": "torchrun"})
    _folder(tmp_path / "n1", {"rank1.json": _rank_doc(1, 2, node_rank=1),
                              "rank1.restart1.json": _rank_doc(1, 2, restart=1, node_rank=1)},
            {"rank1.restart1.steps": b"r1", "nsys/rank1.nsys-rep": b"nsys",
             "nodes/torchrun-status.node1.json": b"{}", "trace/.rank1.raw.json": b"tmp"},
            meta={"started": 9.0, "returncode": 0, "node_rank": 1, "launcher": "torchrun"})
    code, err = _combine(monkeypatch, capsys, tmp_path, "early", "late", "n1", "-o", "out")
    assert code == ExitCode.OK, err
    assert err == [
        "perfrun: rank 0: kept the copy in late: its final results (the other copy was still "
        "running)",
        "perfrun: combined ranks 0-1 from 3 folders into out; dropped 1 other duplicate copy",
        "perfrun: see it with: perfrun report out",
    ]
    out = tmp_path / "out"
    assert (out / "rank0.steps").read_bytes() == b"late"
    assert (out / "trace/rank0.pt.trace.json").read_bytes() == b"late"
    assert (out / "nsys/rank1.nsys-rep").read_bytes() == b"nsys"
    assert (out / "rank1.restart1.steps").read_bytes() == b"r1"
    assert (out / "nodes/torchrun-status.node1.json").exists()
    assert not (out / "trace/.rank1.raw.json").exists()
    meta = json.loads((out / "run.json").read_text())
    assert sorted(meta["nodes"]) == ["0", "1"] and meta["returncode"] == 0
    assert meta["started"] == 9.0 and meta["combined_from"] == ["early", "late", "n1"]
    run = read_run(str(out))
    assert [(r.rank, r.restart, len(r.rows)) for r in run.ranks] == [(0, 0, 5), (1, 1, 3)]
    # Nothing left behind beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["early", "late", "n1", "out"]


def test_without_o_the_combined_folder_is_named_for_the_job(tmp_path: Path, monkeypatch,
                                                             capsys) -> None:
    job = {"id": "J", "name": "job-J", "world_size": 4, "nnodes": "2"}
    _folder(tmp_path / "a", {"rank0.json": _rank_doc(0, 4)}, meta={"job": job})
    _folder(tmp_path / "b", {"rank1.json": _rank_doc(1, 4)}, meta={"job": job})
    code, err = _combine(monkeypatch, capsys, tmp_path, "a", "b")
    assert code == ExitCode.OK
    assert err[-2:] == [
        "perfrun: note: ranks 2-3 of 4 are in none of the folders",
        "perfrun: see it with: perfrun report perfrun_log/combined-job-J",
    ]
    code, err = _combine(monkeypatch, capsys, tmp_path, "a", "b")
    assert code == ExitCode.OK and err[-1].endswith("perfrun_log/combined-job-J-2"), err


@pytest.mark.parametrize(
    "second, fragment",
    [
        ({"rdzv_id": "K"}, "different job ids: J (a), K (b)"),
        ({"script": "other.py"}, "different scripts: train.py (a), other.py (b)"),
        ({"world": 4}, "different world sizes: 2 (a), 4 (b)"),
    ],
)
def test_runs_of_different_jobs_are_refused_in_one_line(
    tmp_path: Path, monkeypatch, capsys, second: dict, fragment: str
) -> None:
    _folder(tmp_path / "a", {"rank0.json": _rank_doc(0, 2)})
    doc = _rank_doc(1, second.pop("world", 2), **second)
    _folder(tmp_path / "b", {"rank1.json": doc})
    code, err = _combine(monkeypatch, capsys, tmp_path, "a", "b", "-o", "out")
    assert code == ExitCode.MIXED_RUNS == 71
    assert err == [f"perfrun: error: cannot combine: the folders are runs of different jobs: "
                   f"{fragment}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "setup, code, fragment",
    [
        ("missing", ExitCode.BAD_RESULTS, "no such results folder: nowhere"),
        ("empty", ExitCode.BAD_RESULTS, "holds no perfrun results"),
        ("damaged", ExitCode.BAD_RESULTS, "is not valid JSON"),
        ("exists", ExitCode.CONFIG, "out already exists"),
    ],
)
def test_bad_input_is_one_line_and_a_documented_code(
    tmp_path: Path, monkeypatch, capsys, setup: str, code: int, fragment: str
) -> None:
    _folder(tmp_path / "a", {"rank0.json": _rank_doc(0, 2)})
    args = ["a"]
    if setup == "missing":
        args.append("nowhere")
    elif setup == "empty":
        (tmp_path / "b").mkdir()
        args.append("b")
    elif setup == "damaged":
        _folder(tmp_path / "b", {})
        (tmp_path / "b" / "rank1.json").write_text('{"format": "perfrun-res')
        args.append("b")
    else:
        _folder(tmp_path / "out", {"rank5.json": _rank_doc(5, 8)})
    got, err = _combine(monkeypatch, capsys, tmp_path, *args, "-o", "out")
    assert got == code and len(err) == 1 and fragment in err[0], err
    assert err[0].startswith("perfrun: error: ")
    if setup == "exists":
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank5.json"]


def test_an_empty_output_folder_is_filled(tmp_path: Path, monkeypatch, capsys) -> None:
    _folder(tmp_path / "a", {"rank0.json": _rank_doc(0, 1)})
    (tmp_path / "out").mkdir()
    code, err = _combine(monkeypatch, capsys, tmp_path, "a", "a", "-o", "out")
    assert code == ExitCode.OK, err
    assert "from 1 folder into out" in err[-2]  # the same folder twice is one
    assert (tmp_path / "out" / "rank0.json").exists()


def test_two_runs_of_one_node_are_not_one_job(tmp_path: Path, monkeypatch, capsys) -> None:
    # The same script run twice on one machine: each rank 0 is another
    # run's, not a duplicate to choose from. A copy of one run is the same.
    def single(name: str, pid: int) -> None:
        doc = _rank_doc(0, 1, rdzv_id=None)
        doc["settings"]["nnodes"] = None
        _folder(tmp_path / name, {"rank0.json": doc},
                meta={"started": 1_700_000_000.0, "pid": pid, "host": "h", "returncode": 0})

    single("first", 10)
    single("copy", 10)
    single("second", 11)
    code, err = _combine(monkeypatch, capsys, tmp_path, "first", "copy", "-o", "out")
    assert code == ExitCode.OK, err
    code, err = _combine(monkeypatch, capsys, tmp_path, "first", "second", "-o", "out2")
    assert code == ExitCode.MIXED_RUNS
    assert len(err) == 1 and "different runs of one node: the run started " in err[0]
    assert "by pid 10 on h (first)" in err[0] and "by pid 11 on h (second)" in err[0]
