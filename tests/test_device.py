"""GPU state from NVML: the GPUs this process sees, in CUDA's numbering, each
reading sampled on its own.

pynvml cannot reach a driver on this machine, so `FakeNvml` stands in for the
module: a machine of GPUs, each with a UUID, a PCI bus id, a name and
readings that may be unsupported (utilisation on a MIG instance) or whose
handle may fail. NVML's index order is deliberately not PCI order here, as
NVML does not promise it. The same stand-in answers the calls that gather
the evidence of a disturbed measurement (clock event reasons, SM clocks,
processes on the GPU, ECC counts, XID events), each of which can be made
unsupported. The real NVML is checked on a GPU by the project's GPU check
(tests/gpu/test_gpu.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import pytest

from perfrun.runtime.device import DeviceSampler, parse_visible

GiB = 1 << 30


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801 - pynvml's own name
    pass


class FakeGpu:
    def __init__(self, uuid: str, bus: str, name: str = "H100", util: Optional[int] = 50,
                 used: int = GiB, broken: bool = False) -> None:
        self.uuid, self.bus, self.name = uuid, bus, name
        self.util, self.used, self.broken = util, used, broken
        self.util_calls = 0
        # Disturbance evidence: a clock event reasons mask, SM clocks (MHz),
        # processes (pid, used bytes) by kind, the volatile uncorrected ECC
        # count, and readings made unsupported by name.
        self.reasons = 0
        self.sm, self.sm_max = 1980, 1980
        self.compute: list[tuple[int, Optional[int]]] = []
        self.graphics: list[tuple[int, Optional[int]]] = []
        self.ecc = 0
        self.power_limit, self.power_default = 700_000, 700_000  # mW
        self.unsupported: set[str] = set()

    def check(self, reading: str) -> None:
        if reading in self.unsupported:
            raise NVMLError("Not Supported")


class FakeNvml:
    """The pynvml calls DeviceSampler makes, over a list of FakeGpu in NVML
    index order, plus MIG instances reachable by UUID only."""

    def __init__(self, gpus: list[FakeGpu], mig: Optional[list[FakeGpu]] = None) -> None:
        self.gpus = gpus
        self.mig = mig or []

    def nvmlInit(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        gpu = self.gpus[i]
        if gpu.broken:
            raise NVMLError("Unknown Error")
        return gpu

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        for gpu in self.gpus + self.mig:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError("Not Found")

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(busId=h.bus.encode())

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(total=80 * GiB, used=h.used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        h.util_calls += 1
        if h.util is None:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=h.util)

    # -- disturbance evidence -------------------------------------------------------

    #: Drivers before 535 know only the older name of the reasons call.
    events_name = True
    xid_supported = True
    pending_xids: list[tuple[FakeGpu, int]]

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksEventReasons" and self.events_name:
            return self._reasons
        raise AttributeError(name)

    def _reasons(self, h: FakeGpu) -> int:
        h.check("reasons")
        return h.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return self._reasons(h)

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        assert clock == 1  # NVML_CLOCK_SM
        h.check("clock")
        return h.sm

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, clock: int) -> int:
        assert clock == 1
        h.check("clock")
        return h.sm_max

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        h.check("power")
        return h.power_limit

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: FakeGpu) -> int:
        h.check("power")
        return h.power_default

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        h.check("processes")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        h.check("processes")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.graphics]

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)  # uncorrected, volatile
        h.check("ecc")
        return h.ecc

    def nvmlEventSetCreate(self) -> str:
        self.pending_xids = []
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, kind: int, events: str) -> None:
        assert kind == 0x8  # critical XID errors
        if not self.xid_supported:
            raise NVMLError("Not Supported")

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0  # polled, never waited on
        if not self.pending_xids:
            raise NVMLError_Timeout("Timeout")
        gpu, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=gpu, eventData=xid, eventType=0x8)


def machine() -> list[FakeGpu]:
    # NVML index order 0..3; PCI order is B, D, A, C.
    return [
        FakeGpu("GPU-aaaa1111", "00000000:C1:00.0", util=10),
        FakeGpu("GPU-bbbb2222", "00000000:1B:00.0", util=20),
        FakeGpu("GPU-cccc3333", "00000000:E1:00.0", util=30),
        FakeGpu("GPU-dddd4444", "00000000:41:00.0", util=40),
    ]


def sampler(nvml: FakeNvml, **env: str) -> tuple[DeviceSampler, list[str]]:
    notes: list[str] = []
    s = DeviceSampler(notes, env=env, nvml=nvml)
    s.sample()
    s.sample()
    return s, notes


def by_index(s: DeviceSampler) -> dict[int, dict[str, Any]]:
    return {g["index"]: g for g in s.summary()["gpus"]}


def test_parse_visible_reads_as_cuda_does() -> None:
    assert parse_visible(None) is None
    assert parse_visible("") == []
    assert parse_visible("2,0") == ["2", "0"]
    assert parse_visible("0,-1,1") == ["0"]  # CUDA stops at an invalid entry
    assert parse_visible("GPU-ab,MIG-cd") == ["GPU-ab", "MIG-cd"]


def test_indices_are_cuda_indices_in_pci_order() -> None:
    s, notes = sampler(FakeNvml(machine()), CUDA_VISIBLE_DEVICES="2,0",
                       CUDA_DEVICE_ORDER="PCI_BUS_ID")
    gpus = by_index(s)
    # CUDA's 2 is the third by bus id (A), its 0 the first (B).
    assert gpus[0]["uuid"] == "GPU-aaaa1111" and gpus[0]["util_avg"] == 10
    assert gpus[1]["uuid"] == "GPU-bbbb2222" and gpus[1]["util_avg"] == 20
    assert len(gpus) == 2  # only what this process sees
    assert s.summary()["gpu_mapping"]["exact"] is True


def test_default_order_with_identical_gpus_is_pci_order() -> None:
    s, notes = sampler(FakeNvml(machine()))
    assert [g["uuid"] for g in s.summary()["gpus"]] == [
        "GPU-bbbb2222", "GPU-dddd4444", "GPU-aaaa1111", "GPU-cccc3333"]
    assert s.summary()["gpu_mapping"]["exact"] is True
    assert not any("guess" in n for n in notes)


def test_default_order_with_mixed_gpus_says_it_guesses() -> None:
    gpus = machine()
    gpus[0].name = "A100"
    s, notes = sampler(FakeNvml(gpus), CUDA_VISIBLE_DEVICES="0")
    mapping = s.summary()["gpu_mapping"]
    assert mapping["exact"] is False and "guess" in mapping["rule"]
    assert any("guess" in n for n in notes)


def test_uuids_in_cuda_visible_devices_are_exact() -> None:
    s, _ = sampler(FakeNvml(machine()), CUDA_VISIBLE_DEVICES="GPU-cccc,GPU-aaaa1111")
    gpus = by_index(s)
    assert gpus[0]["uuid"] == "GPU-cccc3333"  # a unique prefix, as CUDA accepts
    assert gpus[1]["uuid"] == "GPU-aaaa1111"
    assert s.summary()["gpu_mapping"]["exact"] is True


def test_cuda_uuids_replace_the_guess() -> None:
    gpus = machine()
    gpus[0].name = "A100"
    s, _ = sampler(FakeNvml(gpus))
    # torch's uuid of cuda:0 and cuda:1, without the "GPU-" prefix.
    s.use_cuda_uuids(["dddd4444", "aaaa1111"])
    s.sample()
    out = s.summary()
    assert [g["uuid"] for g in out["gpus"]] == ["GPU-dddd4444", "GPU-aaaa1111"]
    assert out["gpu_mapping"] == {"rule": "uuid (CUDA)", "exact": True,
                                  "cuda_visible_devices": None}


def test_mig_memory_is_sampled_without_utilisation() -> None:
    mig = FakeGpu("MIG-eeee5555", "00000000:C1:00.0", name="H100 MIG 1g.10gb",
                  util=None, used=3 * GiB)
    nvml = FakeNvml(machine(), mig=[mig])
    s, _ = sampler(nvml, CUDA_VISIBLE_DEVICES="MIG-eeee5555")
    s.sample()
    (g,) = s.summary()["gpus"]
    assert g["index"] == 0 and g["name"] == "H100 MIG 1g.10gb"
    assert g["util_avg"] is None and g["mem_used_max"] == 3 * GiB
    assert g["unsupported"] == ["util"]
    assert mig.util_calls == 1  # unsupported once: not asked again


def test_one_failing_gpu_drops_only_itself() -> None:
    gpus = machine()
    gpus[1].broken = True  # NVML index 1, the first by bus id
    s, notes = sampler(FakeNvml(gpus))
    assert s.has_nvml
    out = s.summary()["gpus"]
    assert [g["uuid"] for g in out] == ["GPU-dddd4444", "GPU-aaaa1111", "GPU-cccc3333"]
    assert all(g["util_avg"] is not None for g in out)
    assert any("NVML device 1" in n for n in notes)


def test_no_driver_turns_gpu_state_off() -> None:
    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:
            raise NVMLError("Driver Not Loaded")

    s, notes = sampler(NoDriver([]))
    assert not s.has_nvml and s.summary()["gpus"] == []
    assert "gpu_mapping" not in s.summary()
    assert any("NVML unavailable (Driver Not Loaded)" in n for n in notes)


# -- evidence of a disturbed measurement --------------------------------------------


def one_gpu(**attrs: Any) -> tuple[FakeGpu, FakeNvml]:
    gpu = FakeGpu("GPU-aaaa1111", "00000000:C1:00.0", util=90)
    for key, value in attrs.items():
        setattr(gpu, key, value)
    return gpu, FakeNvml([gpu])


def evidence(nvml: FakeNvml, samples: int = 4, job_pid: Optional[int] = None,
             each: Any = None) -> dict[str, Any]:
    s = DeviceSampler([], env={}, nvml=nvml, job_pid=job_pid)
    for i in range(samples):
        if each is not None:
            each(i)
        s.sample()
    (g,) = s.summary()["gpus"]
    return g["evidence"]  # type: ignore[no-any-return]


def test_clock_reasons_are_decoded_and_counted_in_busy_samples_only() -> None:
    from perfrun.runtime.device import decode_reasons

    assert decode_reasons(0x1) == ["gpu_idle"]
    assert decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0x2 | 0x10 | 0x8 | 0x20 | 0x80 | 0x100) == [
        "applications_clocks_setting", "hw_slowdown", "sync_boost", "sw_thermal_slowdown",
        "hw_power_brake_slowdown", "display_clock_setting"]
    gpu, nvml = one_gpu(reasons=0x4, sm=1410)

    def phase(i: int) -> None:
        # Two idle samples (utilisation 0, clocks down, "idle"), then busy.
        gpu.util = 0 if i < 2 else 90
        gpu.reasons = 0x1 if i < 2 else (0x4 if i < 4 else 0)
        gpu.sm = 210 if i < 2 else (1410 if i < 4 else 1980)

    ev = evidence(nvml, samples=6, each=phase)
    assert ev["samples"] == 6 and ev["busy_samples"] == 4
    assert ev["reasons"] == {"sw_power_cap": 0.5}  # idle samples not counted
    assert ev["reasons_api"] == "nvmlDeviceGetCurrentClocksEventReasons"
    assert (ev["sm_clock_min"], ev["sm_clock_median"], ev["sm_clock_max"]) == (1410, 1410, 1980)
    assert (ev["power_limit_w"], ev["power_default_limit_w"]) == (700.0, 700.0)


def test_an_older_driver_answers_the_throttle_reasons_call() -> None:
    gpu, nvml = one_gpu(reasons=0x40)
    nvml.events_name = False
    ev = evidence(nvml)
    assert ev["reasons_api"] == "nvmlDeviceGetCurrentClocksThrottleReasons"
    assert ev["reasons"] == {"hw_thermal_slowdown": 1.0}


def test_a_gpu_whose_utilisation_is_unreadable_counts_every_sample_as_busy() -> None:
    gpu, nvml = one_gpu(util=None, reasons=0x20)
    ev = evidence(nvml, samples=3)
    assert ev["busy_samples"] == 3 and ev["busy_basis"].startswith("all samples")
    assert ev["reasons"] == {"sw_thermal_slowdown": 1.0}


@pytest.mark.slow  # two sleeping Python processes, one a child of the job, one not
def test_processes_of_the_job_are_not_others() -> None:
    import os
    import subprocess
    import sys

    # A real process tree: this test is the "launcher", a child of it a
    # rank of the same job; a process outside the tree is another job's.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        gpu, nvml = one_gpu(compute=[(os.getpid(), GiB), (child.pid, GiB),
                                     (outsider.pid, 3 * GiB), (999_999_999, None)],
                            graphics=[(outsider.pid, 100 << 20)])
        # The outsider is a child of this process too: call the child the
        # launcher instead, so that only the child (itself) is the job.
        ev = evidence(nvml, job_pid=child.pid)
    finally:
        child.kill()
        outsider.kill()
        child.wait()
        outsider.wait()
    assert ev["own_pid_seen"] is True
    others = {(p["pid"], p["kind"]): p for p in ev["other_processes"]}
    # This process's own PID was listed: one PID namespace, so the unknown
    # PID is another container's process and counts as another's. A process
    # listed as compute and graphics is one process, seen once a sample.
    assert set(others) == {(outsider.pid, "compute"), (999_999_999, "compute")}
    assert others[(outsider.pid, "compute")]["used_memory_max"] == 3 * GiB
    assert others[(outsider.pid, "compute")]["samples"] == 4
    assert ev["process_reads"] == 4
    assert others[(outsider.pid, "compute")]["name"].startswith("python")
    assert ev["unresolved_processes"] == []


def test_pids_of_another_namespace_are_not_held_against_the_run() -> None:
    # In a container NVML may list host PIDs only: not even this process's
    # own PID appears. Those PIDs are recorded, not counted as others.
    gpu, nvml = one_gpu(compute=[(999_999_998, GiB), (999_999_999, GiB)])
    ev = evidence(nvml)
    assert ev["own_pid_seen"] is False and ev["other_processes"] == []
    assert [p["pid"] for p in ev["unresolved_processes"]] == [999_999_998, 999_999_999]


def test_new_ecc_and_xid_errors_are_recorded() -> None:
    gpu, nvml = one_gpu(ecc=5)

    def later(i: int) -> None:
        if i == 2:
            gpu.ecc = 7
            nvml.pending_xids += [(gpu, 79), (gpu, 48)]

    ev = evidence(nvml, samples=4, each=later)
    assert ev["ecc_uncorrected_new"] == 2  # counted from the first sample
    assert ev["xid_available"] is True and ev["xid_errors"] == [79, 48]


def test_each_unsupported_reading_is_recorded_and_not_asked_again() -> None:
    gpu, nvml = one_gpu(unsupported={"reasons", "clock", "processes", "ecc"})
    nvml.xid_supported = False
    ev = evidence(nvml)
    assert set(ev["unavailable"]) == {"clock_reasons", "sm_max", "sm_clock", "compute_processes",
                                      "graphics_processes", "ecc", "xid"}
    assert ev["reasons"] == {} and ev["sm_clock_median"] is None
    assert ev["ecc_uncorrected_new"] is None and ev["xid_available"] is False
    # The evidence still validates as part of a rank file.
    from perfrun.store.rankfile import GPU_EVIDENCE
    from perfrun.store.schema import check

    check(ev, GPU_EVIDENCE)


def test_nvtx_is_imported_only_where_a_tool_could_listen(tmp_path, monkeypatch) -> None:
    # On a machine with no NVIDIA driver and no tool named in the
    # environment, nvtx's ranges are no-ops for the whole process: its
    # import would only cost the script's `import torch` 25 ms.
    from perfrun.runtime import device

    monkeypatch.setattr(device, "DRIVER_PATHS", (str(tmp_path / "driver"),))
    monkeypatch.setattr(device.sys, "platform", "linux")
    assert not device.nvtx_tool_possible({})
    assert not device.nvtx_tool_possible({"NVTX_INJECTION64_PATH": ""})
    # Nsight Systems names its library for the process it starts.
    assert device.nvtx_tool_possible({"NVTX_INJECTION64_PATH": "/opt/nsys/libToolsInjection64.so"})
    assert device.nvtx_tool_possible({"NVTX_INJECTION32_PATH": "/opt/nsys/lib32.so"})
    # A driver: newer NVTX finds a tool through it without the variable.
    (tmp_path / "driver").mkdir()
    assert device.nvtx_tool_possible({})
