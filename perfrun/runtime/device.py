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

The same samples gather the evidence that a measurement was disturbed
(analysis/disturbed.py decides): why the clocks were held down (power,
heat, sync boost, applications clocks; "idle" is no disturbance), the SM
clock against its maximum, other processes on the GPU, new uncorrected ECC
errors and XID errors. They are counted only in busy samples (utilisation
above 0, or every sample where utilisation cannot be read): an idle GPU
clocks down by design. Each of these readings, too, is tried on its own
and given up on that GPU after its first failure, recorded as unavailable
in the evidence, so a driver that lacks one loses that one alone.

A process on the GPU is the job's own when it is this process or a
descendant of the launcher (`job_pid`): the other ranks of a torchrun job
sampling the same GPUs. NVML reports PIDs as the host sees them: inside a
container with its own PID namespace they may name no process here. Such
PIDs are "unresolved": counted as another job's only when this process's
own PID was seen in the same list (the namespaces then agree, so an
unknown PID is another container's), and otherwise recorded but not held
against the run.
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


#: The clock event (throttle) reasons NVML reports, by bit. "gpu_idle" is
#: listed so that a mask decodes whole, and is never a disturbance.
CLOCK_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
#: NVML's constants, as numbers: a stand-in module need not define them.
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_EVENT_XID_CRITICAL = 0x8


def decode_reasons(mask: int) -> list[str]:
    """The names of the bits set in a clock event reasons mask."""
    return [name for bit, name in CLOCK_REASONS if mask & bit]


def median_of_counts(counts: Mapping[int, int]) -> Optional[int]:
    """The median of values stored as value -> count (the SM clocks seen:
    a handful of distinct values however long the run)."""
    n = sum(counts.values())
    if not n:
        return None
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if 2 * seen >= n:
            return value
    return None  # pragma: no cover


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

#: Where an NVTX tool names its library for the process to load.
NVTX_INJECTION_VARS = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH")


def nvtx_tool_possible(env: Mapping[str, str], probe_machine: bool = True) -> bool:
    """Whether an NVTX tool could listen to this process: one named in the
    environment (Nsight Systems and Nsight Compute set it for the process
    they start), or an NVIDIA driver, through which newer NVTX finds a tool
    without it. On a machine with neither, nvtx's ranges are no-ops for the
    life of the process, and its import (25 ms, at the script's `import
    torch`) buys nothing."""
    if any(env.get(name) for name in NVTX_INJECTION_VARS):
        return True
    return not probe_machine or driver_present() is not False


def driver_present() -> Optional[bool]:
    """Whether this machine shows an NVIDIA driver (DRIVER_PATHS); None
    where there is no cheap way to tell (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    return any(os.path.exists(path) for path in DRIVER_PATHS)


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
    return probe_machine and driver_present() is False


class DeviceSampler:
    def __init__(
        self,
        notes: list[str],
        env: Optional[Mapping[str, str]] = None,
        nvml: Any = None,
        job_pid: Optional[int] = None,
    ) -> None:
        self.notes = notes
        # The launcher: its descendants are the job (other ranks' PIDs on
        # a GPU are no disturbance).
        self.job_pid = job_pid
        self._pid_kind: dict[int, tuple[str, Optional[str]]] = {}
        self._events: Any = None  # NVML event set for XID errors
        self._events_off: Optional[str] = None
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
        self._cuda_uuids: Optional[list[str]] = None
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
            "ev": _new_evidence(),
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
        if self._nvml is None or uuids == self._cuda_uuids:
            return  # given twice when CUDA started as the sampler was made
        self._cuda_uuids = list(uuids)
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
                    g["_util_now"] = util
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
            try:
                self._sample_evidence(g)
            except Exception as exc:  # never the flush thread's end
                g["ev"]["off"].setdefault("evidence", f"{type(exc).__name__}: {exc}")
        try:
            self._poll_xid()
        except Exception as exc:
            self._events_off = self._events_off or f"{type(exc).__name__}: {exc}"

    # -- disturbance evidence ---------------------------------------------------------

    def _try(self, g: dict[str, Any], reading: str, read: Any) -> Any:
        """One evidence reading; a failure turns it off on this GPU, with
        the reason kept for the evidence."""
        off = g["ev"]["off"]
        if reading in off:
            return None
        try:
            return read()
        except Exception as exc:
            off[reading] = _nvml_reason(exc)
            return None

    def _sample_evidence(self, g: dict[str, Any]) -> None:
        nvml = self._nvml
        handle = g["handle"]
        ev = g["ev"]
        ev["samples"] += 1
        if ev["xid_registered"] is None:
            ev["xid_registered"] = self._register_xid(handle)
        if ev["ecc_start"] is None and "ecc" not in ev["off"]:
            ev["ecc_start"] = self._try(g, "ecc", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
                handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)))
        elif ev["ecc_start"] is not None:
            now = self._try(g, "ecc", lambda: int(nvml.nvmlDeviceGetTotalEccErrors(
                handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)))
            if now is not None:
                ev["ecc_now"] = now
        self._sample_processes(g)
        # Busy: utilisation above 0 in this sample, or every sample where
        # utilisation cannot be read.
        util = g.pop("_util_now", None)
        busy = util > 0 if util is not None else "util" in g["off"]
        if not busy:
            return
        ev["busy"] += 1
        mask = self._try(g, "clock_reasons", lambda: self._reasons(handle, ev))
        if mask is not None:
            for name in decode_reasons(int(mask)):
                ev["reasons"][name] = ev["reasons"].get(name, 0) + 1
            ev["reasons_read"] += 1
        if ev["sm_max"] is None and "sm_max" not in ev["off"]:
            ev["sm_max"] = self._try(
                g, "sm_max", lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM)))
        if ev["power_default_mw"] is None and "power_limit" not in ev["off"]:
            ev["power_default_mw"] = self._try(g, "power_limit", lambda: int(
                nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)))
        limit = self._try(
            g, "power_limit", lambda: int(nvml.nvmlDeviceGetEnforcedPowerLimit(handle)))
        if limit is not None:
            low = ev["power_limit_min_mw"]
            ev["power_limit_min_mw"] = limit if low is None else min(low, limit)
        sm = self._try(
            g, "sm_clock", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)))
        if sm is not None:
            ev["sm_clocks"][sm] = ev["sm_clocks"].get(sm, 0) + 1

    def _reasons(self, handle: Any, ev: dict[str, Any]) -> int:
        """The clock event reasons mask: the current name first, then the
        one drivers before 535 (and older pynvml) know."""
        nvml = self._nvml
        for api in ("nvmlDeviceGetCurrentClocksEventReasons",
                    "nvmlDeviceGetCurrentClocksThrottleReasons"):
            read = getattr(nvml, api, None)
            if read is None or ev["reasons_api"] not in (None, api):
                continue
            try:
                mask = int(read(handle))
            except Exception as exc:
                if ev["reasons_api"] is None and "FunctionNotFound" in type(exc).__name__:
                    continue  # the library has the name, the driver not
                raise
            ev["reasons_api"] = api
            return mask
        raise RuntimeError("no clock event reasons call in this NVML")

    def _sample_processes(self, g: dict[str, Any]) -> None:
        nvml = self._nvml
        handle = g["handle"]
        ev = g["ev"]
        # pid -> (kind, used bytes) in this sample: a process listed as
        # both compute and graphics is one process, seen once, "compute".
        seen: dict[int, tuple[str, Optional[int]]] = {}
        read = False
        for kind, api in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                          ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            procs = self._try(g, f"{kind}_processes", lambda api=api: getattr(nvml, api)(handle))
            if procs is None:
                continue
            read = True
            for p in procs:
                pid = int(getattr(p, "pid", 0) or 0)
                if pid <= 0:
                    continue
                used = getattr(p, "usedGpuMemory", None)
                used = int(used) if isinstance(used, int) and used >= 0 else None
                if pid in seen:
                    first_kind, before = seen[pid]
                    used = before if used is None else max(used, before or 0)
                    seen[pid] = (first_kind, used)
                else:
                    seen[pid] = (kind, used)
        if read:
            ev["process_reads"] += 1
        for pid, (kind, used) in seen.items():
            owner, name = self._classify(pid)
            if owner == "own":
                ev["own_seen"] = True
            if owner in ("own", "job"):
                continue
            table = ev["others"] if owner == "other" else ev["unresolved"]
            entry = table.setdefault(pid, {"pid": pid, "name": name, "kind": kind,
                                           "used_memory_max": None, "samples": 0})
            entry["samples"] += 1
            if used is not None:
                entry["used_memory_max"] = max(entry["used_memory_max"] or 0, used)

    def _classify(self, pid: int) -> tuple[str, Optional[str]]:
        """("own" | "job" | "other" | "unresolved", process name), cached:
        one walk up the process tree per PID per run."""
        known = self._pid_kind.get(pid)
        if known is not None:
            return known
        if pid == os.getpid():
            result: tuple[str, Optional[str]] = ("own", None)
        else:
            result = ("unresolved", None)
            ps = self._psutil
            if ps is not None:
                try:
                    proc = ps.Process(pid)
                    name = proc.name()
                    chain = {p.pid for p in proc.parents()}
                    job = self.job_pid
                    mine = job is not None and (pid == job or job in chain)
                    result = ("job" if mine else "other", name)
                except Exception:
                    result = ("unresolved", None)
        self._pid_kind[pid] = result
        return result

    def _register_xid(self, handle: Any) -> bool:
        """Ask NVML for this GPU's critical XID events (polled, never
        waited on, at each sample). False where it cannot."""
        nvml = self._nvml
        if self._events_off is not None:
            return False
        try:
            if self._events is None:
                self._events = nvml.nvmlEventSetCreate()
            kind = getattr(nvml, "nvmlEventTypeXidCriticalError", NVML_EVENT_XID_CRITICAL)
            nvml.nvmlDeviceRegisterEvents(handle, kind, self._events)
            return True
        except Exception as exc:
            self._events_off = _nvml_reason(exc)
            return False

    def _poll_xid(self) -> None:
        """Take every XID event waiting, without waiting for one (timeout 0:
        NVML then answers "timeout" when there is none)."""
        if self._events is None:
            return
        nvml = self._nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(64):  # a storm of events must not hold the thread
            try:
                data = wait(self._events, 0)
            except Exception as exc:
                if "Timeout" in type(exc).__name__ or "imeout" in str(exc):
                    return
                raise
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except Exception:
                uuid = None
            xid = int(getattr(data, "eventData", 0) or 0)
            for g in self.gpus.values():
                if uuid is None or (g["uuid"] and _norm_uuid(g["uuid"]) == _norm_uuid(uuid)):
                    g["ev"]["xids"].append(xid)
                    if uuid is not None:
                        break

    def _evidence(self, g: dict[str, Any]) -> dict[str, Any]:
        """What the samples say about disturbance, for the rank file."""
        ev = g["ev"]
        busy = ev["busy"]
        read = ev["reasons_read"]
        clocks = ev["sm_clocks"]
        off = dict(ev["off"])
        if self._events_off is not None or ev["xid_registered"] is False:
            off["xid"] = self._events_off or "not supported"
        new_ecc = None
        if ev["ecc_start"] is not None and ev["ecc_now"] is not None:
            new_ecc = max(0, ev["ecc_now"] - ev["ecc_start"])
        elif ev["ecc_start"] is not None:
            new_ecc = 0
        own_seen = ev["own_seen"]
        unresolved = sorted(ev["unresolved"].values(), key=lambda e: e["pid"])
        others = sorted(ev["others"].values(), key=lambda e: e["pid"])
        if own_seen:
            # One PID namespace: an unknown PID is another container's.
            others = sorted(others + unresolved, key=lambda e: e["pid"])
            unresolved = []
        return {
            "samples": ev["samples"],
            "busy_samples": busy,
            "busy_basis": "all samples (utilisation unreadable)" if "util" in g["off"]
            else "utilisation > 0",
            "reasons_api": ev["reasons_api"],
            "reasons_samples": read,
            "reasons": {k: v / read for k, v in sorted(ev["reasons"].items())} if read else {},
            "sm_clock_min": min(clocks) if clocks else None,
            "sm_clock_median": median_of_counts(clocks),
            "sm_clock_max": ev["sm_max"],
            "power_limit_w": _watts(ev["power_limit_min_mw"]),
            "power_default_limit_w": _watts(ev["power_default_mw"]),
            "process_reads": ev["process_reads"],
            "own_pid_seen": own_seen,
            "other_processes": others,
            "unresolved_processes": unresolved,
            "ecc_uncorrected_new": new_ecc,
            "xid_available": bool(ev["xid_registered"]) and self._events_off is None,
            "xid_errors": list(ev["xids"]),
            "unavailable": off,
        }

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
                    "evidence": self._evidence(g),
                }
            )
        if self._nvml is not None:
            out["gpu_mapping"] = dict(self.mapping)
        return out


def _new_evidence() -> dict[str, Any]:
    return {
        "samples": 0,
        "busy": 0,
        "reasons": {},  # name -> busy samples with it
        "reasons_read": 0,
        "reasons_api": None,
        "sm_clocks": {},  # MHz -> busy samples
        "sm_max": None,
        "power_limit_min_mw": None,  # the lowest enforced power limit seen
        "power_default_mw": None,
        "process_reads": 0,
        "own_seen": False,
        "others": {},  # pid -> entry
        "unresolved": {},
        "ecc_start": None,
        "ecc_now": None,
        "xid_registered": None,
        "xids": [],
        "off": {},  # reading -> why it is unavailable
    }


def _watts(milliwatts: Optional[int]) -> Optional[float]:
    return None if milliwatts is None else milliwatts / 1000.0


def _nvml_reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def peak_rss() -> Optional[int]:
    """The process's true peak resident set (not a sampled one)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except Exception:
        return None
