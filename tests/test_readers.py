"""Readers that never trust their input: results files, baselines and configs
with the wrong types, the wrong encoding or an alias bomb end in one line that
names the file and the field, with exit 66 (results, baselines) or 64
(configs), never a traceback. Also: how a log folder's run is picked when
`latest` is stale, and whether a "running" rank's process is alive."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from builders import make_rank, make_rows
from conftest import flat

from perfrun import cli
from perfrun.api import save_baseline
from perfrun.config import PROFILER_KEYS, load_config
from perfrun.exitcodes import ExitCode
from perfrun.settings import SettingsError
from perfrun.store.files import ResultsError
from perfrun.store.rankfile import RankResult, read_rank_file
from perfrun.store.results import rank_alive, resolve_run_dir
from perfrun.store.schema import SHOWN_CHARS, shown
from perfrun.store.stepfile import STEP_COLUMNS

#: Values of every JSON type, to put where another type belongs.
WRONG = ("x", 5, 1.5, True, None, [], {}, [1, "a"], {"a": 1})


def rank_document(n_steps: int = 30, **kwargs: Any) -> dict[str, Any]:
    """A rank file's whole document, with every top-level key a rank writes
    (make_rank's, plus those only the full agent writes)."""
    rows = make_rows([{"forward": 3 / 1024, "backward": 5 / 1024, "samples": 8}] * n_steps)
    doc = dict(make_rank(rows, **kwargs).data)
    doc.update({
        "perfrun": "0.1.0",
        "started_unix": 1795386900.25,
        "elapsed": 2.5,
        "profiled": None,
        "window_summary": None,
        "nsys_capture": None,
        "module_hook_calls": None,
        "distributed": {"world_size": 2, "backend": "gloo",
                        "wrappers": ["DistributedDataParallel"]},
        "cuda": {},
        "extra": {"dataloader_init": {"calls": 1, "time": 0.001}},
        "device": {"samples": 1, "cpu_process_percent": {"avg": 90.0, "max": 99.0},
                   "gpus": [], "driver": None},
        "steps": {"columns": list(STEP_COLUMNS), "rows": rows},
    })
    return doc


RANK_KEYS = sorted(rank_document())


def write_run(folder: Path, doc: dict[str, Any], started: float = 1.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rank0.json").write_text(json.dumps(doc), encoding="utf-8")
    meta = {"expected_ranks": 1, "nnodes": None, "launcher": "python", "started": started}
    (folder / "run.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def perfrun(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """perfrun in-process: its exit code and its own lines on stderr."""
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    return int(code), [line for line in err.splitlines() if line.startswith("perfrun:")]


def _same_type(a: Any, b: Any) -> bool:
    return type(a) is type(b) or (type(a) in (int, float) and type(b) in (int, float))


# -- results files ------------------------------------------------------------------------


@pytest.mark.parametrize("key", RANK_KEYS)
def test_rank_file_key_of_the_wrong_type(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = rank_document()
    for i, bad in enumerate(v for v in WRONG if not _same_type(v, good[key])):
        doc = {**good, key: bad}
        run = write_run(tmp_path / f"r{i}", doc)
        code, lines = perfrun(["report", str(run)], capsys)
        assert code in (ExitCode.OK, ExitCode.BAD_RESULTS, ExitCode.NO_MEASUREMENT), (bad, code)
        if code == ExitCode.BAD_RESULTS:
            assert len(lines) == 1 and lines[0].startswith("perfrun: error: "), lines
            assert str(run / "rank0.json") in lines[0]
            if key not in ("format", "version"):
                assert f": {key}" in lines[0], lines[0]
    # A string where a number, list or mapping belongs (or a number where a
    # string belongs) is always refused: no key is left unchecked.
    bad = 5 if isinstance(good[key], str) else "x"
    run = write_run(tmp_path / "strict", {**good, key: bad})
    code, lines = perfrun(["report", str(run)], capsys)
    assert code == ExitCode.BAD_RESULTS and len(lines) == 1, (code, lines)


def test_rows_of_the_wrong_type_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = rank_document()
    doc["steps"] = {"columns": list(STEP_COLUMNS), "rows": "x"}
    run = write_run(tmp_path / "r", doc)
    code, lines = perfrun(["report", str(run)], capsys)
    assert code == ExitCode.BAD_RESULTS
    assert lines == [
        f"perfrun: error: cannot read {run / 'rank0.json'}: steps.rows: expected a list, got str"
    ]


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda rows: rows.__setitem__(3, "x"),
         "steps.rows[3]: expected a list of 17 values, got str"),
        (lambda rows: rows[4].pop(), "steps.rows[4]: expected a list of 17 values, got 16 values"),
        (lambda rows: rows[5].__setitem__(2, "x"),
         "steps.rows[5][2] (dataloader): expected a number or null, got str"),
        (lambda rows: rows[6].__setitem__(1, None),
         "steps.rows[6] (end): expected a number, got null"),
    ],
)
def test_damaged_step_rows(mutate: Any, fragment: str, tmp_path: Path) -> None:
    doc = rank_document()
    mutate(doc["steps"]["rows"])
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError) as info:
        read_rank_file(str(path))
    assert str(info.value) == f"cannot read {path}: {fragment}"


def test_nested_fields_are_checked(tmp_path: Path) -> None:
    doc = rank_document()
    doc["env"] = {**doc["env"], "pid": "x"}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"env\.pid: expected an integer or null, got str$"):
        read_rank_file(str(path))


@pytest.mark.parametrize("record, fragment", [
    ({"world_size": "2", "backend": "gloo", "wrappers": []},
     r"distributed\.world_size: expected an integer or null, got str$"),
    ({"world_size": 2, "backend": "gloo", "wrappers": "DistributedDataParallel"},
     r"distributed\.wrappers: expected a list"),
    ({"world_size": 2, "backend": "gloo", "wrappers": [5]},
     r"distributed\.wrappers\[0\]: expected a string, got int$"),
])
def test_the_distributed_record_is_checked(record: dict[str, Any], fragment: str,
                                           tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({**rank_document(), "distributed": record}))
    with pytest.raises(ResultsError, match=fragment):
        read_rank_file(str(path))
    # Absent (files from before it) or null (no root module called): read.
    for doc in ({k: v for k, v in rank_document().items() if k != "distributed"},
                {**rank_document(), "distributed": None}):
        path.write_text(json.dumps(doc))
        read_rank_file(str(path))


def test_results_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "r", rank_document())
    raw = (run / "rank0.json").read_bytes().replace(b'"host0"', b'"h\xffst"')
    (run / "rank0.json").write_bytes(raw)
    code, lines = perfrun(["report", str(run)], capsys)
    assert code == ExitCode.BAD_RESULTS
    assert len(lines) == 1 and "not UTF-8 text (byte 0xff" in lines[0], lines


def test_running_rank_is_not_damaged(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(rank_document(status="running")))
    rank = read_rank_file(str(path))
    assert rank.status == "running" and len(rank.rows) == 30


def test_a_long_run_loads_fast(tmp_path: Path) -> None:
    doc = rank_document(n_steps=100_000)
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    t0 = time.perf_counter()
    json.loads(path.read_text())
    parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert len(read_rank_file(str(path)).rows) == 100_000
    # Checking costs a fraction of parsing (loosely: machines vary).
    assert time.perf_counter() - t0 < parse * 2 + 0.5


# -- baselines ----------------------------------------------------------------------------


@pytest.fixture
def baseline_file(tmp_path: Path) -> Path:
    run = write_run(tmp_path / "base_run", rank_document())
    path = tmp_path / "base.json"
    save_baseline(str(run), str(path))
    return path


BASELINE_KEYS = ("format", "version", "fingerprint", "disturbed", "meta", "ranks", "missing",
                 "history")


@pytest.mark.parametrize("key", BASELINE_KEYS)
def test_baseline_key_of_the_wrong_type(
    key: str, baseline_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = json.loads(baseline_file.read_text())
    assert sorted(good) == sorted(BASELINE_KEYS)
    current = write_run(tmp_path / "current", rank_document())
    for bad in (v for v in WRONG if not _same_type(v, good[key])):
        baseline_file.write_text(json.dumps({**good, key: bad}))
        code, lines = perfrun(["compare", str(baseline_file), str(current)], capsys)
        assert code in (ExitCode.OK, ExitCode.BAD_RESULTS, ExitCode.NO_MEASUREMENT,
                        ExitCode.INCONCLUSIVE, ExitCode.REGRESSION), (bad, code)
        if code == ExitCode.BAD_RESULTS:
            assert len(lines) == 1 and str(baseline_file) in lines[0], lines


@pytest.mark.parametrize("key", RANK_KEYS)
def test_baseline_rank_key_of_the_wrong_type(
    key: str, baseline_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = json.loads(baseline_file.read_text())
    current = write_run(tmp_path / "current", rank_document())
    bad = 5 if isinstance(good["ranks"][0][key], str) else "x"
    doc = {**good, "ranks": [{**good["ranks"][0], key: bad}]}
    baseline_file.write_text(json.dumps(doc))
    code, lines = perfrun(["compare", str(baseline_file), str(current)], capsys)
    assert code == ExitCode.BAD_RESULTS and len(lines) == 1, (code, lines)
    assert str(baseline_file) in lines[0]
    if key not in ("format", "version"):
        assert f"ranks[0].{key}" in lines[0], lines[0]


# -- configs ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(PROFILER_KEYS))
def test_config_key_of_the_wrong_type(key: str, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    for bad in ("x", 5, 1.5, True, None, [1, 2, 3], {"a": 1}, "y" * 500):
        config.write_text(json.dumps({"Profiler": {key: bad}}))  # JSON is YAML
        try:
            load_config(str(config))
        except SettingsError as exc:
            message = str(exc)
            assert "\n" not in message and len(message) < 300, message
            assert message.startswith(f"{config}: ") and f"Profiler.{key}" in message


def test_config_error_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("Profiler:\n  scheduler: abc\n")
    code, lines = perfrun(["--config", str(config), "train.py"], capsys)
    assert code == ExitCode.CONFIG
    assert lines == [
        f"perfrun: error: {config}: Profiler.scheduler: expected two integers [START, END], "
        "got 'abc'"
    ]


def test_config_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_bytes(b"Profiler:\n  enable: \xe9t\xe9\n")
    code, lines = perfrun(["--config", str(config), "train.py"], capsys)
    assert code == ExitCode.CONFIG
    assert lines == [
        f"perfrun: error: cannot read config file {config}: not UTF-8 text (byte 0xe9 at offset 20)"
    ]


def _bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nProfiler:\n  enable: *a{levels}\n"


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(_bomb())
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(SettingsError) as info:
            load_config(str(config))
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value) == (
        f"{config}: refusing YAML: its aliases expand to more than 100,000 values"
    )
    assert elapsed < 1.0 and peak < 50 * 2**20, (elapsed, peak)


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("a: &a [1, *a]\nProfiler:\n  enable: true\n")
    with pytest.raises(SettingsError, match="an alias refers to the value that contains it"):
        load_config(str(config))


def test_small_aliases_still_load(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("w: &w [3, 14]\nProfiler:\n  scheduler: *w\n")
    assert load_config(str(config)) == {"scheduler": (3, 14)}


def test_values_shown_in_messages_are_capped() -> None:
    nested: Any = ["x" * 1000]
    for _ in range(50):
        nested = [nested, nested]
    assert len(shown(nested)) <= SHOWN_CHARS
    assert len(shown("y" * 10_000)) <= SHOWN_CHARS
    assert shown("abc") == "'abc'"


# -- which run a log folder means ---------------------------------------------------------


def _log_folder(tmp_path: Path, latest: str) -> tuple[Path, Path, Path]:
    log = tmp_path / "perfrun_log"
    old = write_run(log / "20260101-000000-1", rank_document(), started=100.0)
    new = write_run(log / "20260102-000000-2", rank_document(), started=200.0)
    (log / "latest").symlink_to(latest)
    return log, old, new


@pytest.mark.parametrize(
    "latest, why",
    [
        ("20260103-000000-3", "points to a missing run (20260103-000000-3)"),
        ("20260101-000000-1", "points to an older run (20260101-000000-1)"),
    ],
)
def test_stale_latest_picks_the_newest_run(latest: str, why: str, tmp_path: Path) -> None:
    log, _, new = _log_folder(tmp_path, latest)
    notes: list[str] = []
    assert resolve_run_dir(str(log), note=notes.append) == str(new)
    assert notes == [f"{log / 'latest'} {why}; reporting the newest run, {new}"]


def test_current_latest_is_used_quietly(tmp_path: Path) -> None:
    log, _, new = _log_folder(tmp_path, "20260102-000000-2")
    notes: list[str] = []
    assert resolve_run_dir(str(log), note=notes.append) == os.path.realpath(new)
    assert notes == []


def test_report_with_a_dangling_latest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, _, new = _log_folder(tmp_path, "gone")
    capsys.readouterr()
    code = cli.main(["report", str(log)])
    assert code == ExitCode.OK
    # A note, laid out in 80 columns in a pipe too (prose.note_for_stream).
    assert flat(capsys.readouterr().err).startswith(
        f"perfrun: note: {log / 'latest'} points to a missing run (gone); "
        f"reporting the newest run, {new}"
    )


# -- is a running rank alive? -------------------------------------------------------------


def _rank_of(pid: Any, hostname: Any) -> RankResult:
    rank = make_rank(status="running")
    rank.data["env"] = {**rank.data["env"], "pid": pid, "hostname": hostname}
    return rank


@pytest.mark.slow
def test_rank_alive() -> None:
    here = socket.gethostname()
    assert rank_alive(_rank_of(os.getpid(), here)) is True
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert rank_alive(_rank_of(child.pid, here)) is False
    assert rank_alive(_rank_of(os.getpid(), here + ".elsewhere")) is None
    assert rank_alive(_rank_of(None, here)) is None
    assert rank_alive(_rank_of("12", here)) is None
