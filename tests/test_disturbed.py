"""Disturbed-measurement flags (perfrun/analysis/disturbed.py) and what they
do to the report and the gate.

The decisions are checked on hand-built evidence; then real runs: a small
CPU training script with busy processes started beside it is flagged with
host-load evidence and the same run without them is not; and a disturbed
run that is slower than its baseline gets no regression from the gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from builders import make_rank, make_rows, make_run
from conftest import E2E_TIMEOUT, e2e_environment, import_file

from perfrun import cli
from perfrun.analysis.build import build_report
from perfrun.analysis.disturbed import (
    flags_of,
    gpu_flags,
    host_flags,
    run_flags,
)
from perfrun.analysis.gate import Verdict, disturbed_verdict, gate
from perfrun.exitcodes import ExitCode
from perfrun.report.markdown import render_markdown
from perfrun.store.runmeta import RUN_META
from perfrun.store.schema import check

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "gate_train.py"
GiB = 1 << 30


def host(**figures: Any) -> dict[str, Any]:
    """Launcher evidence of a quiet 2-core machine, with `figures` changed."""
    ev: dict[str, Any] = {
        "version": 1, "host": "node-a", "cpu_count": 2, "samples": 11, "seconds": 10.0,
        "machine_busy_cores": 1.03, "job_cores": 1.0, "launcher_cores": 0.003,
        "other_cores": 0.03, "other_cores_max": 0.2, "steal_fraction": 0.001,
        "cpu_freq": None, "top_others": [], "unavailable": [], "sample_cost": {},
    }
    ev.update(figures)
    return ev


def gpu(**figures: Any) -> dict[str, Any]:
    """One GPU's evidence of a healthy busy run, with `figures` changed."""
    ev: dict[str, Any] = {
        "samples": 20, "busy_samples": 20, "busy_basis": "utilisation > 0",
        "reasons_api": "nvmlDeviceGetCurrentClocksEventReasons", "reasons_samples": 20,
        "reasons": {}, "sm_clock_min": 1950, "sm_clock_median": 1980, "sm_clock_max": 1980,
        "power_limit_w": 700.0, "power_default_limit_w": 700.0, "process_reads": 20,
        "own_pid_seen": True, "other_processes": [],
        "unresolved_processes": [], "ecc_uncorrected_new": 0, "xid_available": True,
        "xid_errors": [], "unavailable": {},
    }
    ev.update(figures)
    return ev


def kinds(flags: list[Any]) -> list[str]:
    return [f.kind for f in flags]


# -- host decisions ------------------------------------------------------------------


def test_a_quiet_host_is_not_flagged() -> None:
    assert host_flags(host()) == []
    # This machine's background measured without a job: a few hundredths.
    assert host_flags(host(other_cores=0.05, other_cores_max=0.6)) == []


def test_other_processes_taking_cpu_are_flagged_with_their_figures() -> None:
    top = [{"pid": 4242, "name": "python", "cores": 0.95}, {"pid": 7, "name": "sshd",
                                                             "cores": 0.01}]
    [flag] = host_flags(host(other_cores=0.98, top_others=top))
    assert flag.kind == "host_cpu_others"
    assert flag.message == ("other processes used 0.98 CPU cores on average (2 cores; the job "
                            "1.00): python (pid 4242) 0.95")
    assert flag.evidence["other_cores"] == 0.98 and flag.evidence["threshold_cores"] == 0.5
    assert flag.host == "node-a"


def test_the_cpu_threshold_grows_with_the_machine() -> None:
    # Half a core, or 5% of the cores when that is more: 3.2 on 64 cores.
    assert host_flags(host(cpu_count=64, other_cores=2.0)) == []
    assert kinds(host_flags(host(cpu_count=64, other_cores=3.5))) == ["host_cpu_others"]
    assert host_flags(host(other_cores=0.49)) == []
    assert kinds(host_flags(host(other_cores=0.5))) == ["host_cpu_others"]


def test_steal_is_flagged_from_five_percent() -> None:
    assert host_flags(host(steal_fraction=0.02)) == []
    [flag] = host_flags(host(steal_fraction=0.075))
    assert flag.kind == "host_steal" and flag.message.startswith("steal 7.5% of CPU time")


def test_cpu_frequency_is_flagged_only_when_the_fastest_core_is_well_down() -> None:
    loaded = {"fastest_mhz_median": 2800.0, "max_mhz": 3700.0, "ratio_median": 0.757,
              "ratio_min": 0.7}
    assert host_flags(host(cpu_freq=loaded)) == []  # an all-core turbo
    slow = {"fastest_mhz_median": 1200.0, "max_mhz": 3500.0, "ratio_median": 0.343,
            "ratio_min": 0.3}
    [flag] = host_flags(host(cpu_freq=slow))
    assert flag.kind == "host_cpu_frequency"
    assert "1200 of 3500 MHz (34%)" in flag.message


def test_a_run_too_short_to_average_is_never_flagged() -> None:
    assert host_flags(host(seconds=1.0, other_cores=1.9)) == []
    assert host_flags(host(seconds=None, other_cores=None)) == []


# -- GPU decisions -------------------------------------------------------------------


def test_a_lowered_power_limit_that_caps_the_clocks_is_flagged() -> None:
    [flag] = gpu_flags(gpu(reasons={"sw_power_cap": 0.34}, sm_clock_median=1410,
                           power_limit_w=400.0), "GPU 0", index=0)
    assert flag.kind == "gpu_power_limited"
    assert flag.message == ("GPU 0 power limit lowered to 400 W of its default 700 W; "
                            "power-capped in 34% of busy samples; SM clock median 1410 "
                            "of 1980 MHz")
    assert flag.gpu == 0 and flag.evidence["power_limit_w"] == 400.0


def test_a_gpu_at_its_own_power_limit_is_normal() -> None:
    # Measured on an H100 SXM running a bf16 GPT alone: power-capped in 92%
    # of busy samples at a median SM clock of 1425 of 1980 MHz, with the
    # default power limit. That is the hardware at full load, no disturbance.
    h100 = gpu(reasons={"sw_power_cap": 0.92}, sm_clock_min=1380, sm_clock_median=1425)
    assert gpu_flags(h100, "GPU 0") == []
    # A lowered limit the run never ran into changes nothing either.
    assert gpu_flags(gpu(reasons={"sw_power_cap": 0.1}, power_limit_w=400.0), "GPU 0") == []
    # Nor does a driver that cannot tell the limits.
    assert gpu_flags(gpu(reasons={"sw_power_cap": 0.9}, sm_clock_median=1400,
                         power_limit_w=None, power_default_limit_w=None), "GPU 0") == []
    assert gpu_flags(gpu(reasons={"gpu_idle": 1.0}), "GPU 0") == []  # idle is no disturbance


def test_a_pinned_applications_clock_that_holds_the_clocks_down_is_flagged() -> None:
    [flag] = gpu_flags(gpu(reasons={"applications_clocks_setting": 0.6},
                           sm_clock_median=1200), "GPU 1", index=1)
    assert flag.kind == "gpu_clocks_held"
    assert "held by its applications clocks setting in 60%" in flag.message
    assert gpu_flags(gpu(reasons={"applications_clocks_setting": 0.6},
                         sm_clock_median=1900), "GPU 1") == []


def test_heat_and_hardware_slowdowns_are_flagged_from_five_percent() -> None:
    [flag] = gpu_flags(gpu(reasons={"hw_thermal_slowdown": 0.1, "sw_power_cap": 0.5}),
                       "GPU 1")
    assert flag.kind == "gpu_throttled"
    assert flag.message.startswith("GPU 1 thermally throttled (hardware) in 10% of busy")
    assert gpu_flags(gpu(reasons={"hw_slowdown": 0.02}), "GPU 1") == []
    [brake] = gpu_flags(gpu(reasons={"hw_power_brake_slowdown": 0.5}), "GPU 1")
    assert "power-braked in 50%" in brake.message


def test_too_few_busy_samples_say_nothing_about_clocks() -> None:
    ev = gpu(busy_samples=2, reasons_samples=2, reasons={"hw_thermal_slowdown": 1.0})
    assert gpu_flags(ev, "GPU 0") == []


def test_another_process_on_the_gpu_is_flagged_a_display_server_is_not() -> None:
    other = {"pid": 777, "name": "python", "kind": "compute", "used_memory_max": 10 * GiB,
             "samples": 12}
    xorg = {"pid": 900, "name": "Xorg", "kind": "graphics", "used_memory_max": 40 << 20,
            "samples": 20}
    [flag] = gpu_flags(gpu(other_processes=[other, xorg]), "GPU 0")
    assert flag.kind == "gpu_other_processes"
    assert flag.message == "GPU 0 shared with 1 other process: python (pid 777, 10.0 GiB)"
    blip = dict(other, samples=1)  # seen once in 20 samples: a passing nvidia-smi
    assert gpu_flags(gpu(other_processes=[blip, xorg]), "GPU 0") == []
    big = dict(xorg, used_memory_max=2 * GiB)
    assert kinds(gpu_flags(gpu(other_processes=[big]), "GPU 0")) == ["gpu_other_processes"]


def test_new_ecc_and_xid_errors_are_flagged() -> None:
    flags = gpu_flags(gpu(ecc_uncorrected_new=2, xid_errors=[79, 79]), "GPU 3")
    assert [f.message for f in flags] == [
        "GPU 3: 2 new uncorrected ECC errors during the run",
        "GPU 3: XID errors during the run (79)",
    ]
    assert gpu_flags(gpu(ecc_uncorrected_new=None, xid_available=False), "GPU 3") == []


# -- a whole run ---------------------------------------------------------------------


def device(*evidence: dict[str, Any]) -> dict[str, Any]:
    return {"samples": 3, "gpus": [
        {"index": i, "name": "H100", "uuid": f"GPU-{i}", "evidence": ev}
        for i, ev in enumerate(evidence)
    ]}


def test_a_gpu_seen_by_every_rank_of_a_host_is_flagged_once() -> None:
    hot = gpu(reasons={"hw_thermal_slowdown": 0.5})
    ranks = [make_rank(rank=r, world_size=2, device=device(gpu(), hot)).data for r in (0, 1)]
    flags = run_flags({}, ranks)
    assert [(f.kind, f.gpu) for f in flags] == [("gpu_throttled", 1)]


def test_each_node_of_a_job_speaks_for_its_own_host() -> None:
    meta = {"nodes": {"0": {"host_load": host(host="node-a")},
                      "1": {"host_load": host(host="node-b", other_cores=1.2)}}}
    [flag] = run_flags(meta, [])
    assert flag.host == "node-b" and flag.message.startswith("node-b: other processes used")
    check(meta, RUN_META)


def test_older_results_without_evidence_are_not_flagged() -> None:
    run = make_run([make_rank(make_rows([{"forward": 0.001}] * 5))], meta={"launcher": "python"})
    assert flags_of(run) == []
    assert build_report(run).to_dict()["disturbed"] == []


def test_a_flagged_run_says_so_at_the_top_of_every_report() -> None:
    rows = make_rows([{"forward": 3 / 1024, "backward": 5 / 1024}] * 30)
    run = make_run([make_rank(rows)], meta={"host_load": host(other_cores=0.98)})
    report = build_report(run)
    doc = report.to_dict()
    assert [d["kind"] for d in doc["disturbed"]] == ["host_cpu_others"]
    assert doc["disturbed"][0]["evidence"]["other_cores"] == 0.98
    text = render_markdown(report)
    assert text.index("Measurement disturbed") < text.index("Perf Summary")
    assert "- other processes used 0.98 CPU cores on average (2 cores" in text

    import io

    from perfrun.report import render

    out = io.StringIO()
    render(report, "table", out, width=120)
    table = out.getvalue()
    assert table.index("Measurement disturbed") < table.index("Perf Summary")
    from perfrun.report.html import render_html

    page = render_html(report)
    assert page.index("Measurement disturbed") < page.index("Perf Summary")


# -- the gate ------------------------------------------------------------------------

BASE = [0.010 + 0.0001 * (i % 7) for i in range(60)]
SLOW = [1.3 * t for t in BASE]


def test_a_disturbed_run_never_gives_a_regression() -> None:
    fail = gate(BASE, SLOW, 0.05)
    assert fail.verdict == Verdict.FAIL
    msg = "other processes used 0.98 CPU cores on average (2 cores)"
    result = disturbed_verdict(fail, current=[msg])
    assert result.verdict == Verdict.INCONCLUSIVE and result.undisturbed == Verdict.FAIL
    assert result.disturbed == (f"current run: {msg}",)
    assert msg in result.reason and "step times alone gave FAIL" in result.reason
    assert result.ratio == fail.ratio  # the figures stay
    doc = result.to_dict()
    assert doc["verdict"] == "inconclusive" and doc["undisturbed_verdict"] == "fail"
    # A disturbed baseline can hide a regression: a pass is not trusted either.
    passed = disturbed_verdict(gate(BASE, BASE, 0.05), baseline=["GPU 0: XID errors"])
    assert passed.verdict == Verdict.INCONCLUSIVE and passed.undisturbed == Verdict.PASS
    assert passed.disturbed == ("baseline: GPU 0: XID errors",)


def test_no_flags_or_nothing_to_decide_leave_the_verdict_alone() -> None:
    fail = gate(BASE, SLOW, 0.05)
    assert disturbed_verdict(fail) is fail
    few = gate(BASE[:5], SLOW, 0.05)  # too few steps: a missing measurement
    assert disturbed_verdict(few, current=["steal 9.0% of CPU time"]) is few


def write_run(folder: Path, rows_ms: float, meta: Optional[dict[str, Any]] = None) -> str:
    rows = make_rows([{"forward": rows_ms / 1024, "backward": 5 / 1024, "samples": 8}] * 40)
    doc = dict(make_rank(rows).data)
    doc.update({"perfrun": "0.1.0", "started_unix": 1.0, "elapsed": 1.0,
                "steps": {"columns": [], "rows": rows}})
    from perfrun.store.stepfile import STEP_COLUMNS

    doc["steps"]["columns"] = list(STEP_COLUMNS)
    folder.mkdir(parents=True)
    (folder / "rank0.json").write_text(json.dumps(doc), encoding="utf-8")
    run_meta = {"expected_ranks": 1, "launcher": "python", "started": 1.0, "returncode": 0,
                **(meta or {})}
    (folder / "run.json").write_text(json.dumps(run_meta), encoding="utf-8")
    return str(folder)


def gated(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["compare", *argv, "--max-regression", "5%"])
    return int(code), capsys.readouterr().err


def test_the_gate_on_a_disturbed_run_exits_0_or_73_never_68(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_run(tmp_path / "base", 3)
    busy = {"host_load": host(other_cores=0.98)}
    current = write_run(tmp_path / "current", 9, busy)  # slower, and disturbed
    code, err = gated([base, current], capsys)
    assert code == ExitCode.OK, err
    assert "gate inconclusive: the measurement was disturbed (the step times alone gave " \
           "FAIL)" in err
    assert "current run: other processes used 0.98 CPU cores" in err
    code, err = gated([base, current, "--fail-on-inconclusive"], capsys)
    assert code == ExitCode.DISTURBED == 73, err
    # A user who knows the machine is shared gets the step times' verdict.
    code, err = gated([base, current, "--ignore-disturbed"], capsys)
    assert code == ExitCode.REGRESSION, err
    # The baseline's disturbance counts too, and is recorded when saved.
    from perfrun.api import save_baseline
    from perfrun.store.baseline import stored_disturbed

    saved = str(tmp_path / "busy-base.json")
    save_baseline(write_run(tmp_path / "busy-base", 3, busy), saved)
    assert stored_disturbed(saved) == [
        "other processes used 0.98 CPU cores on average (2 cores; the job 1.00)"]
    quiet = write_run(tmp_path / "quiet", 9)
    code, err = gated([saved, quiet, "--fail-on-inconclusive"], capsys)
    assert code == ExitCode.DISTURBED, err
    assert "baseline: other processes used 0.98 CPU cores" in err


def test_the_json_comparison_names_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_run(tmp_path / "base", 3)
    current = write_run(tmp_path / "current", 9, {"host_load": host(steal_fraction=0.2)})
    capsys.readouterr()
    code = cli.main(["compare", base, current, "--max-regression", "5%", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK
    assert doc["gate"]["verdict"] == "inconclusive"
    assert doc["gate"]["undisturbed_verdict"] == "fail"
    assert doc["gate"]["disturbed"] == ["current run: steal 20.0% of CPU time (the hypervisor "
                                        "ran other machines on these CPUs)"]
    assert [f["kind"] for f in doc["disturbed"]["current"]] == ["host_steal"]
    assert doc["disturbed"]["baseline"] == [] and doc["disturbed"]["ignored"] is False


# -- real runs -----------------------------------------------------------------------

SPIN = "import time\nend = time.time() + 120\nwhile time.time() < end: pass\n"
STEPS = "400"


def perfrun(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfrun", *args], cwd=cwd, env=e2e_environment(),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=E2E_TIMEOUT,
    )


class Busy:
    """Processes that spin beside a run: one per core, so that on this
    2-core machine at least a core's worth goes to them whatever else runs."""

    def __enter__(self) -> Busy:
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN])
                      for _ in range(os.cpu_count() or 2)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def wait_for_quiet(timeout: float = 30.0) -> None:
    """Wait (a while) for the machine's other work to pause: under a
    quarter of its CPU busy over a second."""
    import time

    import psutil

    deadline = time.monotonic() + timeout
    while psutil.cpu_percent(interval=1.0) > 25 and time.monotonic() < deadline:
        pass


def _false_alarm_script() -> Any:
    """scripts/host_load_false_alarm.py, imported for its independent
    measurement of the other processes' CPU (psutil alone)."""
    path = Path(__file__).parent.parent / "scripts" / "host_load_false_alarm.py"
    return import_file(path, "perfrun_host_load_false_alarm")


FALSE_ALARM = _false_alarm_script()


def evidence(log_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's host-load evidence and its JSON report."""
    latest = log_dir / "latest"
    meta = json.loads((latest / "run.json").read_text(encoding="utf-8"))
    report = perfrun(log_dir.parent, "report", str(latest), "--format", "json")
    assert report.returncode == 0, report.stderr
    return meta["host_load"], json.loads(report.stdout)


@pytest.mark.slow
def test_a_run_beside_busy_processes_is_flagged_and_a_quiet_one_is_not(tmp_path: Path) -> None:
    with Busy() as busy:
        done = perfrun(tmp_path, "-q", "--log-dir", "busy", str(SCRIPT), "--steps", STEPS)
        assert done.returncode == 0, done.stderr
        spinners = {p.pid for p in busy.procs}
    ev, doc = evidence(tmp_path / "busy")
    assert "host_cpu_others" in [f["kind"] for f in doc["disturbed"]], ev
    assert ev["other_cores"] >= 0.5, ev
    assert spinners & {t["pid"] for t in ev["top_others"]}, ev  # named as the evidence
    assert "Measurement disturbed" in done.stdout
    assert done.stdout.index("Measurement disturbed") < done.stdout.index("Perf Summary")

    # Quiet: this machine is shared with other work (in CI, the suite's
    # other worker), which the flag rightly sees. So each try also measures
    # the other processes itself, apart from perfrun's code, and the run
    # must agree with that: the same figure, no flag where it is low, a flag
    # where it is high. A few tries, each at a quiet moment where there is
    # one, look for a quiet run.
    tries = []
    for k in range(3):
        wait_for_quiet()
        with FALSE_ALARM.Background() as measured:
            done = perfrun(tmp_path, "-q", "--log-dir", f"quiet{k}", str(SCRIPT),
                           "--steps", STEPS)
        assert done.returncode == 0, done.stderr
        ev, doc = evidence(tmp_path / f"quiet{k}")
        # The job's own CPU is the job's, never "other" (however little of
        # the machine it got while the rest of the suite ran beside it).
        assert ev["job_cores"] > 0.1, ev
        others = measured.cores()
        flagged = "host_cpu_others" in [f["kind"] for f in doc["disturbed"]]
        tries.append((round(others, 2), ev["other_cores"], flagged))
        # The two windows differ by perfrun's start-up (about a second of a
        # few-second run) while the other work comes and goes: hence the
        # margins around the 0.5-core threshold.
        assert abs(ev["other_cores"] - others) < 0.4, tries
        if others < 0.15:
            assert not flagged and "Measurement disturbed" not in done.stdout, tries
            return
        if others > 0.95:
            assert flagged, tries
    print(f"no quiet moment: other processes' cores (independent, perfrun's, flagged): {tries}")


@pytest.mark.slow
def test_a_disturbed_slower_run_is_inconclusive_never_a_regression(tmp_path: Path) -> None:
    done = perfrun(tmp_path, "-q", "--log-dir", "base", "--timer-only", "--save-baseline",
                   "base.json", str(SCRIPT), "--steps", "150")
    assert done.returncode == 0, done.stderr
    with Busy():
        done = perfrun(tmp_path, "-q", "--log-dir", "cur", "--timer-only", "--baseline",
                       "base.json", "--max-regression", "5%", "--fail-on-inconclusive", str(SCRIPT),
                       "--steps", "150", "--slow-ms", "20")
    assert done.returncode == ExitCode.DISTURBED, done.stdout + done.stderr
    assert "the measurement was disturbed" in done.stderr
    assert "current run: other processes used" in done.stderr
    assert "INCONCLUSIVE" in done.stdout
    # Judged on its step times alone, it is the regression it was made to be
    # (20 ms added to steps of a few: slower beyond any noise of this machine).
    cur = str(tmp_path / "cur" / "latest")
    judged = perfrun(tmp_path, "compare", "base.json", cur, "--max-regression", "5%",
                     "--ignore-disturbed")
    assert judged.returncode == ExitCode.REGRESSION, judged.stdout + judged.stderr
    again = perfrun(tmp_path, "compare", "base.json", cur, "--max-regression", "5%")
    assert again.returncode == ExitCode.OK, again.stdout + again.stderr
