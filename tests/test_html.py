"""report.html (perfrun/report/html.py): the numbers it draws, checked as
pure functions, then the page itself opened in a real headless Chromium for
single-rank, two-rank (gloo), window and gated runs: no JavaScript error,
every chart drawn, and the charts and tables holding the run's numbers.

Chromium comes from the system's packages (.ci/run installs it); where it
is absent the browser tests skip and say so."""

from __future__ import annotations

import base64
import gzip
import html as htmlmod
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import MS, make_rank, make_rows, make_run
from conftest import e2e_environment

from perfrun import commands
from perfrun.analysis import columns
from perfrun.analysis import series as page_series
from perfrun.analysis.build import build_report
from perfrun.analysis.selection import profiled_steps, steady_table
from perfrun.report import html as page
from perfrun.report.primitives import fmt_sig
from perfrun.store.results import read_run
from perfrun.store.stepfile import COL, STEP_COLUMNS

SCRIPTS = Path(__file__).parent / "scripts"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH (CI installs it: apt-get install chromium, see .ci/run)",
)


# -- pure numbers -------------------------------------------------------------------


def _table(n: int, seed: int = 0) -> Any:
    """n steps of known phases, one slow step, and set-aside time at one step."""
    rng = np.random.default_rng(seed)
    t = np.full((n, len(STEP_COLUMNS)), np.nan)
    fwd = rng.uniform(1e-3, 2e-3, n)
    bwd = rng.uniform(2e-3, 3e-3, n)
    fwd[n // 2] = 0.5  # one slow step that must survive downsampling
    others = np.full(n, 1e-4)
    excluded = np.zeros(n)
    excluded[n // 3] = 0.25
    dur = fwd + bwd + others + excluded
    end = np.cumsum(dur)
    t[:, COL["start"]] = end - dur
    t[:, COL["end"]] = end
    t[:, COL["forward"]] = fwd
    t[:, COL["backward"]] = bwd
    t[:, COL["dataloader"]] = 0.0
    t[:, COL["optimization"]] = 0.0
    t[:, COL["excluded"]] = excluded
    return t


def test_a_short_run_is_drawn_step_by_step() -> None:
    t = _table(100)
    s = page_series.step_series(t)
    assert s["size"] == 1 and s["x"] == list(range(100))
    assert np.allclose(s["step"], columns.step_times(t))
    assert int(np.asarray(s["excluded_steps"]).sum()) == 1


def test_a_long_run_is_bucketed_with_its_envelope() -> None:
    n = 1_000_000
    t = _table(n)
    s = page_series.step_series(t)
    assert len(s["x"]) <= page_series.MAX_BUCKETS and s["size"] == 500
    step = columns.step_times(t)
    # The envelope keeps the single slow step; the means add up per bucket.
    assert max(s["max"]) == pytest.approx(step.max())
    assert min(s["min"]) == pytest.approx(step.min())
    stacked = sum(np.asarray(v) for v in s["phases"].values())
    assert np.allclose(stacked, s["step"])
    assert np.allclose(s["step"][:3], step[:1500].reshape(3, 500).mean(axis=1))
    assert int(np.asarray(s["excluded_steps"]).sum()) == 1


def test_a_million_step_page_stays_small(tmp_path: Path) -> None:
    """The step chart adds a bounded amount whatever the run's length: the
    whole page for 10^6 steps is plotly's bundle plus well under 1 MB."""
    rank = make_rank([])
    rank._rows, rank._table = None, _table(1_000_000)
    run = make_run([rank], run_dir=str(tmp_path))
    text = page.render_html(build_report(run))
    data = len(text.encode()) - len(page.plotly_bundle().encode())
    assert data < 1_000_000, data


#: The most a run's page may take: plotly's 4.8 MB bundle, packed, and the run.
PAGE_LIMIT = 2_000_000


def test_the_page_carries_plotly_packed_and_stays_under_2_mb(tmp_path: Path) -> None:
    """plotly's bundle goes into the page gzipped and in base 85, which the
    page unpacks itself: one file, no link to anything, under 2 MB; and
    unpacked it is the installed bundle, byte for byte."""
    rows = make_rows([{"dataloader": MS, "forward": 2 * MS, "backward": 3 * MS}] * 50)
    text = page.render_html(build_report(make_run([make_rank(rows)], run_dir=str(tmp_path))))
    assert len(text.encode()) <= PAGE_LIMIT
    assert not re.search(r"<(script|link|img)[^>]*\b(src|href)=", text)
    packed = re.search(r'<script type="application/octet-stream" id="plotly-packed">([^<]*)'
                       r"</script>", text)
    assert packed is not None
    bundle = _installed_plotly()
    assert bundle[:2000].decode() not in text  # not embedded as it is
    data = packed.group(1).translate(str.maketrans(".", "<")).encode()
    assert gzip.decompress(base64.b85decode(data)) == bundle
    assert set(packed.group(1)) <= set(page.B85_PAGE) and "<" not in page.B85_PAGE


def test_the_packed_bundle_is_kept_in_the_cache_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing plotly costs about 0.3 s a run: it is kept in the cache
    folder, read back on the next run, and packed again when the cached
    copy fails its checksum (a file cut short, edited)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    page._packed.cache_clear()
    first = page.plotly_bundle()
    cached = list((tmp_path / "perfrun").glob("plotly-*.b85"))
    assert len(cached) == 1
    digest, _, text = cached[0].read_text().partition("\n")
    assert text == first and len(digest) == 64
    page._packed.cache_clear()
    assert page.plotly_bundle() == first
    cached[0].write_text(digest + "\n" + text[: len(text) // 2])  # cut short
    page._packed.cache_clear()
    assert page.plotly_bundle() == first
    assert cached[0].read_text().partition("\n")[2] == first  # mended
    page._packed.cache_clear()


def _installed_plotly() -> bytes:
    import importlib.util

    spec = importlib.util.find_spec("plotly")
    assert spec is not None and spec.origin is not None
    return (Path(spec.origin).parent / "package_data" / "plotly.min.js").read_bytes()


def test_box_stats() -> None:
    b = page_series.box_stats([1.0, 2.0, 3.0, 4.0, 5.0, float("nan")])
    assert b == {"min": 1.0, "q1": 2.0, "median": 3.0, "q3": 4.0, "max": 5.0, "mean": 3.0,
                 "n": 5}
    assert page_series.box_stats([]) is None


def test_rank_medians_name_the_slowest_rank_per_phase() -> None:
    fast = make_rows([{"forward": 2 * MS, "backward": 4 * MS}] * 20)
    slow = make_rows([{"forward": 3 * MS, "backward": 4 * MS}] * 20)
    run = make_run([make_rank(fast, rank=0, world_size=2), make_rank(slow, rank=1, world_size=2)])
    m = build_report(run).series.medians
    q = m["quantities"]
    assert m["ranks"] == [0, 1]
    assert m["values"][0][q.index("forward")] == 2 * MS
    assert m["values"][1][q.index("forward")] == 3 * MS
    assert m["slowest"]["forward"] == 1 and m["slowest"]["step"] == 1
    assert "backward" in m["slowest"]  # a tie names one rank


def test_a_failure_to_write_the_page_is_a_note(monkeypatch: Any, capsys: Any,
                                               tmp_path: Path) -> None:
    def broken(*_a: Any, **_k: Any) -> str:
        raise RuntimeError("no plotly here")

    monkeypatch.setattr(page, "write_run_html", broken)
    report = build_report(make_run([make_rank(make_rows([{"forward": MS}] * 8))],
                                   run_dir=str(tmp_path)))
    assert commands.write_report_html(report) is None
    err = capsys.readouterr().err
    assert err == "perfrun: note: report.html not written (RuntimeError: no plotly here)\n"


def test_a_run_without_steps_gets_no_page(monkeypatch: Any, tmp_path: Path) -> None:
    """A script that failed before its loop, or never imported torch: no
    page of nothing (4.8 MB each, in every such folder)."""
    def written(*_a: Any, **_k: Any) -> str:
        raise AssertionError("a page was drawn")

    monkeypatch.setattr(page, "write_run_html", written)
    empty = build_report(make_run([make_rank([])], run_dir=str(tmp_path)))
    assert empty.problem is not None
    assert commands.write_report_html(empty) is None
    assert commands.write_report_html(None) is None


# -- real runs, opened in Chromium ----------------------------------------------------


def _perfrun(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "perfrun", *args], cwd=cwd, env=e2e_environment(),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory: Any) -> dict[str, Any]:
    """One real run of each kind the page must show, made once."""
    root = tmp_path_factory.mktemp("html")
    out: dict[str, Any] = {}
    _perfrun(root, "-q", "--log-dir", "single", str(SCRIPTS / "train_with_eval.py"),
             "--samples", "160")
    _perfrun(root, "-q", "--log-dir", "ddp", "--nproc-per-node", "2", str(SCRIPTS / "proc_ddp.py"),
             "--steps", "40")
    _perfrun(root, "-q", "--log-dir", "win", "--scheduler", "3", "6", str(SCRIPTS / "win_train.py"))
    _perfrun(root, "-q", "--log-dir", "base", "--save-baseline", "base.json",
             str(SCRIPTS / "gate_train.py"), "--steps", "60")
    gated = _perfrun(root, "-q", "--log-dir", "gated", "--baseline", "base.json",
                     "--max-regression", "5%", str(SCRIPTS / "gate_train.py"), "--steps", "60",
                     "--slow-ms", "20", check=False)
    # 10x slower steps: a regression; on a very busy machine the gate may
    # call it inconclusive instead, and the page must say whichever it was.
    assert gated.returncode in (0, 68), gated.stderr
    out["verdict"] = "fail" if gated.returncode == 68 else "inconclusive"
    # Every step's logits kept: memory that creeps, read every 0.05 s.
    _perfrun(root, "-q", "--log-dir", "mem", "--flush-interval", "0.05",
             str(SCRIPTS / "mem_outputs.py"), "--steps", "150")
    for name in ("single", "ddp", "win", "gated", "mem"):
        out[name] = Path(os.path.realpath(root / name / "latest"))
    out["root"] = root
    return out


def _open(path: Path) -> tuple[str, list[str]]:
    """The page's DOM after its scripts ran, and the console messages."""
    proc = subprocess.run(
        # No name resolves: the page must draw everything offline.
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
         "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=10000",
         "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def _check_rendered(dom: str, console: list[str]) -> None:
    assert console == []
    assert 'data-ready="1"' in dom
    charts = re.search(r'data-charts="(\d+)"', dom)
    drawn = re.search(r'data-charts-drawn="(\d+)"', dom)
    assert charts and drawn and charts.group(1) == drawn.group(1), "a chart was not drawn"
    assert re.search(r'<pre id="js-errors"></pre>', dom), "a JS error was caught"
    # Every chart's div holds plotly's SVG.
    assert dom.count('class="main-svg"') >= int(charts.group(1))


def _svg_texts(dom: str, chart: str) -> list[str]:
    start = dom.index(f'id="chart-{chart}"')
    end = dom.find('class="chart-spec"', start)
    texts = re.findall(r"<text[^>]*>(.*?)</text>", dom[start:end], flags=re.S)
    # A multi-line label is <tspan>s: their texts joined by a space.
    return [htmlmod.unescape(" ".join(re.findall(r">([^<]+)<", f">{t}<"))) for t in texts]


def _label_boxes(dom: str, chart: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    """The chart's annotations and title as drawn: (text, (x0, y0, x1, y1))
    in pixels, from plotly's SVG (each annotation is a group translated to
    its place, holding a background rect of its size)."""
    start = dom.index(f'id="chart-{chart}"')
    svg = dom[start:dom.find('class="chart-spec"', start)]
    out = []
    for m in re.finditer(r'<g class="annotation".*?transform="translate\(([\d.]+),([\d.]+)\)">'
                         r'<rect class="bg" x="[\d.]+" y="[\d.]+" width="([\d.]+)" '
                         r'height="([\d.]+)".*?data-unformatted="([^"]*)"', svg, re.S):
        x, y, w, h = (float(v) for v in m.groups()[:4])
        out.append((htmlmod.unescape(m.group(5)), (x, y, x + w, y + h)))
    title = re.search(r'<text class="gtitle" x="([\d.]+)" y="([\d.]+)"', svg)
    if title:  # its baseline, and 17-pixel text above it
        x, y = float(title.group(1)), float(title.group(2))
        out.append(("title", (x, y - 17, 10_000.0, y)))
    return out


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_memory_charts_title_is_clear_of_plotlys_toolbar() -> None:
    """Centred at the top, the chart's one long title line ran under the
    toolbar plotly shows at the top right: it sits at the left, as every
    chart's, in two lines, below the toolbar's row, in a margin of its own."""
    rows = make_rows([{"forward": MS, "backward": 2 * MS}] * 200)
    rank = make_rank(rows)
    at = [int(1000 * r[1]) for r in rows[::20]]
    rank.data["memory"] = {"limit": None, "children": {}, "process": {
        "name": "main", "measure": "rss", "peak": 300 << 20,
        "points": [[t, (300 << 20) + k] for k, t in enumerate(at)]}}
    spec = page.memory_chart(build_report(make_run([rank]), series=True))
    assert spec is not None
    title, layout = spec["layout"]["title"], spec["layout"]
    assert title["text"].startswith("Memory over the run<br><sup>")
    assert (title["x"], title["xanchor"], title["yref"], title["yanchor"]) == (
        0.01, "left", "container", "top")
    # Its top below the toolbar's row; the plot below both of its lines.
    assert (1.0 - title["y"]) * layout["height"] >= page.MODEBAR
    assert layout["margin"]["t"] >= page.MODEBAR + 40


def test_labels_that_would_overlap_are_told_apart() -> None:
    assert _overlap((60, 69, 125, 83), (74, 69, 306, 83))  # warm-up and window, one row
    assert not _overlap((60, 69, 125, 83), (74, 55, 306, 69))  # a row apart


@pytest.mark.slow
def test_every_run_folder_holds_its_page(runs: dict[str, Any]) -> None:
    for name in ("single", "ddp", "win", "gated"):
        assert 1_000_000 < (runs[name] / "report.html").stat().st_size <= PAGE_LIMIT


@pytest.mark.slow
@needs_chromium
def test_single_rank_page_renders_with_the_runs_numbers(runs: dict[str, Any]) -> None:
    dom, console = _open(runs["single"] / "report.html")
    _check_rendered(dom, console)
    report = build_report(read_run(str(runs["single"]))).to_dict()
    perf = report["perf"]
    text = htmlmod.unescape(dom)
    for key in ("reader_cost", "batch_cost"):
        assert fmt_sig(perf[key]["avg"], factor=1e3) in text
    for section in ("Perf Summary", "Model Summary", "Device Summary", "Advice", "Environment"):
        assert section in text
    titles = _svg_texts(dom, "steps")
    assert any("Step time over the run" in t for t in titles)
    assert any(t.startswith("steady median") for t in titles)
    assert any(t.startswith("warm-up") for t in titles)
    # eval passes marked: the steps that held them
    assert "time set aside (eval, DataLoader start-up, profiler)" in text
    # the advice's numbers are on the page
    for advice in report["advice"]:
        assert json.dumps(advice["evidence"], sort_keys=True, indent=1).splitlines()[1].strip() \
            in text


@pytest.mark.slow
@needs_chromium
def test_memory_is_drawn_over_the_run_beside_the_step_time(runs: dict[str, Any]) -> None:
    """The Memory Summary's processes as lines over the steps, and the
    summary itself among the page's summaries, not the window's."""
    dom, console = _open(runs["mem"] / "report.html")
    _check_rendered(dom, console)
    assert dom.index('id="chart-steps"') < dom.index('id="chart-memory"')
    texts = _svg_texts(dom, "memory")
    assert "rank 0, resident" in texts
    report = build_report(read_run(str(runs["mem"])))
    assert report.memory is not None
    (rank,) = report.memory.processes
    assert len(rank.points) >= 8 and rank.creep is not None
    text = htmlmod.unescape(dom)
    summaries = text[text.index('id="summary"'):text.index('id="advice"')]
    assert "Memory Summary" in summaries and "Memory creep" in text


@pytest.mark.slow
@needs_chromium
def test_two_rank_heatmap_cells_are_the_per_rank_medians(runs: dict[str, Any]) -> None:
    run_dir = runs["ddp"]
    dom, console = _open(run_dir / "report.html")
    _check_rendered(dom, console)
    run = read_run(str(run_dir))
    report = build_report(run)
    t = report.title
    cells = _svg_texts(dom, "heatmap")
    expected = []
    for rank in run.ranks:
        table = steady_table(rank, t.warmup, profiled_steps(rank), t.window_excluded)
        assert table.shape[0] == report.to_dict()["ranks"]["rows"][rank.rank]["counted"]
        for series in (
            *(columns.phase_times(table, p) for p in ("dataloader", "forward", "backward",
                                                       "optimization")),
            columns.others_times(table), columns.step_times(table),
        ):
            expected.append(f"{round(float(np.median(series)) * 1e3, 4):.4f}")
    numbers = [c for c in cells if re.fullmatch(r"\d+\.\d{4}", c)]
    assert numbers == expected
    assert "rank-medians" in dom and "rank-box" in dom
    assert len(re.findall(r"slowest rank", dom)) >= 1


@pytest.mark.slow
@needs_chromium
def test_window_page_has_overview_modules_tables_and_trace(runs: dict[str, Any]) -> None:
    run_dir = runs["win"]
    dom, console = _open(run_dir / "report.html")
    _check_rendered(dom, console)
    window = build_report(read_run(str(run_dir))).window.to_dict()["ranks"]["0"]
    bars = _svg_texts(dom, "overview")
    assert any("ProfileStep" in b for b in bars)
    icicle = _svg_texts(dom, "modules")
    for module in window["modules"]["modules"]:  # each module's box: its name and its ms
        label = f"{module['name'].rsplit('.', 1)[-1]} {fmt_sig(module['total'], factor=1e3)} ms"
        assert label in icicle
    # The step chart's labels (warm-up 2 steps, the window from step 2):
    # none printed over another, or over the title.
    boxes = _label_boxes(dom, "steps")
    assert {"warm-up", "window"} <= {text.split()[0] for text, _ in boxes}
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            assert not _overlap(box_a, box_b), (a, b)
    # every operator, in a table that sorts and filters
    assert 'id="t-operator"' in dom and 'data-table="t-operator"' in dom
    for op in window["operators"]:
        assert htmlmod.escape(op["name"]) in dom
    assert 'href="trace/rank0.pt.trace.json"' in dom and "open_trace_in_ui" in dom
    assert (run_dir / "trace" / "rank0.pt.trace.json").exists()


@pytest.mark.slow
@needs_chromium
def test_gated_page_shows_the_comparison(runs: dict[str, Any]) -> None:
    dom, console = _open(runs["gated"] / "report.html")
    _check_rendered(dom, console)
    verdict = str(runs["verdict"])
    assert re.search(rf'class="verdict {verdict}" id="verdict">{verdict.upper()}', dom)
    gate = _svg_texts(dom, "gate")
    assert any(t.startswith("Gate: median step-time ratio") and t.endswith(verdict.upper())
               for t in gate)
    dist = _svg_texts(dom, "compare-dist")
    assert any(t.startswith("baseline (") for t in dist)
    assert any(t.startswith("current (") for t in dist)


@pytest.mark.slow
@needs_chromium
def test_compare_and_report_write_html_on_request(runs: dict[str, Any]) -> None:
    root = runs["root"]
    proc = _perfrun(root, "compare", "base.json", str(runs["gated"]), "--max-regression", "5%",
                    "--format", "html", "--output", "cmp.html", check=False)
    assert proc.returncode in (0, 68), proc.stderr
    dom, console = _open(root / "cmp.html")
    _check_rendered(dom, console)
    assert 'id="verdict"' in dom and 'id="fingerprint"' in dom
    assert 'id="chart-compare-dist"' in dom and 'id="chart-gate"' in dom
    _perfrun(root, "report", str(runs["win"]), "--format", "html", "--output", "win.html")
    dom, console = _open(root / "win.html")
    _check_rendered(dom, console)
    # written elsewhere, the trace link still reaches the run folder's trace
    link = re.search(r'href="([^"]*rank0\.pt\.trace\.json)"', dom)
    assert link and (root / link.group(1)).resolve().exists()


@pytest.mark.slow
def test_report_of_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    proc = _perfrun(tmp_path, "report", "nowhere", "--format", "html", check=False)
    assert proc.returncode == 66
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


@pytest.mark.slow
def test_a_run_whose_page_cannot_be_written_keeps_its_exit_status(tmp_path: Path) -> None:
    """A plotly without its JavaScript bundle (here a stand-in package put
    first on the path): the run reports, says so in one note, and exits as
    the script did."""
    fake = tmp_path / "fake" / "plotly"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("", encoding="utf-8")
    env = dict(e2e_environment(), PYTHONPATH=str(tmp_path / "fake"))
    proc = subprocess.run(
        [sys.executable, "-m", "perfrun", "-q", "--log-dir", "log", str(SCRIPTS / "proc_train.py")],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Perf Summary" in proc.stdout
    [note] = [line for line in proc.stderr.splitlines() if "report.html" in line]
    assert note.startswith("perfrun: note: report.html not written (FileNotFoundError: ")
    assert not list((tmp_path / "log").glob("*/report.html"))
