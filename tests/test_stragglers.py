"""Hangs and stragglers end to end: real torchrun, two ranks on gloo (CPU),
one of them made stuck or slow by tests/scripts/straggler_ddp.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_e2e_process import base_env, free_port, perfrun, run_dir_of

from perfrun.exitcodes import ExitCode

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "straggler_ddp.py"
DELAY = 0.04


def _options(log: Path) -> list[str]:
    return ["--log-dir", str(log), "--nproc-per-node", "2", "--master-port", str(free_port()),
            "--timer-only", "--format", "json", "--output", str(log / "report.json")]


def _straggler(log: Path) -> dict:
    report = json.loads((log / "report.json").read_text())
    return report["ranks"]["straggler"]


@pytest.mark.parametrize("phase", ["dataloader", "forward"])
def test_slow_rank_is_the_culprit_and_the_other_its_victim(tmp_path: Path, phase: str) -> None:
    log = tmp_path / "log"
    log.mkdir()
    result = perfrun(*_options(log), str(SCRIPT), "--steps", "16", "--slow-rank", "1",
                     "--slow-phase", phase, "--delay", str(DELAY), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    v = _straggler(log)
    assert (v["culprit"], v["culprit_phase"], v["victims"]) == (1, phase, [0]), v
    assert v["wait_phase"] == "backward"
    # Generous: the injected sleep, give or take what a loaded CPU adds.
    assert 0.5 * DELAY <= v["phase_loss"] <= 1.6 * DELAY, v
    advice = json.loads((log / "report.json").read_text())["advice"]
    slow = [a for a in advice if a["kind"] == "slow-rank"]
    assert len(slow) == 1 and slow[0]["evidence"]["rank"] == 1, advice


@pytest.mark.timing
def test_healthy_run_has_no_culprit(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    result = perfrun(*_options(log), str(SCRIPT), "--steps", "16", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    v = _straggler(log)
    assert v["culprit"] is None and v["reason"], v


def test_hang_is_reported_with_positions_and_stacks_then_ended(tmp_path: Path) -> None:
    log = tmp_path / "log"
    options = ["--log-dir", str(log), "--nproc-per-node", "2", "--master-port", str(free_port()),
               "--timer-only", "--hang-timeout", "10", "--hang-action", "terminate"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfrun", *options, str(SCRIPT), "--steps", "20",
         "--hang-rank", "1", "--hang-at", "3"],
        cwd=tmp_path, env=base_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    # While it hangs, `perfrun status` shows where the two ranks are.
    status = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1.0)
        if not log.exists() or not any(log.iterdir()):
            continue
        status = subprocess.run([sys.executable, "-m", "perfrun", "status", str(log)],
                                capture_output=True, text=True, env=base_env(), timeout=60).stdout
        if "Forward at step 3" in status and "Backward at step 3" in status:
            break
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"perfrun did not end the hung run:\n{out}\n{err}")
    assert re.search(r"rank 0 +running +Backward at step 3 for", status), status
    assert re.search(r"rank 1 +running +Forward at step 3 for", status), status
    assert "rank 1 is in Forward at step 3" in status
    assert proc.returncode == ExitCode.HANG, err
    assert "perfrun: hang: no rank has finished a step for" in err
    # The hang report's sentences wrap at 80 columns.
    assert re.search(r"perfrun: hang: rank 0 is in Backward at step 3 \(waiting in the "
                     r"gradient all_reduce, if DDP\); rank 1 is in Forward at step 3 for \d+ s",
                     " ".join(err.split())), err
    run_dir = run_dir_of(log)
    report = (run_dir / "hang.txt").read_text()
    rank1 = report.split("--- rank 1 Python stack:")[1]
    assert 'straggler_ddp.py", line' in rank1 and " in forward" in rank1
    rank0 = report.split("--- rank 0 Python stack:")[1].split("--- rank 1")[0]
    assert " in backward" in rank0
    assert "the run hung and was ended" in err
