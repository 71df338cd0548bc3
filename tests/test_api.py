"""perfrun from Python (perfrun/api.py): values back, typed errors, nothing
printed, and the README's example run as written.

The runs are folders written here by hand (a rank document with its steps
inline, as a baseline holds them), read back through the store as any run
folder is: no script runs, so these are in the inner loop."""

from __future__ import annotations

import io
import json
import os
import re
import runpy
from pathlib import Path
from typing import Any

import pytest
from builders import MS, make_rank, make_rows

from perfrun import api
from perfrun.analysis.compare import Comparison
from perfrun.analysis.report import Report
from perfrun.store.stepfile import STEP_COLUMNS

README = Path(__file__).resolve().parent.parent / "README.md"
ROWS = make_rows([{"dataloader": MS, "forward": 2 * MS, "backward": 3 * MS,
                   "optimization": MS, "others": MS, "samples": 32}] * 20)


def write_run(folder: Path, rows: list[list[Any]] = ROWS, **rank: Any) -> Path:
    """A run folder of one rank: its document with the steps inline, and a
    run.json saying when it started."""
    folder.mkdir(parents=True)
    data = make_rank(rows, **rank).data
    data["steps"] = {"columns": list(STEP_COLUMNS), "rows": rows}
    (folder / "rank0.json").write_text(json.dumps(data))
    (folder / "run.json").write_text(json.dumps({"started": 1.0, "returncode": 0,
                                                 "command": ["perfrun", "train.py"]}))
    return folder


def readme_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## perfrun from Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_readme_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "perfrun_log" / "20261126-100000-1")
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    runpy.run_path(str(script))
    out = capsys.readouterr()
    # 8 phases of MS (1/1024 s) a step; a Reader Ratio of 12.5%.
    assert out.out == "7.812 ms a step ['io-bound']\n"
    assert out.err == ""
    markdown = (tmp_path / "report.md").read_text()
    assert "### Perf Summary" in markdown and "batch_cost" in markdown


def test_a_report_is_a_value(tmp_path: Path) -> None:
    run = api.load_run(str(write_run(tmp_path / "run")))
    report = api.build_report(run)
    assert isinstance(report, Report)
    assert report.perf is not None and report.perf.batch_cost.avg == pytest.approx(8 * MS)
    assert report.title.steps_recorded == 20
    # The JSON ends with the merged results, as `perfrun report --format json`.
    doc = json.loads(api.render(report, "json") or "")
    assert doc["results"]["ranks"][0]["rank"] == 0
    # The page needs nothing but the Report.
    page = api.render(report, "html") or ""
    assert 'id="chart-steps"' in page and "Perf Summary" in page


def test_render_writes_to_a_stream_or_returns_the_text(tmp_path: Path) -> None:
    report = api.build_report(api.load_run(str(write_run(tmp_path / "run"))))
    stream = io.StringIO()
    assert api.render(report, "markdown", stream) is None
    assert stream.getvalue() == api.render(report, "markdown")


def test_errors_are_typed_and_nothing_is_printed(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(api.ResultsError) as missing:
        api.load_run(str(tmp_path / "nowhere"))
    assert missing.value.kind == api.MISSING
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "rank0.json").write_text("{not json")
    with pytest.raises(api.ResultsError) as broken:
        api.load_run(str(damaged))
    assert broken.value.kind == api.DAMAGED
    with pytest.raises(api.RunInputError) as base:
        api.compare(str(tmp_path / "no-baseline.json"), str(damaged))
    assert (base.value.which, base.value.kind) == ("baseline", api.MISSING)
    with pytest.raises(api.TraceError):
        api.analyze([str(tmp_path / "no-trace.json")])
    assert capsys.readouterr() == ("", "")


def test_every_error_perfrun_raises_has_one_root_and_a_slug(tmp_path: Path) -> None:
    """One `except api.PerfrunError` catches each kind the API raises; each
    public kind has its own slug, and the root is in every error class
    the package defines (read from its source, so a new one cannot miss
    it)."""
    import ast
    import importlib

    with pytest.raises(api.PerfrunError) as caught:
        api.load_run(str(tmp_path / "nowhere"))
    assert caught.value.slug == "results"
    with pytest.raises(api.PerfrunError) as caught:
        api.analyze([str(tmp_path / "no-trace.json")])
    assert caught.value.slug == "trace"
    kinds = [api.ResultsError, api.RunInputError, api.TraceError, api.EnvironmentMismatch,
             api.LaunchError, api.SettingsError]
    assert all(issubclass(kind, api.PerfrunError) for kind in kinds)
    assert len({kind.slug for kind in kinds}) == len(kinds)

    package = Path(api.__file__).parent
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error") \
                    and not node.name.startswith("_"):
                name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
                cls = getattr(importlib.import_module(name), node.name)
                assert issubclass(cls, api.PerfrunError), f"{name}.{node.name}"
                assert cls is api.PerfrunError or cls.slug != "error", f"{name}.{node.name}"


def test_the_result_types_are_importable_from_the_api_and_cost_nothing_until_asked() -> None:
    """`from perfrun.api import Report` works at run time; importing the
    api alone does not import the analysis (a script that never imports
    torch is reported without it)."""
    import subprocess
    import sys

    code = ("import sys, perfrun.api as api\n"
            "print('perfrun.analysis.report' in sys.modules)\n"
            "from perfrun.api import Report, Comparison, TraceAnalysis, Settings\n"
            "print(Report.__module__, Comparison.__module__, TraceAnalysis.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == ["False", "perfrun.analysis.report", "perfrun.analysis.compare",
                   "perfrun.analysis.window"]
    assert api.Report is Report and api.Comparison is Comparison
    assert set(api.__all__) >= {"Report", "Comparison", "TraceAnalysis", "Settings",
                                "PerfrunError", "SettingsError"}
    with pytest.raises(AttributeError):
        api.NoSuchThing  # noqa: B018


def test_compare_returns_the_comparison_and_refuses_other_environments(tmp_path: Path) -> None:
    long = ROWS * 10  # enough steady steps for the gate to decide
    base = write_run(tmp_path / "base", long)
    same = write_run(tmp_path / "same", long)
    comparison = api.compare(str(base), str(same), threshold=0.05)
    assert isinstance(comparison, Comparison)
    assert comparison.gate is not None and comparison.gate.ratio == pytest.approx(1.0)
    other = write_run(tmp_path / "other", long, command="python other.py",
                      settings={"script": "other.py"})
    with pytest.raises(api.EnvironmentMismatch) as refused:
        api.compare(str(base), str(other), threshold=0.05)
    assert any(d.startswith("script:") for d in refused.value.differences)
    # Without a gate, runs of different environments are compared all the same.
    assert api.compare(str(base), str(other)).mismatches


def test_a_run_with_no_steps_is_no_baseline_and_the_file_is_kept(tmp_path: Path) -> None:
    """A baseline of no steps would make every later gate exit 67: it is
    refused (MISSING: no measurement), and a baseline already in the file
    stays as it was."""
    path = tmp_path / "base.json"
    assert api.save_baseline(str(write_run(tmp_path / "good")), str(path)) == 1
    before = path.read_bytes()
    empty = write_run(tmp_path / "empty", rows=[])
    with pytest.raises(api.ResultsError) as refused:
        api.save_baseline(str(empty), str(path))
    assert refused.value.kind == api.MISSING
    assert "recorded no steps" in str(refused.value)
    assert path.read_bytes() == before
    with pytest.raises(api.ResultsError):
        api.save_baseline(str(empty), str(tmp_path / "new.json"))
    assert not (tmp_path / "new.json").exists()


def test_save_baseline_returns_the_runs_it_holds(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    path = str(tmp_path / "base.json")
    assert api.save_baseline(str(run_dir), path) == 1
    assert api.save_baseline(str(run_dir), path) == 2
    assert api.load_baseline(path).ranks[0].n_steps == 20
    assert os.path.exists(path)
