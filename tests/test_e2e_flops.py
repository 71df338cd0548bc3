"""FLOPs end to end: a small MLP trained under perfrun, its counted FLOPs
against the figure worked out from its shapes, the counted step left out of
the statistics, the achieved GFLOP/s against torch.utils.benchmark's timing
of the same matmuls, and a compiled model (not counted, and no recompile).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from conftest import RunPerfrun, e2e_environment

from perfrun.store.stepfile import COL

SCRIPT = str(Path(__file__).parent / "scripts" / "flops_train.py")
WIDTH, BATCH, STEPS = 512, 128, 12
#: One Linear's forward, 2*m*n*k; the MLP has three.
LINEAR = 2 * BATCH * WIDTH * WIDTH

pytestmark = pytest.mark.slow


def matmul_rate() -> float:
    """FLOP/s of the forward's matmul on one thread, timed by torch."""
    import torch
    from torch.utils import benchmark

    x, w, b = torch.randn(BATCH, WIDTH), torch.randn(WIDTH, WIDTH), torch.randn(WIDTH)
    timer = benchmark.Timer(stmt="torch.addmm(b, x, w)", globals={"torch": torch, "x": x,
                                                                   "w": w, "b": b},
                            num_threads=1)
    return LINEAR / timer.blocked_autorange(min_run_time=0.3).median


@pytest.mark.timing
def test_flops_counted_reported_and_left_out(run_perfrun: RunPerfrun) -> None:
    before = matmul_rate()
    run = run_perfrun("--warmup", "2", SCRIPT, "--width", str(WIDTH), "--batch", str(BATCH),
                      "--steps", str(STEPS))
    assert run.returncode == 0, run.describe()
    rank = run.rank0()
    flops = rank.data["flops"]
    assert rank.data["faults"] == [], rank.data["faults"]
    assert flops["counted"] and flops["step"] == 1, flops
    assert flops["forward"] == 3 * LINEAR
    # Weight gradients of all three, input gradients of the last two.
    assert flops["backward"] == 5 * LINEAR
    assert flops["optimizer"] == 0 and flops["dtype"] == "float32"
    report = run.report()
    # Step 1 lies inside the warm-up here: nothing more is left out.
    assert report["title"]["steps_counted"] == STEPS - 2
    phases = {p["name"]: p for p in report["flops"]["phases"]}
    assert phases["Forward"]["basis"] == "cpu" and phases["Forward"]["mfu"] is None
    forward = phases["Forward"]["achieved"]
    backward = phases["Backward"]["achieved"]
    # Each rate is the phase's FLOPs over its median time on the counted
    # steps, read from the run's own rows: the rate's units, FLOPs and steps,
    # whatever the machine's load did to the times.
    counted = rank.rows[2:]
    for rate, phase in ((forward, "forward"), (backward, "backward")):
        seconds = statistics.median(row[COL[phase]] for row in counted)
        assert rate == pytest.approx(flops[phase] / seconds, rel=1e-9), (phase, rate, seconds)
    # The machine's matmul rate now and as the run began (the run's own
    # start is in `before`): where other tests load the machine, the run
    # and one reading may see different load.
    reference = matmul_rate()
    high = max(before, reference)
    # No phase outruns the matmuls it holds (generous: the reference too is
    # timed on a shared machine). No lower bound: a phase's wall time holds
    # its waits for a core, which load alone makes most of it (7.8 GFLOP/s
    # against a reference of 61 beside busy processes on this 2-core
    # machine, the reference being the median of many short blocks).
    assert 0 < forward < high * 3, (forward, before, reference)
    assert 0 < backward < high * 3, (backward, before, reference)
    print(f"\nforward {forward / 1e9:.2f} GFLOP/s, backward {backward / 1e9:.2f} GFLOP/s, "
          f"torch.utils.benchmark addmm {reference / 1e9:.2f} GFLOP/s")


def test_no_flops(run_perfrun: RunPerfrun) -> None:
    """--no-flops: nothing counted, no step left out, and the table says why
    (the counted case's tables: tests/test_flops.py, on hand-built rows)."""
    run = run_perfrun("--warmup", "0", "--no-flops", SCRIPT, "--width", "64", "--batch", "8",
                      "--steps", "6", json_report=False)
    assert run.returncode == 0, run.describe()
    assert "FLOP/s: not counted: off (--no-flops)" in run.out
    assert run.rank0().data["flops"]["reason"] == "off (--no-flops)"
    assert run.report()["title"]["steps_counted"] == 6


def test_a_script_without_dynamo_is_counted_without_importing_it(
    run_perfrun: RunPerfrun,
) -> None:
    """A loop that updates its parameters by hand never imports Dynamo;
    torch's counter would at its first op (seconds, inside the counted
    step). perfrun's count leaves the script as it was, and counts the
    same FLOPs."""
    script = str(Path(__file__).parent / "scripts" / "flops_by_hand.py")
    points = 2000
    run = run_perfrun(script, "--points", str(points), "--steps", "40")
    assert run.returncode == 0, run.describe()
    assert "DYNAMO False" in run.out
    flops = run.rank0().data["flops"]
    assert run.rank0().data["faults"] == [], run.rank0().data["faults"]
    assert flops["counted"] and flops["step"] == 1, flops
    # Linear(3, 1) over the points: 2*m*n*k forward, the weight's gradient
    # backward (the input needs none).
    assert flops["forward"] == 2 * points * 3 and flops["backward"] == 2 * points * 3
    assert any(n.startswith("FLOPs counted on step 1") for n in run.report()["notes"])


def test_a_compiled_model_is_not_counted_and_not_recompiled(
    run_perfrun: RunPerfrun, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from test_e2e_compile import dynamo_log

    env = e2e_environment()
    env["TORCH_LOGS"] = "recompiles,guards"
    args = [SCRIPT, "--compile", "--width", "32", "--batch", "8", "--steps", "6"]
    plain = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    run = run_perfrun(*args, env=env, timeout=300)
    assert run.returncode == 0, run.describe()
    assert dynamo_log(run.err) == dynamo_log(plain.stderr)
    flops = run.rank0().data["flops"]
    assert not flops["counted"] and flops["step"] is None
    assert flops["reason"].startswith("compiled module"), flops
    report = run.report()
    assert report["flops"]["reason"].startswith("compiled module")
    assert run.rank0().data["faults"] == []


def test_a_recurrent_model_counts_its_lstm(run_perfrun: RunPerfrun) -> None:
    """The shape of pytorch/examples' mnist_rnn: the LSTM is nearly all of
    the step's FLOPs, and runs as oneDNN's fused layer, which torch's
    counter alone counts 0 (the figure was 280 times too low)."""
    script = str(Path(__file__).parent / "scripts" / "mnist_rnn.py")
    batch = 64
    run = run_perfrun(script, "--batch-size", str(batch), "--steps", "12")
    assert run.returncode == 0, run.describe()
    flops = run.rank0().data["flops"]
    assert run.rank0().data["faults"] == [], run.rank0().data["faults"]
    assert flops["counted"], flops
    # 28 time steps of 64 images through the LSTM's two weight matrices,
    # then fc1 and fc2 on the last state.
    lstm = 2 * batch * 28 * (4 * 64 * 28 + 4 * 64 * 64)
    linear = 2 * batch * (64 * 32 + 32 * 10)
    assert flops["forward"] == lstm + linear
    # The LSTM's backward two of its forward; fc1's and fc2's weights and
    # inputs.
    assert flops["backward"] == 2 * lstm + 2 * linear
