"""CPU, memory and GPU state of the run, sampled from the flush thread."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional


class DeviceSampler:
    def __init__(self, notes: list[str]) -> None:
        self.samples = 0
        self.proc_cpu = [0.0, 0.0]  # sum, max
        self.sys_cpu = [0.0, 0.0]
        self.gpus: dict[int, dict[str, Any]] = {}
        self._proc: Any = None
        self._psutil: Any = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.driver: Optional[str] = None
        try:
            import psutil

            self._psutil = psutil
            self._proc = psutil.Process()
            self._proc.cpu_percent(None)
            psutil.cpu_percent(None)
        except Exception as exc:  # pragma: no cover - psutil is a dependency
            notes.append(f"CPU sampling off: psutil unavailable ({exc})")
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            driver = pynvml.nvmlSystemGetDriverVersion()
            self.driver = driver.decode() if isinstance(driver, bytes) else str(driver)
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                if isinstance(name, bytes):
                    name = name.decode()
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                self._handles.append(handle)
                self.gpus[i] = {
                    "index": i,
                    "name": name,
                    "util_sum": 0.0,
                    "util_max": 0.0,
                    "mem_used_max": 0,
                    "mem_total": int(mem.total),
                    "n": 0,
                }
        except Exception as exc:
            # No NVIDIA driver: the normal case on CPU machines.
            self._nvml = None
            reason = str(exc).strip() or type(exc).__name__
            notes.append(f"GPU state off: NVML unavailable ({reason})")

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
        if self._nvml is not None:
            for i, handle in enumerate(self._handles):
                try:
                    util = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                    used = self._nvml.nvmlDeviceGetMemoryInfo(handle).used
                except Exception:
                    continue
                g = self.gpus[i]
                g["n"] += 1
                g["util_sum"] += util
                g["util_max"] = max(g["util_max"], util)
                g["mem_used_max"] = max(g["mem_used_max"], int(used))

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
        for g in self.gpus.values():
            out["gpus"].append(
                {
                    "index": g["index"],
                    "name": g["name"],
                    "util_avg": g["util_sum"] / g["n"] if g["n"] else None,
                    "util_max": g["util_max"] if g["n"] else None,
                    "mem_used_max": g["mem_used_max"],
                    "mem_total": g["mem_total"],
                }
            )
        return out


def peak_rss() -> Optional[int]:
    """The process's true peak resident set (not a sampled one)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except Exception:
        return None
