"""perfrun on a real NVIDIA GPU: real CUDA scripts, real subprocesses.

The CPU suite cannot tell whether perfrun's CUDA side works: CUDA events,
the detailed window's kernel, memcpy and memset rows, NVML readings, ranks
sharing a GPU, CUDA graphs, a script choosing its own GPU, forked DataLoader
workers next to a CUDA context, and what all that costs a GPU-bound step.
Each check here runs one of the small scripts in tests/gpu/scripts under
perfrun (and, where the script's own output is the evidence, under plain
Python too) and holds the result files and the output to ground truth the
script measured itself. Every check records its figures through the
`figures` fixture, so a run on a GPU machine leaves numbers to read, not
only a verdict.

Run them with `bash scripts/gpu_check.sh` (it installs what is missing
without network and prints the figures). On a machine without CUDA the
whole module is skipped at collection, before torch is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import pytest


def cuda_missing() -> Optional[str]:
    """Why CUDA cannot be used here, or None. Without an NVIDIA driver CUDA
    cannot be available, and that is known without importing torch (which
    would cost each collecting process a second or two on CPU machines)."""
    driver = (
        os.path.exists("/proc/driver/nvidia/version")
        or os.path.exists("/dev/nvidiactl")
        or shutil.which("nvidia-smi") is not None
    )
    if not driver:
        return "no NVIDIA driver on this machine"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.slow]

_MISSING = cuda_missing()
if _MISSING is not None:
    pytest.skip(f"GPU checks need CUDA: {_MISSING}", allow_module_level=True)

from perfrun.store.rankfile import RankResult  # noqa: E402
from perfrun.store.results import read_run  # noqa: E402
from perfrun.store.stepfile import COL  # noqa: E402

SCRIPTS = Path(__file__).parent / "scripts"

#: A run that takes longer than this is hung, not slow (torch's import and
#: CUDA's start-up take seconds on their own).
TIMEOUT = 300


# -- running scripts -----------------------------------------------------------------


def environment() -> dict[str, str]:
    """What perfrun and plain Python both get: the test process's own
    environment, without perfrun state leaking in."""
    env = dict(os.environ)
    env.pop("PERFRUN_SETTINGS", None)
    return env


@dataclass
class Run:
    """One process run (perfrun or plain Python) and what it left."""

    argv: list[str]
    returncode: int
    out: str
    err: str
    log_dir: Optional[Path] = None
    report_path: Optional[Path] = None

    def describe(self) -> str:
        return (
            f"{' '.join(self.argv)} -> {self.returncode}\n"
            f"--- stdout ---\n{self.out}\n--- stderr ---\n{self.err[-6000:]}"
        )

    def lines(self, prefix: str) -> list[str]:
        """The script's own lines starting with `prefix` (its evidence)."""
        return [line for line in self.out.splitlines() if line.startswith(prefix)]

    @property
    def run_dir(self) -> Path:
        assert self.log_dir is not None, "not a perfrun run"
        runs = [p for p in self.log_dir.iterdir() if p.is_dir() and not p.is_symlink()]
        assert len(runs) == 1, f"expected one run folder, found {runs}\n{self.describe()}"
        return runs[0]

    def ranks(self) -> list[RankResult]:
        return read_run(str(self.run_dir)).ranks

    def rank0(self) -> RankResult:
        ranks = self.ranks()
        assert [r.rank for r in ranks] == [0], self.describe()
        return ranks[0]

    def report(self) -> dict[str, Any]:
        assert self.report_path is not None, "not a perfrun run"
        return json.loads(self.report_path.read_text(encoding="utf-8"))


def _unique(tmp: Path, stem: str, suffix: str = "") -> Path:
    n = 1
    while (tmp / f"{stem}{n}{suffix}").exists():
        n += 1
    return tmp / f"{stem}{n}{suffix}"


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )


def perfrun(tmp: Path, *args: str, timeout: float = TIMEOUT) -> Run:
    """`python -m perfrun` with its own log folder and the JSON report in a
    file, so that stdout holds only what the script printed."""
    log_dir = _unique(tmp, "log")
    report = _unique(tmp, "report", ".json")
    argv = ["--log-dir", str(log_dir), "--format", "json", "--output", str(report), *args]
    proc = _run([sys.executable, "-m", "perfrun", *argv], tmp, timeout)
    return Run(
        ["perfrun", *argv],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
        log_dir,
        report,
    )


def python(tmp: Path, *args: str, timeout: float = TIMEOUT) -> Run:
    """The same script as a user runs it without perfrun."""
    proc = _run([sys.executable, *args], tmp, timeout)
    return Run(
        ["python", *args],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds * 1000.0, 4)


def gpu_columns(rank: RankResult) -> dict[str, list[Any]]:
    names = ("gpu_dataloader", "gpu_forward", "gpu_backward", "gpu_optimization", "gpu_step")
    return {name: rank.column(name) for name in names}


def model_row(report: dict[str, Any], name: str) -> dict[str, Any]:
    for row in report["model"]["rows"]:
        if row["name"] == name:
            return row
    raise KeyError(name)


# -- 1. CUDA-event phase times against the script's own events ---------------------------

PHASE_STEPS = 40
GPU_PHASES = ("forward", "backward", "optimization")


def phase_bound(truth: float) -> float:
    """How far perfrun's median may be from the script's: 10%, or 0.2 ms
    for phases too short for a ratio to mean much."""
    return max(0.10 * truth, 0.0002)


@pytest.fixture(scope="module")
def phases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict[str, Any]]:
    """One run of cuda_phases.py, read by the phase check and the NVML check."""
    tmp = tmp_path_factory.mktemp("cuda_phases")
    truth_path = tmp / "truth.json"
    script = str(SCRIPTS / "cuda_phases.py")
    run = perfrun(tmp, script, "--steps", str(PHASE_STEPS), "--out", str(truth_path))
    assert run.returncode == 0, run.describe()
    return run, json.loads(truth_path.read_text(encoding="utf-8"))


def test_gpu_phase_times_match_the_scripts_cuda_events(
    phases: tuple[Run, dict[str, Any]], figures: Any
) -> None:
    """On the median steady step, perfrun's GPU time of each phase is the
    GPU time the script's own events around the same calls measured; the
    report's GPU median is the per-step columns' median."""
    run, truth = phases
    rank = run.rank0()
    report = run.report()
    assert rank.data["faults"] == [], run.describe()
    assert rank.data["gpu"] is True, rank.data.get("notes")
    assert len(rank.rows) == PHASE_STEPS
    warmup = int(report["title"]["warmup"])
    steady = rank.rows[warmup:]
    problems = []
    for phase in GPU_PHASES:
        measured = [row[COL["gpu_" + phase]] for row in steady]
        assert None not in measured, (phase, measured)
        ours = statistics.median(measured)
        theirs = statistics.median(truth[phase][warmup:])
        reported = (model_row(report, phase.capitalize())["gpu"] or {}).get("median")
        figures(
            phase=phase, perfrun_ms=ms(ours), script_events_ms=ms(theirs),
            report_median_ms=ms(reported), ratio=round(ours / theirs, 4) if theirs else None,
            steps=len(steady),
        )
        if abs(ours - theirs) > phase_bound(theirs):
            problems.append(f"{phase}: perfrun {ms(ours)} ms, script's events {ms(theirs)} ms")
        if reported is None or reported != pytest.approx(ours, rel=1e-6, abs=1e-9):
            problems.append(f"{phase}: report median {reported} != per-step median {ours}")
    # A step's GPU span holds its phases.
    for i, row in enumerate(steady):
        phases_sum = sum(row[COL["gpu_" + p]] or 0.0 for p in ("dataloader", *GPU_PHASES))
        if row[COL["gpu_step"]] is None or phases_sum > row[COL["gpu_step"]] + 1e-5:
            problems.append(f"step {warmup + i}: phases {phases_sum} > step {row[COL['gpu_step']]}")
    assert not problems, "\n".join(problems)


# -- 6. NVML readings ------------------------------------------------------------------


def bare_uuid(uuid: Any) -> str:
    """`GPU-xxxx` (NVML), `MIG-xxxx` or torch's bare `xxxx`, compared alike."""
    text = str(uuid or "").strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def nvml_index_of(gpu: dict[str, Any]) -> int:
    return int(gpu["nvml_index"] if gpu.get("nvml_index") is not None else gpu["index"])


def used_gpu(truth: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The reading of the GPU the script ran on: the one whose UUID is the
    CUDA device's (from the rank file, else from NVML), or the only one."""
    wanted = bare_uuid(truth.get("device_uuid"))
    for g in gpus:
        if wanted and g.get("uuid") and bare_uuid(g["uuid"]) == wanted:
            return g
    if len(gpus) == 1:
        return gpus[0]
    import pynvml

    pynvml.nvmlInit()
    try:
        for g in gpus:
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index_of(g))
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            if wanted and bare_uuid(uuid.decode() if isinstance(uuid, bytes) else uuid) == wanted:
                return g
    finally:
        pynvml.nvmlShutdown()
    raise AssertionError(f"no GPU reading has the CUDA device's UUID {wanted!r}: {gpus}")


def mig_enabled(index: int) -> bool:
    """NVML reports no utilisation for a GPU split into MIG instances."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            current, _ = pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(index))
            return bool(current)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def test_nvml_readings_of_the_gpu_used(
    phases: tuple[Run, dict[str, Any]], figures: Any
) -> None:
    """The rank file's Device Summary readings for the GPU the script
    trained on: utilisation sampled, memory in use seen (the script's own
    CUDA context alone takes hundreds of MiB)."""
    run, truth = phases
    device = run.rank0().data["device"]
    gpus = device["gpus"]
    assert gpus, f"no GPU in the rank file's device readings: {device}"
    gpu = used_gpu(truth, gpus)
    if mig_enabled(nvml_index_of(gpu)):
        pytest.skip("MIG is enabled: NVML has no utilisation to read")
    figures(
        index=gpu["index"], name=gpu["name"], util_avg=gpu["util_avg"], util_max=gpu["util_max"],
        mem_used_max_mib=round(gpu["mem_used_max"] / 2**20, 1) if gpu["mem_used_max"] else None,
        mem_total_mib=round(gpu["mem_total"] / 2**20, 1) if gpu["mem_total"] else None,
        samples=device.get("samples"),
        driver=device.get("driver"),
    )
    assert gpu["util_avg"] is not None, gpu
    assert gpu["mem_used_max"] is not None and gpu["mem_used_max"] > 0, gpu
    assert gpu["mem_total"] is None or gpu["mem_used_max"] <= gpu["mem_total"], gpu


# -- 2. the detailed window's GPU rows ----------------------------------------------------

WINDOW_STEPS = 14


def test_window_has_kernel_memcpy_memset_and_operator_gpu_time(
    tmp_path: Path, figures: Any
) -> None:
    """`--scheduler 5 10` on a loop that copies to the GPU, sets memory and
    multiplies matrices: the window summary's Kernel, Memcpy and Memset rows
    have time, and the matmul operators carry their kernels' GPU time."""
    script = str(SCRIPTS / "cuda_window.py")
    run = perfrun(tmp_path, "--scheduler", "5", "10", script, "--steps", str(WINDOW_STEPS))
    assert run.returncode == 0, run.describe()
    rank = run.rank0()
    assert rank.data["faults"] == [], run.describe()
    assert len(rank.rows) == WINDOW_STEPS
    assert rank.data["window"] == [5, 10]
    summary = rank.data["window_summary"]
    assert summary, f"no window summary: {rank.data.get('notes')}"
    overview = {o["type"]: o for o in summary["overview"]}
    operators = {o["name"]: o for o in summary["operators"]}
    copies = {c["name"]: c for c in summary["memory_manipulation"]["copies"]}
    figures(
        window_steps=summary["steps"],
        **{f"{t.lower()}_ms": ms((overview.get(t) or {}).get("time"))
           for t in ("Kernel", "Memcpy", "Memset")},
        **{f"{t.lower()}_calls": (overview.get(t) or {}).get("calls")
           for t in ("Kernel", "Memcpy", "Memset")},
        **{f"{op.split('::')[-1]}_gpu_ms": ms((operators.get(op) or {}).get("gpu_total"))
           for op in ("aten::mm", "aten::addmm")},
        copies=sorted(copies),
    )
    assert summary["steps"] == 5
    for kind in ("Kernel", "Memcpy", "Memset"):
        row = overview.get(kind)
        assert row is not None and row["calls"] > 0 and row["time"] > 0, (kind, overview)
    for op in ("aten::mm", "aten::addmm"):
        row = operators.get(op)
        assert row is not None, (op, sorted(operators))
        assert row["gpu_total"] is not None and row["gpu_total"] > 0, (op, row)
    assert "Memcpy HtoD" in copies and "Memset" in copies, sorted(copies)
    # `perfrun analyze` on the trace the window exported gives the window's
    # own tables: one computation.
    trace = run.run_dir / summary["trace"]
    out = subprocess.run(
        [sys.executable, "-m", "perfrun", "analyze", str(trace), "--format", "json"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    again = json.loads(out.stdout)["traces"][0]["summary"]
    assert again["steps"] == summary["steps"]
    assert again["kernel_total"] == pytest.approx(summary["kernel_total"])
    assert [g["busy"] for g in again["gpus"]] == pytest.approx(
        [g["busy"] for g in summary["gpus"]]
    )


# -- 3. two ranks sharing the GPU -------------------------------------------------------

RANK_STEPS = 12


def test_two_ranks_share_the_gpu(tmp_path: Path, figures: Any) -> None:
    """`--nproc-per-node 2` on one GPU, gloo all-reducing CUDA tensors: both
    ranks finish, each with its steps and its GPU columns."""
    script = str(SCRIPTS / "cuda_ranks.py")
    options = ["--nproc-per-node", "2", "--master-port", str(free_port())]
    run = perfrun(tmp_path, *options, script, "--steps", str(RANK_STEPS))
    assert run.returncode == 0, run.describe()
    ranks = run.ranks()
    assert [r.rank for r in ranks] == [0, 1], run.describe()
    for rank in ranks:
        data = rank.data
        columns = gpu_columns(rank)
        figures(
            rank=rank.rank, steps=len(rank.rows), gpu=data["gpu"], cuda=data.get("cuda"),
            gpu_step_median_ms=ms(statistics.median(columns["gpu_step"]))
            if columns["gpu_step"] and None not in columns["gpu_step"] else None,
        )
        assert (data["world_size"], data["status"]) == (2, "finished"), data["status"]
        assert data["faults"] == [], data["faults"]
        assert len(rank.rows) == RANK_STEPS
        assert data["gpu"] is True, data.get("notes")
        for name, values in columns.items():
            assert None not in values, (rank.rank, name, values)
        assert all(v > 0 for v in columns["gpu_step"]), columns["gpu_step"]
        assert all(v > 0 for v in columns["gpu_forward"]), columns["gpu_forward"]
        assert f"cuda_ranks: rank {rank.rank} of 2 done, sum 1" in run.out, run.describe()


# -- 4. CUDA graphs ---------------------------------------------------------------------

REPLAYS = 20


def test_cuda_graph_capture_and_replay_are_unchanged(tmp_path: Path, figures: Any) -> None:
    """A captured training step replays to the same losses under perfrun as
    under plain Python, and the eager steps around the capture are
    recorded."""
    script = str(SCRIPTS / "cuda_graph.py")
    plain = python(tmp_path, script, "--replays", str(REPLAYS))
    assert plain.returncode == 0, plain.describe()
    run = perfrun(tmp_path, script, "--replays", str(REPLAYS))
    assert run.returncode == 0, run.describe()
    rank = run.rank0()
    columns = gpu_columns(rank)
    figures(
        steps=len(rank.rows), gpu=rank.data["gpu"], faults=rank.data["faults"],
        plain=plain.lines("GRAPH "), perfrun=run.lines("GRAPH "),
        last_steps_gpu_step_ms=[ms(v) for v in columns["gpu_step"][-3:]],
    )
    assert len(plain.lines("GRAPH ")) == 2, plain.describe()
    assert run.lines("GRAPH ") == plain.lines("GRAPH "), run.describe()
    assert rank.data["status"] == "finished"
    # Three warm-up steps and three after the replays, plus the captured
    # step if perfrun counts it; replays call no hooked function.
    assert 6 <= len(rank.rows) <= 7, len(rank.rows)
    # The capture worked, but perfrun's own hooks must not have failed on it.
    assert rank.data["faults"] == [], rank.data["faults"]


# -- 5. a script choosing its own GPU -----------------------------------------------------


@pytest.mark.parametrize("mode", ["last", "none"])
def test_cuda_visible_devices_set_by_the_script(
    tmp_path: Path, figures: Any, mode: str
) -> None:
    """CUDA_VISIBLE_DEVICES set after `import torch` and before any CUDA
    call takes effect under perfrun exactly as under plain Python."""
    script = str(SCRIPTS / "cuda_visible.py")
    plain = python(tmp_path, script, mode)
    assert plain.returncode == 0, plain.describe()
    run = perfrun(tmp_path, script, mode)
    figures(mode=mode, plain=plain.lines("VISIBLE "), perfrun=run.lines("VISIBLE "))
    assert run.returncode == 0, run.describe()
    assert len(plain.lines("VISIBLE ")) == 2, plain.describe()
    if mode == "none":
        assert "device_count 0 " in plain.lines("VISIBLE ")[0], plain.describe()
    else:
        assert "device_count 1 " in plain.lines("VISIBLE ")[0], plain.describe()
    assert run.lines("VISIBLE ") == plain.lines("VISIBLE "), run.describe()
    rank = run.rank0()
    assert len(rank.rows) == 5
    assert rank.data["gpu"] is (mode == "last"), rank.data.get("notes")


# -- DataLoader workers forked after CUDA ---------------------------------------------------

LOADER_STEPS = 16


def test_dataloader_workers_forked_after_cuda(tmp_path: Path, figures: Any) -> None:
    """Two DataLoader workers forked from a process that holds a CUDA
    context run under perfrun as under plain Python, and only the main
    process is a rank."""
    script = str(SCRIPTS / "cuda_loader_workers.py")
    plain = python(tmp_path, script)
    assert plain.returncode == 0, plain.describe()
    run = perfrun(tmp_path, script)
    figures(plain=plain.lines("LOADER "), perfrun=run.lines("LOADER "), exit=run.returncode)
    assert run.returncode == 0, run.describe()
    assert "re-initialize CUDA" not in run.err, run.describe()
    assert run.lines("LOADER ") == plain.lines("LOADER "), run.describe()
    rank = run.rank0()
    assert rank.data["faults"] == [], rank.data["faults"]
    assert len(rank.rows) == LOADER_STEPS
    assert rank.data["gpu"] is True, rank.data.get("notes")


# -- 7. overhead on a ~10 ms GPU step -----------------------------------------------------

OVERHEAD_ROUNDS = 7
OVERHEAD_STEPS = 200
OVERHEAD_SKIP = 20
#: Loose on purpose: a shared machine's noise is a few percent; a profiler
#: that makes a 10 ms GPU step 10% slower is broken, not noisy. The figures
#: (issue targets: 0.5% in either mode) go to the note, not to an assert.
OVERHEAD_LIMIT = 1.10


def step_ms(run: Run) -> float:
    assert run.returncode == 0, run.describe()
    lines = run.lines("STEP_MS ")
    assert len(lines) == 1, run.describe()
    return float(lines[0].split()[1])


def test_overhead_of_both_modes_on_a_10ms_gpu_step(tmp_path: Path, figures: Any) -> None:
    """The script's own steady-state step time (steps 20..200, the loss read
    every step, so the CPU waits for the GPU each step and any cost perfrun
    adds between steps shows) under the default mode and `--timer-only`
    against plain Python. Rounds of three runs, their order rotating so that
    drift in the machine's speed falls on every arm; each mode's figure is
    the median of its per-round ratios to the plain run."""
    script = str(SCRIPTS / "cuda_overhead.py")
    args = (script, "--item", "--steps", str(OVERHEAD_STEPS), "--skip", str(OVERHEAD_SKIP))
    arms: dict[str, Callable[[], Run]] = {
        "plain": lambda: python(tmp_path, *args),
        "default": lambda: perfrun(tmp_path, *args),
        "timer-only": lambda: perfrun(tmp_path, "--timer-only", *args),
    }
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(OVERHEAD_ROUNDS):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(step_ms(arms[name]()))
    found: dict[str, Any] = {"plain_step_ms": times["plain"]}
    medians = {}
    for mode in ("default", "timer-only"):
        ratios = [p / q for p, q in zip(times[mode], times["plain"])]
        medians[mode] = statistics.median(ratios)
        found[f"{mode}_step_ms"] = times[mode]
        found[f"{mode}_ratios"] = [round(r, 4) for r in ratios]
        found[f"{mode}_median_ratio"] = round(medians[mode], 4)
    figures(**found)
    assert all(m < OVERHEAD_LIMIT for m in medians.values()), found


# -- disturbed-measurement evidence ----------------------------------------------------

#: The clock event reasons perfrun decodes (runtime/device.py).
REASON_NAMES = {"gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
                "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                "hw_power_brake_slowdown", "display_clock_setting"}


def test_disturbance_evidence_is_read_and_a_normal_run_is_not_flagged(
    tmp_path: Path, figures: Any
) -> None:
    """A few seconds of 10 ms GPU steps, sampled every half second: the new
    NVML readings work on a real driver (clock event reasons decoded, SM
    clock against its maximum, the GPU's process list with this run's own
    process in it, ECC and XID availability recorded), and a run on a
    machine lent to this check alone raises no disturbance flag."""
    script = str(SCRIPTS / "cuda_overhead.py")
    run = perfrun(tmp_path, "--timer-only", "--flush-interval", "0.5", script,
                  "--steps", "600", "--skip", "20")
    assert run.returncode == 0, run.describe()
    device = run.rank0().data["device"]
    gpu = next(g for g in device["gpus"] if g.get("evidence", {}).get("busy_samples"))
    ev = gpu["evidence"]
    report = run.report()
    meta = json.loads((run.run_dir / "run.json").read_text(encoding="utf-8"))
    host = meta.get("host_load") or {}
    figures(
        name=gpu["name"], samples=ev["samples"], busy_samples=ev["busy_samples"],
        reasons_api=ev["reasons_api"], reasons=ev["reasons"],
        sm_clock_min=ev["sm_clock_min"], sm_clock_median=ev["sm_clock_median"],
        sm_clock_max=ev["sm_clock_max"], power_limit_w=ev["power_limit_w"],
        power_default_limit_w=ev["power_default_limit_w"], own_pid_seen=ev["own_pid_seen"],
        other_processes=ev["other_processes"], unresolved=ev["unresolved_processes"],
        ecc_uncorrected_new=ev["ecc_uncorrected_new"], xid_available=ev["xid_available"],
        xid_errors=ev["xid_errors"], unavailable=ev["unavailable"],
        flags=[f["message"] for f in report["disturbed"]],
        host_other_cores=host.get("other_cores"), host_steal=host.get("steal_fraction"),
        host_cpu_freq=host.get("cpu_freq"), host_sample_cost=host.get("sample_cost"),
    )
    assert ev["busy_samples"] >= 3, ev
    assert ev["reasons_api"] is not None, ev["unavailable"]
    assert set(ev["reasons"]) <= REASON_NAMES, ev["reasons"]
    assert ev["sm_clock_max"] and ev["sm_clock_median"], ev
    assert 0 < ev["sm_clock_min"] <= ev["sm_clock_median"] <= ev["sm_clock_max"] * 1.05, ev
    assert ev["power_limit_w"] or "power_limit" in ev["unavailable"], ev
    assert ev["process_reads"] > 0, ev["unavailable"]
    # This process is on the list: by its own PID, or (a container with a
    # PID namespace of its own) as a PID that names no process here.
    assert ev["own_pid_seen"] or ev["unresolved_processes"], ev
    assert "ecc" in ev["unavailable"] or ev["ecc_uncorrected_new"] is not None, ev
    assert ev["xid_available"] or "xid" in ev["unavailable"], ev
    assert report["disturbed"] == [], report["disturbed"]


# -- 10. MFU of a GPT-like model against a hand calculation --------------------------------

GPT_STEPS, GPT_SKIP = 60, 20


def script_figure(run: Run, name: str) -> str:
    lines = run.lines(name + " ")
    assert lines, f"the script printed no {name}\n{run.describe()}"
    return lines[-1].split(" ", 1)[1]


def test_mfu_of_a_gpt_in_bf16_against_a_hand_calculation(tmp_path: Path, figures: Any) -> None:
    """A small GPT in bf16 autocast under perfrun: the FLOPs perfrun counted
    against the script's analytic figure, and the MFU it reports against
    analytic FLOPs per step / the script's own step time / the table's peak
    for this GPU."""
    from perfrun.analysis.peaks import peak_for

    script = str(SCRIPTS / "cuda_gpt.py")
    run = perfrun(tmp_path, script, "--steps", str(GPT_STEPS), "--skip", str(GPT_SKIP))
    assert run.returncode == 0, run.describe()
    forward = int(script_figure(run, "FLOPS_FORWARD"))
    backward = int(script_figure(run, "FLOPS_BACKWARD"))
    per_step = int(script_figure(run, "FLOPS_PER_STEP"))
    device = script_figure(run, "DEVICE")
    step_ms = float(script_figure(run, "STEP_MS"))
    counted = run.rank0().data["flops"]
    report = run.report()["flops"]
    peak, why = peak_for(device, "bfloat16")
    hand_mfu = per_step / (step_ms / 1e3) / peak.flops if peak is not None else None
    phases = {p["name"]: p for p in report["phases"]}
    step = phases["ProfileStep"]
    figures(
        device=device, peak_tflops=peak.flops / 1e12 if peak else None, peak_missing=why,
        analytic_forward=forward, counted_forward=counted["forward"],
        analytic_backward=backward, counted_backward=counted["backward"],
        counted_optimizer=counted["optimizer"], dtype=counted["dtype"],
        autocast=counted["autocast"], counted_step=counted["step"],
        counting_seconds=counted["seconds"], script_step_ms=step_ms,
        perfrun_step_ms=ms(step["seconds"]),
        achieved_tflops_step=step["achieved"] / 1e12 if step["achieved"] else None,
        achieved_tflops_forward=(phases["Forward"]["achieved"] or 0) / 1e12,
        achieved_tflops_backward=(phases["Backward"]["achieved"] or 0) / 1e12,
        mfu_reported=step["mfu"], mfu_by_hand=hand_mfu, notes=counted["notes"],
    )
    assert counted["counted"] and counted["dtype"] == "bfloat16" and counted["autocast"]
    assert counted["forward"] == pytest.approx(forward, rel=0.005)
    assert counted["backward"] == pytest.approx(backward, rel=0.005)
    assert phases["Forward"]["basis"] == "gpu"
    if peak is None:
        pytest.skip(f"no MFU to compare on this GPU: {why}")
    assert step["mfu"] == pytest.approx(hand_mfu, rel=0.15)


# -- GPU memory: per-phase peaks, creep, out of memory, the snapshot ----------------------

MEMORY_SCRIPT = str(SCRIPTS / "cuda_memory.py")
MIB = 1 << 20


def cuda_memory(rank: RankResult) -> dict[str, Any]:
    memory = rank.data.get("memory") or {}
    assert isinstance(memory.get("cuda"), dict), rank.data.get("faults")
    return memory["cuda"]


def test_per_phase_memory_peaks_match_the_scripts_own_readings(
    tmp_path: Path, figures: Any
) -> None:
    """On every step perfrun sampled, each phase's peak allocated bytes are
    within 1 MiB of what the script read itself with
    torch.cuda.max_memory_allocated() around the same call (after its own
    reset_peak_memory_stats); and the script's readings are what it reads
    without perfrun (its peaks are its own)."""
    truth_path = tmp_path / "truth.json"
    plain_path = tmp_path / "plain.json"
    args = ("--mode", "phases", "--steps", "1500")
    run = perfrun(tmp_path, MEMORY_SCRIPT, *args, "--out", str(truth_path))
    assert run.returncode == 0, run.describe()
    plain = python(tmp_path, MEMORY_SCRIPT, *args, "--out", str(plain_path))
    assert plain.returncode == 0, plain.describe()
    truth = {s["step"]: s for s in json.loads(truth_path.read_text())["steps"]}
    alone = json.loads(plain_path.read_text())["steps"]
    rank = run.rank0()
    assert rank.data["faults"] == [], rank.data["faults"]
    section = cuda_memory(rank)
    rows = section["rows"]
    names = section["buckets"]
    problems, compared = [], 0
    worst = 0
    for row in rows:
        step = truth.get(row[0])
        if step is None:
            problems.append(f"sampled step {row[0]} is not a step of the script")
            continue
        for b, phase in enumerate(names[:4]):
            ours, theirs = row[3 + b], step[phase]
            worst = max(worst, abs(ours - theirs))
            compared += 1
            if abs(ours - theirs) > MIB:
                problems.append(f"step {row[0]} {phase}: perfrun {ours}, script {theirs}")
    # The script reads the same peaks with and without perfrun (the same
    # work, the same allocator: equal to the byte on steady steps).
    steady = slice(50, None)
    same = [a[p] == b[p] for a, b in zip(alone[steady], list(truth.values())[steady])
            for p in ("dataloader", "forward", "backward", "optimization")]
    report = run.report()
    devices = report["memory"]["devices"]
    figures(sampled=len(rows), compared=compared, worst_difference_bytes=worst,
            script_peaks_equal_without_perfrun=sum(same), of=len(same),
            events_per_step=section.get("events_per_step"),
            peak_phase=devices[0]["peak_phase"], peak_allocated=devices[0]["peak_allocated"])
    assert len(rows) >= 3, section
    assert not problems, "\n".join(problems[:20])
    assert all(same), "the script's own peaks differ under perfrun"


@pytest.mark.parametrize("mode", ["creep", "flat"])
def test_gpu_memory_creep_is_flagged_and_a_flat_run_is_not(
    tmp_path: Path, figures: Any, mode: str
) -> None:
    """Logits kept every step (4 MiB a step): the Memory Summary's creep and
    the memory-creep advice, with a slope within 10% of what the script
    keeps; the same loop keeping them on the CPU: no creep."""
    run = perfrun(tmp_path, MEMORY_SCRIPT, "--mode", mode, "--steps", "3000")
    assert run.returncode == 0, run.describe()
    report = run.report()
    device = report["memory"]["devices"][0]
    kinds = [a["kind"] for a in report.get("advice") or []]
    figures(mode=mode, creep=device["creep"], sampled=len(device["points"]), advice=kinds)
    if mode == "creep":
        kept = 1024 * 1000 * 4  # batch x classes float32 logits a step
        assert device["creep"] is not None, device
        assert device["creep"]["slope_bytes_per_step"] == pytest.approx(kept, rel=0.10)
        assert device["creep"]["full_at_step"] is not None
        assert "memory-creep" in kinds
    else:
        assert device["creep"] is None, device
        # The logits kept on the CPU instead: the host's memory creeps (4 MiB
        # a step), and the advice says so of the rank's process, not of the
        # GPU.
        creeps = [a for a in report.get("advice") or [] if a["kind"] == "memory-creep"]
        assert creeps and all("processes" in a["evidence"] for a in creeps), creeps
        assert not any("device" in a["evidence"] for a in creeps), creeps


def test_an_out_of_memory_error_is_reported_with_its_step_phase_module_and_snapshot(
    tmp_path: Path, figures: Any
) -> None:
    """The bloat block's forward asks for twice the device at step 7: the
    script's traceback and exit status are its own; the report names step
    7, forward and the module; the snapshot written at the error opens with
    torch.cuda._memory_viz and tags allocations with their step and phase."""
    args = ("--mode", "oom", "--oom-step", "7", "--steps", "50")
    plain = python(tmp_path, MEMORY_SCRIPT, *args)
    run = perfrun(tmp_path, "--memory-snapshot", MEMORY_SCRIPT, *args)
    assert plain.returncode != 0 and run.returncode == plain.returncode, run.describe()
    assert "OutOfMemoryError" in run.err
    rank = run.rank0()
    section = cuda_memory(rank)
    first = section["oom"]["first"]
    figures(oom=first, snapshot=section.get("snapshot"))
    assert first["step"] == 7, first
    assert first["phase"] == "forward", first
    assert first["module"] == "Net.bloat", first
    assert first["requested"] >= first["device_total"], first
    assert 0 < first["allocated"] <= first["reserved"], first
    snapshot = section["snapshot"]
    assert snapshot["reason"] == "out of memory"
    path = run.run_dir / snapshot["file"]
    import pickle

    from torch.cuda import _memory_viz

    with open(path, "rb") as f:
        data = pickle.load(f)
    assert _memory_viz.segsum(data)
    assert _memory_viz.trace_plot(data)
    entries = [e for trace in data.get("device_traces", []) for e in trace]
    tagged = [e for e in entries if any(isinstance(v, str) and v.startswith("step ")
                                        for v in e.values())]
    figures(snapshot_entries=len(entries), tagged=len(tagged),
            tags=sorted({v for e in tagged for v in e.values()
                         if isinstance(v, str) and v.startswith("step ")})[:10])
    assert entries and tagged, "no allocation carries its step and phase"
    text = run.out + run.err
    assert "Net.bloat" in json.dumps(run.report()["memory"]), run.report()["memory"]
    assert "OutOfMemoryError" in text
