"""CPU, memory and GPU state of the run, sampled from the flush thread.

GPU state comes from NVML, which knows nothing of the process: it numbers
every GPU of the machine in its own order. The GPUs sampled are the ones this
process can see, numbered as CUDA numbers them, so that "GPU 1" in the report
is `cuda:1` in the script:

* Once the script initialised CUDA, the agent hands over CUDA's own device
  UUIDs (`use_cuda_uuids`): the mapping is exact.
* Before that (CUDA is never initialised by perfrun itself),
  CUDA_VISIBLE_DEVICES is read as CUDA reads it: indices, `GPU-` UUIDs
  (unique prefixes allowed) or `MIG-` UUIDs, up to the first invalid entry.
  UUIDs are exact. Indices are CUDA's, in CUDA_DEVICE_ORDER: with
  PCI_BUS_ID they are the GPUs sorted by PCI bus id (exact; NVML's own index
  order is not guaranteed to be that). The default order, FASTEST_FIRST,
  puts faster GPUs first; for identical GPUs that is PCI order, but with
  mixed models it is a guess, and the summary says so (`gpu_mapping`).

Each reading (utilisation, memory) is tried on its own: on a MIG instance
utilisation is not supported, but memory is. A reading that fails once is
not tried again on that GPU, and a GPU whose handle cannot be had is dropped
alone, never NVML as a whole.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, Optional


def parse_visible(value: Optional[str]) -> Optional[list[str]]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU is
    visible); otherwise the entries before the first invalid one (CUDA
    ignores it and everything after it, so "0,-1,1" is GPU 0 alone)."""
    if value is None:
        return None
    out: list[str] = []
    for token in value.split(","):
        token = token.strip()
        if token.isdigit() or token.startswith(("GPU-", "MIG-")):
            if token not in out:
                out.append(token)
        else:
            break
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _norm_uuid(uuid: str) -> str:
    """`GPU-xxxx`, `MIG-xxxx` or torch's bare `xxxx`, compared alike."""
    u = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            return u[len(prefix):]
    return u


def _norm_bus(bus: Optional[str]) -> str:
    """A PCI bus id ("00000000:3B:00.0", domain:bus:device.function, or
    without the domain) as text that sorts in bus order; unknown ones last."""
    if not bus:
        return "~"
    parts = bus.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    return ":".join([parts[0].zfill(8), parts[1].zfill(2), *parts[2:]])


#: Where an NVIDIA driver shows itself on Linux: its /proc entry, or WSL's
#: GPU device (WSL has no /proc entry for the Windows driver it uses).
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/dxg")

#: NVML's own word for "this machine has no NVIDIA driver": no libnvidia-ml,
#: or no kernel module behind it.
_NO_DRIVER_ERRORS = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")


def _no_driver(exc: BaseException, probe_machine: bool) -> bool:
    """Whether NVML failed because the machine has no NVIDIA driver at all.

    That is every CPU-only machine: a note there would be printed on every
    run and say nothing. Where a driver is there but NVML cannot read it (no
    permission, a library and module of different versions), the GPU state
    is missing for a reason worth a note. `probe_machine`: whether to look at
    this machine too, which only makes sense when NVML is the real one.
    """
    try:
        import pynvml
    except Exception:
        pynvml = None
    kinds = tuple(
        kind for kind in (getattr(pynvml, name, None) for name in _NO_DRIVER_ERRORS)
        if isinstance(kind, type)
    )
    if kinds and isinstance(exc, kinds):
        return True
    if probe_machine and sys.platform.startswith("linux"):
        return not any(os.path.exists(path) for path in DRIVER_PATHS)
    return False


class DeviceSampler:
    def __init__(
        self,
        notes: list[str],
        env: Optional[Mapping[str, str]] = None,
        nvml: Any = None,
    ) -> None:
        self.notes = notes
        self.samples = 0
        self.proc_cpu = [0.0, 0.0]  # sum, max
        self.sys_cpu = [0.0, 0.0]
        # Every NVML device this process may see, by NVML index (or by UUID
        # for MIG instances): name, uuid, bus id, handle, sums.
        self.gpus: dict[Any, dict[str, Any]] = {}
        # The ones sampled, in CUDA order: (CUDA index, key into gpus).
        self.visible: list[tuple[int, Any]] = []
        self.mapping: dict[str, Any] = {"rule": None, "exact": False}
        self._proc: Any = None
        self._psutil: Any = None
        self._nvml: Any = None
        self.driver: Optional[str] = None
        try:
            import psutil

            self._psutil = psutil
            self._proc = psutil.Process()
            self._proc.cpu_percent(None)
            psutil.cpu_percent(None)
        except Exception as exc:  # pragma: no cover - psutil is a dependency
            notes.append(f"CPU sampling off: psutil unavailable ({exc})")
        nvml_given = nvml
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            self._nvml = nvml
        except Exception as exc:
            self._nvml = None
            if not _no_driver(exc, probe_machine=nvml_given is None):
                reason = str(exc).strip() or type(exc).__name__
                notes.append(f"GPU state off: NVML unavailable ({reason})")
            return
        try:
            self.driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            pass
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            notes.append(f"GPU state off: NVML could not count the GPUs ({exc})")
            self._nvml = None
            return
        for i in range(count):
            try:
                self._add(i, nvml.nvmlDeviceGetHandleByIndex(i))
            except Exception as exc:
                notes.append(f"GPU state of NVML device {i} off: {exc}")
        env = os.environ if env is None else env
        self._map_visible(parse_visible(env.get("CUDA_VISIBLE_DEVICES")),
                          env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST"))

    def _add(self, key: Any, handle: Any) -> dict[str, Any]:
        """Register one GPU. Only its handle is required; every other
        attribute is read on its own."""
        nvml = self._nvml
        g: dict[str, Any] = {
            "nvml_index": key if isinstance(key, int) else None,
            "handle": handle,
            "name": None,
            "uuid": None,
            "pci_bus_id": None,
            "mem_total": None,
            "util": [0.0, 0.0, 0],  # sum, max, n
            "mem_used_max": None,
            "off": set(),  # readings that failed once
        }
        for field, read in (
            ("name", lambda: _text(nvml.nvmlDeviceGetName(handle))),
            ("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
            ("pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
            ("mem_total", lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total)),
        ):
            try:
                g[field] = read()
            except Exception:
                pass
        self.gpus[key] = g
        return g

    def _by_uuid(self, uuid: str) -> Optional[Any]:
        """The key of the GPU with this UUID (or unique UUID prefix, as CUDA
        accepts), asking NVML for it (a MIG instance is not among the
        devices it enumerates) when it is not known yet."""
        want = _norm_uuid(uuid)
        found = [k for k, g in self.gpus.items()
                 if g["uuid"] and _norm_uuid(g["uuid"]).startswith(want)]
        if len(found) == 1:
            return found[0]
        exact = [k for k in found if _norm_uuid(self.gpus[k]["uuid"]) == want]
        if len(exact) == 1:
            return exact[0]
        for prefix in ("MIG-", "GPU-", ""):
            name = uuid if uuid.startswith(("GPU-", "MIG-")) else prefix + uuid
            try:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(name)
            except Exception:
                continue
            key = "uuid:" + _norm_uuid(uuid)
            self._add(key, handle)
            if not self.gpus[key]["uuid"]:
                self.gpus[key]["uuid"] = name
            return key
        return None

    def _pci_order(self) -> list[Any]:
        keys = [k for k in self.gpus if isinstance(k, int)]
        return sorted(keys, key=lambda k: (_norm_bus(self.gpus[k]["pci_bus_id"]), k))

    def _map_visible(self, tokens: Optional[list[str]], order: str) -> None:
        by_bus = self._pci_order()
        pci = order.strip().upper() == "PCI_BUS_ID"
        names = {self.gpus[k]["name"] for k in by_bus}
        indices = tokens is None or any(t.isdigit() for t in tokens)
        if not indices:
            rule, exact = "uuid (CUDA_VISIBLE_DEVICES)", True
        elif pci:
            rule, exact = "pci_bus_id (CUDA_DEVICE_ORDER=PCI_BUS_ID)", True
        elif len(names) <= 1:
            rule, exact = "pci_bus_id (FASTEST_FIRST, identical GPUs)", True
        else:
            rule, exact = "pci_bus_id (guess: FASTEST_FIRST with mixed GPUs)", False
        visible: list[tuple[int, Any]] = []
        for token in (tokens if tokens is not None else [str(i) for i in range(len(by_bus))]):
            if token.isdigit():
                i = int(token)
                key = by_bus[i] if i < len(by_bus) else None
            else:
                key = self._by_uuid(token)
            if key is None:
                # CUDA stops at an entry that names no device.
                break
            visible.append((len(visible), key))
        self.visible = visible
        self.mapping = {"rule": rule, "exact": exact, "cuda_visible_devices": tokens}
        if not exact:
            self.notes.append(
                "GPU numbering is a guess: CUDA orders mixed GPUs fastest first, NVML does "
                "not; set CUDA_DEVICE_ORDER=PCI_BUS_ID for an exact mapping"
            )

    def use_cuda_uuids(self, uuids: list[str]) -> None:
        """CUDA's own UUIDs of the devices this process sees, in CUDA's
        order (the agent passes them once the script initialised CUDA): the
        exact mapping, replacing the one read from the environment."""
        if self._nvml is None:
            return
        visible: list[tuple[int, Any]] = []
        for i, uuid in enumerate(uuids):
            key = self._by_uuid(uuid)
            if key is None:
                self.notes.append(f"GPU state of cuda:{i} off: NVML does not know {uuid}")
                continue
            visible.append((i, key))
        self.visible = visible  # one assignment: the flush thread reads it
        self.mapping = {"rule": "uuid (CUDA)", "exact": True,
                        "cuda_visible_devices": self.mapping.get("cuda_visible_devices")}

    @property
    def has_nvml(self) -> bool:
        return self._nvml is not None

    def sample(self) -> None:
        if self._proc is not None:
            try:
                p = self._proc.cpu_percent(None)
                s = self._psutil.cpu_percent(None)
                self.samples += 1
                self.proc_cpu[0] += p
                self.proc_cpu[1] = max(self.proc_cpu[1], p)
                self.sys_cpu[0] += s
                self.sys_cpu[1] = max(self.sys_cpu[1], s)
            except Exception:
                pass
        nvml = self._nvml
        if nvml is None:
            return
        for _index, key in self.visible:
            g = self.gpus[key]
            off = g["off"]
            handle = g["handle"]
            if "util" not in off:
                try:
                    util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                    u = g["util"]
                    u[0] += util
                    u[1] = max(u[1], util)
                    u[2] += 1
                except Exception:
                    off.add("util")  # MIG instances: not supported, ever
            if "memory" not in off:
                try:
                    used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
                    g["mem_used_max"] = max(g["mem_used_max"] or 0, used)
                except Exception:
                    off.add("memory")

    def summary(self) -> dict[str, Any]:
        n = self.samples
        out: dict[str, Any] = {
            "samples": n,
            "cpu_process_percent": {
                "avg": self.proc_cpu[0] / n if n else None,
                "max": self.proc_cpu[1] if n else None,
            },
            "cpu_system_percent": {
                "avg": self.sys_cpu[0] / n if n else None,
                "max": self.sys_cpu[1] if n else None,
            },
            "cpu_count": os.cpu_count(),
            "rss_peak_bytes": peak_rss(),
            "gpus": [],
            "driver": self.driver,
        }
        for index, key in self.visible:
            g = self.gpus[key]
            util_sum, util_max, count = g["util"]
            out["gpus"].append(
                {
                    "index": index,
                    "name": g["name"],
                    "util_avg": util_sum / count if count else None,
                    "util_max": util_max if count else None,
                    "mem_used_max": g["mem_used_max"],
                    "mem_total": g["mem_total"],
                    "uuid": g["uuid"],
                    "pci_bus_id": g["pci_bus_id"],
                    "nvml_index": g["nvml_index"],
                    "unsupported": sorted(g["off"]),
                }
            )
        if self._nvml is not None:
            out["gpu_mapping"] = dict(self.mapping)
        return out


def peak_rss() -> Optional[int]:
    """The process's true peak resident set (not a sampled one)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except Exception:
        return None
