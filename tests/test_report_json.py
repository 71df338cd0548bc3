"""The JSON report (`--format json`) as a contract: its document for a
fixed run, kept in tests/expected/report.json (floats rounded to 9
significant digits, the run folder's path scrubbed), and its top-level keys
as docs/results-format.md lists them.

A change that adds, removes or renames a key, or changes a value, fails
here; when it is intended, write the file again and say in
docs/results-format.md's history what changed (and bump REPORT_VERSION for
a key removed or renamed, or a value whose meaning or unit changed):
PERFRUN_UPDATE_EXPECTED=1 pytest tests/test_report_json.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from builders import MS, make_rank, make_rows

from perfrun import api
from perfrun.analysis.report import REPORT_VERSION
from perfrun.store.stepfile import STEP_COLUMNS

EXPECTED = Path(__file__).parent / "expected" / "report.json"
DOC = Path(__file__).resolve().parent.parent / "docs" / "results-format.md"
UPDATE_EXPECTED = os.environ.get("PERFRUN_UPDATE_EXPECTED") == "1"


def _rows(rank: int) -> list[list[Any]]:
    """40 steps of a DataLoader loop; rank 1 a little slower in backward,
    and one slow step in each."""
    steps = []
    for i in range(40):
        slow = 6 if i == 25 else 1
        steps.append({"dataloader": MS, "forward": 2 * MS, "backward": (3 + rank) * MS * slow,
                      "optimization": MS, "others": MS / 2, "samples": 32})
    return make_rows(steps)


def _run(folder: Path) -> Path:
    """A run folder of two ranks, their documents with the steps inline."""
    folder.mkdir(parents=True)
    for rank in (0, 1):
        data = make_rank(_rows(rank), rank=rank, world_size=2,
                         extra={"loss.item": {"calls": 40, "time": 0.004}},
                         notes=["a note of the rank's own"]).data
        data["steps"] = {"columns": list(STEP_COLUMNS), "rows": _rows(rank)}
        (folder / f"rank{rank}.json").write_text(json.dumps(data))
    (folder / "run.json").write_text(json.dumps({"started": 1.0, "returncode": 0,
                                                 "command": ["perfrun", "train.py"]}))
    return folder


def _scrubbed(value: Any, run_dir: str) -> Any:
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, str):
        return value.replace(run_dir, "<run_dir>")
    if isinstance(value, dict):
        return {k: _scrubbed(v, run_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, run_dir) for v in value]
    return value


def report_document(tmp_path: Path) -> dict[str, Any]:
    run_dir = _run(tmp_path / "run")
    report = api.build_report(api.load_run(str(run_dir)))
    doc = json.loads(api.render(report, "json") or "")
    doc.pop("results", None)  # the rank documents: their own format (rankfile.py)
    return _scrubbed(doc, str(run_dir))


def test_the_json_report_of_a_fixed_run_is_as_kept(tmp_path: Path) -> None:
    doc = report_document(tmp_path)
    if UPDATE_EXPECTED:
        EXPECTED.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    expected = json.loads(EXPECTED.read_text())
    assert doc["format"] == "perfrun-report" and doc["version"] == REPORT_VERSION
    assert doc == expected


def test_the_documented_keys_are_the_reports(tmp_path: Path) -> None:
    """docs/results-format.md lists every top-level key of the JSON report,
    and the version it describes."""
    section = DOC.read_text(encoding="utf-8").split("\n## The JSON report", 1)[1]
    section = section.split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    doc = report_document(tmp_path)
    assert listed == set(doc) | {"results"}
    assert f"`version` {REPORT_VERSION}" in section
