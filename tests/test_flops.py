"""FLOPs: torch's counter with perfrun's formulas against figures worked out
by hand, the counter in the hooks (which step, which phase), the peak table,
and the achieved-FLOP/s and MFU arithmetic on hand-built rows.

Real torch on CPU throughout; the analytic figures are computed here from
the shapes, never read back from torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from builders import make_rank, make_row, make_run
from conftest import import_file
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from perfrun.analysis.build import build_report
from perfrun.analysis.flops import (
    COST_SHARE,
    achieved,
    counted_step,
    counted_step_note,
    flops_summary,
    job_rates,
    median_step,
    mfu,
)
from perfrun.analysis.peaks import PEAKS, dtype_key, match_gpu, peak_for
from perfrun.analysis.selection import steady_table
from perfrun.runtime import hooks
from perfrun.runtime.clock import PhaseClock
from perfrun.runtime.flops import (
    DEFAULT_STEP,
    FlopCounter,
    causal_fraction,
    counting_mode,
    custom_mapping,
)
from perfrun.runtime.flops import (
    counted_step as runtime_counted_step,
)
from perfrun.runtime.hooks import HookState
from perfrun.runtime.modules import RootTracker
from perfrun.runtime.steps import StepTracker
from perfrun.store.rankfile import RANK_FILE, RankResult
from perfrun.store.schema import SchemaError, check


def count(fn: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """FLOPs of `fn()` with perfrun's formulas: total and per op."""
    with FlopCounterMode(display=False, custom_mapping=custom_mapping(torch)) as mode:
        fn()
    per_op = {str(k): int(v) for k, v in mode.get_flop_counts()["Global"].items()}
    return mode.get_total_flops(), per_op


def forward_backward(fn: Callable[[], torch.Tensor]) -> tuple[int, int]:
    """(forward FLOPs, backward FLOPs) of `fn().sum().backward()`."""
    out: list[torch.Tensor] = []
    fwd, _ = count(lambda: out.append(fn()))
    bwd, _ = count(lambda: out[0].sum().backward())
    return fwd, bwd


# -- counts against analytic figures ------------------------------------------------


def test_linear_forward_is_2mnk_and_backward_4mnk() -> None:
    m, k, n = 32, 48, 24
    layer = nn.Linear(k, n)
    x = torch.randn(m, k, requires_grad=True)
    fwd, bwd = forward_backward(lambda: layer(x))
    assert fwd == 2 * m * n * k
    # Two matmuls of the forward's size: the weight's gradient and the input's.
    assert bwd == 4 * m * n * k
    # An input that needs no gradient: the weight's gradient only.
    fwd, bwd = forward_backward(lambda: layer(torch.randn(m, k)))
    assert (fwd, bwd) == (2 * m * n * k, 2 * m * n * k)


def sdpa_analytic(b: int, h: int, s_q: int, s_k: int, d: int, causal: bool) -> tuple[int, int]:
    """Forward: QK^T and PV, 2 matmuls of 2*b*h*s_q*s_k*d FLOPs. Backward
    as the fused kernels run it: the scores recomputed, then dV, dP, dQ and
    dK, 5 such matmuls. A causal mask keeps query i's first i + 1 keys."""
    pairs = sum(min(i + 1, s_k) for i in range(s_q)) if causal else s_q * s_k
    one = 2 * b * h * pairs * d
    return 2 * one, 5 * one


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_counts_on_cpu(causal: bool) -> None:
    # torch's registry lacks the CPU fused op (it would count 0): perfrun's
    # formula counts it, once (no fused op and its pieces both).
    b, h, s, d = 2, 4, 64, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    fwd, bwd = forward_backward(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    want_fwd, want_bwd = sdpa_analytic(b, h, s, s, d, causal)
    assert (fwd, bwd) == (want_fwd, want_bwd)
    with FlopCounterMode(display=False) as plain:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert plain.get_total_flops() == 0  # why perfrun supplies the formula


def test_sdpa_with_a_mask_tensor_counts_in_full() -> None:
    b, h, s, d = 1, 2, 32, 8
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    fwd, _ = count(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert fwd == sdpa_analytic(b, h, s, s, d, causal=False)[0]


def test_causal_fraction() -> None:
    assert causal_fraction(4, 4) == 10 / 16
    assert causal_fraction(2, 4) == 3 / 8  # top-left aligned, as SDPA's is_causal
    assert causal_fraction(4, 2) == (1 + 2 + 2 + 2) / 8
    assert math.isclose(causal_fraction(2048, 2048), 0.5, rel_tol=1e-3)


def _gpu_script(name: str) -> Any:
    """A script of the GPU check, imported (its `main` is not run)."""
    path = Path(__file__).parent / "gpu" / "scripts" / f"{name}.py"
    return import_file(path, f"perfrun_gpu_{name}")


#: A GPT block (pre-norm causal self-attention and a 4x MLP): the very one
#: the GPU check trains under perfrun to measure MFU, counted here on CPU.
Block = _gpu_script("cuda_gpt").Block


def test_gpt_block_against_the_analytic_figure() -> None:
    b, t, c, heads = 2, 32, 64, 4
    block = Block(c, heads)
    x = torch.randn(b, t, c, requires_grad=True)
    fwd, bwd = forward_backward(lambda: block(x))
    # Linears: C->3C, C->C, C->4C, 4C->C: 12 C^2 weights, 2 FLOPs each per token.
    linear = 2 * b * t * 12 * c * c
    attn_fwd, attn_bwd = sdpa_analytic(b, heads, t, t, c // heads, causal=True)
    assert fwd == linear + attn_fwd
    assert bwd == 2 * linear + attn_bwd  # every linear's input needs its gradient


# -- the counter in the hooks ---------------------------------------------------------


def make_agent() -> SimpleNamespace:
    tracker = StepTracker("auto")
    phase_clock = PhaseClock(tracker)
    faults: list[str] = []
    agent = SimpleNamespace(
        hooks_state=HookState(), tracker=tracker, phase_clock=phase_clock, clock=phase_clock,
        faults=faults, record_fault=lambda where, exc: faults.append(f"{where}: {exc}"),
        roots=RootTracker(), count_samples=True,
        note_dataloader=lambda loader, grad=True: None,
        note_once=lambda note: None,
    )
    return agent


@pytest.fixture
def hooked() -> Iterator[SimpleNamespace]:
    agent = make_agent()
    agent.counter = FlopCounter(torch, agent.hooks_state, agent.tracker, agent.record_fault,
                                DEFAULT_STEP)
    agent.tracker.on_begin = agent.counter.step_begin
    agent.tracker.on_end = agent.counter.step_end
    agent.undo = hooks.install(torch, agent)
    try:
        yield agent
    finally:
        hooks.uninstall(agent.undo)


def test_the_counter_counts_step_1_per_phase(hooked: SimpleNamespace) -> None:
    m, k, n = 16, 32, 8
    model = nn.Linear(k, n)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = model(torch.randn(m, k)).sum()
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # an evaluation forward: not counted
            model(torch.randn(m, k))
        seen.append(hooked.hooks_state.flops is not None)
    hooked.counter.finish()
    result = hooked.counter.result()
    assert hooked.faults == []
    assert result["counted"] and result["step"] == 1
    assert (result["forward"], result["backward"], result["optimizer"]) == (
        2 * m * n * k, 2 * m * n * k, 0)
    assert result["calls"] == {"forward": 1, "backward": 1, "optimizer": 1}
    assert result["dtype"] == "float32" and result["device"] == "cpu"
    assert any("elementwise" in note for note in result["notes"])
    assert hooked.hooks_state.flops is None and not any(seen[2:])


def test_a_closure_s_phases_are_their_own(hooked: SimpleNamespace) -> None:
    """LBFGS runs forward and backward inside optimizer.step: each counts
    as its own phase, not as the optimizer's."""
    m, k, n = 8, 16, 4
    model = nn.Linear(k, n)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=1)
    x = torch.randn(m, k)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    for _ in range(3):
        optimizer.step(closure)
    hooked.counter.finish()
    result = hooked.counter.result()
    assert result["counted"], result
    assert result["forward"] == 2 * m * n * k * result["calls"]["forward"]
    assert result["backward"] == 2 * m * n * k * result["calls"]["backward"]
    assert result["optimizer"] == 0


def test_a_run_too_short_says_so(hooked: SimpleNamespace) -> None:
    model = nn.Linear(4, 4)
    model(torch.randn(2, 4)).sum().backward()
    hooked.counter.finish()
    result = hooked.counter.result()
    assert not result["counted"] and result["step"] is None
    assert result["reason"] == "the run ended before step 1"


def test_the_mode_s_dynamo_wrapper_is_handed_its_plain_function_for_the_step() -> None:
    """torch wraps every dispatch mode's `__torch_dispatch__` in
    `_disable_dynamo`, which imports Dynamo at its first call unless the
    function carries the one to call: perfrun gives it the plain one for
    its step, where Dynamo is not imported, and takes it back after."""
    import sys

    from perfrun.runtime.flops import _skip_dynamo_import

    def plain(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return getattr(plain, "__dynamo_disable", None)

    wrapper.__wrapped__ = plain  # type: ignore[attr-defined]
    mode = type("Mode", (), {"__torch_dispatch__": wrapper})
    undo = _skip_dynamo_import(mode)
    assert undo is not None and wrapper() is plain
    undo()
    assert wrapper() is None and "__dynamo_disable" not in plain.__dict__
    # Made already (torch's own, Dynamo imported), or no wrapper: untouched.
    plain.__dynamo_disable = len  # type: ignore[attr-defined]
    assert _skip_dynamo_import(mode) is None and wrapper() is len
    assert _skip_dynamo_import(type("Old", (), {"__torch_dispatch__": plain})) is None

    # The real mode counts what torch's does, and is left as it was.
    model = nn.Linear(32, 8)
    x = torch.randn(16, 32)
    had = "torch._dynamo" in sys.modules
    entered, undo = counting_mode(custom_mapping(torch))
    try:
        model(x).sum().backward()
    finally:
        entered.__exit__(None, None, None)
        if undo is not None:
            undo()
    assert (undo is None) == had
    assert entered.get_total_flops() == 2 * 2 * 16 * 32 * 8
    from torch.utils import flop_counter

    cls = getattr(flop_counter, "_FlopCounterMode", flop_counter.FlopCounterMode)
    wrapped = getattr(cls.__dict__["__torch_dispatch__"], "__wrapped__", None)
    if wrapped is not None and not had:
        assert "__dynamo_disable" not in wrapped.__dict__


def test_the_counted_step_s_note_names_no_flops_where_it_stretched_the_run() -> None:
    # 20 ms more than a 10 ms step, in a run of 1,000 steps: 0.2%.
    note = counted_step_note(1, 0.020, 0.010, 1000)
    assert note == ("FLOPs counted on step 1 (torch's FlopCounterMode, 20.0 ms slower than "
                    "the median step); that step is left out of the statistics")
    # 2 s more, 200 steps of 20 ms: a third of the run's time in steps.
    note = counted_step_note(1, 2.0, 0.020, 200)
    assert ("2000.0 ms slower than the median step: 33% of this run's time in steps; "
            "--no-flops runs without the count") in note
    assert "--no-flops" not in counted_step_note(1, 0.0999, 0.001, 1000)
    assert "--no-flops" in counted_step_note(1, 0.112, 0.001, 1000)
    assert COST_SHARE == 0.1
    assert "slower" not in counted_step_note(3, None, 0.01, 10)
    assert "slower" not in counted_step_note(3, -0.001, 0.01, 10)


def test_the_counted_step_avoids_the_profiled_steps() -> None:
    assert runtime_counted_step(None) == 1
    assert runtime_counted_step((5, 10)) == 1
    assert runtime_counted_step((0, 3)) == 3
    assert runtime_counted_step((1, 2)) == 2
    # The profiler's warm-up step (profiled, its events discarded, left out
    # already) is counted on rather than one more step after the window.
    assert runtime_counted_step((1, 4), 2) == 1
    assert runtime_counted_step((0, 4), 1) == 4


# -- peaks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, model",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_peak_table_matches_device_names(name: str, model: str) -> None:
    gpu = match_gpu(name)
    assert gpu is not None and gpu.model == model
    assert gpu.source.startswith("https://")


def test_peak_lookup_by_dtype() -> None:
    assert match_gpu("AMD Instinct MI300X") is None and match_gpu(None) is None
    assert dtype_key("bfloat16") == "bf16" and dtype_key("float16") == "fp16"
    assert dtype_key("float32") == "fp32" and dtype_key("float32", tf32=True) == "tf32"
    assert dtype_key("float8_e4m3fn") == "fp8" and dtype_key("int8") is None
    peak, why = peak_for("NVIDIA H100 80GB HBM3", "bfloat16")
    assert peak is not None and why is None and peak.flops == 989.4e12
    peak, _ = peak_for("NVIDIA A100-SXM4-80GB", "float32", tf32=True)
    assert peak is not None and peak.flops == 156e12
    peak, why = peak_for("Tesla V100-SXM2-16GB", "bfloat16")
    assert peak is None and "no bf16 peak" in (why or "")
    peak, why = peak_for("AMD Instinct MI300X", "bfloat16")
    assert peak is None and "--peak-tflops" in (why or "")
    peak, _ = peak_for("AMD Instinct MI300X", "bfloat16", override_tflops=1307.4)
    assert peak is not None and peak.flops == pytest.approx(1307.4e12)
    # Dense figures: every Tensor Core rate at least the CUDA-core fp32 one.
    for gpu in PEAKS.values():
        assert all(v >= gpu.tflops["fp32"] for v in gpu.tflops.values()), gpu.model


# -- achieved FLOP/s and MFU ---------------------------------------------------------------

MS = 1e-3


def flops_rank(rows: list[list[Any]], section: dict[str, Any], rank: int = 0,
               settings: dict[str, Any] | None = None) -> RankResult:
    r = make_rank(rows, rank=rank, settings=settings)
    r.data["flops"] = section
    return r


def section(device: str = "cpu", **changes: Any) -> dict[str, Any]:
    out = {
        "counted": True, "step": 1, "reason": None, "forward": 2_000_000_000,
        "backward": 4_000_000_000, "optimizer": 0, "calls": {"forward": 1},
        "ops": {"aten.mm": 6_000_000_000}, "dtype": "bfloat16", "autocast": True,
        "tf32": None, "device": device,
        "device_name": "NVIDIA H100 80GB HBM3" if device == "cuda" else None,
        "seconds": 0.5, "notes": [],
    }
    out.update(changes)
    return out


def rows(n: int = 8, slow: int = 1, gpu: bool = False) -> list[list[Any]]:
    """Steps of 20 ms forward, 40 ms backward, 10 ms optimizer, 30 ms
    others (100 ms); step `slow` is the counted one, 10x slower."""
    out, t = [], 0.0
    for i in range(n):
        f = 10 if i == slow else 1
        g = {"forward": 0.01 * f, "backward": 0.02 * f, "step": 0.1 * f} if gpu else None
        row = make_row(t, forward=0.02 * f, backward=0.04 * f, optimization=0.01 * f,
                       others=0.03 * f, gpu=g)
        out.append(row)
        t = row[1]
    return out


def test_achieved_and_mfu_arithmetic() -> None:
    assert achieved(6e9, 0.1) == pytest.approx(6e10)
    assert achieved(0, 0.1) is None and achieved(6e9, None) is None and achieved(6e9, 0.0) is None
    assert mfu(5e14, 1e15) == 0.5 and mfu(None, 1e15) is None and mfu(1.0, None) is None


def test_cpu_rates_per_phase_and_the_counted_step_left_out() -> None:
    rank = flops_rank(rows(), section())
    assert counted_step(rank.data) == 1
    steady = steady_table(rank, warmup=0)
    assert steady.shape[0] == 7  # step 1, under the counter, is left out
    summary = flops_summary(rank.data, steady, rank.take([1]))
    assert summary is not None and summary.counted and not summary.on_gpu
    assert summary.unit == ("GFLOP/s", 1e-9)
    assert summary.rate("Forward").achieved == pytest.approx(2e9 / 0.02)
    assert summary.rate("Backward").achieved == pytest.approx(4e9 / 0.04)
    assert summary.rate("ProfileStep").achieved == pytest.approx(6e9 / 0.1)
    assert summary.rate("Optimization").achieved is None  # 0 FLOPs counted
    assert all(p.mfu is None for p in summary.phases)  # no MFU on a CPU
    assert summary.cost == pytest.approx(0.9)


def test_gpu_rates_use_gpu_phase_times_and_the_peak() -> None:
    rank = flops_rank(rows(gpu=True), section("cuda"))
    summary = flops_summary(rank.data, steady_table(rank, warmup=0), rank.take([1]))
    assert summary is not None and summary.on_gpu and summary.unit == ("TFLOP/s", 1e-12)
    assert summary.peak is not None and summary.peak.model == "H100 SXM"
    forward = summary.rate("Forward")
    assert forward.basis == "gpu" and forward.achieved == pytest.approx(2e9 / 0.01)
    step = summary.rate("ProfileStep")
    assert step.basis == "wall" and step.mfu == pytest.approx(6e9 / 0.1 / 989.4e12)
    # --peak-tflops wins over the table.
    summary = flops_summary(rank.data, steady_table(rank, warmup=0), None, 100.0)
    assert summary.rate("ProfileStep").mfu == pytest.approx(6e10 / 100e12)
    unknown = flops_rank(rows(gpu=True), section("cuda", device_name="AMD Instinct MI300X"))
    summary = flops_summary(unknown.data, steady_table(unknown, warmup=0))
    assert summary.peak is None and "--peak-tflops" in summary.peak_reason
    assert summary.rate("ProfileStep").mfu is None


def test_job_wide_rate_over_ranks() -> None:
    fast = flops_rank(rows(gpu=True), section("cuda"), rank=0)
    slow_rows = rows(gpu=True)
    for row in slow_rows:  # rank 1's steps take twice as long
        row[1] = row[0] + 2 * (row[1] - row[0])
    slow = flops_rank(slow_rows, section("cuda"), rank=1)
    ranks, job = job_rates([(r.rank, r.data, median_step(steady_table(r, warmup=0)))
                           for r in (fast, slow)])
    assert [r.rank for r in ranks] == [0, 1]
    assert ranks[0].achieved == pytest.approx(6e10) and ranks[1].achieved == pytest.approx(3e10)
    assert job is not None and job.seconds == pytest.approx(0.2)
    assert job.achieved == pytest.approx(12e9 / 0.2)
    assert job.mfu == pytest.approx(job.achieved / (2 * 989.4e12))


def test_report_with_flops_and_without() -> None:
    from perfrun.report.content import blocks

    rank = flops_rank(rows(n=12), section(), settings={"warmup": 0})
    report = build_report(make_run([rank]))
    assert report.title.steps_counted == 11
    assert report.flops is not None and report.to_dict()["flops"]["counted"]
    model = next(b for b in blocks(report) if getattr(b, "key", None) == "model")
    assert model.columns[-1].header == "Achieved GFLOP/s"
    assert model.rows[2][-1] == "100.00"  # Forward: 2 GFLOP in 20 ms
    assert any("FLOPs counted on step 1" in n for n in report.notes)
    # Not counted: one line says why, and no step is left out for it.
    rank = flops_rank(rows(n=12), {"counted": False, "step": None,
                                   "reason": "off (--no-flops)"}, settings={"warmup": 0})
    report = build_report(make_run([rank]))
    assert report.title.steps_counted == 12
    model = next(b for b in blocks(report) if getattr(b, "key", None) == "model")
    assert "FLOP/s: not counted: off (--no-flops)" in model.footer
    # A file from before FLOPs were counted reads as it did.
    old = make_rank(rows(n=12), settings={"warmup": 0})
    report = build_report(make_run([old]))
    assert report.flops is None and report.to_dict()["flops"] is None
    assert report.title.steps_counted == 12


def test_schema_takes_the_section_and_older_files() -> None:
    data = flops_rank(rows(), section()).data
    check({"flops": data["flops"]}, RANK_FILE)
    check({"flops": None}, RANK_FILE)
    check({}, RANK_FILE)
    with pytest.raises(SchemaError):
        check({"flops": {**section(), "forward": "many"}}, RANK_FILE)


@pytest.mark.slow
def test_tf32_read_from_either_api_without_a_warning() -> None:
    """torch >= 2.9 raises from the legacy `get_float32_matmul_precision()`
    once a script set the per-backend `fp32_precision`: both are read, in a
    fresh process (the settings are global), with warnings as errors."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from perfrun.runtime.flops import tf32_allowed\n"
        "out = [tf32_allowed(torch)]\n"
        "torch.set_float32_matmul_precision('high'); out.append(tf32_allowed(torch))\n"
        "m = torch.backends.cuda.matmul\n"
        "if hasattr(m, 'fp32_precision'):\n"
        "    m.fp32_precision = 'ieee'; out.append(tf32_allowed(torch))\n"
        "    m.fp32_precision = 'tf32'; out.append(tf32_allowed(torch))\n"
        "print(out)\n"
    )
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.strip() in ("[False, True, False, True]", "[False, True]")


def test_gpu_report_has_mfu_and_says_against_what() -> None:
    from perfrun.report.content import blocks

    rank = flops_rank(rows(n=12, gpu=True), section("cuda"), settings={"warmup": 0})
    report = build_report(make_run([rank]))
    model = next(b for b in blocks(report) if getattr(b, "key", None) == "model")
    # 6 GFLOP in 100 ms on an H100: in GFLOP/s, as 0.06 TFLOP/s reads as nothing.
    assert [c.header for c in model.columns[-2:]] == ["Achieved GFLOP/s", "MFU(%)"]
    step = model.rows[0]
    assert step[-2] == "60.00" and step[-1] == "0.0"
    assert any("H100 SXM bf16 peak of 989.4 dense TFLOP/s" in line for line in model.footer)
    assert any("bfloat16 (autocast)" in line for line in model.footer)
    # --peak-tflops, as the run recorded it.
    rank = flops_rank(rows(n=12, gpu=True), section("cuda"),
                      settings={"warmup": 0, "peak_tflops": 0.12})
    report = build_report(make_run([rank]))
    assert report.flops.rate("ProfileStep").mfu == pytest.approx(0.5)
    model = next(b for b in blocks(report) if getattr(b, "key", None) == "model")
    assert model.rows[0][-1] == "50.0"


def test_options_reach_the_settings() -> None:
    from perfrun.cli import settings_from_options
    from perfrun.settings import Settings, SettingsError

    settings = settings_from_options({"script": "train.py", "no_flops": True,
                                      "peak_tflops": 312.0})
    assert settings.count_flops is False and settings.peak_tflops == 312.0
    assert Settings.from_json(settings.to_json()) == settings
    assert Settings().count_flops is True and Settings().peak_tflops is None
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(SettingsError, match="--peak-tflops"):
            Settings(peak_tflops=bad).validate()


# -- recurrent layers ----------------------------------------------------------------


@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, False), (2, True)],
                         ids=["one-layer", "two-layers", "bidirectional"])
def test_a_fused_lstm_counts_what_the_unfused_one_does(layers: int, bidirectional: bool) -> None:
    """oneDNN's fused LSTM layer (what nn.LSTM runs on CPU) counts as the
    same LSTM run as matmuls (oneDNN off: torch's own formulas count each
    gate's matmul): the independent figure. torch alone counts the fused
    one 0."""
    torch.manual_seed(0)
    lstm = nn.LSTM(28, 64, num_layers=layers, bidirectional=bidirectional, batch_first=True)
    x = torch.randn(8, 28, 28, requires_grad=True)

    def run() -> torch.Tensor:
        return lstm(x)[0]

    fused = forward_backward(run)
    with torch.backends.mkldnn.flags(enabled=False):
        unfused = forward_backward(run)
    dirs = 2 if bidirectional else 1
    first = 2 * 8 * 28 * dirs * (4 * 64 * 28 + 4 * 64 * 64)
    later = 2 * 8 * 28 * dirs * (4 * 64 * 64 * dirs + 4 * 64 * 64) * (layers - 1)
    assert fused[0] == unfused[0] == first + later
    # Backward: two matmuls of the forward's each; the unfused layer skips
    # one, the gradient of the zero initial state, which needs none (one
    # hidden-to-gates matmul a layer and direction, about 1% here).
    assert fused[1] == 2 * (first + later)
    assert fused[1] - unfused[1] == layers * dirs * 2 * 8 * 4 * 64 * 64
    with FlopCounterMode(display=False) as plain:
        run()
    assert plain.get_total_flops() == 0  # why perfrun supplies the formula


def test_cudnns_recurrent_op_is_read_by_its_schema() -> None:
    """cuDNN's op (every recurrent layer on CUDA) takes the input, then the
    list of every layer's weights, 2-D matrices and 1-D biases: the formula
    counts the matrices. Called here with tensors in the schema's order (no
    GPU in this suite)."""
    formula = custom_mapping(torch)[torch.ops.aten._cudnn_rnn]
    h, i, t, b = 32, 16, 10, 4
    weights = [torch.empty(4 * h, i), torch.empty(4 * h, h), torch.empty(4 * h),
               torch.empty(4 * h), torch.empty(4 * h, h), torch.empty(4 * h, h),
               torch.empty(4 * h), torch.empty(4 * h)]
    x = torch.empty(t, b, i)
    assert formula(x, weights, 4, None, torch.empty(2, b, h)) == \
        2 * t * b * (4 * h * i + 3 * 4 * h * h)
    backward = custom_mapping(torch)[torch.ops.aten._cudnn_rnn_backward]
    assert backward(x, weights) == 2 * formula(x, weights)
