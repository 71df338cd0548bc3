"""The Device Summary: CPU, memory and GPU utilisation per host, as the
ranks' samplers saw them (runtime/device.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from perfrun.store.rankfile import RankResult
from perfrun.store.schema import as_finite, as_int


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    util_avg: Optional[float]
    util_max: Optional[float]
    mem_used_max: Optional[int]
    mem_total: Optional[int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "util_avg": self.util_avg,
            "util_max": self.util_max,
            "mem_used_max": self.mem_used_max,
            "mem_total": self.mem_total,
        }


@dataclass(frozen=True)
class HostDevice:
    """One host's utilisation, as sampled by its lowest rank. The process
    figures are that rank's process; CPU(Process) can exceed 100% (one
    hundred per busy core)."""

    hostname: str
    rank: int
    cpu_process_avg: Optional[float]
    cpu_process_max: Optional[float]
    cpu_system_avg: Optional[float]
    cpu_system_max: Optional[float]
    rss_peak_bytes: Optional[int]
    gpus: list[GpuDevice]

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "rank": self.rank,
            "cpu_process_avg": self.cpu_process_avg,
            "cpu_process_max": self.cpu_process_max,
            "cpu_system_avg": self.cpu_system_avg,
            "cpu_system_max": self.cpu_system_max,
            "rss_peak_bytes": self.rss_peak_bytes,
            "gpus": [g.to_dict() for g in self.gpus],
        }


@dataclass(frozen=True)
class DeviceSummary:
    hosts: list[HostDevice]

    @property
    def has_gpu(self) -> bool:
        return any(h.gpus for h in self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {"hosts": [h.to_dict() for h in self.hosts], "has_gpu": self.has_gpu}


def _pair(section: Any) -> tuple[Optional[float], Optional[float]]:
    if not isinstance(section, Mapping):
        return None, None
    return as_finite(section.get("avg")), as_finite(section.get("max"))


def device_summary(ranks: Sequence[RankResult]) -> Optional[DeviceSummary]:
    """CPU, memory and GPU utilisation per host, or None when no rank
    sampled any. Every rank on a host sees the same GPUs and the same system
    CPU; taking the lowest rank per host keeps each device once."""
    chosen: dict[str, RankResult] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        device = rank.data.get("device")
        if not isinstance(device, Mapping) or not device:
            continue
        host = str((rank.data.get("env") or {}).get("hostname") or "?")
        chosen.setdefault(host, rank)
    hosts = []
    for host, rank in chosen.items():
        device = rank.data["device"]
        proc_avg, proc_max = _pair(device.get("cpu_process_percent"))
        sys_avg, sys_max = _pair(device.get("cpu_system_percent"))
        gpus = []
        for i, g in enumerate(device.get("gpus") or []):
            if not isinstance(g, Mapping):
                continue
            index = as_int(g.get("index"))
            gpus.append(
                GpuDevice(
                    index=i if index is None else index,
                    name=str(g.get("name") or "GPU"),
                    util_avg=as_finite(g.get("util_avg")),
                    util_max=as_finite(g.get("util_max")),
                    mem_used_max=as_int(g.get("mem_used_max")),
                    mem_total=as_int(g.get("mem_total")),
                )
            )
        hosts.append(
            HostDevice(
                hostname=host,
                rank=rank.rank,
                cpu_process_avg=proc_avg,
                cpu_process_max=proc_max,
                cpu_system_avg=sys_avg,
                cpu_system_max=sys_max,
                rss_peak_bytes=as_int(device.get("rss_peak_bytes")),
                gpus=gpus,
            )
        )
    return DeviceSummary(hosts=hosts) if hosts else None
