"""`perfrun watch` (perfrun/watch.py): the figures of the live view as pure
functions over hand-built results, then the real thing: a two-rank gloo run
followed in a real 80-column terminal (tmux), its screen read while the run
trains and after it ends.

tmux comes from the system's packages (.ci/run installs it); where it is
absent the terminal test skips and says so (conftest.py's Terminal)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from builders import MS, make_rank, make_rows, make_run
from conftest import Terminal, e2e_environment, needs_tmux

from perfrun import watch
from perfrun.cli import main

SCRIPTS = Path(__file__).parent / "scripts"
def test_rank_view_takes_the_last_steps() -> None:
    rows = make_rows([{"forward": MS, "backward": 2 * MS, "others": MS}] * 10
                     + [{"forward": 3 * MS, "backward": 4 * MS, "others": MS}] * 4)
    view = watch.rank_view(make_rank(rows, status="running"), alive=True, last=4)
    assert view.steps == 14 and view.status == "running"
    assert view.last == 8 * MS and view.median == 8 * MS
    assert view.rate == pytest.approx(4 / (32 * MS))
    assert view.split["forward"] == pytest.approx(3 / 8)
    assert view.split["others"] == pytest.approx(1 / 8)
    assert sum(view.split.values()) == pytest.approx(1.0)


def test_rank_view_has_the_last_memory_readings() -> None:
    rank = make_rank(make_rows([{"forward": MS}] * 3), status="running")
    rank.data["memory"] = {
        "children": {},
        "process": {"name": "rank", "measure": "rss", "peak": 900 << 20,
                    "points": [[10, 800 << 20], [2000, 850 << 20]]},
        "cuda": {"rows": [[0, 5 << 30] + [0] * 13, [40, 12 << 30] + [0] * 13]},
    }
    view = watch.rank_view(rank, alive=True)
    assert (view.rss, view.gpu) == (850 << 20, 12 << 30)
    assert [watch.short_bytes(v) for v in (view.rss, view.gpu, 3 << 30, None)] == \
        ["850M", "12G", "3.0G", "-"]


def test_the_live_view_with_gpu_memory_stays_within_80_columns() -> None:
    from rich.console import Console

    views = [watch.RankView(r, "finished", 12_345_678, 1234.5, 0.123456, 0.123456,
                            {p: 0.2 for p in ("dataloader", "forward", "backward",
                                              "optimization", "others")},
                            rss=999 << 20, gpu=79 << 30) for r in range(8)]
    snap = watch.Snapshot("/runs/x", "perfrun train.py", views, [], None, [], False, None)
    console = Console(width=80, record=True, file=__import__("io").StringIO())
    console.print(watch.render_snapshot(snap))
    text = console.export_text()
    assert "GPU" in text and "79G" in text and "999M" in text
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_a_running_rank_whose_process_is_gone_died() -> None:
    view = watch.rank_view(make_rank([], status="running"), alive=False)
    assert view.status == "died" and view.steps == 0 and view.rate is None


def test_snapshot_names_the_slowest_rank_and_when_the_run_ended() -> None:
    fast = make_rows([{"forward": MS, "backward": MS}] * 10)
    slow = make_rows([{"forward": 3 * MS, "backward": MS}] * 10)
    ranks = [make_rank(fast, rank=0, world_size=2, hostname="elsewhere"),
             make_rank(slow, rank=1, world_size=2, hostname="elsewhere")]
    running = make_run(ranks, meta={"command": ["perfrun", "train.py"]})
    snap = watch.snapshot(running, with_advice=False)
    assert snap.slowest is not None
    who, median, excess = snap.slowest
    assert who == 1 and median == 4 * MS and excess == pytest.approx(4 / 3 - 1)
    assert snap.ended  # both rank files say finished, and no launcher to ask
    assert snap.command == "perfrun train.py"
    still = [make_rank(fast, rank=0, status="running", hostname="elsewhere")]
    assert not watch.snapshot(make_run(still, meta={"pid": 1, "host": "elsewhere"}),
                              with_advice=False).ended
    assert watch.snapshot(make_run(still, meta={"returncode": 0}), with_advice=False).ended


def test_watch_of_a_missing_folder_is_one_line(capsys: Any, tmp_path: Path) -> None:
    assert main(["watch", str(tmp_path / "nowhere")]) == 66
    assert capsys.readouterr().err == f"perfrun: error: no such folder: {tmp_path / 'nowhere'}\n"
    assert main(["watch", str(tmp_path), "--interval", "0"]) == 64


# -- a real run, in a real terminal --------------------------------------------------


def _rank_line(screen: str, rank: int) -> list[str]:
    for line in screen.splitlines():
        cells = line.split()
        if len(cells) >= 11 and cells[0] == str(rank) and cells[1] in ("running", "finished"):
            return cells
    return []


@pytest.mark.slow
@needs_tmux
def test_watch_follows_a_two_rank_run_live_and_leaves_the_final_tables(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    stop = tmp_path / "stop"
    env = e2e_environment()
    term = Terminal(tmp_path)
    # The view starts first, on an empty log folder, and waits for the run.
    cmd = (f"cd {tmp_path} && PYTHONPATH={Path(__file__).parents[1]} {sys.executable} -m perfrun "
           f"watch {log} --interval 0.5; echo WATCH-EXIT=$?; sleep 600")
    term.start(f"env OMP_NUM_THREADS=1 sh -c '{cmd}'")
    run = None
    try:
        term.wait_for(lambda s: "waiting for a run in" in s, timeout=30)
        run = subprocess.Popen(
            [sys.executable, "-m", "perfrun", "-q", "--log-dir", str(log), "--nproc-per-node",
             "2", str(SCRIPTS / "watch_ddp.py"), "--stop-file", str(stop)],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

        def both_running(screen: str) -> bool:
            # Both ranks past their first steps: under load rank 1 can start
            # seconds after rank 0, and the slowest-rank line needs steps
            # from both.
            r0, r1 = _rank_line(screen, 0), _rank_line(screen, 1)
            return bool(r0 and r1 and r0[1] == r1[1] == "running" and int(r0[2]) > 20
                        and int(r1[2]) > 5)

        first = term.wait_for(both_running)
        assert "perfrun watch" in first and "Slowest rank:" in first
        for line in first.splitlines():
            assert len(line) <= 80
        assert "…" not in first.split("Slowest rank:")[0]  # no column cut short
        steps_then = int(_rank_line(first, 0)[2])
        later = term.wait_for(lambda s: _rank_line(s, 0)
                              and int(_rank_line(s, 0)[2]) > steps_then, timeout=30)
        r0 = _rank_line(later, 0)
        assert float(r0[3]) > 0  # steps a second
        assert sum(int(c) for c in r0[6:11]) in range(98, 103)  # phase split in %
        assert r0[11].endswith("M"), r0  # its resident memory, a few hundred MiB
        stop.touch()
        _out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        final = term.wait_for(lambda s: "WATCH-EXIT=" in s)
        assert "WATCH-EXIT=0" in final
        assert "perfrun watch: the run ended (exit status 0)" in final
        for section in ("Perf Summary", "Model Summary", "Ranks"):
            assert section in final
        assert "St/s" not in final.split("the run ended")[1]  # the live view is gone
    finally:
        if run is not None and run.poll() is None:
            stop.touch()
            run.wait(timeout=60)
        term.close()


def test_a_fast_rank_is_where_its_steps_say_and_a_held_one_is_named() -> None:
    """A rank of thousands of steps a second, a millisecond into Backward
    when it saved: its phase is one instant of thousands and the seconds
    since it the save's age ("Backward at step 60953 (1.7 s)"); the table's
    Steps and St/s say where it is. A rank held in a phase is named."""
    import time as clock

    from rich.console import Console

    now = clock.time()
    fast = make_rank(make_rows([{"forward": MS / 8, "backward": MS / 8}] * 200), rank=0,
                     world_size=2, status="running", hostname="elsewhere")
    fast.data["position"] = {"step": 60953, "phase": "backward", "since_unix": now - 1.7,
                             "step_since_unix": now - 1.7, "written_unix": now - 1.699,
                             "buffered": False}
    held = make_rank(make_rows([{"forward": MS / 8, "backward": MS / 8}] * 200), rank=1,
                     world_size=2, status="running", hostname="elsewhere")
    held.data["position"] = {"step": 60950, "phase": "forward", "since_unix": now - 30,
                             "step_since_unix": now - 30, "written_unix": now - 1,
                             "buffered": False}
    snap = watch.snapshot(make_run([fast, held], meta={"pid": 1, "host": "elsewhere"}),
                          with_advice=False)
    zero, one = snap.ranks
    assert zero.moving and zero.where == f"at step 60953, {zero.rate:,.0f} steps/s"
    assert not one.moving and one.where.startswith("Forward at step 60950 for 3")
    console = Console(width=80, record=True, file=__import__("io").StringIO())
    console.print(watch.render_snapshot(snap))
    text = console.export_text()
    now_lines = [line for line in text.splitlines() if line.startswith("Now:")]
    assert now_lines == [f"Now: 1: {one.where}"], text
    assert all(len(line) <= 80 for line in text.splitlines())
