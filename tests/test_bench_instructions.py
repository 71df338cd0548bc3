"""scripts/bench_instructions.py counts what perfrun adds to a step in
instructions under cachegrind. Valgrind runs take minutes, so the suite
checks the arithmetic that turns its output files into a step's figures,
and that its child runs a workload with perfrun seeing every step, untraced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import import_file

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_instructions.py"

#: The head and tail of a real cachegrind output file (valgrind 3.19,
#: --cache-sim=yes), its per-function lines left out.
CACHEGRIND_OUT = """\
version: 1
creator: valgrind-3.19.0
pid: 8326
cmd: python cg.py plain 205
desc: I1 cache:         32768 B, 64 B, 8-way associative
desc: D1 cache:         49152 B, 64 B, 12-way associative
desc: LL cache:         31457280 B, 64 B, 15-way associative
positions: line
events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
fl=???
fn=???
0 10 1 1 2 0 0 3 0 0
summary: 13852818724 54817 29210 2867239224 292253603 2993015 1380665648 45518824 3557950
"""


@pytest.fixture(scope="module")
def bench() -> Any:
    return import_file(SCRIPT, "bench_instructions")


def test_the_totals_are_read_by_the_events_line(bench: Any) -> None:
    totals = bench.parse_totals(CACHEGRIND_OUT)
    assert totals["Ir"] == 13_852_818_724
    assert totals["D1mr"] == 292_253_603
    assert totals["DLmw"] == 3_557_950
    assert set(bench.EVENTS) <= set(totals)
    with pytest.raises(ValueError):
        bench.parse_totals("events: Ir\n")


def test_a_step_is_the_difference_over_the_steps_between_two_runs(bench: Any) -> None:
    short = {"Ir": 9_728_391_822, "D1mr": 121_919_122}
    long = {"Ir": 13_852_818_724, "D1mr": 292_253_603}
    step = bench.per_step(short, long, 200)
    assert step["Ir"] == pytest.approx(20_622_134.51)
    hooked = {"Ir": step["Ir"] + 33_574, "D1mr": step["D1mr"]}
    more = bench.added(step, hooked)
    assert more["Ir"]["added"] == pytest.approx(33_574)
    assert more["Ir"]["added_pct"] == pytest.approx(0.1628, abs=1e-4)
    assert more["D1mr"]["added"] == 0


def test_a_replay_holds_as_many_steps_as_the_clock_would(bench: Any) -> None:
    from perfrun.runtime.clock import REPLAY_EVENTS, REPLAY_INTERVAL_MAX

    # About REPLAY_EVENTS edges at a step of a few milliseconds...
    assert bench.steps_per_replay(0.0046, 10) == round(REPLAY_EVENTS / 10)
    # ...at most REPLAY_INTERVAL_MAX seconds of longer steps...
    assert bench.steps_per_replay(0.032, 10) == round(REPLAY_INTERVAL_MAX / 0.032)
    # ...and never fewer than one.
    assert bench.steps_per_replay(5.0, 10) == 1


@pytest.mark.slow
def test_its_child_runs_the_step_with_perfrun_seeing_every_step() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--child", "mlp", "hooked", "30", "10"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
