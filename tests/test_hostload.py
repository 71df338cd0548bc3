"""The launcher's host-load sampler (perfrun/launcher/hostload.py): its pure parts on
hand-written readings, then the sampler itself on real processes and the
real /proc of this machine."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from perfrun.launcher.hostload import (
    HostLoadSampler,
    Reading,
    accumulate_others,
    descendants,
    fastest_core,
    machine_times,
    parse_proc_stat,
    summarise,
    top_others,
)
from perfrun.store.runmeta import HOST_LOAD
from perfrun.store.schema import check

# -- pure ----------------------------------------------------------------------------


def test_parse_proc_stat_takes_fields_after_the_last_parenthesis() -> None:
    # A name with spaces and parentheses, as a process may call itself.
    fields = ["S", "41"] + ["0"] * 9 + ["250", "50", "7", "3"] + ["0"] * 30
    text = "1234 (my (odd) name) " + " ".join(fields)
    assert parse_proc_stat(text) == ("my (odd) name", 41, 300, 10)
    assert parse_proc_stat("garbage") is None
    assert parse_proc_stat("1 (x) S 0") is None


def test_descendants_are_the_whole_tree_below_the_root() -> None:
    parents = {10: 1, 11: 10, 12: 11, 13: 11, 20: 1, 21: 20, 14: 13}
    assert descendants(parents, 10) == {11, 12, 13, 14}
    assert descendants(parents, 20) == {21}
    assert descendants(parents, 99) == set()
    assert descendants({5: 5}, 5) == set()  # a loop never hangs


def test_machine_times_leave_interrupts_out_of_busy() -> None:
    fields = {"user": 10.0, "nice": 1.0, "system": 4.0, "idle": 80.0, "iowait": 1.0,
              "irq": 2.0, "softirq": 1.0, "steal": 1.0, "guest": 3.0}
    busy, total, steal = machine_times(fields)
    assert (busy, total, steal) == (15.0, 100.0, 1.0)  # guest is inside user


def test_the_fastest_core_decides_and_an_unknown_maximum_is_none() -> None:
    # Idle cores clock down: only the fastest counts.
    assert fastest_core([(800, 3500), (3400, 3500), (1200, 3500)]) == (3400, 3500)
    assert fastest_core([(2445, 0.0), (2445, 0.0)]) == (2445, None)  # a VM
    assert fastest_core([]) == (None, None)


def readings(busy: list[float], job: list[float], launcher: float = 0.0,
             steal: float = 0.0, total: float = 2.0) -> list[Reading]:
    """One reading a second; cumulative CPU seconds."""
    return [
        Reading(t=float(i), busy=b, total=total * i, steal=steal * i, job=j,
                launcher=launcher * i)
        for i, (b, j) in enumerate(zip(busy, job))
    ]


def test_other_processes_are_machine_busy_less_the_job_and_the_launcher() -> None:
    # 2 cores; the machine busy 1.9 cores a second, the job 0.9, perfrun 0.01.
    rs = readings([1.9 * i for i in range(11)], [0.9 * i for i in range(11)], launcher=0.01,
                  steal=0.1)
    ev = summarise(rs, 2, host="h")
    assert ev["seconds"] == 10.0 and ev["samples"] == 11
    assert ev["machine_busy_cores"] == pytest.approx(1.9)
    assert ev["job_cores"] == pytest.approx(0.9)
    assert ev["other_cores"] == pytest.approx(0.99)
    assert ev["other_cores_max"] == pytest.approx(0.99)
    assert ev["steal_fraction"] == pytest.approx(0.05)
    check(ev, HOST_LOAD)


def test_a_run_shorter_than_one_interval_says_so() -> None:
    ev = summarise(readings([0.0], [0.0]), 2)
    assert ev["other_cores"] is None
    assert any("too few samples" in u for u in ev["unavailable"])
    check(ev, HOST_LOAD)


def test_frequency_ratio_is_the_median_sample() -> None:
    rs = readings([0.0, 1.0, 2.0], [0.0, 1.0, 2.0])
    for r, top in zip(rs, (1000.0, 1800.0, 3400.0)):
        r.freq_top, r.freq_max = top, 3500.0
    ev = summarise(rs, 2)
    assert ev["cpu_freq"]["fastest_mhz_median"] == 1800.0
    assert ev["cpu_freq"]["ratio_median"] == pytest.approx(1800 / 3500)
    assert ev["cpu_freq"]["ratio_min"] == pytest.approx(1000 / 3500)


def test_other_processes_are_named_by_what_they_took_during_the_run() -> None:
    used: dict[int, tuple[str, float]] = {}
    start = {1: ("init", 5.0), 7: ("spin", 100.0)}
    accumulate_others(used, start, {1: ("init", 5.0), 7: ("spin", 104.0)})
    accumulate_others(used, start, {1: ("init", 5.1), 7: ("spin", 108.0), 9: ("new", 2.0)})
    # 7 ended before the last reading: it keeps what it had.
    accumulate_others(used, start, {1: ("init", 5.1), 9: ("new", 3.0)})
    top = top_others(used, 10.0)
    assert [(t["pid"], t["name"]) for t in top] == [(7, "spin"), (9, "new"), (1, "init")]
    assert top[0]["cores"] == pytest.approx(0.8)
    assert top[1]["cores"] == pytest.approx(0.3)  # started during the run: all of it


# -- the sampler on real processes ---------------------------------------------------

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"
linux = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")


def spin(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)])


@pytest.mark.slow
@linux
@pytest.mark.timing
def test_the_job_is_the_roots_process_tree() -> None:
    # The sampler's root is this process: a busy child is the job's, not
    # another process's, and perfrun's own sampling is its launcher time.
    sampler = HostLoadSampler(interval=0.25)
    sampler.start()
    child = spin(1.5)
    child.wait()
    ev = sampler.stop()
    check(ev, HOST_LOAD)
    assert ev["samples"] >= 4
    assert ev["job_cores"] > 0.1, ev  # the spinner, on a possibly busy machine
    assert child.pid not in [t["pid"] for t in ev["top_others"]], ev
    cost = ev["sample_cost"]
    assert cost["samples"] == ev["samples"] and cost["cpu_seconds_avg"] < 0.05, cost


@pytest.mark.slow
@linux
@pytest.mark.timing
def test_a_busy_process_outside_the_tree_is_another_process() -> None:
    # Root the sampler at a sleeping child: the spinner (this process's
    # other child) is then outside the job.
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    time.sleep(0.5)  # its own start-up is done before the sampling starts
    try:
        # Every other process listed, not the 5 busiest: on a machine busy
        # with other tests, five of theirs may outrank the spinner.
        sampler = HostLoadSampler(root=root.pid, interval=0.25, top=1000)
        sampler.start()
        child = spin(1.5)
        child.wait()
        ev = sampler.stop()
    finally:
        root.kill()
        root.wait()
    # A spinner gets what this shared machine leaves it: at least a little.
    assert ev["job_cores"] == pytest.approx(0.0, abs=0.05), ev
    assert ev["other_cores"] > 0.1, ev
    mine = [t for t in ev["top_others"] if t["pid"] == child.pid]
    assert mine and mine[0]["cores"] > 0.1, ev


def test_a_reading_that_fails_is_recorded_never_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = HostLoadSampler(interval=0.05)

    def broken() -> None:
        raise RuntimeError("no /proc here")

    monkeypatch.setattr(sampler, "_read", broken)
    sampler.start()
    time.sleep(0.2)
    ev = sampler.stop()
    assert ev["samples"] == 0 and ev["other_cores"] is None
    assert any("no /proc here" in u for u in ev["unavailable"])


def test_a_run_that_ends_before_the_first_reading_is_not_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A script of a few tens of milliseconds ends while the sampler's thread
    # still imports psutil: the launcher does not wait for the import and a
    # reading that nothing could be compared with.
    sampler = HostLoadSampler(interval=0.05)
    release = threading.Event()
    importing = sampler._import

    def slow_import() -> None:
        release.wait(10)
        importing()

    monkeypatch.setattr(sampler, "_import", slow_import)
    sampler.start()
    began = time.monotonic()
    ev = sampler.stop()
    took = time.monotonic() - began
    release.set()
    assert took < 5, took  # not the join's 5 s, nor the import
    assert ev["samples"] == 0 and ev["other_cores"] is None
    assert any("too few samples" in u for u in ev["unavailable"]), ev
