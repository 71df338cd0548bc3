"""GPU state from NVML: the GPUs this process sees, in CUDA's numbering, each
reading sampled on its own.

pynvml cannot reach a driver on this machine, so `FakeNvml` stands in for the
module: a machine of GPUs, each with a UUID, a PCI bus id, a name and
readings that may be unsupported (utilisation on a MIG instance) or whose
handle may fail. NVML's index order is deliberately not PCI order here, as
NVML does not promise it. The real NVML is checked on a GPU by the project's
GPU check.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

from perfrun.runtime.device import DeviceSampler, parse_visible

GiB = 1 << 30


class NVMLError(Exception):
    pass


class FakeGpu:
    def __init__(self, uuid: str, bus: str, name: str = "H100", util: Optional[int] = 50,
                 used: int = GiB, broken: bool = False) -> None:
        self.uuid, self.bus, self.name = uuid, bus, name
        self.util, self.used, self.broken = util, used, broken
        self.util_calls = 0


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
